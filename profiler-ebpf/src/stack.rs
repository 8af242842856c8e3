//! Capturing a stack into the stack map, keyed by its hash and the caller's map set.
//!
//! `bpf_get_stack` (not a `STACK_TRACE` map) so that stacks live in an ordinary hash map: a
//! hash collision in a stack-trace map silently drops or overwrites stacks, a 64-bit hash key
//! in a hash map does not.
#![allow(non_upper_case_globals)]

use core::ffi::c_void;

use aya_ebpf::{
    bindings::BPF_NOEXIST,
    helpers::{bpf_get_current_uid_gid, generated::bpf_get_stack},
    macros::map,
    maps::{HashMap, PerCpuArray},
};
use profiler_common::{
    maps::STORED_STACKS_MAX_SLOT_ENTRIES,
    share::{ShareKey, SHARE_ALL, SHARE_UID},
    stack::{chunk_key, finish_hash, hash_frame, hash_start, set_key, STACK_CONTINUED, STACK_TRUNCATED},
    ShareUse, Stack, KERNEL_STACK_CHUNKS, KERNEL_STACK_DEPTH, MAX_USER_STACK_DEPTH, NO_STACK, OVER_SHARE_STACK,
    STACK_CHUNKS, STACK_PIECE_FRAMES,
};

use crate::{
    maps::{
        active_generation, add_or_insert, pick_set, Scratch, SCRATCH_SLOTS, STACKS, STACK_HASH_KEY, STACK_SCRATCH,
        STACK_SHARES_0, STACK_SHARES_1, STACK_SHARE_CAPS, STORED_STACKS_SLOT_ENTRIES,
    },
    user_stack,
};

/// Stacks this CPU stored lately, by hash (see [`store`]): a hit skips the stack-map lookup,
/// which costs about a microsecond per sample on these VMs. One table of
/// `STORED_STACKS_SLOT_ENTRIES` per [`Scratch`] slot (fewer on hosts with many CPUs).
#[map]
pub static STORED_STACKS: PerCpuArray<StoredStack> =
    PerCpuArray::with_max_entries(STORED_STACKS_MAX_SLOT_ENTRIES * SCRATCH_SLOTS, 0);

/// Where `bpf_get_stack` writes a kernel stack, one entry per [`Scratch`] slot: it needs one
/// buffer, and a stack entry holds [`STACK_PIECE_FRAMES`]. Sized in whole pieces, so a new
/// stack is spread into its pieces by whole-piece copies that never read past its end.
#[map]
pub static KERNEL_SCRATCH: PerCpuArray<[u64; KERNEL_SCRATCH_WORDS]> = PerCpuArray::with_max_entries(SCRATCH_SLOTS, 0);

const KERNEL_SCRATCH_WORDS: usize = KERNEL_STACK_CHUNKS * STACK_PIECE_FRAMES;

/// A stack hash known to be in the stack map of generation `generation`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct StoredStack {
    hash: u64,
    generation: u32,
    /// 1 once written (generation 0 is a real generation).
    valid: u32,
}

/// Why a stack is missing from a sample.
pub enum StackError {
    /// The kernel could not walk the stack.
    Walk,
    /// The stack map is full.
    MapFull,
}

const EEXIST: i32 = 17;

/// Walks the kernel stack of the sample (empty when it hit user mode) and stores it in map
/// set `set`, charged to process `tgid`'s share. Returns its hash, or [`NO_STACK`] when there
/// is none.
#[inline(always)]
pub fn capture_kernel(ctx: *mut c_void, set: u32, slot: Scratch, tgid: u32) -> Result<u64, StackError> {
    capture_kernel_skipping(ctx, set, slot, 0, tgid)
}

