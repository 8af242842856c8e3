//! Go's CPU profile: on-CPU samples of the CPU clock by (thread, user stack, kernel stack),
//! `samples/count` and `cpu/nanoseconds`, period 1e9 / frequency, labelled `tid` and
//! `thread`.

use std::collections::{HashMap, HashSet};

use super::{unwind_comment, Context, Counts, Settings};
use crate::{
    catalog::Sighting,
    ebpf::{Batch, Counters, RawCpuSample},
    ids::{StackId, Tid},
    pprof::Shape,
    resolve::{LabelValue, StackSample},
};

/// A sample's user leaf is the interrupted pc itself, not a return address.
const USER_LEAF_IS_RETURN: bool = false;

/// What CPU samples are counted under inside one process.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SampleKey {
    pub tid: Tid,
    pub user_stack: StackId,
    pub kernel_stack: StackId,
}

/// One process's CPU samples in a window.
#[derive(Clone, Debug, Default)]
pub struct CpuCounts {
    pub samples: HashMap<SampleKey, u64>,
    /// Thread id → thread name.
    pub threads: HashMap<Tid, String>,
    /// Total samples.
    pub total: u64,
}

impl CpuCounts {
    fn add(&mut self, sample: &RawCpuSample) {
        self.threads.insert(sample.tid, sample.comm.clone());
        let key = SampleKey { tid: sample.tid, user_stack: sample.user_stack, kernel_stack: sample.kernel_stack };
        *self.samples.entry(key).or_default() += sample.count;
        self.total += sample.count;
    }
}

pub(super) fn count(batch: &Batch, counts: &mut Counts) {
    for sample in &batch.cpu {
        counts.process_mut(sample.pid).cpu.add(sample);
    }
}

pub(super) fn sightings<'a>(batch: &'a Batch, out: &mut Vec<Sighting<'a>>) {
    out.extend(batch.cpu.iter().map(|s| Sighting {
        pid: s.pid,
        user_stack: s.user_stack,
        kernel_stack: s.kernel_stack,
        user_leaf_is_return: USER_LEAF_IS_RETURN,
        main_thread_name: (s.tid.0 == s.pid.0).then_some(s.comm.as_str()),
    }));
}

pub(super) fn stacks(counts: &CpuCounts, out: &mut HashSet<StackId>) {
    out.extend(counts.samples.keys().flat_map(|k| [k.user_stack, k.kernel_stack]));
}

pub(super) fn shape(settings: &Settings) -> Shape {
    Shape {
        sample_types: &[("samples", "count"), ("cpu", "nanoseconds")],
        period_type: ("cpu", "nanoseconds"),
        period: period_ns(settings),
        default_sample_type: "cpu",
    }
}

fn period_ns(settings: &Settings) -> i64 {
    1_000_000_000 / i64::from(settings.frequency_hz.max(1))
}

pub(super) fn samples(counts: &CpuCounts, settings: &Settings) -> Vec<StackSample> {
    let period = period_ns(settings);
    counts
        .samples
        .iter()
        .map(|(key, &count)| StackSample {
            user_stack: key.user_stack,
            kernel_stack: key.kernel_stack,
            user_leaf_is_return: USER_LEAF_IS_RETURN,
            values: vec![count as i64, count as i64 * period],
            unscaled: Vec::new(),
            labels: vec![
                ("tid", LabelValue::Num(i64::from(key.tid.0), None)),
                ("thread", LabelValue::Str(counts.threads.get(&key.tid).cloned().unwrap_or_default())),
            ],
        })
        .collect()
}

/// What it is and what was dropped (machine-wide counts since the programs were loaded).
pub(super) fn comments(context: Context, counters: &Counters) -> Vec<String> {
    let c = counters.cpu;
    vec![
        format!(
            "profiler {} cpu profile (on-CPU samples of the CPU clock); {}",
            env!("CARGO_PKG_VERSION"),
            context.describe()
        ),
        format!(
            "dropped samples (whole machine): counts map full {}; stacks without frames: stack not stored \
             (map full or kernel allocation failed) {}, user stack unreadable {}, kernel stack unreadable {}; \
             user stacks cut at {} frames {}; samples of cgroups not selected (not walked) {}; ticks of the \
             CPU clock the sampler never ran for (another BPF program or a bpf() call was running on that \
             CPU, or the timer ran late) {} of {}",
            c.counts_map_full,
            c.stacks_map_full,
            c.user_stack_failed,
            c.kernel_stack_failed,
            profiler_common::MAX_USER_STACK_DEPTH,
            c.user_stack_truncated,
            c.cgroup_filtered,
            c.ticks_missed,
            c.ticks_due
        ),
        unwind_comment(counters),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::Pid;

    #[test]
    fn counts_per_thread_and_names_the_main_thread() {
        let sample = |tid, user, count| RawCpuSample {
            pid: Pid(10),
            tid: Tid(tid),
            comm: format!("t{tid}"),
            user_stack: StackId(user),
            kernel_stack: StackId::NONE,
            count,
        };
        let batch = Batch { cpu: vec![sample(10, 7, 3), sample(11, 7, 1)], ..Batch::default() };
        let mut counts = Counts::default();
        count(&batch, &mut counts);
        count(&batch, &mut counts);
        let cpu = &counts.process(Pid(10)).unwrap().cpu;
        assert_eq!(cpu.total, 8);
        assert_eq!(cpu.threads.len(), 2);
        let key = SampleKey { tid: Tid(10), user_stack: StackId(7), kernel_stack: StackId::NONE };
        assert_eq!(cpu.samples[&key], 6);
        let mut seen = Vec::new();
        sightings(&batch, &mut seen);
        assert_eq!(seen[0].main_thread_name, Some("t10"));
        assert_eq!(seen[1].main_thread_name, None, "not the main thread");
        let samples = samples(
            cpu,
            &Settings {
                frequency_hz: 100,
                heap_sample_bytes: 1,
                offcpu_rate_ns: 1,
                offcpu_sample_every: 1,
                block_rate_ns: 1,
                mutex_fraction: 1,
            },
        );
        let s = samples.iter().find(|s| s.labels[0].1 == LabelValue::Num(10, None)).unwrap();
        assert_eq!(s.values, [6, 60_000_000], "count, and count × the 10 ms period");
    }
}
