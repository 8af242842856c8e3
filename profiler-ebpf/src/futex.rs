//! Block and mutex profiles from futex syscalls: programs on `syscalls:sys_{enter,exit}_futex`
//! and the futex2 tracepoints (`futex_wait`, `futex_waitv`, `futex_wake`, `futex_requeue`).
//!
//! A wait (`FUTEX_WAIT`, `WAIT_BITSET`, `LOCK_PI`, `LOCK_PI2`, `WAIT_REQUEUE_PI`, futex2
//! `futex_wait`/`futex_waitv`) is remembered per thread at entry (in the thread's entry of
//! `FUTEX_PENDING`, which lives from its first wait to its exit); at exit its delay is added
//! under (process, op, outcome, waiting stack) in the block maps. The stack is taken at exit:
//! the thread's saved user registers are those of the syscall either way, and taking it in
//! the set that receives the count keeps count and stack in one batch.
//!
//! A wake (`FUTEX_WAKE`, `WAKE_BITSET`, `WAKE_OP`, `UNLOCK_PI`, the requeues, futex2
//! `futex_wake`/`futex_requeue`) records its stack as the futex word's last waker at entry,
//! before any waiter can run. A waiter that returns woken, on a word whose last wake came
//! after it started waiting, has its delay added under the waker's stack in the mutex maps.
//! A requeue also notes the word it moved waiters to; a waiter whose word's last wake was a
//! requeue is charged to the next wake of that second word (the unlock that woke it).
//!
//! Both are sampled as Go samples them, decided before any stack is walked (`FUTEX_CONFIG`):
//! a wait at least as long as the block rate is always counted, a shorter one of length d
//! with probability d/rate and then as rate/d waits of total delay rate (Go's unbiasing);
//! 1 in N wakes (the mutex fraction) walks its stack, and only the waits a sampled wake ends
//! are charged, scaled by N in userspace. An unsampled wait costs two timestamps and its
//! in-flight entry; an unsampled wake, a timestamp and its word's entry.
#![allow(non_upper_case_globals)]

use core::ptr;

use aya_ebpf::{
    bindings::BPF_ANY,
    helpers::{bpf_get_current_pid_tgid, bpf_ktime_get_ns, bpf_probe_read_user, generated::bpf_get_prandom_u32},
    macros::{map, tracepoint},
    maps::{Array, HashMap, LruHashMap, PerCpuArray},
    programs::TracePointContext,
};
use profiler_common::{
    futex::{
        is_requeue_cmd, is_wake_cmd, FUTEX_CMD_MASK, FUTEX_CONFIG_BLOCK_RATE_NS, FUTEX_CONFIG_MUTEX_FRACTION,
        FUTEX_CONFIG_SLOTS, WAIT_COUNT_ONE,
    },
    maps::{FUTEX_PENDING_MAX_ENTRIES, FUTEX_WAKERS_MAX_ENTRIES, WAIT_COUNTS_MAX_ENTRIES},
    FutexCounter, PendingWait, WaitKey, WaitOp, WaitOutcome, WaitTotals, Waker, WakerKey, NO_STACK,
};

use crate::{
    maps::{active_set, add_or_insert, bump, current_task, pick_set, wanted_task, Scratch, Task},
    stack::capture_user,
    tracepoint::read_field,
};

#[map]
pub static BLOCK_COUNTS_0: HashMap<WaitKey, WaitTotals> = HashMap::with_max_entries(WAIT_COUNTS_MAX_ENTRIES, 0);
#[map]
pub static BLOCK_COUNTS_1: HashMap<WaitKey, WaitTotals> = HashMap::with_max_entries(WAIT_COUNTS_MAX_ENTRIES, 0);
#[map]
pub static MUTEX_COUNTS_0: HashMap<WaitKey, WaitTotals> = HashMap::with_max_entries(WAIT_COUNTS_MAX_ENTRIES, 0);
#[map]
pub static MUTEX_COUNTS_1: HashMap<WaitKey, WaitTotals> = HashMap::with_max_entries(WAIT_COUNTS_MAX_ENTRIES, 0);