/// [`capture_kernel`] for a program whose own frames (and its trampoline's) are on the
/// kernel stack: the `skip` innermost frames are left out (`BPF_F_SKIP_FIELD_MASK`), so the
/// stack starts at the traced function.
#[inline(always)]
pub fn capture_kernel_skipping(
    ctx: *mut c_void,
    set: u32,
    slot: Scratch,
    skip: u64,
    tgid: u32,
) -> Result<u64, StackError> {
    let buffer = kernel_scratch(slot)?;
    let size = (KERNEL_STACK_DEPTH * 8) as u32;
    // SAFETY: the buffer is at least `size` bytes of map memory owned by this program for now.
    let ret = unsafe { bpf_get_stack(ctx, buffer.as_mut_ptr().cast(), size, skip & 0xff) };
    if ret < 0 {
        return Err(StackError::Walk);
    }
    match profiler_store_kernel_stack(set, slot as u32, (ret / 8) as u32, tgid) {
        CAPTURE_WALK_FAILED => Err(StackError::Walk),
        CAPTURE_MAP_FULL => Err(StackError::MapFull),
        hash => Ok(hash),
    }
}

/// The hashing and storing of a kernel stack that `bpf_get_stack` left in the scratch of
/// `slot` (`len` frames), as a global function, for the reason [`profiler_capture_user_stack`]
/// is one: inlined, the hash loop and the store were checked again for every way the
/// program reached them (`cpu_sample`: 43,000 of its verified instructions). Returns what
/// [`profiler_capture_user_stack`] does.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn profiler_store_kernel_stack(set: u32, slot: u32, len: u32, tgid: u32) -> u64 {
    if slot > Scratch::Switch as u32 {
        return CAPTURE_WALK_FAILED;
    }
    // SAFETY: `Scratch` is a `repr(u32)` enum of the values 0..=Switch, checked above.
    let slot = unsafe { core::mem::transmute::<u32, Scratch>(slot) };
    match store_kernel(set & 1, slot, len as usize, tgid) {
        Ok(hash) => hash,
        Err(StackError::Walk) => CAPTURE_WALK_FAILED,
        Err(StackError::MapFull) => CAPTURE_MAP_FULL,
    }
}

#[inline(always)]
fn store_kernel(set: u32, slot: Scratch, len: usize, tgid: u32) -> Result<u64, StackError> {
    let len = len.min(KERNEL_STACK_DEPTH);
    let head = scratch(slot)?;
    head.len = len as u32;
    head.truncated = if len == KERNEL_STACK_DEPTH { STACK_TRUNCATED } else { 0 };
    let hash = profiler_hash_kernel_stack(slot as u32, len as u32);
    store(set, slot, hash, tgid, Walked::Kernel)
}

/// [`hash_kernel`] of the kernel scratch of `slot`, as a global function: each of the hash
/// loop's exits (one per stack length) reached the store with its own view of the length,
/// and the store was checked again for each. A call's result is one unknown number.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn profiler_hash_kernel_stack(slot: u32, len: u32) -> u64 {
    let Some(buffer) = KERNEL_SCRATCH.get_ptr(slot) else { return 0 };
    // SAFETY: this CPU's kernel scratch for the caller's context.
    hash_kernel(unsafe { &*buffer }, len as usize)
}

/// Walks the current thread's user stack (see [`crate::user_stack`]) and stores it in map set
/// `set`. Returns its hash, or [`NO_STACK`] for kernel threads. `truncated` is set at the
/// depth limit. `slot`: the caller's context (see [`Scratch`]); `tgid`: the process, as the
/// profiler sees it (see `maps::Task`).
#[inline(always)]
pub fn capture_user(set: u32, truncated: &mut bool, slot: Scratch, tgid: u32) -> Result<u64, StackError> {
    let hash = match profiler_capture_user_stack(set, slot as u32, tgid) {
        CAPTURE_WALK_FAILED => return Err(StackError::Walk),
        CAPTURE_MAP_FULL => return Err(StackError::MapFull),
        hash => hash,
    };
    if hash != NO_STACK {
        *truncated = scratch(slot)?.truncated & STACK_TRUNCATED != 0;
    }
    Ok(hash)
}

