//! Capturing a stack into the stack map of the active set, keyed by its hash.
//!
//! `bpf_get_stack` (not a `STACK_TRACE` map) so that stacks live in an ordinary hash map: a
//! hash collision in a stack-trace map silently drops or overwrites stacks, a 64-bit hash key
//! in a hash map does not.
#![allow(non_upper_case_globals)]

use core::ffi::c_void;

use aya_ebpf::{
    bindings::BPF_NOEXIST,
    helpers::generated::bpf_get_stack,
    macros::map,
    maps::{HashMap, PerCpuArray},
};
use profiler_common::{
    stack::{finish_hash, hash_frame, hash_seed},
    Stack, MAX_STACK_DEPTH, NO_STACK,
};

use crate::{
    maps::{active_generation, Scratch, SCRATCH_SLOTS, STACKS_1, STACK_SCRATCH},
    user_stack,
};

/// Stacks this CPU stored lately, by hash (see [`store`]): a hit skips the stack-map lookup,
/// which costs about a microsecond per sample on these VMs. One table of
/// [`STORED_STACKS_ENTRIES`] per [`Scratch`] slot.
#[map]
pub static STORED_STACKS: PerCpuArray<StoredStack> =
    PerCpuArray::with_max_entries(STORED_STACKS_ENTRIES * SCRATCH_SLOTS, 0);

/// Entries of one [`STORED_STACKS`] table; a power of two (indexed by the hash's low bits).
const STORED_STACKS_ENTRIES: u32 = 256;

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

/// Walks the kernel stack of the sample (empty when it hit user mode) and stores it in
/// `stacks`. Returns its hash, or [`NO_STACK`] when there is none.
#[inline(always)]
pub fn capture_kernel(ctx: *mut c_void, stacks: &HashMap<u64, Stack>, slot: Scratch) -> Result<u64, StackError> {
    let scratch = scratch(slot)?;
    let size = (MAX_STACK_DEPTH * 8) as u32;
    // SAFETY: the buffer is `size` bytes of map memory owned by this program for now.
    let ret = unsafe { bpf_get_stack(ctx, scratch.ips.as_mut_ptr().cast(), size, 0) };
    if ret < 0 {
        return Err(StackError::Walk);
    }
    let len = (ret as usize / 8).min(MAX_STACK_DEPTH);
    scratch.len = len as u32;
    scratch.truncated = (len == MAX_STACK_DEPTH) as u32;
    store(scratch, stacks, slot)
}

/// Walks the current thread's user stack (see [`crate::user_stack`]) and stores it. Returns
/// its hash, or [`NO_STACK`] for kernel threads. `truncated` is set at the depth limit.
/// `slot`: the caller's context (see [`Scratch`]); `tgid`: the process, as the profiler sees
/// it (see `maps::Task`).
#[inline(always)]
pub fn capture_user(
    stacks: &HashMap<u64, Stack>,
    truncated: &mut bool,
    slot: Scratch,
    tgid: u32,
) -> Result<u64, StackError> {
    if !user_stack::walk(slot, tgid) {
        return Ok(NO_STACK);
    }
    let scratch = scratch(slot)?;
    *truncated = scratch.truncated != 0;
    store(scratch, stacks, slot)
}

#[inline(always)]
fn scratch(slot: Scratch) -> Result<&'static mut Stack, StackError> {
    let ptr = STACK_SCRATCH.get_ptr_mut(slot as u32).ok_or(StackError::Walk)?;
    // SAFETY: this CPU's slot of the scratch array for the caller's context: no program of
    // the same context nests on a CPU, and the other context has its own slot.
    Ok(unsafe { &mut *ptr })
}

/// Hashes the frames of `scratch` and inserts them into `stacks` unless already there.
#[inline(always)]
fn store(scratch: &mut Stack, stacks: &HashMap<u64, Stack>, slot: Scratch) -> Result<u64, StackError> {
    let len = (scratch.len as usize).min(MAX_STACK_DEPTH);
    if len == 0 {
        return Ok(NO_STACK);
    }

    let mut hash = hash_seed(len as u32);
    for i in 0..MAX_STACK_DEPTH {
        if i >= len {
            break;
        }
        hash = hash_frame(hash, scratch.ips[i]);
    }
    let hash = finish_hash(hash);
    // Most samples repeat a stack this CPU stored lately: the per-CPU note of it is an array
    // slot, cheaper than a hash lookup. It holds only for the generation it was written in:
    // each flip, userspace drains and clears the set. If the sets flipped since the caller
    // chose `stacks` (the generation's parity differs), neither read nor write the note.
    let generation = active_generation();
    let noted = generation & 1 == core::ptr::eq(stacks, &STACKS_1) as u32;
    let note_index = slot as u32 * STORED_STACKS_ENTRIES + (hash as u32 & (STORED_STACKS_ENTRIES - 1));
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
    if unsafe { stacks.get(&hash) }.is_none() {
        match stacks.insert(&hash, &*scratch, BPF_NOEXIST as u64) {
            Ok(()) => {}
            Err(err) if err == -EEXIST => {}
            Err(_) => return Err(StackError::MapFull),
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