#[map]
pub static FUTEX_PENDING: HashMap<u64, PendingWait> = HashMap::with_max_entries(FUTEX_PENDING_MAX_ENTRIES, 0);

// LRU: words nobody wakes any more age out instead of filling the map.
#[map]
pub static FUTEX_WAKERS: LruHashMap<WakerKey, Waker> = LruHashMap::with_max_entries(FUTEX_WAKERS_MAX_ENTRIES, 0);

/// Sampling knobs written by userspace after load (see the module's comment).
#[map]
pub static FUTEX_CONFIG: Array<u64> = Array::with_max_entries(FUTEX_CONFIG_SLOTS, 0);

#[map]
pub static FUTEX_COUNTERS: PerCpuArray<u64> = PerCpuArray::with_max_entries(FutexCounter::COUNT, 0);

/// Field offsets in the syscall tracepoint records (see
/// `/sys/kernel/tracing/events/syscalls/sys_enter_futex/format`): every syscall argument is
/// 8 bytes wide from offset 16; `sys_exit_*` has `ret` at 16.
const ARG0: usize = 16;
const ARG1: usize = 24;
const ARG3: usize = 40;
const ARG4: usize = 48;
const RET: usize = 16;

/// `futex(2)`: one program for every command, which tells waits from wakes.
#[tracepoint]
pub fn futex_enter(ctx: TracePointContext) -> u32 {
    match try_futex_enter(&ctx) {
        Ok(()) | Err(()) => 0,
    }
}

#[inline(always)]
fn try_futex_enter(ctx: &TracePointContext) -> Result<(), ()> {
    let task = wanted_task().ok_or(())?;
    let uaddr = read_field(ctx, ARG0);
    let cmd = read_field(ctx, ARG1) as u32 & FUTEX_CMD_MASK;
    if let Some(op) = WaitOp::of_cmd(cmd) {
        begin_wait(task, uaddr, op);
    } else if is_wake_cmd(cmd) {
        // `uaddr2`, where a requeue moves the waiters it does not wake (`val2`, in the
        // timeout's place, says how many at most: none makes it a plain wake).
        let requeued_to = if is_requeue_cmd(cmd) && read_field(ctx, ARG3) != 0 { read_field(ctx, ARG4) } else { 0 };
        record_waker(task, uaddr, requeued_to);
    }
    Ok(())
}

/// futex2 `futex_wait(uaddr, val, mask, flags, timeout, clockid)`.
#[tracepoint]
pub fn futex_wait_enter(ctx: TracePointContext) -> u32 {
    if let Some(task) = wanted_task() {
        begin_wait(task, read_field(&ctx, ARG0), WaitOp::Futex2Wait);
    }
    0
}

/// futex2 `futex_waitv(waiters, nr, flags, timeout, clockid)`: several words at once, so no
/// single word to find a waker by; it goes to the block profile only.
#[tracepoint]
pub fn futex_waitv_enter(_ctx: TracePointContext) -> u32 {
    if let Some(task) = wanted_task() {
        begin_wait(task, 0, WaitOp::Futex2Waitv);
    }
    0
}

/// futex2 `futex_wake(uaddr, mask, nr, flags)`.
#[tracepoint]
pub fn futex_wake_enter(ctx: TracePointContext) -> u32 {
    if let Some(task) = wanted_task() {
        record_waker(task, read_field(&ctx, ARG0), 0);
    }
    0
}

/// futex2 `futex_requeue(waiters[2], flags, nr_wake, nr_requeue)`: wakes waiters of
/// `waiters[0].uaddr` and moves others to `waiters[1].uaddr` (a `struct futex_waitv` is
/// `{ u64 val; u64 uaddr; u32 flags; u32 _; }`, 24 bytes).
#[tracepoint]
pub fn futex_requeue_enter(ctx: TracePointContext) -> u32 {
    match try_futex_requeue_enter(&ctx) {
        Ok(()) | Err(()) => 0,
    }
}