/// What [`profiler_capture_user_stack`] returns for the two [`StackError`]s: odd values of
/// at least 3, which no stack hash (even), [`NO_STACK`] or [`OVER_SHARE_STACK`] is.
const CAPTURE_WALK_FAILED: u64 = u64::MAX;
const CAPTURE_MAP_FULL: u64 = u64::MAX - 2;

/// [`capture_user`]'s work as a global function: the verifier checks a global function once
/// per program, on its own with its arguments unknown, and takes its result as an unknown
/// number. Inlined, the walk and the store were verified again for every way a caller
/// reached them: `cpu_sample` and `futex_exit` needed 936,000 and 952,000 of the verifier's
/// million instructions, and the futex programs' array bookkeeping took `futex_exit` past
/// the limit (the block and mutex profiles failed to load). As a global function the walk is
/// checked once per program (with the searches and the store's rare parts global functions
/// of their own: about 30,000 instructions, see docs/unwinding.md). `slot` is a [`Scratch`].
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn profiler_capture_user_stack(set: u32, slot: u32, tgid: u32) -> u64 {
    // One path on, not one per context: the walk is the same for every slot.
    if slot > Scratch::Switch as u32 {
        return CAPTURE_WALK_FAILED;
    }
    // SAFETY: `Scratch` is a `repr(u32)` enum of the values 0..=Switch, checked above.
    let slot = unsafe { core::mem::transmute::<u32, Scratch>(slot) };
    match walk_and_store(set & 1, slot, tgid) {
        Ok(hash) => hash,
        Err(StackError::Walk) => CAPTURE_WALK_FAILED,
        Err(StackError::MapFull) => CAPTURE_MAP_FULL,
    }
}

/// [`capture_user`] inlined into its caller, for a program whose own stack frame leaves no
/// room for the global function's: the BPF stack of a call chain is 512 bytes in all, and
/// `offcpu_switch`'s frame with the function's and the walk's callback's is past it.
#[inline(always)]
pub fn capture_user_inline(set: u32, truncated: &mut bool, slot: Scratch, tgid: u32) -> Result<u64, StackError> {
    let hash = walk_and_store(set, slot, tgid)?;
    if hash != NO_STACK {
        *truncated = scratch(slot)?.truncated & STACK_TRUNCATED != 0;
    }
    Ok(hash)
}

#[inline(always)]
fn walk_and_store(set: u32, slot: Scratch, tgid: u32) -> Result<u64, StackError> {
    let Some(hash) = user_stack::walk(slot, tgid) else { return Ok(NO_STACK) };
    store(set, slot, hash, tgid, Walked::User)
}

/// Where a walk left its frames.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Walked {
    /// In the scratch pieces (the user walker writes them frame by frame).
    User,
    /// In [`KERNEL_SCRATCH`]: spread into the pieces only when the stack is new.
    Kernel,
}

#[inline(always)]
fn kernel_scratch(slot: Scratch) -> Result<&'static mut [u64; KERNEL_SCRATCH_WORDS], StackError> {
    let ptr = KERNEL_SCRATCH.get_ptr_mut(slot as u32).ok_or(StackError::Walk)?;
    // SAFETY: as in `piece`: this CPU's entry for the caller's context.
    Ok(unsafe { &mut *ptr })
}

/// Copies the caller's kernel stack into its scratch pieces, a whole piece per copy (the
/// buffer is whole pieces long; frames past the stack's length are not read back).
#[inline(always)]
fn spread_kernel(slot: Scratch, len: usize) -> Result<(), StackError> {
    let buffer = kernel_scratch(slot)?;
    for n in 0..KERNEL_STACK_CHUNKS {
        if n * STACK_PIECE_FRAMES >= len {
            break;
        }
        let piece = piece(slot, n)?;
        let from = &buffer[n * STACK_PIECE_FRAMES..(n + 1) * STACK_PIECE_FRAMES];
        piece.ips.copy_from_slice(from);
    }
    Ok(())
}

#[inline(always)]
fn scratch(slot: Scratch) -> Result<&'static mut Stack, StackError> {
    piece(slot, 0)
}

