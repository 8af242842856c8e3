//! The CPU sampler's side of the session: attach the perf_event program to every online
//! CPU's clock, read its counters, and drain its counts.

use std::time::Instant;

use aya::{
    programs::{
        perf_event::{PerfEventConfig, PerfEventScope, SamplePolicy, SoftwareEvent},
        PerfEvent,
    },
    util::online_cpus,
    Ebpf,
};
use profiler_common::{maps, programs, CpuCounter, CpuSampleKey};

use super::{drain_counts, missing, program_error, sum_counters, Error, Result};
use crate::ids::{Pid, StackId, Tid};

/// Totals of the CPU sampler's event and drop counters since load.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CpuCounters {
    pub samples: u64,
    pub user_stack_failed: u64,
    pub kernel_stack_failed: u64,
    pub stacks_map_full: u64,
    pub counts_map_full: u64,
    pub user_stack_truncated: u64,
    /// Samples of tasks in cgroups the configuration does not select: not walked.
    pub cgroup_filtered: u64,
    /// Ticks of idle CPUs, or of processes a pid list leaves out: not samples.
    pub not_sampled: u64,
    /// Ticks of the CPU clock the program never ran for, of `ticks_due`: the kernel skips
    /// a tick that comes while another BPF program, or a `bpf()` call, runs on that CPU
    /// (uprobes, syscall tracepoints, map updates: perf_event programs have no miss count),
    /// and a timer held up past its next tick (a busy hypervisor) fires once for both.
    pub ticks_missed: u64,
    /// Ticks due on all CPUs since the clock was attached (0 before).
    pub ticks_due: u64,
    /// Samples of Go processes whose goroutine had pprof labels, read.
    pub go_labels: u64,
    /// Samples of Go processes whose goroutine's labels could not be read (no labels).
    pub go_labels_unreadable: u64,
    /// Samples whose labels were read but not stored, the labels map full (no labels).
    pub go_labels_map_full: u64,
}

/// The CPU clock as attached: since when, on how many CPUs, and its period (the kernel
/// turns a frequency into a fixed period for this software event, `NSEC_PER_SEC / hz`).
#[derive(Clone, Copy, Debug)]
pub(super) struct Clock {
    attached: Instant,
    cpus: u64,
    period_ns: u64,
}

impl Clock {
    /// Ticks due on all CPUs from the attach to `now`.
    fn ticks_due(&self, now: Instant) -> u64 {
        let elapsed = now.saturating_duration_since(self.attached).as_nanos() as u64;
        self.cpus * (elapsed / self.period_ns.max(1))
    }
}

/// A (process, thread, stacks) entry with the number of samples it got.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RawCpuSample {
    pub pid: Pid,
    pub tid: Tid,
    /// The thread's name at sampling time.
    pub comm: String,
    pub user_stack: StackId,
    pub kernel_stack: StackId,
    /// The goroutine's pprof labels (a Go process's sample; see [`super::LabelsId`]).
    pub labels: super::LabelsId,
    pub count: u64,
}

pub(super) const COUNTS: [&str; 2] = [maps::CPU_COUNTS_0, maps::CPU_COUNTS_1];

pub(super) fn attach(ebpf: &mut Ebpf, frequency_hz: u32) -> Result<Clock> {
    let name = programs::CPU_SAMPLE;
    let program: &mut PerfEvent =
        ebpf.program_mut(name).ok_or_else(|| missing(name))?.try_into().map_err(program_error("find", name))?;
    program.load().map_err(program_error("load", name))?;
    let cpus = online_cpus()
        .map_err(|(path, source)| Error::Io { action: format!("read the online CPUs from {path}"), source })?;
    let attached = cpus.len() as u64;
    for cpu in cpus {
        program
            .attach(
                PerfEventConfig::Software(SoftwareEvent::CpuClock),
                PerfEventScope::AllProcessesOneCpu { cpu },
                SamplePolicy::Frequency(frequency_hz.into()),
                false,
            )
            .map_err(program_error("attach (perf event on a cpu)", name))?;
    }
    // After the last attach: the ticks due are counted short by at most the attach time.
    Ok(Clock { attached: Instant::now(), cpus: attached, period_ns: 1_000_000_000 / u64::from(frequency_hz.max(1)) })
}

/// The counters, and the ticks `clock` (if attached) was due that the program never ran for.
pub(super) fn counters(ebpf: &Ebpf, clock: Option<Clock>) -> Result<CpuCounters> {
    // Before the counters are read, so that a tick counted after `now` is not missing.
    let ticks_due = clock.map_or(0, |clock| clock.ticks_due(Instant::now()));
    let c: [u64; CpuCounter::COUNT as usize] = sum_counters(ebpf, maps::CPU_COUNTERS)?;
    let get = |counter: CpuCounter| c[counter as usize];
    // Every tick the program runs for ends in exactly one of these.
    let ran = get(CpuCounter::Samples)
        + get(CpuCounter::CountsMapFull)
        + get(CpuCounter::CgroupFiltered)
        + get(CpuCounter::NotSampled);
    Ok(CpuCounters {
        samples: get(CpuCounter::Samples),
        user_stack_failed: get(CpuCounter::UserStackFailed),
        kernel_stack_failed: get(CpuCounter::KernelStackFailed),
        stacks_map_full: get(CpuCounter::StacksMapFull),
        counts_map_full: get(CpuCounter::CountsMapFull),
        user_stack_truncated: get(CpuCounter::UserStackTruncated),
        cgroup_filtered: get(CpuCounter::CgroupFiltered),
        not_sampled: get(CpuCounter::NotSampled),
        ticks_missed: ticks_due.saturating_sub(ran),
        ticks_due,
        go_labels: get(CpuCounter::GoLabels),
        go_labels_unreadable: get(CpuCounter::GoLabelsUnreadable),
        go_labels_map_full: get(CpuCounter::GoLabelsMapFull),
    })
}

/// Reads and empties set `set`'s sample counts.
pub(super) fn drain(ebpf: &mut Ebpf, set: usize) -> Result<Vec<RawCpuSample>> {
    let entries = drain_counts(ebpf, COUNTS[set])?;
    Ok(entries.into_iter().map(|(key, count)| raw_sample(&key, count)).collect())
}

fn raw_sample(key: &CpuSampleKey, count: u64) -> RawCpuSample {
    let comm_len = key.comm.iter().position(|&b| b == 0).unwrap_or(key.comm.len());
    RawCpuSample {
        pid: Pid(key.tgid),
        tid: Tid(key.tid),
        comm: String::from_utf8_lossy(&key.comm[..comm_len]).into_owned(),
        user_stack: StackId(key.user_stack),
        kernel_stack: StackId(key.kernel_stack),
        labels: super::LabelsId(key.labels),
        count,
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn ticks_due_are_whole_periods_on_every_cpu() {
        let now = Instant::now();
        // 999 Hz: the kernel's period is 1,001,001 ns, so a second holds 999 whole ticks.
        let clock = Clock { attached: now - Duration::from_secs(1), cpus: 2, period_ns: 1_000_000_000 / 999 };
        assert_eq!(clock.ticks_due(now), 2 * 999);
        assert_eq!(clock.ticks_due(now - Duration::from_secs(5)), 0, "a read before the attach is due nothing");
    }
}
