//! The off-CPU programs' side of the session: set their sampling, attach them to the
//! BTF tracepoints `sched_switch` (switch-out) and `sched_exit_tp` (back on a CPU), read their
//! counters and drain their counts.

use aya::{
    maps::{Array, HashMap, MapData},
    programs::BtfTracePoint,
    Btf, Ebpf,
};
use aya_obj::btf::BtfKind;
use profiler_common::{
    maps, offcpu::OffCpuConfig, programs, OffCpuCounter, OffCpuKey, OffCpuState, OffCpuTotals, SwitchedOut,
};

use super::{drain_counts, map_error, map_mut, map_ref, missing, program_error, sum_counters, Error, Result};
use crate::ids::{Pid, StackId, Tid};

/// The maps only the off-CPU program uses (created with one entry when it is off).
pub(super) const MAPS: [&str; 5] =
    [maps::OFFCPU_COUNTS_0, maps::OFFCPU_COUNTS_1, maps::OFFCPU_OUT, maps::OFFCPU_PENDING, maps::OFFCPU_MAYBE_PENDING];

const COUNTS: [&str; 2] = [maps::OFFCPU_COUNTS_0, maps::OFFCPU_COUNTS_1];

/// Totals of the off-CPU counters since load.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OffCpuCounters {
    /// Sampled switches charged (unscaled).
    pub charged: u64,
    /// Intervals shorter than the rate left out by its sampling (all threads, not walked).
    pub unsampled: u64,
    pub pending_map_full: u64,
    pub counts_map_full: u64,
    pub stack_lost: u64,
    /// Sampled switch-outs of cgroups not selected: not walked.
    pub cgroup_filtered: u64,
    /// Stacks are walked as the thread leaves the CPU (a kernel without `sched_exit_tp`).
    pub walked_at_switch_out: bool,
}

/// Switches of one (thread, state, stacks) and the time they kept it off a CPU, as the
/// kernel counted them: already unbiased, switches in 1/`profiler_common::sampling::WEIGHT_ONE`.
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

/// Makes a test take the path of kernels without `sched_exit_tp` on one that has it.
const FORCE_WALK_AT_SWITCH_OUT: &str = "PROFILER_TEST_OFFCPU_WALK_AT_SWITCH_OUT";

/// Makes `cargo xtask bench offcpu`'s floor: empty programs on the same two tracepoints, and
/// no off-CPU profile.
const BENCH_EMPTY: &str = "PROFILER_BENCH_OFFCPU_EMPTY";

