//! The CPU sampler's side of the session: attach the perf_event program to every online
//! CPU's clock, and read its counters.

use aya::{
    maps::{MapData, PerCpuArray},
    programs::{
        perf_event::{PerfEventConfig, PerfEventScope, SamplePolicy, SoftwareEvent},
        PerfEvent,
    },
    util::online_cpus,
    Ebpf,
};
use profiler_common::{maps, CpuCounter};

use super::{map_ref, missing, program_error, sum_counter};
use crate::error::{Error, Result};

/// Name of the perf_event program.
pub const PROGRAM: &str = "cpu_sample";

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

pub(super) fn attach(ebpf: &mut Ebpf, frequency_hz: u32) -> Result<()> {
    let program: &mut PerfEvent = ebpf
        .program_mut(PROGRAM)
        .ok_or_else(|| missing(PROGRAM))?
        .try_into()
        .map_err(program_error("find", PROGRAM))?;
    program.load().map_err(program_error("load", PROGRAM))?;
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
            .map_err(program_error("attach (perf event on a cpu)", PROGRAM))?;
    }
    Ok(())
}

pub(super) fn counters(ebpf: &Ebpf) -> Result<CpuCounters> {
    let array: PerCpuArray<&MapData, u64> = map_ref(ebpf, maps::CPU_COUNTERS)?;
    let get = |c: CpuCounter| sum_counter(&array, c as u32, maps::CPU_COUNTERS);
    Ok(CpuCounters {
        samples: get(CpuCounter::Samples)?,
        user_stack_failed: get(CpuCounter::UserStackFailed)?,
        kernel_stack_failed: get(CpuCounter::KernelStackFailed)?,
        stacks_map_full: get(CpuCounter::StacksMapFull)?,
        counts_map_full: get(CpuCounter::CountsMapFull)?,
        user_stack_truncated: get(CpuCounter::UserStackTruncated)?,
    })
}
