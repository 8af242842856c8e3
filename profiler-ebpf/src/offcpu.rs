//! The off-CPU profile: BTF tracepoints on `sched_switch`, which runs on the CPU of a switch
//! in the context of the thread leaving it (`prev`), and `sched_exit_tp`, which ends every
//! `__schedule` in the context of the thread then on the CPU.
//!
//! Intervals off the CPU are sampled by length, as the block profile samples waits
//! (`profiler_common::sampling::by_length` at `OffCpuConfig::rate_ns`): one at least the rate
//! long is always recorded, a shorter one of length d with probability d/rate and then as
//! rate/d switches of `rate` ns in all (Go's unbiasing), so a thread that blocks rarely but
//! long is never missed. The length is known only when the thread is back, so every
//! switch-out notes its time and state in the thread's slot of `OFFCPU_OUT` (an array by
//! thread id: no hash, no lock); at the switch-in, in the thread's own context,
//! `sched_exit_tp` takes the time, decides, and only then, for a kept interval, checks the
//! process and cgroup filters and walks the thread's user and kernel stacks (unchanged: it has
//! not run). A thread whose slot holds another thread's interval in flight notes its own in
//! `OFFCPU_PENDING` under its `task_struct` address, counted in its slot of
//! `OFFCPU_MAYBE_PENDING` so that the switch-in of nearly every switch reads one array word
//! where it would look a hash up. An interval costs two timestamps, its slot's write and
//! read, and for one shorter than the rate a random number.
//!
//! Why the walk waits for the switch-in: walked at the switch-out, it ran on the thread's
//! clock while its wake-up (a timer, another thread's write) did not move, so each sampled
//! wait was shorter than the unsampled ones it stands for: at 1 in 50, nanosleeps of 160 µs
//! read 10-22% low. The time off CPU runs from `sched_switch` to the end of the `__schedule`
//! that brings the thread back, which includes that context switch (about a microsecond).
//!
//! On a kernel without `sched_exit_tp` (before 6.16) the stacks are walked at the
//! switch-out, before the length is known, so there a switch-out is sampled 1 in
//! `OFFCPU_CONFIG[SAMPLE_EVERY]` (random, not a countdown: two threads ping-ponging on one CPU
//! would alias with any even period), its key noted in `OFFCPU_PENDING`, and `sched_switch`
//! charges it N times over when the task is `next` of a later switch.
#![allow(non_upper_case_globals)]

use core::ptr;

use aya_ebpf::{
    bindings::BPF_ANY,
    helpers::{bpf_get_current_pid_tgid, bpf_get_current_task, bpf_ktime_get_ns, generated::bpf_get_prandom_u32},
    macros::{btf_tracepoint, map},
    maps::{Array, HashMap, PerCpuArray},
    programs::BtfTracePointContext,
    EbpfContext,
};
use profiler_common::{
    maps::{OFFCPU_COUNTS_MAX_ENTRIES, OFFCPU_MAYBE_PENDING_SLOTS, OFFCPU_PENDING_MAX_ENTRIES},
    offcpu::{maybe_pending_slot, out_slot, OffCpuConfig, OutSlot, OUT_SLOTS},
    sampling::{by_length, WEIGHT_ONE},
    OffCpuCounter, OffCpuKey, OffCpuState, OffCpuTotals, SwitchedOut, NO_STACK,
};

use crate::{
    maps::{
        active_set, add_or_insert_in_set, atomic_add, bump, cgroup_wanted, current_comm, current_task, current_task_of,
        wanted, Scratch, COUNTS_MAP_FLAGS,
    },
    stack::{capture_kernel_skipping, capture_user_inline},
};

#[map]
pub static OFFCPU_COUNTS_0: HashMap<OffCpuKey, OffCpuTotals> =
    HashMap::with_max_entries(OFFCPU_COUNTS_MAX_ENTRIES, COUNTS_MAP_FLAGS);
#[map]
pub static OFFCPU_COUNTS_1: HashMap<OffCpuKey, OffCpuTotals> =
    HashMap::with_max_entries(OFFCPU_COUNTS_MAX_ENTRIES, COUNTS_MAP_FLAGS);

#[map]
pub static OFFCPU_OUT: Array<OutSlot> = Array::with_max_entries(OUT_SLOTS, 0);

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
/// unsigned int prev_state)`: notes the switch-out of `prev`; stacks walked at the
/// switch-out, notes a sampled one and charges `next`'s.
#[btf_tracepoint(function = "sched_switch")]
pub fn offcpu_switch(ctx: BtfTracePointContext) -> i32 {
    let preempt = ctx.arg::<u64>(0) & 1 != 0;
    let prev: u64 = ctx.arg(1);
    let prev_state = ctx.arg::<u64>(3) & 0xffff_ffff;
    let config = OFFCPU_CONFIG.get(0).copied().unwrap_or_default();
    if config.walk_at_switch_out == 0 {
        note_out(preempt, prev_state);
        return 0;
    }
    charge_walked(ctx.arg(2), config.sample_every);
    let _ = switch_out(&ctx, prev, preempt, prev_state, config.sample_every);
    0
}

