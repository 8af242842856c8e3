//! The block and mutex profiles' map layout: futex waits in flight, the last waker of each
//! futex word, and per-stack wait totals.

/// Key of the wait totals (block and mutex maps): (process, wait operation, outcome, stack).
/// In the block maps `stack` is the waiting thread's user stack; in the mutex maps it is the
/// stack of the thread that woke it (Go charges mutex delay to the unlocker).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct WaitKey {
    pub tgid: u32,
    /// A [`WaitOp`] as its `u16`.
    pub op: u16,
    /// A [`WaitOutcome`] as its `u16`.
    pub outcome: u16,
    /// User stack hash in the stack maps, or [`crate::NO_STACK`].
    pub stack: u64,
}

/// Completed waits under one key.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WaitTotals {
    /// Waits, in units of 1/[`WAIT_COUNT_ONE`]: a wait recorded as it is counts one; a short
    /// block wait sampled with probability d/rate counts rate/d (Go's unbiasing).
    pub count: u64,
    /// Sum of (syscall exit − entry), nanoseconds of `bpf_ktime_get_ns` (CLOCK_MONOTONIC);
    /// a sampled short block wait adds the rate instead of its own length.
    pub delay_ns: u64,
}

/// One wait in [`WaitTotals::count`] (fixed point, so that rate/d keeps its fraction).
pub const WAIT_COUNT_ONE: u64 = crate::sampling::WEIGHT_ONE;

/// Slots of the `FUTEX_CONFIG` array (`u64`s written by userspace after load).
/// The block profile's rate in nanoseconds: waits at least this long are always recorded,
/// shorter ones with probability length/rate (0 or 1: every wait).
pub const FUTEX_CONFIG_BLOCK_RATE_NS: u32 = 0;
/// The mutex profile's fraction: on top of the rate (a wake is kept as
/// `crate::sampling::wake_weight` says, by what the waits it ends have waited), 1 in N of the
/// wakes the rate keeps records its stack; userspace scales by N (0 or 1: no fraction).
pub const FUTEX_CONFIG_MUTEX_FRACTION: u32 = 1;
/// Slots of `FUTEX_CONFIG`.
pub const FUTEX_CONFIG_SLOTS: u32 = 2;

/// A wait between its syscall entry and exit: a thread's [`PendingSlot`], or its entry in the
/// spill hash (keyed by pid_tgid).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct PendingWait {
    /// The futex word waited on (0 for `futex_waitv`, which waits on several).
    pub uaddr: u64,
    /// `bpf_ktime_get_ns` at entry.
    pub start_ns: u64,
    /// [`Waker::seq`] of the word's `FUTEX_WAKERS` slot at entry: a wake recorded after the
    /// wait began has a greater one.
    pub wake_seq: u64,
    /// A [`WaitOp`] as its `u16`.
    pub op: u16,
    pub _pad: [u16; 3],
}

/// A futex word of a process: the word whose last wake a [`WakerSlot`] holds.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct WakerKey {
    pub tgid: u32,
    pub _pad: u32,
    pub uaddr: u64,
}

/// The last wake (or unlock, or requeue) issued on a futex word.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Waker {
    /// The waking thread's user stack hash, or [`crate::NO_STACK`].
    pub stack: u64,
    /// The slot's write count when this wake was written (see [`WakerSlot`]): a waiter is
    /// charged to this waker only if the slot's count grew since it began waiting, so a stale
    /// entry never takes a wait it did not end. A count, not a time: a wake then reads no
    /// clock, and the waiter reads the count it needs at its entry, with the slot.
    pub seq: u64,
    /// For a requeue (`FUTEX_REQUEUE`, `CMP_REQUEUE`, `CMP_REQUEUE_PI`, futex2
    /// `futex_requeue`): the word its waiters were moved to, else 0. A waiter of this word
    /// woken after the requeue was woken by the next wake of that word (the unlock of the
    /// mutex a condition variable's broadcast requeues its waiters onto), and is charged to
    /// it, not to the broadcaster.
    pub requeued_to: u64,
    /// [`Waker::seq`] of `requeued_to`'s slot at the requeue: that word's next wake has a
    /// greater one.
    pub requeued_seq: u64,
    pub tid: u32,
    pub _pad: u32,
    /// 0 when the wake was not sampled (its stack not walked; a wait it ends is not charged),
    /// else what each wait it ends counts, in 1/[`WAIT_COUNT_ONE`] (see
    /// `crate::sampling::wake_weight`).
    pub weight: u64,
    /// `bpf_ktime_get_ns` at the wake's entry: the next wake of the word bounds what its
    /// waiters have waited by it.
    pub wake_ns: u64,
}

