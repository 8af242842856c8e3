//! The off-CPU programs' side of the session: set their sampling period, attach them to the
//! BTF tracepoints `sched_switch` (switch-out) and `sched_exit_tp` (back on a CPU), read their
//! counters and drain their counts.

use aya::{
    maps::{Array, MapData},
    programs::BtfTracePoint,
    Btf, Ebpf,
};
use profiler_common::{
    maps, offcpu::OFFCPU_CONFIG_SAMPLE_EVERY, programs, OffCpuCounter, OffCpuKey, OffCpuState, OffCpuTotals,
};

use super::{drain::drain_counts, map_error, map_mut, missing, program_error, sum_counters, Error, Result};
use crate::ids::{Pid, StackId, Tid};

/// The maps only the off-CPU program uses (created with one entry when it is off).
pub(super) const MAPS: [&str; 3] = [maps::OFFCPU_COUNTS_0, maps::OFFCPU_COUNTS_1, maps::OFFCPU_PENDING];

const COUNTS: [&str; 2] = [maps::OFFCPU_COUNTS_0, maps::OFFCPU_COUNTS_1];

/// Totals of the off-CPU counters since load.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OffCpuCounters {
    /// Sampled switches charged (unscaled).
    pub charged: u64,
    pub pending_map_full: u64,
    pub counts_map_full: u64,
    pub stack_lost: u64,
    /// Sampled switch-outs of cgroups not selected: not walked.
    pub cgroup_filtered: u64,
}

/// Sampled switches of one (thread, state, stacks) and the time they kept it off a CPU, as
/// the kernel counted them (not yet scaled by the sampling period).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RawOffCpu {
    pub pid: Pid,
    pub tid: Tid,
    /// The thread's name at the switch-out.
    pub comm: String,
    pub state: OffCpuState,
    pub user_stack: StackId,
    pub kernel_stack: StackId,
    pub switches: u64,
    pub off_cpu_ns: u64,
}

/// Sets the sampling period and attaches the programs to `sched_switch` and `sched_exit_tp`.
pub(super) fn attach(ebpf: &mut Ebpf, sample_every: u32) -> Result<()> {
    let mut config: Array<&mut MapData, u32> = map_mut(ebpf, maps::OFFCPU_CONFIG)?;
    config.set(OFFCPU_CONFIG_SAMPLE_EVERY, sample_every, 0).map_err(map_error("write", maps::OFFCPU_CONFIG))?;
    let btf = Btf::from_sys_fs().map_err(|err| Error::KernelFeature {
        feature: "kernel BTF (/sys/kernel/btf/vmlinux)",
        detail: err.to_string(),
    })?;
    // Back-on-CPU first: a switch-out noted before it is attached would wait for the next one.
    for (name, tracepoint, load, attach) in [
        (
            programs::OFFCPU_SWITCH_IN,
            "sched_exit_tp",
            "load (BTF tracepoint sched_exit_tp: Linux 6.16 and later)",
            "attach (BTF tracepoint sched_exit_tp: Linux 6.16 and later)",
        ),
        (programs::OFFCPU_SWITCH, "sched_switch", "load", "attach (BTF tracepoint sched_switch)"),
    ] {
        let program: &mut BtfTracePoint =
            ebpf.program_mut(name).ok_or_else(|| missing(name))?.try_into().map_err(program_error("find", name))?;
        program.load(tracepoint, &btf).map_err(program_error(load, name))?;
        program.attach().map_err(program_error(attach, name))?;
    }
    Ok(())
}

pub(super) fn counters(ebpf: &Ebpf) -> Result<OffCpuCounters> {
    let c: [u64; OffCpuCounter::COUNT as usize] = sum_counters(ebpf, maps::OFFCPU_COUNTERS)?;
    let get = |counter: OffCpuCounter| c[counter as usize];
    Ok(OffCpuCounters {
        charged: get(OffCpuCounter::Charged),
        pending_map_full: get(OffCpuCounter::PendingMapFull),
        counts_map_full: get(OffCpuCounter::CountsMapFull),
        stack_lost: get(OffCpuCounter::StackLost),
        cgroup_filtered: get(OffCpuCounter::CgroupFiltered),
    })
}

/// Reads and empties set `set`'s off-CPU counts.
pub(super) fn drain(ebpf: &mut Ebpf, set: usize) -> Result<Vec<RawOffCpu>> {
    let entries = drain_counts(ebpf, COUNTS[set])?;
    Ok(entries.into_iter().map(|(key, totals): (OffCpuKey, OffCpuTotals)| raw(&key, totals)).collect())
}

fn raw(key: &OffCpuKey, totals: OffCpuTotals) -> RawOffCpu {
    let comm_len = key.comm.iter().position(|&b| b == 0).unwrap_or(key.comm.len());
    RawOffCpu {
        pid: Pid(key.tgid),
        tid: Tid(key.tid),
        comm: String::from_utf8_lossy(&key.comm[..comm_len]).into_owned(),
        state: OffCpuState::from_raw(key.state),
        user_stack: StackId(key.user_stack),
        kernel_stack: StackId(key.kernel_stack),
        switches: totals.switches,
        off_cpu_ns: totals.off_cpu_ns,
    }
}
