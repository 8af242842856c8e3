//! Capturing a stack into the stack map of the active set, keyed by its hash.
//!
//! `bpf_get_stack` (not a `STACK_TRACE` map) so that stacks live in an ordinary hash map: a
//! hash collision in a stack-trace map silently drops or overwrites stacks, a 64-bit hash key
//! in a hash map does not.

use core::ffi::c_void;

use aya_ebpf::{bindings::BPF_NOEXIST, helpers::generated::bpf_get_stack, maps::HashMap};
use profiler_common::{
    stack::{finish_hash, hash_frame, hash_seed},
    Stack, MAX_STACK_DEPTH, NO_STACK,
};

use crate::maps::STACK_SCRATCH;

/// Why a stack is missing from a sample.
pub enum StackError {
    /// The kernel could not walk the stack.
    Walk,
    /// The stack map is full.
    MapFull,
}

const EEXIST: i32 = 17;

/// Walks the stack selected by `flags` (0 = kernel, `BPF_F_USER_STACK` = user) and stores it in
/// `stacks`. Returns its hash, or [`NO_STACK`] when there is none (user mode has no kernel
/// stack; kernel threads have no user stack). `truncated` is set when the walk hit the depth
/// limit.
#[inline(always)]
pub fn capture(
    ctx: *mut c_void,
    flags: u64,
    stacks: &HashMap<u64, Stack>,
    truncated: &mut bool,
) -> Result<u64, StackError> {
    let Some(scratch) = STACK_SCRATCH.get_ptr_mut(0) else {
        return Err(StackError::Walk);
    };
    // SAFETY: `scratch` points to this CPU's slot of the scratch array, which nothing else
    // touches while this program runs.
    let scratch = unsafe { &mut *scratch };
    let size = (MAX_STACK_DEPTH * 8) as u32;
    // SAFETY: the buffer is `size` bytes of map memory owned by this program for now.
    let ret = unsafe { bpf_get_stack(ctx, scratch.ips.as_mut_ptr().cast(), size, flags) };
    if ret < 0 {
        return Err(StackError::Walk);
    }
    let len = (ret as usize / 8).min(MAX_STACK_DEPTH);
    if len == 0 {
        return Ok(NO_STACK);
    }
    scratch.len = len as u32;
    scratch.truncated = (len == MAX_STACK_DEPTH) as u32;
    *truncated = len == MAX_STACK_DEPTH;

    let mut hash = hash_seed(len as u32);
    for i in 0..MAX_STACK_DEPTH {
        if i >= len {
            break;
        }
        hash = hash_frame(hash, scratch.ips[i]);
    }
    let hash = finish_hash(hash);
    match stacks.insert(&hash, &*scratch, BPF_NOEXIST as u64) {
        Ok(()) => Ok(hash),
        Err(err) if err == -EEXIST => Ok(hash),
        Err(_) => Err(StackError::MapFull),
    }
}
