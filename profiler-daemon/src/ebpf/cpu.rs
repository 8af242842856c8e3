//! The CPU sampler's side of the session: attach the perf_event program to every online
//! CPU's clock, read its counters, and drain its counts.

use aya::{
    programs::{
        perf_event::{PerfEventConfig, PerfEventScope, SamplePolicy, SoftwareEvent},
        PerfEvent,
    },
    util::online_cpus,
    Ebpf,
};
use profiler_common::{maps, programs, CpuCounter, CpuSampleKey};

use super::{drain::drain_per_cpu, missing, program_error, sum_counters, Error, Result};
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
    pub count: u64,
}

pub(super) const COUNTS: [&str; 2] = [maps::CPU_COUNTS_0, maps::CPU_COUNTS_1];

pub(super) fn attach(ebpf: &mut Ebpf, frequency_hz: u32) -> Result<()> {
    let name = programs::CPU_SAMPLE;
    let program: &mut PerfEvent =
        ebpf.program_mut(name).ok_or_else(|| missing(name))?.try_into().map_err(program_error("find", name))?;
    program.load().map_err(program_error("load", name))?;
    let cpus = online_cpus()
        .map_err(|(path, source)| Error::Io { action: format!("read the online CPUs from {path}"), source })?;
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
    Ok(())
}

pub(super) fn counters(ebpf: &Ebpf) -> Result<CpuCounters> {
    let c: [u64; CpuCounter::COUNT as usize] = sum_counters(ebpf, maps::CPU_COUNTERS)?;
    let get = |counter: CpuCounter| c[counter as usize];
    Ok(CpuCounters {
        samples: get(CpuCounter::Samples),
        user_stack_failed: get(CpuCounter::UserStackFailed),
        kernel_stack_failed: get(CpuCounter::KernelStackFailed),
        stacks_map_full: get(CpuCounter::StacksMapFull),
        counts_map_full: get(CpuCounter::CountsMapFull),
        user_stack_truncated: get(CpuCounter::UserStackTruncated),
    })
}

/// Reads and empties set `set`'s sample counts.
pub(super) fn drain(ebpf: &mut Ebpf, set: usize) -> Result<Vec<RawCpuSample>> {
    let entries = drain_per_cpu(ebpf, COUNTS[set], |values: &[u64]| values.iter().sum())?;
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
        count,
    }
}