/// Why a thread leaves the CPU, from `sched_switch`'s arguments.
#[inline(always)]
fn state_of(preempt: bool, prev_state: u64) -> OffCpuState {
    if preempt || prev_state == 0 {
        OffCpuState::Runnable
    } else {
        OffCpuState::Blocked
    }
}

/// Notes the time and state of the current thread's switch-out in its `OFFCPU_OUT` slot, or,
/// if that slot holds another thread's interval in flight, in `OFFCPU_PENDING`.
#[inline(always)]
fn note_out(preempt: bool, prev_state: u64) {
    if prev_state & TASK_DEAD != 0 {
        return;
    }
    let pid_tgid = bpf_get_current_pid_tgid();
    // Kernel-wide tid 0 is the idle task.
    if pid_tgid as u32 == 0 {
        return;
    }
    let Some(slot) = OFFCPU_OUT.get_ptr_mut(out_slot(pid_tgid)) else { return };
    // SAFETY: a helper without arguments.
    let out_ns = unsafe { bpf_ktime_get_ns() };
    let state = state_of(preempt, prev_state) as u32;
    // The thread's slot, or a slot with no interval in flight, which it takes; `out_ns` last,
    // which marks it in flight. Two threads of one slot switching out at the same instant
    // may both take it, and one interval is then lost (ids equal modulo `OUT_SLOTS` and the
    // same few nanoseconds on two CPUs).
    // SAFETY: a live array slot; plain field accesses.
    unsafe {
        if (*slot).owner == pid_tgid || ptr::read_volatile(&(*slot).out_ns) == 0 {
            (*slot).owner = pid_tgid;
            (*slot).state = state;
            ptr::write_volatile(&mut (*slot).out_ns, out_ns);
            return;
        }
    }
    let key =
        OffCpuKey { tgid: 0, tid: 0, user_stack: NO_STACK, kernel_stack: NO_STACK, state, _pad: 0, comm: [0; 16] };
    // SAFETY: a helper without arguments; the address as a number, as the switch-in reads it.
    let task = unsafe { bpf_get_current_task() };
    if OFFCPU_PENDING.insert(&task, &SwitchedOut { out_ns, key }, BPF_ANY as u64).is_err() {
        count(OffCpuCounter::PendingMapFull);
        return;
    }
    if let Some(maybe) = OFFCPU_MAYBE_PENDING.get_ptr_mut(maybe_pending_slot(task)) {
        atomic_add(maybe, 1);
    }
}

/// Stacks walked at the switch-out: if `next`'s switch-out was sampled (1 in `every`),
/// charges it as `every` switches. (The verifier keeps `next` a pointer it cannot hash, so
/// this path looks up every switch.)
#[inline(always)]
fn charge_walked(next: u64, every: u32) {
    // SAFETY: the value is copied out before the entry is deleted.
    let Some(out) = (unsafe { OFFCPU_PENDING.get(&next) }).copied() else { return };
    // SAFETY: a helper without arguments.
    let in_ns = unsafe { bpf_ktime_get_ns() };
    let _ = OFFCPU_PENDING.remove(&next);
    // `every` is at most 10^6 < 2^20 (`offcpu.sample_every`), so an interval up to 2^44 ns
    // (4.9 hours) is scaled without overflow; a longer one is charged as that.
    let every = u64::from(every.clamp(1, 1 << 20));
    let off_ns = in_ns.saturating_sub(out.out_ns).min(u64::MAX >> 20);
    add(active_set(), &out.key, every * WEIGHT_ONE, every * off_ns);
}

/// `sched_exit_tp(bool is_switch)`, the end of `__schedule` in the context of the task now on
/// the CPU: ends its interval off the CPU, and charges it if its length keeps it.
#[btf_tracepoint(function = "sched_exit_tp")]
pub fn offcpu_switch_in(ctx: BtfTracePointContext) -> i32 {
    // Not switched: this task never left the CPU.
    if ctx.arg::<u64>(0) & 1 == 0 {
        return 0;
    }
    let pid_tgid = bpf_get_current_pid_tgid();
    if pid_tgid as u32 == 0 {
        return 0;
    }
    let Some((out_ns, state)) = take_out(pid_tgid) else { return 0 };
    // SAFETY: a helper without arguments.
    let in_ns = unsafe { bpf_ktime_get_ns() };
    let rate_ns = OFFCPU_CONFIG.get(0).map_or(0, |config| config.rate_ns);
    // SAFETY: a helper without arguments.
    let Some(kept) = by_length(in_ns.saturating_sub(out_ns), rate_ns, || unsafe { bpf_get_prandom_u32() }) else {
        count(OffCpuCounter::Unsampled);
        return 0;
    };
    let _ = charge_in(&ctx, pid_tgid, state, kept.count, kept.total_ns);
    0
}

