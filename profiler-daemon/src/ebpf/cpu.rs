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

use super::{drain::drain_counts, missing, program_error, sum_counters, Error, Result};
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
    /// Samples the kernel did not run the program for because another BPF program was
    /// running on that CPU (the program's `recursion_misses`); 0 before it is attached.
    pub recursion_misses: u64,
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

/// Offset of `recursion_misses` in the kernel's `struct bpf_prog_info` (uapi, stable: after
/// `run_time_ns` at 192 and `run_cnt` at 200).
const RECURSION_MISSES_OFFSET: usize = 208;
/// `BPF_OBJ_GET_INFO_BY_FD`.
const BPF_OBJ_GET_INFO_BY_FD: libc::c_long = 15;

/// The CPU program's `recursion_misses`: aya 0.14's `ProgramInfo` does not expose it, so
/// `bpf_prog_info` is read here (the kernel fills as much as it has of the buffer given).
fn recursion_misses(ebpf: &Ebpf) -> u64 {
    use std::os::fd::{AsFd, AsRawFd};
    let Some(program) = ebpf.program(programs::CPU_SAMPLE) else { return 0 };
    let Ok(fd) = program.fd() else { return 0 };
    let mut info = [0u8; 256];
    #[repr(C)]
    struct InfoAttr {
        bpf_fd: u32,
        info_len: u32,
        info: u64,
    }
    let mut attr =
        InfoAttr { bpf_fd: fd.as_fd().as_raw_fd() as u32, info_len: info.len() as u32, info: info.as_mut_ptr() as u64 };
    // SAFETY: `attr` names a writable buffer of `info_len` bytes that outlives the call; the
    // kernel writes at most that many.
    let ret = unsafe { super::bpf_call(BPF_OBJ_GET_INFO_BY_FD, &mut attr) };
    if ret.is_err() || (attr.info_len as usize) < RECURSION_MISSES_OFFSET + 8 {
        return 0;
    }
    let bytes: [u8; 8] = info[RECURSION_MISSES_OFFSET..RECURSION_MISSES_OFFSET + 8].try_into().unwrap_or_default();
    u64::from_ne_bytes(bytes)
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
        cgroup_filtered: get(CpuCounter::CgroupFiltered),
        recursion_misses: recursion_misses(ebpf),
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
        count,
    }
}