#[inline(always)]
fn try_futex_requeue_enter(ctx: &TracePointContext) -> Result<(), ()> {
    let task = wanted_task().ok_or(())?;
    let waiters = read_field(ctx, ARG0);
    // SAFETY: a fault-safe read of the caller's argument array.
    let uaddr = unsafe { bpf_probe_read_user((waiters + 8) as *const u64) }.map_err(|_| ())?;
    // The second element's word; none is moved when `nr_requeue` is 0.
    let requeued_to = if read_field(ctx, ARG3) == 0 {
        0
    } else {
        // SAFETY: as above.
        unsafe { bpf_probe_read_user((waiters + 24 + 8) as *const u64) }.unwrap_or(0)
    };
    record_waker(task, uaddr, requeued_to);
    Ok(())
}

/// The exit of `futex(2)`, `futex_wait(2)` and `futex_waitv(2)`: completes a pending wait.
#[tracepoint]
pub fn futex_exit(ctx: TracePointContext) -> u32 {
    match try_futex_exit(&ctx) {
        Ok(()) | Err(()) => 0,
    }
}

/// `Err` when the thread has no wait in flight (not a wait, or not a process profiled).
#[inline(always)]
fn try_futex_exit(ctx: &TracePointContext) -> Result<(), ()> {
    // The entry first: every futex exit on the machine comes here, and only this thread's
    // own wait needs its ids as the profiler sees them.
    let pid_tgid = bpf_get_current_pid_tgid();
    let entry = FUTEX_PENDING.get_ptr_mut(&pid_tgid).ok_or(())?;
    // SAFETY: this thread's own entry (only it and its exit write it); plain field accesses.
    let wait = unsafe {
        if (*entry).start_ns == 0 {
            return Err(());
        }
        let wait = *entry;
        // Done with, but kept for the thread's next wait: rewriting an entry in place costs a
        // lookup, where a delete and an insert take the bucket's lock and the free list twice.
        (*entry).start_ns = 0;
        wait
    };
    end_wait(ctx, current_task().ok_or(())?, &wait);
    Ok(())
}

/// `sched:sched_process_exit`, for every thread that exits while futex waits are profiled:
/// its entry in `FUTEX_PENDING`, kept between its waits, goes with it.
#[tracepoint]
pub fn futex_thread_exit(_ctx: TracePointContext) -> u32 {
    let _ = FUTEX_PENDING.remove(&bpf_get_current_pid_tgid());
    0
}

#[inline(always)]
fn count(counter: FutexCounter) {
    bump(&FUTEX_COUNTERS, counter as u32);
}

#[inline(always)]
fn begin_wait(task: Task, uaddr: u64, op: WaitOp) {
    // SAFETY: a helper without arguments.
    let start_ns = unsafe { bpf_ktime_get_ns() };
    // The thread's entry from its last wait is rewritten in place (see `try_futex_exit`);
    // the start last, which marks the entry in flight.
    if let Some(entry) = FUTEX_PENDING.get_ptr_mut(&task.pid_tgid) {
        // SAFETY: this thread's own entry; plain field writes.
        unsafe {
            (*entry).uaddr = uaddr;
            (*entry).op = op as u16;
            (*entry).start_ns = start_ns;
        }
        return;
    }
    let wait = PendingWait { uaddr, start_ns, op: op as u16, _pad: [0; 3] };
    // BPF_ANY: an entry left by a thread whose tid was reused is simply replaced.
    if FUTEX_PENDING.insert(&task.pid_tgid, &wait, BPF_ANY as u64).is_err() {
        count(FutexCounter::PendingMapFull);
    }
}

