//! The off-CPU profile: time threads spent switched out, from `sched_switch` sampled by the
//! length of the interval, by (thread, state, user stack, kernel stack): `switches/count` and
//! `off_cpu/nanoseconds`, labelled `state` (`blocked`: it slept; `runnable`: it was preempted
//! and waited for a core), `thread` and `tid`. The kernel's counts are already unbiased
//! estimates of every switch (see `profiler_common::sampling`); switches come in fixed point
//! and are rounded here.

use std::collections::{HashMap, HashSet};

use profiler_common::{sampling::WEIGHT_ONE, OffCpuState};

use super::{unwind_comment, Context, Counts, Settings};
use crate::{
    catalog::Sighting,
    ebpf::{Batch, Counters, OffCpuCounters, RawOffCpu},
    ids::{StackId, Tid},
    pprof::Shape,
    resolve::{LabelValue, StackSample},
};

/// The stack is taken in `schedule()`, inside a system call or an interrupt return: the
/// user leaf is where the thread will resume, the return point of its syscall or the
/// interrupted instruction. Like CPU samples, it is shown as taken.
const USER_LEAF_IS_RETURN: bool = false;

/// What off-CPU time is counted under inside one process.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct OffCpuSampleKey {
    pub tid: Tid,
    pub user_stack: StackId,
    pub kernel_stack: StackId,
    /// `OffCpuState` as its raw value (ordered, hashable).
    pub state: u32,
}

/// Switches and their time off the CPU, as estimated by the kernel.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OffCpuTime {
    /// In 1/`WEIGHT_ONE` (a short interval kept with probability d/rate counts rate/d).
    pub switches: u64,
    pub off_cpu_ns: u64,
}

/// One process's off-CPU time in a window.
#[derive(Clone, Debug, Default)]
pub struct OffCpuCounts {
    pub samples: HashMap<OffCpuSampleKey, OffCpuTime>,
    /// Thread id → thread name.
    pub threads: HashMap<Tid, String>,
}

impl OffCpuCounts {
    fn add(&mut self, raw: &RawOffCpu) {
        self.threads.insert(raw.tid, raw.comm.clone());
        let key = OffCpuSampleKey {
            tid: raw.tid,
            user_stack: raw.user_stack,
            kernel_stack: raw.kernel_stack,
            state: raw.state as u32,
        };
        let time = self.samples.entry(key).or_default();
        time.switches += raw.switches;
        time.off_cpu_ns += raw.off_cpu_ns;
    }

    /// Switches in the window (estimated).
    pub fn switches(&self) -> u64 {
        whole(self.samples.values().map(|t| t.switches).sum())
    }
}

pub(super) fn count(batch: &Batch, counts: &mut Counts) {
    for raw in &batch.offcpu {
        counts.process_mut(raw.pid).offcpu.add(raw);
    }
}

pub(super) fn sightings<'a>(batch: &'a Batch, out: &mut Vec<Sighting<'a>>) {
    out.extend(batch.offcpu.iter().map(|s| Sighting {
        pid: s.pid,
        user_stack: s.user_stack,
        kernel_stack: s.kernel_stack,
        user_leaf_is_return: USER_LEAF_IS_RETURN,
        main_thread_name: (s.tid.0 == s.pid.0).then_some(s.comm.as_str()),
    }));
}

pub(super) fn stacks(counts: &OffCpuCounts, out: &mut HashSet<StackId>) {
    out.extend(counts.samples.keys().flat_map(|k| [k.user_stack, k.kernel_stack]));
}

pub(super) const SAMPLE_TYPES: &[(&str, &str)] = &[("switches", "count"), ("off_cpu", "nanoseconds")];

/// Values are estimates of every switch already, so the period is 1.
pub(super) fn shape(_settings: &Settings) -> Shape {
    Shape { sample_types: SAMPLE_TYPES, period_type: ("switches", "count"), period: 1, default_sample_type: "off_cpu" }
}

/// Switches from the kernel's fixed point, rounded.
fn whole(switches: u64) -> u64 {
    switches.saturating_add(WEIGHT_ONE / 2) / WEIGHT_ONE
}