/// A thread's slot in `FUTEX_PENDING`, an array indexed by [`pending_slot`] of the kernel's
/// thread id: the thread that last used it (`owner`, its pid_tgid; 0 for none) and its wait
/// in flight (`wait.start_ns` 0: none). An array slot is found without a hash or a lock,
/// which is most of what an unsampled wait costs. Two live threads may share a slot (their
/// ids equal modulo the array's size, common where `pid_max` exceeds it, as systemd sets it
/// to 4194304): a thread whose slot holds another's wait in flight keeps its own in
/// `FUTEX_PENDING_SPILL`. Only waits in flight at the same time collide; a slot whose wait
/// has ended passes to the next thread of it that waits.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct PendingSlot {
    pub owner: u64,
    pub wait: PendingWait,
}

/// Slots of `FUTEX_PENDING` (a power of two): the kernel's default `pid_max` up to 32 CPUs,
/// where no two live threads share one.
pub const FUTEX_PENDING_SLOTS: u32 = 32_768;

/// The `FUTEX_PENDING` slot of the thread whose kernel `pid_tgid` this is.
#[inline(always)]
pub fn pending_slot(pid_tgid: u64) -> u32 {
    pid_tgid as u32 & (FUTEX_PENDING_SLOTS - 1)
}

/// A slot of `FUTEX_WAKERS`, an array indexed by [`waker_slot`] of the word: the word whose
/// last wake it holds and that wake. A word whose slot another word took since its wake has
/// no waker on record (counted, as an evicted entry was before). `waker.seq` is also a
/// sequence lock: the writer reads it, sets [`WAKER_SEQ_BUSY`] in it, writes the rest, then
/// writes the count plus one; a reader takes the slot only if it reads the same count, not
/// busy, before and after the rest.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct WakerSlot {
    pub key: WakerKey,
    pub waker: Waker,
}

/// The bit of [`Waker::seq`] set while a wake rewrites its slot.
pub const WAKER_SEQ_BUSY: u64 = 1 << 63;

/// Slots of `FUTEX_WAKERS` (a power of two, see [`waker_slot`]).
pub const FUTEX_WAKERS_SLOT_BITS: u32 = 14;
pub const FUTEX_WAKERS_SLOTS: u32 = 1 << FUTEX_WAKERS_SLOT_BITS;

/// The `FUTEX_WAKERS` slot of word `uaddr` of process `tgid`, under the load's random key
/// (`globals::STACK_HASH_KEY`): a process cannot choose words that take another's slots.
#[inline(always)]
pub fn waker_slot(key: u64, tgid: u32, uaddr: u64) -> u32 {
    use crate::stack::{hash_frame, hash_start};
    // One more multiply carries the word's low bits (which differ between neighbouring
    // locks) into the top bits taken.
    let h = hash_frame(hash_frame(hash_start(key), tgid as u64), uaddr).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    (h >> (64 - FUTEX_WAKERS_SLOT_BITS)) as u32
}

const _: () = assert!(core::mem::size_of::<WaitKey>() == 16);
const _: () = assert!(core::mem::size_of::<PendingSlot>() == 40);
const _: () = assert!(core::mem::size_of::<WakerSlot>() == 72);
const _: () = assert!(core::mem::size_of::<WaitTotals>() == 16);
const _: () = assert!(core::mem::size_of::<PendingWait>() == 32);
const _: () = assert!(core::mem::size_of::<WakerKey>() == 16);
const _: () = assert!(core::mem::size_of::<Waker>() == 56);

