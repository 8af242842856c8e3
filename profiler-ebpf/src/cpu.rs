//! On-CPU sampling: a perf_event program on the CPU clock of every online CPU. Each sample is
//! counted under (process, thread, user stack, kernel stack) in the active map set.

use aya_ebpf::{
    helpers::{bpf_get_current_comm, bpf_get_current_pid_tgid},
    macros::perf_event,
    programs::PerfEventContext,
    EbpfContext,
};
use profiler_common::{CpuCounter, CpuSampleKey, NO_STACK};

use crate::{
    maps::{active_set, add_or_insert, bump, wanted, Scratch, CPU_COUNTS_0, CPU_COUNTS_1, STACKS_0, STACKS_1},
    stack::{capture_kernel, capture_user, StackError},
};

#[perf_event]
pub fn cpu_sample(ctx: PerfEventContext) -> u32 {
    try_cpu_sample(&ctx);
    0
}

#[inline(always)]
fn try_cpu_sample(ctx: &PerfEventContext) {
    let pid_tgid = bpf_get_current_pid_tgid();
    let tgid = (pid_tgid >> 32) as u32;
    let tid = pid_tgid as u32;
    // tid 0 is the idle task: the CPU was not running anything.
    if tid == 0 || !wanted(tgid) {
        return;
    }
    let set = active_set();
    let (counts, stacks) = if set == 0 { (&CPU_COUNTS_0, &STACKS_0) } else { (&CPU_COUNTS_1, &STACKS_1) };

    let mut truncated = false;
    let user_stack =
        stack_or_count(capture_user(stacks, &mut truncated, Scratch::Interrupt), CpuCounter::UserStackFailed);
    if truncated {
        bump(CpuCounter::UserStackTruncated);
    }
    // A sample that interrupted user mode has no kernel stack: skip the helper call.
    let kernel_stack = if interrupted_user_mode(ctx) {
        NO_STACK
    } else {
        stack_or_count(capture_kernel(ctx.as_ptr(), stacks, Scratch::Interrupt), CpuCounter::KernelStackFailed)
    };

    let key = CpuSampleKey { tgid, tid, user_stack, kernel_stack, comm: bpf_get_current_comm().unwrap_or([0; 16]) };
    if !add_or_insert(counts, &key, &1, |n| *n += 1) {
        bump(CpuCounter::CountsMapFull);
        return;
    }
    bump(CpuCounter::Samples);
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
            bump(walk_failed);
            NO_STACK
        }
        Err(StackError::MapFull) => {
            bump(CpuCounter::StacksMapFull);
            NO_STACK
        }
    }
}
