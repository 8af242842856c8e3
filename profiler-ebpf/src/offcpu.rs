//! The off-CPU profile: BTF tracepoints on `sched_switch`, which runs on the CPU of a switch
//! in the context of the thread leaving it (`prev`), and `sched_exit_tp`, which ends every
//! `__schedule` in the context of the thread then on the CPU.
//!
//! A switch-out is sampled with probability 1 / `OFFCPU_CONFIG[SAMPLE_EVERY]`, decided
//! first (random, not a countdown: two threads ping-ponging on one CPU would alias with any
//! even period). A sampled one notes the time, the thread and its state in `OFFCPU_PENDING`
//! under the `task_struct` address, and counts the entry in its slot of
//! `OFFCPU_MAYBE_PENDING`. When that task is back on a CPU, `sched_exit_tp` runs in its own
//! context: it takes the time, walks the thread's user and kernel stacks (unchanged: it has
//! not run) and adds the time between the two to that key in the active set. Userspace
//! scales counts and times by the sampling period. An unsampled switch costs a random number
//! and, at its `sched_exit_tp`, one array read: the slot of a task with no entry is nearly
//! always 0, and only a non-zero one pays the hash lookup.
//!
//! Why the walk waits for the switch-in: walked at the switch-out, it ran on the thread's
//! clock while its wake-up (a timer, another thread's write) did not move, so each sampled
//! wait was shorter than the unsampled ones it stands for: at 1 in 50, nanosleeps of 160 µs
//! read 10-22% low. The time off CPU runs from `sched_switch` to the end of the `__schedule`
//! that brings the thread back, which includes that context switch (about a microsecond).
//!
//! On a kernel without `sched_exit_tp` (before 6.16) the stacks are walked at the
//! switch-out, and `sched_switch` charges the time when the task is `next` of a later switch.
#![allow(non_upper_case_globals)]

use aya_ebpf::{
    bindings::BPF_ANY,
    helpers::{bpf_get_current_task, bpf_ktime_get_ns, generated::bpf_get_prandom_u32},
    macros::{btf_tracepoint, map},
    maps::{Array, HashMap, PerCpuArray},
    programs::BtfTracePointContext,
    EbpfContext,
};
use profiler_common::{
    maps::{OFFCPU_COUNTS_MAX_ENTRIES, OFFCPU_MAYBE_PENDING_SLOTS, OFFCPU_PENDING_MAX_ENTRIES},
    offcpu::{maybe_pending_slot, OffCpuConfig},
    OffCpuCounter, OffCpuKey, OffCpuState, OffCpuTotals, SwitchedOut, NO_STACK,
};

use crate::{
    maps::{
        active_set, add_or_insert_in_set, atomic_add, bump, cgroup_wanted, current_comm, current_task, wanted, Scratch,
    },
    stack::{capture_kernel_skipping, capture_user_inline},
};

#[map]
pub static OFFCPU_COUNTS_0: HashMap<OffCpuKey, OffCpuTotals> = HashMap::with_max_entries(OFFCPU_COUNTS_MAX_ENTRIES, 0);
#[map]
pub static OFFCPU_COUNTS_1: HashMap<OffCpuKey, OffCpuTotals> = HashMap::with_max_entries(OFFCPU_COUNTS_MAX_ENTRIES, 0);

#[map]
pub static OFFCPU_PENDING: HashMap<u64, SwitchedOut> = HashMap::with_max_entries(OFFCPU_PENDING_MAX_ENTRIES, 0);

/// How many `OFFCPU_PENDING` entries each slot's keys have (see `maybe_pending_slot`),
/// added to after an insert and taken from after a delete, so a slot at 0 has none: the
/// switch-in of nearly every switch reads one array word where it would look a hash up.
/// A count left high (an entry replaced in place) only costs its slot's switches that lookup.
#[map]
pub static OFFCPU_MAYBE_PENDING: Array<u64> = Array::with_max_entries(OFFCPU_MAYBE_PENDING_SLOTS, 0);

/// Knobs written by userspace after load (a map rather than a load-time global: a global
/// can be folded into a constant by the compiler).
#[map]
pub static OFFCPU_CONFIG: Array<OffCpuConfig> = Array::with_max_entries(1, 0);

