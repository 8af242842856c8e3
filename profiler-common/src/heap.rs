//! The heap profile's map layout: sampled allocations in flight, live, and allocated totals.

/// Key of the live-allocation map: one entry per sampled, not yet freed block.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct LiveKey {
    pub tgid: u32,
    pub _pad: u32,
    /// The block's address in the process.
    pub addr: u64,
}

/// A sampled live block.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LiveAlloc {
    /// Requested size in bytes.
    pub size: u64,
    /// Hash of the allocating user stack (in the stack maps), or `NO_STACK`.
    pub stack: u64,
}

/// Key of the allocated-totals map: (process, allocating stack, block size), Go's heap
/// bucket. Each sampled block stands for `1 / (1 − e^(−size/rate))` blocks, which depends on
/// its own size: one stack allocating 16 B and 1 MiB blocks needs two scales, so the exact
/// requested size is part of the key (an average per stack would be biased).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct HeapKey {
    pub tgid: u32,
    pub _pad: u32,
    pub stack: u64,
    /// Requested size in bytes of every block counted under this key.
    pub size: u64,
}

/// Sampled allocations under one key, unscaled (userspace scales them to estimates);
/// `bytes` is `count × size` of the key.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HeapTotals {
    pub count: u64,
    pub bytes: u64,
}

/// An allocator call between its entry and its return, per thread. Every outermost call
/// leaves one, sampled or not, so that a call it makes inside (or tail-jumps to: glibc's
/// `reallocarray` jumps to `realloc`, `realloc(NULL, n)` to `malloc`) is not sampled again.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct PendingAlloc {
    /// Requested size in bytes (n × size for calloc).
    pub size: u64,
    /// realloc's old block, or 0.
    pub old_ptr: u64,
    /// posix_memalign's `void **memptr`, or 0.
    pub out_ptr: u64,
    /// User stack pointer at entry: the return lands at `entry_sp + 8`, which tells this
    /// call's return from the return of an allocator function it calls internally.
    pub entry_sp: u64,
    /// 1 when the byte sampler picked this allocation.
    pub sampled: u32,
    pub _pad: u32,
    /// `bpf_ktime_get_ns` at entry: an entry far older than any allocator call is left over
    /// from a call that never returned (a longjmp out of it) and is ignored.
    pub entered_ns: u64,
}

const _: () = assert!(core::mem::size_of::<LiveKey>() == 16);
const _: () = assert!(core::mem::size_of::<LiveAlloc>() == 16);
const _: () = assert!(core::mem::size_of::<HeapKey>() == 24);
const _: () = assert!(core::mem::size_of::<HeapTotals>() == 16);
const _: () = assert!(core::mem::size_of::<PendingAlloc>() == 48);

/// Indices into the `HEAP_COUNTERS` per-CPU array.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HeapCounter {
    /// Allocations picked by the sampler and recorded.
    Sampled = 0,
    /// Sampled allocations not tracked as live because the live map was full.
    LiveMapFull = 1,
    /// Sampled allocations lost because the totals map was full.
    TotalsMapFull = 2,
    /// Sampled allocations whose stack was not stored (stack map full or unreadable).
    StackLost = 3,
    /// Allocator calls not followed because the in-flight map was full.
    PendingMapFull = 4,
    /// Frees of sampled blocks (removed from the live map).
    Freed = 5,
    /// posix_memalign results that could not be read back from user memory.
    OutPtrUnreadable = 6,
}

impl HeapCounter {
    pub const COUNT: u32 = 7;
    pub const ALL: [HeapCounter; Self::COUNT as usize] = [
        HeapCounter::Sampled,
        HeapCounter::LiveMapFull,
        HeapCounter::TotalsMapFull,
        HeapCounter::StackLost,
        HeapCounter::PendingMapFull,
        HeapCounter::Freed,
        HeapCounter::OutPtrUnreadable,
    ];
}

/// Number of equal-probability strata of the exponential distribution that `HEAP_INTERVALS`
/// describes (a power of two, so a random index is a mask).
pub const HEAP_INTERVALS_LEN: u32 = 1024;

/// Entries of `HEAP_INTERVALS`: the edges of the strata, one more than there are strata.
pub const HEAP_INTERVAL_EDGES: u32 = HEAP_INTERVALS_LEN + 1;

/// A sampling interval drawn from the stratum `[lo, hi)`, `fraction / 2^32` of the way in.
///
/// Drawing the stratum's edge or midpoint instead would give every interval the same low bits
/// wherever the distribution is nearly linear (near 0, the strata are `mean / 1024` wide, a
/// multiple of 64 at the default rate): an allocation pattern that repeats with a power-of-two
/// period (a site that keeps every 4th 16-byte block) then sees its samples fall on some phases
/// more than others, and inuse came out 15% high on such a site. Uniform within the stratum, the
/// draw is continuous to within its rounding to whole bytes.
///
/// Written without a 128-bit product (BPF has none): `(hi − lo) × fraction / 2^32` by 32-bit
/// halves of the width, which cannot overflow.
#[inline(always)]
pub fn interval_in_stratum(lo: u64, hi: u64, fraction: u32) -> u64 {
    let width = hi.saturating_sub(lo);
    let f = fraction as u64;
    lo + (width >> 32) * f + (((width & 0xffff_ffff) * f) >> 32)
}

#[cfg(feature = "user")]
mod pod {
    // SAFETY: all repr(C) integer structs without implicit padding (sizes asserted above).
    unsafe impl aya::Pod for super::LiveKey {}
    unsafe impl aya::Pod for super::LiveAlloc {}
    unsafe impl aya::Pod for super::HeapKey {}
    unsafe impl aya::Pod for super::HeapTotals {}
    unsafe impl aya::Pod for super::PendingAlloc {}
}
