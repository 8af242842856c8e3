//! On-CPU sampling: a perf_event program on the CPU clock of every online CPU. Each sample is
//! counted under (process, thread, user stack, kernel stack, and for a Go process the
//! goroutine's pprof labels) in the active map set.
#![allow(non_upper_case_globals)]

use aya_ebpf::{
    macros::{map, perf_event},
    maps::{HashMap, PerCpuArray},
    programs::PerfEventContext,
    EbpfContext,
};
use profiler_common::{
    maps::CPU_COUNTS_MAX_ENTRIES,
    runtimes::go::{LABELS_MAP_FULL, LABELS_UNREADABLE, NO_LABELS},
    CpuCounter, CpuSampleKey, NO_STACK,
};

use crate::{
    maps::{
        active_set, add_or_insert_in_set, bump, cgroup_wanted, current_comm, current_task, wanted, Scratch,
        COUNTS_MAP_FLAGS,
    },
    runtimes::go,
    stack::{capture_kernel, capture_user, StackError},
};

#[map]
pub static CPU_COUNTS_0: HashMap<CpuSampleKey, u64> =
    HashMap::with_max_entries(CPU_COUNTS_MAX_ENTRIES, COUNTS_MAP_FLAGS);
#[map]
pub static CPU_COUNTS_1: HashMap<CpuSampleKey, u64> =
    HashMap::with_max_entries(CPU_COUNTS_MAX_ENTRIES, COUNTS_MAP_FLAGS);

#[map]
pub static CPU_COUNTERS: PerCpuArray<u64> = PerCpuArray::with_max_entries(CpuCounter::COUNT, 0);

#[perf_event]
pub fn cpu_sample(ctx: PerfEventContext) -> u32 {
    match try_cpu_sample(&ctx) {
        Ok(()) | Err(()) => 0,
    }
}

/// `Err` for a sample that is not counted (idle, filtered out, or the counts map full).
#[inline(always)]
fn try_cpu_sample(ctx: &PerfEventContext) -> Result<(), ()> {
    let Some(task) = current_task() else {
        // A task outside the profiler's pid namespace: the program ran for this tick, and
        // left it out (uncounted, it read as a tick the sampler missed).
        count(CpuCounter::NotSampled);
        return Err(());
    };
    let (tgid, tid) = (task.tgid, task.tid);
    // Kernel-wide tid 0 is the idle task: the CPU was not running anything.
    if task.pid_tgid as u32 == 0 || !wanted(tgid) {
        // Off the sampled path: an idle CPU, or a process nobody asked for.
        count(CpuCounter::NotSampled);
        return Err(());
    }
    if !cgroup_wanted() {
        count(CpuCounter::CgroupFiltered);
        return Err(());
    }
    let set = active_set();

    let mut truncated = false;
    let user_stack =
        stack_or_count(capture_user(set, &mut truncated, Scratch::Interrupt, tgid), CpuCounter::UserStackFailed);
    if truncated {
        count(CpuCounter::UserStackTruncated);
    }
    // A sample that interrupted user mode has no kernel stack: skip the helper call.
    let kernel_stack = if interrupted_user_mode(ctx) {
        NO_STACK
    } else {
        stack_or_count(capture_kernel(ctx.as_ptr(), set, Scratch::Interrupt, tgid), CpuCounter::KernelStackFailed)
    };

    // After the stacks, not inside their walk: the walk's calls use most of the BPF stack.
    let labels = go::labels(set, Scratch::Interrupt, tgid);
    match labels {
        NO_LABELS => {}
        LABELS_UNREADABLE => count(CpuCounter::GoLabelsUnreadable),
        LABELS_MAP_FULL => count(CpuCounter::GoLabelsMapFull),
        _ => count(CpuCounter::GoLabels),
    }
    let key = CpuSampleKey { tgid, tid, user_stack, kernel_stack, comm: current_comm(), labels };
    if !add_or_insert_in_set(set, &CPU_COUNTS_0, &CPU_COUNTS_1, &key, &1) {
        count(CpuCounter::CountsMapFull);
        return Err(());
    }
    count(CpuCounter::Samples);
    Ok(())
}

#[inline(always)]
fn count(counter: CpuCounter) {
    bump(&CPU_COUNTERS, counter as u32);
}

/// Whether the sample interrupted user mode (the low two bits of the saved `cs` are the
/// privilege level: 3 for user).
#[inline(always)]
fn interrupted_user_mode(ctx: &PerfEventContext) -> bool {
    // SAFETY: the perf_event context's registers are readable for the whole program.
    unsafe { (*ctx.ctx).regs.cs & 3 == 3 }
}

/// The stack hash, or [`NO_STACK`] with the failure counted.
#[inline(always)]
fn stack_or_count(result: Result<u64, StackError>, walk_failed: CpuCounter) -> u64 {
    match result {
        Ok(hash) => hash,
        Err(StackError::Walk) => {
            count(walk_failed);
            NO_STACK
        }
        Err(StackError::MapFull) => {
            count(CpuCounter::StacksMapFull);
            NO_STACK
        }
    }
}