#[map]
pub static OFFCPU_COUNTERS: PerCpuArray<u64> = PerCpuArray::with_max_entries(OffCpuCounter::COUNT, 0);

/// `TASK_DEAD` of `task_struct::__state`: the task's last switch-out, it never comes back.
const TASK_DEAD: u64 = 0x80;

/// Kernel frames above `__schedule` on the stack of a program on a scheduler tracepoint: the
/// program and the tracepoint's `bpf_trace_run<N>`.
const OWN_FRAMES: u64 = 2;

/// `sched_switch(bool preempt, struct task_struct *prev, struct task_struct *next,
/// unsigned int prev_state)`: notes a sampled switch-out of `prev`; stacks walked at the
/// switch-out, also charges `next`'s.
#[btf_tracepoint(function = "sched_switch")]
pub fn offcpu_switch(ctx: BtfTracePointContext) -> i32 {
    let preempt = ctx.arg::<u64>(0) & 1 != 0;
    let prev: u64 = ctx.arg(1);
    let prev_state = ctx.arg::<u64>(3) & 0xffff_ffff;
    let config = OFFCPU_CONFIG.get(0).copied().unwrap_or_default();
    let walk_out = config.walk_at_switch_out != 0;
    if walk_out {
        charge_walked(ctx.arg(2));
    }
    let _ = switch_out(&ctx, prev, preempt, prev_state, config.sample_every, walk_out);
    0
}

/// Stacks walked at the switch-out: if `next`'s switch-out was sampled, charges it. (The
/// verifier keeps `next` a pointer it cannot hash, so this path looks up every switch.)
#[inline(always)]
fn charge_walked(next: u64) {
    // SAFETY: the value is copied out before the entry is deleted.
    let Some(out) = (unsafe { OFFCPU_PENDING.get(&next) }).copied() else { return };
    // SAFETY: a helper without arguments.
    let in_ns = unsafe { bpf_ktime_get_ns() };
    let _ = OFFCPU_PENDING.remove(&next);
    add(active_set(), &out.key, in_ns.saturating_sub(out.out_ns));
}

/// `sched_exit_tp(bool is_switch)`, the end of `__schedule` in the context of the task now on
/// the CPU: charges its time off the CPU, if its switch-out was sampled.
#[btf_tracepoint(function = "sched_exit_tp")]
pub fn offcpu_switch_in(ctx: BtfTracePointContext) -> i32 {
    // Not switched: this task never left the CPU.
    if ctx.arg::<u64>(0) & 1 == 0 {
        return 0;
    }
    // SAFETY: a helper without arguments; the address as a number, which can be hashed.
    let task = unsafe { bpf_get_current_task() };
    let Some(maybe) = OFFCPU_MAYBE_PENDING.get_ptr_mut(maybe_pending_slot(task)) else { return 0 };
    // SAFETY: a live array value, changed only by atomic adds. This task's own entry, if any,
    // was counted before it could be switched in anywhere: its switch-out's program ran
    // before the switch, and a wake-up waits for that to finish (`p->on_cpu`).
    if unsafe { core::ptr::read_volatile(maybe) } == 0 {
        return 0;
    }
    // SAFETY: the value is copied out before the entry is deleted.
    let Some(out) = (unsafe { OFFCPU_PENDING.get(&task) }).copied() else { return 0 };
    // SAFETY: a helper without arguments.
    let in_ns = unsafe { bpf_ktime_get_ns() };
    if OFFCPU_PENDING.remove(&task).is_ok() {
        atomic_add(maybe, u64::MAX);
    }
    let set = active_set();
    if let Some(key) = walked(&ctx, set, out.key) {
        add(set, &key, in_ns.saturating_sub(out.out_ns));
    }
    0
}

/// An empty program on `sched_switch`, for the floor of `cargo xtask bench offcpu`: the
/// profiler attaches it and [`offcpu_empty_switch_in`] in place of the real two when
/// `PROFILER_BENCH_OFFCPU_EMPTY` is set (what attaching to these tracepoints costs before any
/// work; bpftrace 0.17 cannot attach to `sched_exit_tp`).
#[btf_tracepoint(function = "sched_switch")]
pub fn offcpu_empty_switch(_ctx: BtfTracePointContext) -> i32 {
    0
}