/// Piece `n` of the caller's scratch stack (see `maps::STACK_SCRATCH`).
#[inline(always)]
fn piece(slot: Scratch, n: usize) -> Result<&'static mut Stack, StackError> {
    let ptr = STACK_SCRATCH.get_ptr_mut(slot as u32 * STACK_CHUNKS as u32 + n as u32).ok_or(StackError::Walk)?;
    // SAFETY: this CPU's slot of the scratch array for the caller's context: no program of
    // the same context nests on a CPU, and the other context has its own slot.
    Ok(unsafe { &mut *ptr })
}

/// The hash of a kernel stack of `len` frames.
#[inline(always)]
fn hash_kernel(frames: &[u64; KERNEL_SCRATCH_WORDS], len: usize) -> u64 {
    let mut hash = hash_start(STACK_HASH_KEY.load());
    for (i, &ip) in frames.iter().enumerate().take(KERNEL_STACK_DEPTH) {
        if i >= len {
            break;
        }
        hash = hash_frame(hash, ip);
    }
    finish_hash(hash, len as u32)
}

/// Inserts `stack` under `key` unless it is there. Err when the map is full.
#[inline(always)]
fn insert(key: u64, stack: &Stack) -> Result<(), StackError> {
    match STACKS.insert(&key, stack, BPF_NOEXIST as u64) {
        Ok(()) => Ok(()),
        Err(err) if err == -EEXIST => Ok(()),
        Err(_) => Err(StackError::MapFull),
    }
}

/// Stores the caller's scratch stack of `len` frames under `hash` in map set `set`: the
/// pieces after the first under their [`chunk_key`]s, last first, then the first, so a stack
/// whose hash is in the set has its whole chain there.
#[inline(always)]
fn insert_chain(set: u32, hash: u64, slot: Scratch, len: usize) -> Result<(), StackError> {
    let pieces = len.div_ceil(STACK_PIECE_FRAMES);
    for n in (1..STACK_CHUNKS).rev() {
        if n >= pieces {
            continue;
        }
        let piece = piece(slot, n)?;
        piece.len = (len - n * STACK_PIECE_FRAMES).min(STACK_PIECE_FRAMES) as u32;
        piece.truncated = if n + 1 < pieces { STACK_CONTINUED } else { 0 };
        insert(set_key(chunk_key(hash, n as u32), set), piece)?;
    }
    let head = scratch(slot)?;
    head.len = len.min(STACK_PIECE_FRAMES) as u32;
    if pieces > 1 {
        head.truncated |= STACK_CONTINUED;
    }
    insert(set_key(hash, set), head)
}

/// Inserts the caller's scratch stack, whose hash is `hash`, into map set `set` unless
/// already there, or returns [`OVER_SHARE_STACK`] when the stack is new and process `tgid` (or its
/// uid) holds its share of the map. `walked`: where its frames are.
#[inline(always)]
fn store(set: u32, slot: Scratch, hash: u64, tgid: u32, walked: Walked) -> Result<u64, StackError> {
    let len = (scratch(slot)?.len as usize).min(MAX_USER_STACK_DEPTH);
    if len == 0 {
        return Ok(NO_STACK);
    }
    // Most samples repeat a stack this CPU stored lately: the per-CPU note of it is an array
    // slot, cheaper than a hash lookup. It holds only for the generation it was written in:
    // each flip, userspace drains and clears the set. If the sets flipped since the caller
    // chose `set` (the generation's parity differs), neither read nor write the note.
    let generation = active_generation();
    let noted = generation & 1 == set;
    // Hashes are even: the index starts at bit 1.
    let entries = STORED_STACKS_SLOT_ENTRIES.load();
    let note_index = slot as u32 * entries + ((hash >> 1) as u32 & entries.wrapping_sub(1));
    if noted {
        if let Some(note) = STORED_STACKS.get_ptr(note_index) {
            // SAFETY: this CPU's entry in the table of the caller's context (see `scratch`).
            let note = unsafe { &*note };
            if note.valid == 1 && note.hash == hash && note.generation == generation {
                return Ok(hash);
            }
        }
    }
    // Otherwise a lookup is cheaper than an update, which takes the bucket lock (and for this
    // map allocates) before it finds the key.
    // SAFETY: only checks for presence.
    if unsafe { STACKS.get(&set_key(hash, set)) }.is_none() {
        if profiler_take_share(set, tgid, len.div_ceil(STACK_PIECE_FRAMES) as u32) == 0 {
            return Ok(OVER_SHARE_STACK);
        }
        if walked == Walked::Kernel {
            spread_kernel(slot, len)?;
        }
        match profiler_insert_chain(set, hash, slot as u32, len as u32) {
            0 => {}
            1 => return Err(StackError::MapFull),
            _ => return Err(StackError::Walk),
        }
    }
    if noted {
        if let Some(note) = STORED_STACKS.get_ptr_mut(note_index) {
            // SAFETY: as above.
            unsafe { *note = StoredStack { hash, generation, valid: 1 } };
        }
    }
    Ok(hash)
}