/// Sets the sampling (by length at `rate_ns`, or 1 in `sample_every` where stacks are walked
/// at the switch-out) and attaches the programs to `sched_switch` and, where the kernel
/// has it (Linux 6.16+), `sched_exit_tp`. Without it a sampled switch's stacks are walked as
/// the thread leaves the CPU, which perturbs the waits sampled; a warning says so. Returns
/// whether stacks are walked at the switch-out.
pub(super) fn attach(ebpf: &mut Ebpf, sample_every: u32, rate_ns: u64) -> Result<bool> {
    let btf = Btf::from_sys_fs().map_err(|err| Error::KernelFeature {
        feature: "kernel BTF (/sys/kernel/btf/vmlinux)",
        detail: err.to_string(),
    })?;
    let has_exit_tp = btf.id_by_type_name_kind("btf_trace_sched_exit_tp", BtfKind::Typedef).is_ok();
    if std::env::var_os(BENCH_EMPTY).is_some() {
        // The floor is the two tracepoints the real programs use; attaching the real ones
        // instead would make a bench call the profiler its own floor.
        if !has_exit_tp {
            return Err(Error::KernelFeature {
                feature: "the sched_exit_tp tracepoint (Linux 6.16 and later)",
                detail: format!(
                    "{BENCH_EMPTY} asks for empty programs on sched_switch and sched_exit_tp; unset it \
                     (`cargo xtask bench offcpu` cannot measure its floor on this kernel)"
                ),
            });
        }
        tracing::warn!("{BENCH_EMPTY} is set: empty programs on sched_switch and sched_exit_tp, no off-CPU profile");
        attach_one(ebpf, &btf, programs::OFFCPU_EMPTY_SWITCH_IN, "sched_exit_tp")?;
        attach_one(ebpf, &btf, programs::OFFCPU_EMPTY_SWITCH, "sched_switch")?;
        return Ok(false);
    }
    let walk_at_switch_out = !has_exit_tp || std::env::var_os(FORCE_WALK_AT_SWITCH_OUT).is_some();
    let mut config: Array<&mut MapData, OffCpuConfig> = map_mut(ebpf, maps::OFFCPU_CONFIG)?;
    let knobs = OffCpuConfig { sample_every, walk_at_switch_out: u32::from(walk_at_switch_out), rate_ns };
    config.set(0, knobs, 0).map_err(map_error("write", maps::OFFCPU_CONFIG))?;
    if walk_at_switch_out {
        tracing::warn!(
            "this kernel has no sched_exit_tp tracepoint (Linux 6.16 and later): the off-CPU profile walks a \
             sampled switch's stacks as the thread leaves the CPU, which perturbs the sampled waits (short \
             ones read a few percent high), and samples 1 in --offcpu-every switches (the rate needs the \
             length before the walk); --offcpu-every 1 records every switch"
        );
    } else {
        // Back-on-CPU first: a switch-out noted before it is attached would wait for the next.
        attach_one(ebpf, &btf, programs::OFFCPU_SWITCH_IN, "sched_exit_tp")?;
    }
    attach_one(ebpf, &btf, programs::OFFCPU_SWITCH, "sched_switch")?;
    Ok(walk_at_switch_out)
}

fn attach_one(ebpf: &mut Ebpf, btf: &Btf, name: &'static str, tracepoint: &str) -> Result<()> {
    let program: &mut BtfTracePoint =
        ebpf.program_mut(name).ok_or_else(|| missing(name))?.try_into().map_err(program_error("find", name))?;
    program.load(tracepoint, btf).map_err(program_error(format!("load (for BTF tracepoint {tracepoint})"), name))?;
    program.attach().map_err(program_error(format!("attach (to BTF tracepoint {tracepoint})"), name))?;
    Ok(())
}

/// The off-CPU counters; `walked_at_switch_out` as [`attach`] returned it.
pub(super) fn counters(ebpf: &Ebpf, walked_at_switch_out: bool) -> Result<OffCpuCounters> {
    let c: [u64; OffCpuCounter::COUNT as usize] = sum_counters(ebpf, maps::OFFCPU_COUNTERS)?;
    let get = |counter: OffCpuCounter| c[counter as usize];
    Ok(OffCpuCounters {
        charged: get(OffCpuCounter::Charged),
        unsampled: get(OffCpuCounter::Unsampled),
        pending_map_full: get(OffCpuCounter::PendingMapFull),
        counts_map_full: get(OffCpuCounter::CountsMapFull),
        stack_lost: get(OffCpuCounter::StackLost),
        cgroup_filtered: get(OffCpuCounter::CgroupFiltered),
        walked_at_switch_out,
    })
}

/// With stacks walked at the switch-out: the stacks of the sampled switch-outs whose time is
/// not charged yet (the thread is still off its CPU), which a later set's counts will name.
/// Otherwise (`walked_at_switch_out` false) none: pending entries hold no stacks.
pub(super) fn pending_stacks(
    ebpf: &Ebpf,
    walked_at_switch_out: bool,
    into: &mut std::collections::HashSet<StackId>,
) -> Result<()> {
    if !walked_at_switch_out {
        return Ok(());
    }
    let pending: HashMap<&MapData, u64, SwitchedOut> = map_ref(ebpf, maps::OFFCPU_PENDING)?;
    for (_, out) in pending.iter().filter_map(|entry| entry.ok()) {
        into.extend([StackId(out.key.user_stack), StackId(out.key.kernel_stack)]);
    }
    Ok(())
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
