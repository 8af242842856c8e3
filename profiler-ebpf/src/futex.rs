//! Block and mutex profiles from futex syscalls: programs on `syscalls:sys_{enter,exit}_futex`
//! and the futex2 tracepoints (`futex_wait`, `futex_waitv`, `futex_wake`, `futex_requeue`).
//!
//! A wait (`FUTEX_WAIT`, `WAIT_BITSET`, `LOCK_PI`, `LOCK_PI2`, `WAIT_REQUEUE_PI`, futex2
//! `futex_wait`/`futex_waitv`) is remembered per thread at entry (in the thread's slot of
//! `FUTEX_PENDING`, see `profiler_common::futex::PendingSlot`); at exit its delay is added
//! under (process, op, outcome, waiting stack) in the block maps. The stack is taken at exit:
//! the thread's saved user registers are those of the syscall either way, and taking it in
//! the set that receives the count keeps count and stack in one batch.
//!
//! A wake (`FUTEX_WAKE`, `WAKE_BITSET`, `WAKE_OP`, `UNLOCK_PI`, the requeues, futex2
//! `futex_wake`/`futex_requeue`) records its stack as the futex word's last waker at entry,
//! before any waiter can run, in the word's slot of `FUTEX_WAKERS`. A waiter that returns
//! woken, on a word whose last wake came after it started waiting (the slot's write count
//! grew since its entry), has its delay added under the waker's stack in the mutex maps.
//! A requeue also notes the word it moved waiters to; a waiter whose word's last wake was a
//! requeue is charged to the next wake of that second word (the unlock that woke it).
//!
//! Both are sampled by length, decided before any stack is walked (`FUTEX_CONFIG`,
//! `profiler_common::sampling`): a wait at least as long as the block rate is always
//! counted, a shorter one of length d with probability d/rate and then as rate/d waits of
//! total delay rate (Go's unbiasing).
//!
//! The mutex profile decides at the wake, which must walk its stack before its waiters run,
//! so before their delays are known. It decides by what they have waited so far, bounded by
//! the time since the word's previous wake (`so_far`, see `waited_by`): a wake behind a
//! wait of at least the rate is always walked, one seen at s < rate with probability s/rate,
//! and then each wait it ends is charged its own full delay (to its exit) times rate/s, with
//! the weight stored in the word's slot. The estimate is unbiased for every wait, whatever s
//! is and however many waits the wake ends, because each is charged d/p with probability p
//! and p was fixed before the draw (proven in `profiler_common::sampling`'s tests); a poor s
//! costs variance only. The mutex fraction (1 in N of those) is on top, scaled by N in
//! userspace. Two second-order effects remain: a walked wake wakes its waiters a walk
//! (microseconds) later, which its waits then include; and a waiter that exits after a later
//! wake of its word rewrote the slot is charged with that wake's stack and weight, as before.
//! An unsampled wait costs two timestamps and two array slots; an unsampled wake, a
//! timestamp, a random draw and its word's slot.
#![allow(non_upper_case_globals)]

use core::ptr;

use aya_ebpf::{
    bindings::{BPF_EXIST, BPF_NOEXIST},
    helpers::{bpf_get_current_pid_tgid, bpf_ktime_get_ns, bpf_probe_read_user, generated::bpf_get_prandom_u32},
    macros::{map, tracepoint},
    maps::{Array, HashMap, PerCpuArray},
    programs::TracePointContext,
};
use profiler_common::{
    futex::{
        is_requeue_cmd, is_wake_cmd, pending_slot, waker_slot, PendingSlot, WakerSlot, FUTEX_CMD_MASK,
        FUTEX_CONFIG_BLOCK_RATE_NS, FUTEX_CONFIG_MUTEX_FRACTION, FUTEX_CONFIG_SLOTS, FUTEX_PENDING_SLOTS,
        FUTEX_WAKERS_SLOTS, WAKER_SEQ_BUSY,
    },
    maps::{FUTEX_PENDING_SPILL_MAX_ENTRIES, WAIT_COUNTS_MAX_ENTRIES},
    sampling::{by_length, charge, wake_weight},
    FutexCounter, PendingWait, WaitKey, WaitOp, WaitOutcome, WaitTotals, Waker, NO_STACK,
};