/// [`take_share`] in set `set`'s shares map, as a global function: it runs only for a stack
/// new to the set, and inlined, its three counts' branches multiplied the ways the store was
/// checked. 1 when charged, 0 when refused.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn profiler_take_share(set: u32, tgid: u32, entries: u32) -> u32 {
    take_share(pick_set(set & 1, &STACK_SHARES_0, &STACK_SHARES_1), tgid, entries as u64) as u32
}

/// [`insert_chain`] as a global function, for the same reason as [`profiler_take_share`].
/// 0 when stored, 1 when the stack map is full, 2 when a scratch piece is missing (or `slot`
/// is not a [`Scratch`]).
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn profiler_insert_chain(set: u32, hash: u64, slot: u32, len: u32) -> u32 {
    if slot > Scratch::Switch as u32 {
        return 2;
    }
    // SAFETY: `Scratch` is a `repr(u32)` enum of the values 0..=Switch, checked above.
    let slot = unsafe { core::mem::transmute::<u32, Scratch>(slot) };
    match insert_chain(set & 1, hash, slot, (len as usize).min(MAX_USER_STACK_DEPTH)) {
        Ok(()) => 0,
        Err(StackError::MapFull) => 1,
        Err(StackError::Walk) => 2,
    }
}

/// Charges `entries` new stack-map entries to process `tgid` and the current uid in `shares`
/// (the stack map's set), or, when either already holds its cap (`STACK_SHARE_CAPS`) and the
/// set's table is past the point where caps bind, counts a refusal against the process and
/// returns false. Paid only for a stack new to the set:
/// samples repeat stacks, so this is rare once a process is warm. The check and the charge
/// are not one atomic step, so concurrent inserts of one owner may pass its cap by a few.
#[inline(always)]
fn take_share(shares: &HashMap<ShareKey, ShareUse>, tgid: u32, entries: u64) -> bool {
    let caps = STACK_SHARE_CAPS.load();
    if caps.per_process == 0 && caps.per_uid == 0 {
        return true;
    }
    let process = tgid as ShareKey;
    let uid = SHARE_UID | (bpf_get_current_uid_gid() as u32) as ShareKey;
    let holds = |key: &ShareKey, cap: u32| {
        // SAFETY: a plain read of a live map value's counter.
        cap != 0 && unsafe { shares.get(key) }.is_some_and(|used| used.entries >= cap as u64)
    };
    if (holds(&process, caps.per_process) || holds(&uid, caps.per_uid)) && holds(&SHARE_ALL, caps.binding_from) {
        add_or_insert(shares, &process, &ShareUse { entries: 0, refused: 1 });
        return false;
    }
    // A full shares map (more owners than it holds) leaves the insert uncapped: refusing
    // would punish a process for the number of others.
    let charged = ShareUse { entries, refused: 0 };
    add_or_insert(shares, &process, &charged);
    if caps.per_uid != 0 {
        add_or_insert(shares, &uid, &charged);
    }
    add_or_insert(shares, &SHARE_ALL, &charged);
    true
}