/// The current thread's switch-out in flight (time, state), taken out of its `OFFCPU_OUT`
/// slot or, if another thread held that, of `OFFCPU_PENDING`.
#[inline(always)]
fn take_out(pid_tgid: u64) -> Option<(u64, u32)> {
    let slot = OFFCPU_OUT.get_ptr_mut(out_slot(pid_tgid))?;
    // SAFETY: a live array slot; its owner's fields are written only by the owner (see
    // `note_out` for two threads of one slot), whose switch-out ran before this switch-in
    // could (a wake-up waits for `p->on_cpu`).
    unsafe {
        let out_ns = ptr::read_volatile(&(*slot).out_ns);
        if (*slot).owner == pid_tgid && out_ns != 0 {
            let state = (*slot).state;
            // Done with; the slot stays the thread's until another thread of it takes it.
            ptr::write_volatile(&mut (*slot).out_ns, 0);
            return Some((out_ns, state));
        }
    }
    // SAFETY: a helper without arguments; the address as a number, which can be hashed.
    let task = unsafe { bpf_get_current_task() };
    let maybe = OFFCPU_MAYBE_PENDING.get_ptr_mut(maybe_pending_slot(task))?;
    // SAFETY: a live array value, changed only by atomic adds; this task's own entry, if any,
    // was counted before it could be switched in anywhere (as above).
    if unsafe { ptr::read_volatile(maybe) } == 0 {
        return None;
    }
    // SAFETY: the value is copied out before the entry is deleted.
    let out = (unsafe { OFFCPU_PENDING.get(&task) }).copied()?;
    if OFFCPU_PENDING.remove(&task).is_ok() {
        atomic_add(maybe, u64::MAX);
    }
    Some((out.out_ns, out.key.state))
}

/// Charges a kept interval (`switches` in 1/`WEIGHT_ONE`, `off_ns`) to the current thread,
/// if its process and cgroup are profiled, under its stacks. `Err` when not charged.
#[inline(always)]
fn charge_in(ctx: &BtfTracePointContext, pid_tgid: u64, state: u32, switches: u64, off_ns: u64) -> Result<(), ()> {
    let task = current_task_of(pid_tgid).ok_or(())?;
    if !wanted(task.tgid) {
        return Err(());
    }
    if !cgroup_wanted() {
        count(OffCpuCounter::CgroupFiltered);
        return Err(());
    }
    let key = OffCpuKey {
        tgid: task.tgid,
        tid: task.tid,
        user_stack: NO_STACK,
        kernel_stack: NO_STACK,
        state,
        _pad: 0,
        comm: [0; 16],
    };
    let set = active_set();
    let key = walked(ctx, set, key).ok_or(())?;
    add(set, &key, switches, off_ns);
    Ok(())
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

/// Adds `switches` (in 1/`WEIGHT_ONE`) of `off_ns` in all to `key` in set `set`.
#[inline(always)]
fn add(set: u32, key: &OffCpuKey, switches: u64, off_ns: u64) {
    if add_or_insert_in_set(
        set,
        &OFFCPU_COUNTS_0,
        &OFFCPU_COUNTS_1,
        key,
        &OffCpuTotals { switches, off_cpu_ns: off_ns },
    ) {
        count(OffCpuCounter::Charged);
    } else {
        count(OffCpuCounter::CountsMapFull);
    }
}

/// Stacks walked at the switch-out: remembers a switch-out of the current thread (`prev`),
/// sampled 1 in `every`, with its stacks. `Err` when not sampled.
#[inline(always)]
fn switch_out(ctx: &BtfTracePointContext, prev: u64, preempt: bool, prev_state: u64, every: u32) -> Result<(), ()> {
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
    let key = OffCpuKey {
        tgid: task.tgid,
        tid: task.tid,
        user_stack: NO_STACK,
        kernel_stack: NO_STACK,
        state: state_of(preempt, prev_state) as u32,
        _pad: 0,
        comm: [0; 16],
    };
    let key = walked(ctx, active_set(), key).ok_or(())?;
    if OFFCPU_PENDING.insert(&prev, &SwitchedOut { out_ns, key }, BPF_ANY as u64).is_err() {
        count(OffCpuCounter::PendingMapFull);
        return Err(());
    }
    Ok(())
}

#[inline(always)]
fn count(counter: OffCpuCounter) {
    bump(&OFFCPU_COUNTERS, counter as u32);
}
