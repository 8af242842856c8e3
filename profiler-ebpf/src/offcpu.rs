//! The off-CPU profile: a BTF tracepoint on `sched_switch`, which runs on the CPU of the
//! switch in the context of the thread leaving it (`prev`), with interrupts off.
//!
//! A switch-out is sampled with probability 1 / `OFFCPU_CONFIG[SAMPLE_EVERY]`, decided
//! first (random, not a countdown: two threads ping-ponging on one CPU would alias with any
//! even period); an unsampled switch costs a random number and, at the next switch-in, one
//! failed lookup. A sampled one walks `prev`'s user and kernel stacks, then notes the time
//! and the key in `OFFCPU_PENDING` under the `task_struct` address. When that task is switched
//! back in (`next` of a later switch, on any CPU), the time since is added to its key in the
//! active set. Userspace scales counts and times by the sampling period.
#![allow(non_upper_case_globals)]

use aya_ebpf::{
    bindings::BPF_ANY,
    helpers::{bpf_get_current_comm, bpf_ktime_get_ns, generated::bpf_get_prandom_u32},
    macros::{btf_tracepoint, map},
    maps::{Array, HashMap, PerCpuArray},
    programs::BtfTracePointContext,
    EbpfContext,
};
use profiler_common::{
    maps::{OFFCPU_COUNTS_MAX_ENTRIES, OFFCPU_PENDING_MAX_ENTRIES},
    offcpu::OFFCPU_CONFIG_SAMPLE_EVERY,
    OffCpuCounter, OffCpuKey, OffCpuState, OffCpuTotals, SwitchedOut, NO_STACK,
};

use crate::{
    maps::{active_set, add_or_insert, bump, cgroup_wanted, current_task, pick_set, stacks_of, wanted, Scratch},
    stack::{capture_kernel_skipping, capture_user},
};

#[map]
pub static OFFCPU_COUNTS_0: HashMap<OffCpuKey, OffCpuTotals> = HashMap::with_max_entries(OFFCPU_COUNTS_MAX_ENTRIES, 0);
#[map]
pub static OFFCPU_COUNTS_1: HashMap<OffCpuKey, OffCpuTotals> = HashMap::with_max_entries(OFFCPU_COUNTS_MAX_ENTRIES, 0);

#[map]
pub static OFFCPU_PENDING: HashMap<u64, SwitchedOut> = HashMap::with_max_entries(OFFCPU_PENDING_MAX_ENTRIES, 0);

/// Knobs written by userspace after load (a map rather than a load-time global: a global
/// can be folded into a constant by the compiler).
#[map]
pub static OFFCPU_CONFIG: Array<u32> = Array::with_max_entries(1, 0);

#[map]
pub static OFFCPU_COUNTERS: PerCpuArray<u64> = PerCpuArray::with_max_entries(OffCpuCounter::COUNT, 0);

/// `TASK_DEAD` of `task_struct::__state`: the task's last switch-out, it never comes back.
const TASK_DEAD: u64 = 0x80;

/// Kernel frames above `__schedule` on a switch-out's stack: this program and the
/// tracepoint's `bpf_trace_run4`.
const OWN_FRAMES: u64 = 2;

/// `sched_switch(bool preempt, struct task_struct *prev, struct task_struct *next,
/// unsigned int prev_state)`.
#[btf_tracepoint(function = "sched_switch")]
pub fn offcpu_switch(ctx: BtfTracePointContext) -> i32 {
    let preempt = ctx.arg::<u64>(0) & 1 != 0;
    let prev: u64 = ctx.arg(1);
    let next: u64 = ctx.arg(2);
    let prev_state = ctx.arg::<u64>(3) & 0xffff_ffff;
    switch_in(next);
    let _ = switch_out(&ctx, prev, preempt, prev_state);
    0
}

/// Charges `next`'s time off the CPU, if its switch-out was sampled.
#[inline(always)]
fn switch_in(next: u64) {
    // SAFETY: the value is copied out before the entry is deleted.
    let Some(out) = (unsafe { OFFCPU_PENDING.get(&next) }).copied() else { return };
    let _ = OFFCPU_PENDING.remove(&next);
    // SAFETY: a helper without arguments.
    let now = unsafe { bpf_ktime_get_ns() };
    let off_ns = now.saturating_sub(out.out_ns);
    let counts = pick_set(active_set(), &OFFCPU_COUNTS_0, &OFFCPU_COUNTS_1);
    if add_or_insert(counts, &out.key, &OffCpuTotals { switches: 1, off_cpu_ns: off_ns }) {
        count(OffCpuCounter::Charged);
    } else {
        count(OffCpuCounter::CountsMapFull);
    }
}

/// Remembers a sampled switch-out of the current thread (`prev`). `Err` when not sampled.
#[inline(always)]
fn switch_out(ctx: &BtfTracePointContext, prev: u64, preempt: bool, prev_state: u64) -> Result<(), ()> {
    let every = OFFCPU_CONFIG.get(OFFCPU_CONFIG_SAMPLE_EVERY).copied().unwrap_or(1);
    // SAFETY: a helper without arguments.
    if every > 1 && unsafe { bpf_get_prandom_u32() } % every != 0 {
        return Err(());
    }
    if prev_state & TASK_DEAD != 0 {
        return Err(());
    }
    let task = current_task().ok_or(())?;
    // Kernel-wide tid 0 is the idle task.
    if task.pid_tgid as u32 == 0 || !wanted(task.tgid) {
        return Err(());
    }
    if !cgroup_wanted() {
        count(OffCpuCounter::CgroupFiltered);
        return Err(());
    }
    let set = active_set();
    let stacks = stacks_of(set);
    let mut truncated = false;
    let user_stack = match capture_user(stacks, &mut truncated, Scratch::Switch, task.tgid) {
        // No user context: a kernel thread, whose sleeps are the kernel's business.
        Ok(NO_STACK) => return Err(()),
        Ok(hash) => hash,
        Err(_) => {
            count(OffCpuCounter::StackLost);
            NO_STACK
        }
    };
    let kernel_stack = capture_kernel_skipping(ctx.as_ptr(), stacks, Scratch::Switch, OWN_FRAMES, task.tgid)
        .unwrap_or_else(|_| {
            count(OffCpuCounter::StackLost);
            NO_STACK
        });
    let state = if preempt || prev_state == 0 { OffCpuState::Runnable } else { OffCpuState::Blocked };
    let key = OffCpuKey {
        tgid: task.tgid,
        tid: task.tid,
        user_stack,
        kernel_stack,
        state: state as u32,
        _pad: 0,
        comm: bpf_get_current_comm().unwrap_or([0; 16]),
    };
    // After the walks: their time is on the CPU, not off it.
    // SAFETY: a helper without arguments.
    let out = SwitchedOut { out_ns: unsafe { bpf_ktime_get_ns() }, key };
    if OFFCPU_PENDING.insert(&prev, &out, BPF_ANY as u64).is_err() {
        count(OffCpuCounter::PendingMapFull);
        return Err(());
    }
    Ok(())
}

#[inline(always)]
fn count(counter: OffCpuCounter) {
    bump(&OFFCPU_COUNTERS, counter as u32);
}