/// The futex command bits of `futex(2)`'s `op` (the kernel's `FUTEX_CMD_MASK`: without
/// `FUTEX_PRIVATE_FLAG` (128) and `FUTEX_CLOCK_REALTIME` (256)).
pub const FUTEX_CMD_MASK: u32 = !(128 | 256);

/// `futex(2)` commands, after [`FUTEX_CMD_MASK`].
pub mod cmd {
    pub const WAIT: u32 = 0;
    pub const WAKE: u32 = 1;
    pub const REQUEUE: u32 = 3;
    pub const CMP_REQUEUE: u32 = 4;
    pub const WAKE_OP: u32 = 5;
    pub const LOCK_PI: u32 = 6;
    pub const UNLOCK_PI: u32 = 7;
    pub const TRYLOCK_PI: u32 = 8;
    pub const WAIT_BITSET: u32 = 9;
    pub const WAKE_BITSET: u32 = 10;
    pub const WAIT_REQUEUE_PI: u32 = 11;
    pub const CMP_REQUEUE_PI: u32 = 12;
    pub const LOCK_PI2: u32 = 13;
}

/// The waiting operation of a wait, recorded as a sample label.
#[repr(u16)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WaitOp {
    Wait = 0,
    WaitBitset = 1,
    LockPi = 2,
    LockPi2 = 3,
    WaitRequeuePi = 4,
    /// futex2 `futex_wait(2)`.
    Futex2Wait = 5,
    /// futex2 `futex_waitv(2)`.
    Futex2Waitv = 6,
}

impl WaitOp {
    /// The wait operation of a masked `futex(2)` command, or `None` for a non-waiting one.
    #[inline(always)]
    pub fn of_cmd(cmd: u32) -> Option<Self> {
        match cmd {
            cmd::WAIT => Some(Self::Wait),
            cmd::WAIT_BITSET => Some(Self::WaitBitset),
            cmd::LOCK_PI => Some(Self::LockPi),
            cmd::LOCK_PI2 => Some(Self::LockPi2),
            cmd::WAIT_REQUEUE_PI => Some(Self::WaitRequeuePi),
            _ => None,
        }
    }

    /// The op stored as `value`.
    pub fn from_u16(value: u16) -> Option<Self> {
        Some(match value {
            0 => Self::Wait,
            1 => Self::WaitBitset,
            2 => Self::LockPi,
            3 => Self::LockPi2,
            4 => Self::WaitRequeuePi,
            5 => Self::Futex2Wait,
            6 => Self::Futex2Waitv,
            _ => return None,
        })
    }

    /// The name shown in the `futex_op` label.
    pub fn name(self) -> &'static str {
        match self {
            Self::Wait => "FUTEX_WAIT",
            Self::WaitBitset => "FUTEX_WAIT_BITSET",
            Self::LockPi => "FUTEX_LOCK_PI",
            Self::LockPi2 => "FUTEX_LOCK_PI2",
            Self::WaitRequeuePi => "FUTEX_WAIT_REQUEUE_PI",
            Self::Futex2Wait => "futex_wait",
            Self::Futex2Waitv => "futex_waitv",
        }
    }
}

/// Whether a masked `futex(2)` command wakes (or hands over) waiters of its `uaddr`.
#[inline(always)]
pub fn is_wake_cmd(cmd: u32) -> bool {
    matches!(
        cmd,
        cmd::WAKE
            | cmd::WAKE_BITSET
            | cmd::UNLOCK_PI
            | cmd::REQUEUE
            | cmd::CMP_REQUEUE
            | cmd::WAKE_OP
            | cmd::CMP_REQUEUE_PI
    )
}

/// Whether `cmd` moves waiters to a second word (`futex(2)`'s `uaddr2`) besides waking some.
pub fn is_requeue_cmd(cmd: u32) -> bool {
    matches!(cmd, cmd::REQUEUE | cmd::CMP_REQUEUE | cmd::CMP_REQUEUE_PI)
}

/// How a wait ended, from the syscall's return value.
#[repr(u16)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WaitOutcome {
    /// Returned 0 (or a `futex_waitv` index): woken, or the lock was acquired.
    Woken = 0,
    /// `ETIMEDOUT`.
    TimedOut = 1,
    /// `EINTR` / `ERESTARTSYS`: a signal.
    Interrupted = 2,
    /// `EAGAIN`: the word changed before the thread slept; it barely waited.
    ValueChanged = 3,
    /// Any other error.
    Failed = 4,
}