use crate::{
    maps::{
        active_set, add_or_insert_in_set, atomic_add, bump, current_task_of, wanted_task, Scratch, Task,
        COUNTS_MAP_FLAGS, STACK_HASH_KEY,
    },
    stack::capture_user,
    tracepoint::read_field,
};

#[map]
pub static BLOCK_COUNTS_0: HashMap<WaitKey, WaitTotals> =
    HashMap::with_max_entries(WAIT_COUNTS_MAX_ENTRIES, COUNTS_MAP_FLAGS);
#[map]
pub static BLOCK_COUNTS_1: HashMap<WaitKey, WaitTotals> =
    HashMap::with_max_entries(WAIT_COUNTS_MAX_ENTRIES, COUNTS_MAP_FLAGS);
#[map]
pub static MUTEX_COUNTS_0: HashMap<WaitKey, WaitTotals> =
    HashMap::with_max_entries(WAIT_COUNTS_MAX_ENTRIES, COUNTS_MAP_FLAGS);
#[map]
pub static MUTEX_COUNTS_1: HashMap<WaitKey, WaitTotals> =
    HashMap::with_max_entries(WAIT_COUNTS_MAX_ENTRIES, COUNTS_MAP_FLAGS);

// Arrays, not hashes: a slot is found with a shift and a mask where a hash lookup hashes the
// key and walks a bucket; every futex call pays one or two of these (`bench futex`).
#[map]
pub static FUTEX_PENDING: Array<PendingSlot> = Array::with_max_entries(FUTEX_PENDING_SLOTS, 0);

#[map]
pub static FUTEX_PENDING_SPILL: HashMap<u64, PendingWait> =
    HashMap::with_max_entries(FUTEX_PENDING_SPILL_MAX_ENTRIES, 0);

/// Entries in `FUTEX_PENDING_SPILL` now (slot 0, atomic adds): while it is 0, as it is
/// unless two threads of one slot wait at once, an exit whose slot is not its own has no
/// wait in flight without looking.
#[map]
pub static FUTEX_SPILLED: Array<u64> = Array::with_max_entries(1, 0);

// Words nobody wakes any more are overwritten by the next word of their slot.
#[map]
pub static FUTEX_WAKERS: Array<WakerSlot> = Array::with_max_entries(FUTEX_WAKERS_SLOTS, 0);

/// Sampling knobs written by userspace after load (see the module's comment).
#[map]
pub static FUTEX_CONFIG: Array<u64> = Array::with_max_entries(FUTEX_CONFIG_SLOTS, 0);

#[map]
pub static FUTEX_COUNTERS: PerCpuArray<u64> = PerCpuArray::with_max_entries(FutexCounter::COUNT, 0);

// Field offsets in the syscall tracepoint records, checked against the kernel's `format`
// files by userspace before attaching (see `profiler_common::tracepoint`).
use profiler_common::tracepoint::{
    SYSCALL_ARG0 as ARG0, SYSCALL_ARG1 as ARG1, SYSCALL_ARG3 as ARG3, SYSCALL_ARG4 as ARG4, SYSCALL_RET as RET,
};

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
    let slot = FUTEX_PENDING.get_ptr_mut(pending_slot(pid_tgid)).ok_or(())?;
    // SAFETY: a live array slot; its owner's fields are written only by the owner (see
    // `begin_wait` for two threads of one slot).
    let wait = unsafe {
        if (*slot).owner == pid_tgid {
            if (*slot).wait.start_ns == 0 {
                return Err(());
            }
            let wait = (*slot).wait;
            // Done with; the slot stays the thread's until another thread of it waits.
            (*slot).wait.start_ns = 0;
            wait
        } else {
            take_spilled(pid_tgid).ok_or(())?
        }
    };
    end_wait(ctx, current_task_of(pid_tgid).ok_or(())?, &wait);
    Ok(())
}

/// `sched:sched_process_exit`, for every thread that exits while futex waits are profiled.
#[tracepoint]
pub fn futex_thread_exit(_ctx: TracePointContext) -> u32 {
    forget_thread(bpf_get_current_pid_tgid());
    0
}