/// Counts a finished wait in the block maps, and in the mutex maps under its waker.
///
/// The stack walk comes first: with the walk inlined, an outcome already decoded into
/// constants multiplied the verifier's states past its instruction limit (found with the
/// unrolled frame-pointer walk; the order is kept).
#[inline(always)]
fn end_wait(ctx: &TracePointContext, task: Task, wait: &PendingWait) {
    // The end first: the walk below is the profiler's time, not the wait's.
    // SAFETY: a helper without arguments.
    let delay_ns = unsafe { bpf_ktime_get_ns() }.wrapping_sub(wait.start_ns);
    let tgid = task.tgid;
    let set = active_set();
    let (block, mutex) =
        (pick_set(set, &BLOCK_COUNTS_0, &BLOCK_COUNTS_1), pick_set(set, &MUTEX_COUNTS_0, &MUTEX_COUNTS_1));
    let outcome = WaitOutcome::of_ret(read_field(ctx, RET) as i64);
    let mut key = WaitKey { tgid, op: wait.op, outcome: outcome as u16, stack: NO_STACK };
    match block_weight(delay_ns) {
        Some((weight, delay)) => {
            key.stack = user_stack(set, tgid);
            if add_wait(block, &key, weight, delay) {
                count(FutexCounter::Waits);
            } else {
                count(FutexCounter::BlockMapFull);
            }
        }
        None => count(FutexCounter::BlockUnsampled),
    }
    if outcome != WaitOutcome::Woken || wait.uaddr == 0 {
        return;
    }
    let Some(last) = last_wake(tgid, wait.uaddr, wait.start_ns) else {
        count(FutexCounter::NoWaker);
        return;
    };
    let (mut waker_stack, mut sampled) = (last.stack, last.sampled);
    if last.requeued_to != 0 {
        // The word's last wake moved waiters to `requeued_to`: a waiter among them was woken by
        // that word's next wake (an unlock), which is what it waited for at the end. One the
        // requeue woke directly is charged to a wake of that word that came before it
        // returned, if any (it goes on to take that lock), else to no one (counted without a
        // waker): a condition's broadcast is no lock release.
        match last_wake(tgid, last.requeued_to, last.wake_ns) {
            Some(unlock) => (waker_stack, sampled) = (unlock.stack, unlock.sampled),
            None => {
                count(FutexCounter::NoWaker);
                return;
            }
        }
    }
    if sampled == 0 {
        count(FutexCounter::MutexUnsampled);
        return;
    }
    let key = WaitKey { stack: waker_stack, ..key };
    if add_wait(mutex, &key, WAIT_COUNT_ONE, delay_ns) {
        if last.requeued_to != 0 {
            count(FutexCounter::Requeued);
        }
        count(FutexCounter::MutexCharged);
    } else {
        count(FutexCounter::MutexMapFull);
    }
}

/// A copy of the last wake of `uaddr`, if it was issued at or after `since_ns`. The time is
/// read first: `record_waker` may be rewriting the entry in place, and writes the time last.
#[inline(always)]
fn last_wake(tgid: u32, uaddr: u64, since_ns: u64) -> Option<Waker> {
    let entry = FUTEX_WAKERS.get_ptr(&WakerKey { tgid, _pad: 0, uaddr })?;
    // SAFETY: plain field reads of a live map value.
    unsafe {
        let wake_ns = ptr::read_volatile(&(*entry).wake_ns);
        if wake_ns < since_ns {
            return None;
        }
        Some(Waker {
            stack: ptr::read_volatile(&(*entry).stack),
            wake_ns,
            tid: ptr::read_volatile(&(*entry).tid),
            sampled: ptr::read_volatile(&(*entry).sampled),
            requeued_to: ptr::read_volatile(&(*entry).requeued_to),
        })
    }
}