pub(super) fn samples(counts: &OffCpuCounts, _settings: &Settings) -> Vec<StackSample> {
    let mut keys: Vec<(&OffCpuSampleKey, &OffCpuTime)> = counts.samples.iter().collect();
    keys.sort_unstable_by_key(|(k, _)| **k);
    keys.into_iter()
        .map(|(key, time)| StackSample {
            user_stack: key.user_stack,
            kernel_stack: key.kernel_stack,
            user_leaf_is_return: USER_LEAF_IS_RETURN,
            values: vec![whole(time.switches) as i64, time.off_cpu_ns.min(i64::MAX as u64) as i64],
            unscaled: Vec::new(),
            labels: vec![
                ("state", LabelValue::Str(OffCpuState::from_raw(key.state).name().to_string())),
                ("tid", LabelValue::Num(i64::from(key.tid.0), None)),
                ("thread", LabelValue::Str(counts.threads.get(&key.tid).cloned().unwrap_or_default())),
            ],
        })
        .collect()
}

/// What it is, the sampling in force, and what was dropped (machine-wide, since load).
pub(super) fn comments(context: Context, counters: &Counters, settings: &Settings) -> Vec<String> {
    let o = counters.offcpu;
    vec![
        format!(
            "profiler {} offcpu profile: time threads spent off a CPU (sched_switch), by the stack they left \
             it with; state blocked = slept (S, D), runnable = preempted, waited for a core; {}",
            env!("CARGO_PKG_VERSION"),
            context.describe()
        ),
        sampling_comment(&o, settings),
        format!(
            "dropped (whole machine, unscaled): in-flight map full {}; counts map full {}; stacks lost {}; \
             switches of cgroups not selected (not walked) {}",
            o.pending_map_full, o.counts_map_full, o.stack_lost, o.cgroup_filtered
        ),
        unwind_comment(counters),
    ]
}

/// How the kernel sampled: by length (Go's block-rate rule), or, on a kernel without
/// `sched_exit_tp`, 1 in N switches.
fn sampling_comment(o: &OffCpuCounters, settings: &Settings) -> String {
    if o.walked_at_switch_out {
        let every = settings.offcpu_sample_every.max(1);
        return format!(
            "sampling: 1 in {every} switches recorded (offcpu.sample_every), values scaled by {every}; stacks \
             walked as the thread left the CPU (this kernel has no sched_exit_tp), which perturbs the waits \
             sampled: short ones read a few percent high; kernel threads are not recorded"
        );
    }
    format!(
        "sampling: offcpu rate {} ns: intervals off a CPU at least that long are all recorded, a shorter one of \
         length d with probability d/rate and then counted as rate/d switches of rate ns in all (Go's block \
         profile unbiasing); shorter intervals left out (whole machine): {}; kernel threads are not recorded",
        settings.offcpu_rate_ns.max(1),
        o.unsampled
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::Pid;

    #[test]
    fn rounds_the_kernel_estimates_and_labels_the_state() {
        let raw = |state, switches, ns| RawOffCpu {
            pid: Pid(7),
            tid: Tid(8),
            comm: "w".into(),
            state,
            user_stack: StackId(1),
            kernel_stack: StackId(2),
            switches: switches * WEIGHT_ONE / 2,
            off_cpu_ns: ns,
        };
        // Halves: a short interval kept with probability d/rate counts rate/d switches.
        let batch = Batch {
            offcpu: vec![raw(OffCpuState::Blocked, 3, 1_000), raw(OffCpuState::Runnable, 1, 50)],
            ..Batch::default()
        };
        let mut counts = Counts::default();
        count(&batch, &mut counts);
        count(&batch, &mut counts);
        let offcpu = &counts.process(Pid(7)).unwrap().offcpu;
        assert_eq!(offcpu.switches(), 4);
        let settings = Settings {
            frequency_hz: 99,
            heap_sample_bytes: 1,
            offcpu_rate_ns: 1,
            offcpu_sample_every: 10,
            block_rate_ns: 1,
            mutex_fraction: 1,
        };
        let samples = samples(offcpu, &settings);
        assert_eq!(samples.len(), 2);
        assert_eq!(samples[0].values, [3, 2_000]);
        assert_eq!(samples[0].labels[0], ("state", LabelValue::Str("blocked".into())));
        assert_eq!(samples[1].values, [1, 100]);
        assert_eq!(samples[1].labels[0], ("state", LabelValue::Str("runnable".into())));
        assert_eq!(shape(&settings).period, 1);
    }
}