/// Drops the wait in flight of thread `pid_tgid`, which exits or takes another id (a thread
/// that is not its process's leader calling `execve`), and frees its slot.
#[inline(always)]
pub fn forget_thread(pid_tgid: u64) {
    if let Some(slot) = FUTEX_PENDING.get_ptr_mut(pending_slot(pid_tgid)) {
        // SAFETY: a live array slot (see `try_futex_exit`).
        unsafe {
            if (*slot).owner == pid_tgid {
                (*slot).wait.start_ns = 0;
                (*slot).owner = 0;
            }
        }
    }
    // Also for the slot's owner: a spilled wait whose exit was never seen (the thread was
    // killed in it) leaves its entry behind, and the thread may own its slot by now.
    let _ = take_spilled(pid_tgid);
}

/// The spilled wait of thread `pid_tgid`, taken out of `FUTEX_PENDING_SPILL`, if any.
#[inline(always)]
fn take_spilled(pid_tgid: u64) -> Option<PendingWait> {
    let spilled = FUTEX_SPILLED.get_ptr_mut(0)?;
    // SAFETY: a live array value, only changed by atomic adds.
    if unsafe { ptr::read_volatile(spilled) } == 0 {
        return None;
    }
    // SAFETY: a copy is taken at once; only this thread writes its entry.
    let wait = unsafe { FUTEX_PENDING_SPILL.get(&pid_tgid) }.copied()?;
    if FUTEX_PENDING_SPILL.remove(&pid_tgid).is_ok() {
        atomic_add(spilled, u64::MAX);
    }
    Some(wait)
}

#[inline(always)]
fn count(counter: FutexCounter) {
    bump(&FUTEX_COUNTERS, counter as u32);
}