/// Adds `weight` waits (in 1/`WAIT_COUNT_ONE`) of `delay_ns` in all under `key`. False when
/// the map is full.
#[inline(always)]
fn add_wait(totals: &HashMap<WaitKey, WaitTotals>, key: &WaitKey, weight: u64, delay_ns: u64) -> bool {
    add_or_insert(totals, key, &WaitTotals { count: weight, delay_ns })
}

/// Whether a wait of `delay_ns` goes into the block profile, and as what (count in
/// 1/`WAIT_COUNT_ONE`, delay): as itself when at least the rate long, else with probability
/// delay/rate as rate/delay waits of `rate` ns in all (Go's CL 299991), so that the sums
/// estimate every wait's.
#[inline(always)]
fn block_weight(delay_ns: u64) -> Option<(u64, u64)> {
    let rate = FUTEX_CONFIG.get(FUTEX_CONFIG_BLOCK_RATE_NS).copied().unwrap_or(0);
    if rate <= 1 || delay_ns >= rate {
        return Some((WAIT_COUNT_ONE, delay_ns));
    }
    // Uniform in [0, rate): a 32-bit random number scaled, no division.
    // SAFETY: a helper without arguments.
    let draw = (u64::from(unsafe { bpf_get_prandom_u32() }) * rate) >> 32;
    if draw >= delay_ns {
        return None;
    }
    // delay_ns > draw >= 0 here.
    Some(((rate * WAIT_COUNT_ONE) / delay_ns, rate))
}

/// Whether this wake walks its stack: 1 in the mutex fraction.
#[inline(always)]
fn wake_sampled() -> bool {
    let fraction = FUTEX_CONFIG.get(FUTEX_CONFIG_MUTEX_FRACTION).copied().unwrap_or(0);
    // SAFETY: a helper without arguments.
    fraction <= 1 || u64::from(unsafe { bpf_get_prandom_u32() }) % fraction == 0
}

/// The calling thread's user stack stored in map set `set`, or `NO_STACK` with the loss
/// counted.
#[inline(always)]
fn user_stack(set: u32, tgid: u32) -> u64 {
    let mut truncated = false;
    match capture_user(set, &mut truncated, Scratch::Task, tgid) {
        Ok(hash) => hash,
        Err(_) => {
            count(FutexCounter::StackLost);
            NO_STACK
        }
    }
}

/// Remembers the calling thread's stack as the last waker of `uaddr` (and, for a requeue,
/// the word its other waiters moved to).
#[inline(always)]
fn record_waker(task: Task, uaddr: u64, requeued_to: u64) {
    let sampled = wake_sampled();
    let stack = if sampled { user_stack(active_set(), task.tgid) } else { NO_STACK };
    let tgid = task.tgid;
    // SAFETY: a helper without arguments.
    let wake_ns = unsafe { bpf_ktime_get_ns() };
    let waker = Waker { stack, wake_ns, tid: task.tid, sampled: sampled as u32, requeued_to };
    let key = WakerKey { tgid, _pad: 0, uaddr };
    // A word is usually woken again and again (the same lock or condition): overwriting its
    // entry in place skips the LRU's allocation and list locking. `wake_ns` is written last,
    // so a waiter that sees the new time also sees the new stack (x86 keeps stores in order).
    if let Some(entry) = FUTEX_WAKERS.get_ptr_mut(&key) {
        // SAFETY: a live map value of this type; plain field writes.
        unsafe {
            ptr::write_volatile(&mut (*entry).stack, stack);
            ptr::write_volatile(&mut (*entry).tid, waker.tid);
            ptr::write_volatile(&mut (*entry).sampled, waker.sampled);
            ptr::write_volatile(&mut (*entry).requeued_to, requeued_to);
            ptr::write_volatile(&mut (*entry).wake_ns, wake_ns);
        }
        count(FutexCounter::Wakes);
    } else if FUTEX_WAKERS.insert(&key, &waker, BPF_ANY as u64).is_ok() {
        count(FutexCounter::Wakes);
    } else {
        count(FutexCounter::WakerMapFull);
    }
}