impl WaitOutcome {
    /// The outcome of a wait syscall that returned `ret`.
    #[inline(always)]
    pub fn of_ret(ret: i64) -> Self {
        match ret {
            r if r >= 0 => Self::Woken,
            -110 => Self::TimedOut,
            // EINTR, and the kernel-internal ERESTARTSYS / ERESTARTNOINTR / ERESTARTNOHAND /
            // ERESTART_RESTARTBLOCK a tracepoint can see before signal delivery rewrites them.
            -4 | -512 | -513 | -514 | -516 => Self::Interrupted,
            -11 => Self::ValueChanged,
            _ => Self::Failed,
        }
    }

    /// The outcome stored as `value`.
    pub fn from_u16(value: u16) -> Option<Self> {
        Some(match value {
            0 => Self::Woken,
            1 => Self::TimedOut,
            2 => Self::Interrupted,
            3 => Self::ValueChanged,
            4 => Self::Failed,
            _ => return None,
        })
    }

    /// The name shown in the `outcome` label.
    pub fn name(self) -> &'static str {
        match self {
            Self::Woken => "woken",
            Self::TimedOut => "timed_out",
            Self::Interrupted => "interrupted",
            Self::ValueChanged => "value_changed",
            Self::Failed => "failed",
        }
    }
}

/// Indices into the `FUTEX_COUNTERS` per-CPU array.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FutexCounter {
    /// Waits counted into the block maps.
    Waits = 0,
    /// Waits charged to a waker in the mutex maps.
    MutexCharged = 1,
    /// Woken waits with no recorded wake on their word during the wait (woken by another
    /// process, by the kernel at thread exit, or another word took the waker's slot), or woken
    /// directly by a requeue with no later wake of the word it moved waiters to.
    NoWaker = 2,
    /// Waits not followed because the spill map (the waits in flight of threads whose
    /// `FUTEX_PENDING` slot held another thread's) was full.
    PendingMapFull = 3,
    /// Waits lost because the block totals map was full.
    BlockMapFull = 4,
    /// Waits not charged because the mutex totals map was full.
    MutexMapFull = 5,
    /// Stacks not stored (stack map full or unreadable); counted with no stack.
    StackLost = 6,
    /// Wakes issued and recorded as a futex word's last waker.
    Wakes = 7,
    /// Wakes not recorded because the waker map has no slot for them (it was created with
    /// one entry: the profile is off).
    WakerMapFull = 8,
    /// Waits shorter than the block rate left out by its sampling (not walked).
    BlockUnsampled = 9,
    /// Woken waits not charged because the wake that ended them was not sampled.
    MutexUnsampled = 10,
    /// Woken waits of a requeued word charged (among `MutexCharged`) to the next wake of the
    /// word they were moved to (the unlock that woke them), not to the requeue.
    Requeued = 11,
}

impl FutexCounter {
    pub const COUNT: u32 = 12;
    pub const ALL: [FutexCounter; Self::COUNT as usize] = [
        FutexCounter::Waits,
        FutexCounter::MutexCharged,
        FutexCounter::NoWaker,
        FutexCounter::PendingMapFull,
        FutexCounter::BlockMapFull,
        FutexCounter::MutexMapFull,
        FutexCounter::StackLost,
        FutexCounter::Wakes,
        FutexCounter::WakerMapFull,
        FutexCounter::BlockUnsampled,
        FutexCounter::MutexUnsampled,
        FutexCounter::Requeued,
    ];
}

#[cfg(feature = "user")]
mod pod {
    // SAFETY: all repr(C) integer structs without implicit padding (sizes asserted above).
    unsafe impl aya::Pod for super::WaitKey {}
    unsafe impl aya::Pod for super::WaitTotals {}
    unsafe impl aya::Pod for super::PendingWait {}
    unsafe impl aya::Pod for super::WakerKey {}
    unsafe impl aya::Pod for super::Waker {}
}