#[inline(always)]
fn begin_wait(task: Task, uaddr: u64, op: WaitOp) {
    // SAFETY: a helper without arguments.
    let start_ns = unsafe { bpf_ktime_get_ns() };
    // A futex2 `futex_waitv` waits on several words and is charged to no waker.
    let wake_seq = if uaddr == 0 { 0 } else { waker_seq(task.tgid, uaddr) };
    let pid_tgid = task.pid_tgid;
    let Some(slot) = FUTEX_PENDING.get_ptr_mut(pending_slot(pid_tgid)) else { return };
    // The thread's slot, or a slot with no wait in flight, which it takes (its last owner
    // exited, or waits no more); the start last, which marks the wait in flight. Two
    // threads of one slot that enter a wait at the same instant may both take it, and one
    // wait is then lost, as it is when the slot's last owner exits at the instant another
    // thread of it takes the slot: either needs thread ids equal modulo
    // `FUTEX_PENDING_SLOTS` and the same few nanoseconds on two CPUs.
    // SAFETY: a live array slot; plain field accesses.
    unsafe {
        if (*slot).owner == pid_tgid || (*slot).wait.start_ns == 0 {
            (*slot).owner = pid_tgid;
            (*slot).wait.uaddr = uaddr;
            (*slot).wait.wake_seq = wake_seq;
            (*slot).wait.op = op as u16;
            ptr::write_volatile(&mut (*slot).wait.start_ns, start_ns);
            return;
        }
    }
    let wait = PendingWait { uaddr, start_ns, wake_seq, op: op as u16, _pad: [0; 3] };
    // A new entry is counted in `FUTEX_SPILLED`; one this thread left (a wait whose exit was
    // not seen) is replaced and was counted already.
    if FUTEX_PENDING_SPILL.insert(&pid_tgid, &wait, BPF_NOEXIST as u64).is_ok() {
        if let Some(spilled) = FUTEX_SPILLED.get_ptr_mut(0) {
            atomic_add(spilled, 1);
        }
    } else if FUTEX_PENDING_SPILL.insert(&pid_tgid, &wait, BPF_EXIST as u64).is_err() {
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
    let outcome = WaitOutcome::of_ret(read_field(ctx, RET) as i64);
    let mut key = WaitKey { tgid, op: wait.op, outcome: outcome as u16, stack: NO_STACK };
    match by_length(delay_ns, config(FUTEX_CONFIG_BLOCK_RATE_NS), random_u32) {
        Some(weighted) => {
            key.stack = user_stack(set, tgid);
            if add_or_insert_in_set(
                set,
                &BLOCK_COUNTS_0,
                &BLOCK_COUNTS_1,
                &key,
                &WaitTotals { count: weighted.count, delay_ns: weighted.total_ns },
            ) {
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
    let Some(last) = last_wake(tgid, wait.uaddr, wait.wake_seq) else {
        count(FutexCounter::NoWaker);
        return;
    };
    let (mut waker_stack, mut weight) = (last.stack, last.weight);
    if last.requeued_to != 0 {
        // The word's last wake moved waiters to `requeued_to`: a waiter among them was woken by
        // that word's next wake (an unlock), which is what it waited for at the end. One the
        // requeue woke directly is charged to a wake of that word that came before it
        // returned, if any (it goes on to take that lock), else to no one (counted without a
        // waker): a condition's broadcast is no lock release.
        match last_wake(tgid, last.requeued_to, last.requeued_seq) {
            Some(unlock) => (waker_stack, weight) = (unlock.stack, unlock.weight),
            None => {
                count(FutexCounter::NoWaker);
                return;
            }
        }
    }
    if weight == 0 {
        count(FutexCounter::MutexUnsampled);
        return;
    }
    let key = WaitKey { stack: waker_stack, ..key };
    let charged = charge(delay_ns, weight);
    if add_or_insert_in_set(
        set,
        &MUTEX_COUNTS_0,
        &MUTEX_COUNTS_1,
        &key,
        &WaitTotals { count: charged.count, delay_ns: charged.total_ns },
    ) {
        if last.requeued_to != 0 {
            count(FutexCounter::Requeued);
        }
        count(FutexCounter::MutexCharged);
    } else {
        count(FutexCounter::MutexMapFull);
    }
}

/// The `FUTEX_WAKERS` slot of word `uaddr` of process `tgid`.
#[inline(always)]
fn waker_slot_of(tgid: u32, uaddr: u64) -> Option<*mut WakerSlot> {
    FUTEX_WAKERS.get_ptr_mut(waker_slot(STACK_HASH_KEY.load(), tgid, uaddr))
}

/// The write count of the slot of word `uaddr` now (whichever word holds it: a later wake
/// of `uaddr` writes it, and so has a greater count).
#[inline(always)]
fn waker_seq(tgid: u32, uaddr: u64) -> u64 {
    match waker_slot_of(tgid, uaddr) {
        // SAFETY: a plain read of a live array value.
        Some(slot) => (unsafe { ptr::read_volatile(&(*slot).waker.seq) }) & !WAKER_SEQ_BUSY,
        None => 0,
    }
}

/// A copy of the last wake of `uaddr`, if it was recorded after the slot's count was `since`
/// and its slot still holds it. The count is read before and after the rest (see
/// `WakerSlot`): a wake rewriting the slot meanwhile changes it.
#[inline(always)]
fn last_wake(tgid: u32, uaddr: u64, since: u64) -> Option<Waker> {
    let slot = waker_slot_of(tgid, uaddr)?;
    // SAFETY: plain field reads of a live array value.
    unsafe {
        let seq = ptr::read_volatile(&(*slot).waker.seq);
        if seq <= since || seq & WAKER_SEQ_BUSY != 0 {
            return None;
        }
        let waker = Waker {
            stack: ptr::read_volatile(&(*slot).waker.stack),
            seq,
            requeued_to: ptr::read_volatile(&(*slot).waker.requeued_to),
            requeued_seq: ptr::read_volatile(&(*slot).waker.requeued_seq),
            tid: ptr::read_volatile(&(*slot).waker.tid),
            _pad: 0,
            weight: ptr::read_volatile(&(*slot).waker.weight),
            wake_ns: 0,
        };
        let (word_tgid, word) = (ptr::read_volatile(&(*slot).key.tgid), ptr::read_volatile(&(*slot).key.uaddr));
        if ptr::read_volatile(&(*slot).waker.seq) != seq || word_tgid != tgid || word != uaddr {
            return None;
        }
        Some(waker)
    }
}

/// Slot `slot` of `FUTEX_CONFIG` (0 when unset: sample everything).
#[inline(always)]
fn config(slot: u32) -> u64 {
    FUTEX_CONFIG.get(slot).copied().unwrap_or(0)
}

/// Per CPU, the state of [`random_u32`]'s generator (0: not seeded yet).
#[map]
pub static FUTEX_RANDOM: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);

/// A uniform 32-bit draw for the sampling decisions: xorshift64* on this CPU's state, seeded
/// once from the kernel's generator. Inline, it costs a wake or a wait a few instructions
/// where the helper costs a call; the futex programs do not nest on a CPU, so the state has
/// one user at a time.
#[inline(always)]
fn random_u32() -> u32 {
    let Some(state) = FUTEX_RANDOM.get_ptr_mut(0) else {
        // SAFETY: a helper without arguments.
        return unsafe { bpf_get_prandom_u32() };
    };
    // SAFETY: this CPU's slot of a live array.
    let mut x = unsafe { *state };
    if x == 0 {
        // SAFETY: as above; `| 1` keeps the seed non-zero.
        x = (u64::from(unsafe { bpf_get_prandom_u32() }) << 32 | u64::from(unsafe { bpf_get_prandom_u32() })) | 1;
    }
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    // SAFETY: as above.
    unsafe { *state = x };
    (x.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 32) as u32
}

/// What the waits a wake of the word in `slot` ends have waited by `now_ns`, at least (see
/// the module's comment): the time since the word's previous wake, which every wait that
/// began since then has waited at most and every older one at least. With no previous wake
/// of the word on record (its first, or its slot was another word's), `u64::MAX`: unknown,
/// so the wake is walked.
#[inline(always)]
fn waited_by(slot: *const WakerSlot, tgid: u32, uaddr: u64, now_ns: u64) -> u64 {
    // SAFETY: plain field reads of a live array value; a torn read (a wake rewriting the slot)
    // changes the sampling probability only, which is fixed before the draw either way.
    unsafe {
        let seq = ptr::read_volatile(&(*slot).waker.seq);
        if seq & !WAKER_SEQ_BUSY == 0 || (*slot).key.tgid != tgid || (*slot).key.uaddr != uaddr {
            return u64::MAX;
        }
        now_ns.saturating_sub(ptr::read_volatile(&(*slot).waker.wake_ns))
    }
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
    let tgid = task.tgid;
    let Some(slot) = waker_slot_of(tgid, uaddr) else {
        count(FutexCounter::WakerMapFull);
        return;
    };
    // SAFETY: a helper without arguments.
    let now_ns = unsafe { bpf_ktime_get_ns() };
    let so_far = waited_by(slot, tgid, uaddr, now_ns);
    let rate = config(FUTEX_CONFIG_BLOCK_RATE_NS);
    let weight = wake_weight(so_far, rate, config(FUTEX_CONFIG_MUTEX_FRACTION), random_u32).unwrap_or(0);
    let stack = if weight != 0 { user_stack(active_set(), tgid) } else { NO_STACK };
    let requeued_seq = if requeued_to == 0 { 0 } else { waker_seq(tgid, requeued_to) };
    // The count is marked busy first and written last, one more (see `WakerSlot`): a waiter
    // reading the slot meanwhile sees it change and takes no waker from it (x86 keeps stores
    // in order, and loads in order). Two wakes writing one slot at once (no compare-and-swap
    // here) may leave one's fields under the other's count, so one waiter may be charged to
    // the other waker, and may write the same count twice, so a waiter that entered between
    // them may find no waker (counted as such).
    // SAFETY: a live array value of this type; plain field accesses.
    unsafe {
        let seq = ptr::read_volatile(&(*slot).waker.seq) & !WAKER_SEQ_BUSY;
        ptr::write_volatile(&mut (*slot).waker.seq, seq | WAKER_SEQ_BUSY);
        ptr::write_volatile(&mut (*slot).key.tgid, tgid);
        ptr::write_volatile(&mut (*slot).key.uaddr, uaddr);
        ptr::write_volatile(&mut (*slot).waker.stack, stack);
        ptr::write_volatile(&mut (*slot).waker.requeued_to, requeued_to);
        ptr::write_volatile(&mut (*slot).waker.requeued_seq, requeued_seq);
        ptr::write_volatile(&mut (*slot).waker.tid, task.tid);
        ptr::write_volatile(&mut (*slot).waker.weight, weight);
        ptr::write_volatile(&mut (*slot).waker.wake_ns, now_ns);
        ptr::write_volatile(&mut (*slot).waker.seq, seq + 1);
    }
    count(FutexCounter::Wakes);
}