/// The floor's empty program on `sched_exit_tp` (see [`offcpu_empty_switch`]).
#[btf_tracepoint(function = "sched_exit_tp")]
pub fn offcpu_empty_switch_in(_ctx: BtfTracePointContext) -> i32 {
    0
}

/// `key` with the current thread's stacks (stored in `set`) and name; `None` for a kernel
/// thread, whose sleeps are the kernel's business.
#[inline(always)]
fn walked(ctx: &BtfTracePointContext, set: u32, key: OffCpuKey) -> Option<OffCpuKey> {
    let mut truncated = false;
    let user_stack = match capture_user_inline(set, &mut truncated, Scratch::Switch, key.tgid) {
        Ok(NO_STACK) => return None,
        Ok(hash) => hash,
        Err(_) => {
            count(OffCpuCounter::StackLost);
            NO_STACK
        }
    };
    let kernel_stack = capture_kernel_skipping(ctx.as_ptr(), set, Scratch::Switch, OWN_FRAMES, key.tgid)
        .unwrap_or_else(|_| {
            count(OffCpuCounter::StackLost);
            NO_STACK
        });
    Some(OffCpuKey { user_stack, kernel_stack, comm: current_comm(), ..key })
}

/// Adds one switch of `off_ns` to `key` in set `set`.
#[inline(always)]
fn add(set: u32, key: &OffCpuKey, off_ns: u64) {
    if add_or_insert_in_set(
        set,
        &OFFCPU_COUNTS_0,
        &OFFCPU_COUNTS_1,
        key,
        &OffCpuTotals { switches: 1, off_cpu_ns: off_ns },
    ) {
        count(OffCpuCounter::Charged);
    } else {
        count(OffCpuCounter::CountsMapFull);
    }
}

/// Remembers a switch-out of the current thread (`prev`), sampled 1 in `every`, its stacks
/// walked if `walk`. `Err` when not sampled.
#[inline(always)]
fn switch_out(
    ctx: &BtfTracePointContext,
    prev: u64,
    preempt: bool,
    prev_state: u64,
    every: u32,
    walk: bool,
) -> Result<(), ()> {
    // 1 in `every`: a 32-bit draw r is below 2^32 / every with that probability (to within
    // 2^-32), tested with a multiply rather than a division.
    // SAFETY: a helper without arguments.
    if every > 1 && (u64::from(unsafe { bpf_get_prandom_u32() }) * u64::from(every)) >> 32 != 0 {
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
    // Before any walk: the wait it stands for begins now.
    // SAFETY: a helper without arguments.
    let out_ns = unsafe { bpf_ktime_get_ns() };
    let state = if preempt || prev_state == 0 { OffCpuState::Runnable } else { OffCpuState::Blocked };
    let mut key = OffCpuKey {
        tgid: task.tgid,
        tid: task.tid,
        user_stack: NO_STACK,
        kernel_stack: NO_STACK,
        state: state as u32,
        _pad: 0,
        comm: [0; 16],
    };
    if walk {
        key = walked(ctx, active_set(), key).ok_or(())?;
    }
    if OFFCPU_PENDING.insert(&prev, &SwitchedOut { out_ns, key }, BPF_ANY as u64).is_err() {
        count(OffCpuCounter::PendingMapFull);
        return Err(());
    }
    // Counted for `sched_exit_tp`, which walks when the stacks were not. `prev` is the
    // current task here, whose address the helper gives as a number.
    // SAFETY: a helper without arguments.
    if !walk {
        if let Some(maybe) = OFFCPU_MAYBE_PENDING.get_ptr_mut(maybe_pending_slot(unsafe { bpf_get_current_task() })) {
            atomic_add(maybe, 1);
        }
    }
    Ok(())
}

#[inline(always)]
fn count(counter: OffCpuCounter) {
    bump(&OFFCPU_COUNTERS, counter as u32);
}
