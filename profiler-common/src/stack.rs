//! Stacks as the kernel stores them: a length and up to [`STACK_PIECE_FRAMES`] instruction
//! pointers, leaf first, keyed by a 64-bit hash of the frames. A stack deeper than one entry
//! (a user stack of up to [`MAX_USER_STACK_DEPTH`] frames, a kernel stack of up to
//! [`KERNEL_STACK_DEPTH`]) is stored as a chain: the first [`STACK_PIECE_FRAMES`] frames
//! under the stack's hash, each further piece under [`chunk_key`]`(hash, n)`, each piece but
//! the last flagged [`STACK_CONTINUED`]. Entries are 512 bytes whatever the depth, so the
//! stack map's memory per entry does not grow with the limits.
//!
//! Both map sets share one stack map: hashes and piece keys are even, and an entry's key is
//! [`set_key`]`(key, set)`, whose low bit names the set that stored it. Userspace drains a
//! set's entries by that bit while the kernel fills the other set's, so the two sets share
//! one table's capacity instead of each preallocating its own.

/// Frames per stored stack entry. 63 makes an entry 512 bytes: most stacks fit one (half
/// the kernel memory of the earlier 127-frame entries, priced at the maps' full size), and a
/// deeper one takes an entry more per 63 frames.
pub const STACK_PIECE_FRAMES: usize = 63;

/// Frames of a kernel stack: the kernel's `perf_event_max_stack` default.
pub const KERNEL_STACK_DEPTH: usize = 127;

/// Frames of a user stack, walked and stored as up to [`STACK_CHUNKS`] entries.
pub const MAX_USER_STACK_DEPTH: usize = 512;

/// Entries the deepest stack takes (a user stack of [`MAX_USER_STACK_DEPTH`] frames).
pub const STACK_CHUNKS: usize = MAX_USER_STACK_DEPTH.div_ceil(STACK_PIECE_FRAMES);

/// Entries a kernel stack of [`KERNEL_STACK_DEPTH`] frames takes.
pub const KERNEL_STACK_CHUNKS: usize = KERNEL_STACK_DEPTH.div_ceil(STACK_PIECE_FRAMES);

/// [`Stack::truncated`] bit: the walk stopped at the depth limit (the stack may be deeper).
pub const STACK_TRUNCATED: u32 = 1;
/// [`Stack::truncated`] bit: the frames continue in the next piece of the chain.
pub const STACK_CONTINUED: u32 = 2;

/// The stack hash recorded when no stack was taken (kernel thread with no user stack, a
/// sample in user mode with no kernel stack, or a failed walk, which is counted).
pub const NO_STACK: u64 = 0;

/// The stack hash recorded for a new stack the kernel did not keep because its process (or
/// its uid) already holds its share of this map set's stack table (see [`crate::share`]):
/// the sample still counts, without frames.
pub const OVER_SHARE_STACK: u64 = 1;

/// One stack, leaf first. Only `ips[..len]` is meaningful.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Stack {
    /// Number of valid frames in `ips` (in the scratch copy of a walk's first piece: of the
    /// whole walk).
    pub len: u32,
    /// [`STACK_TRUNCATED`] when the walk stopped at the depth limit (the stack may be
    /// deeper), [`STACK_CONTINUED`] when the frames go on in the chain's next piece.
    pub truncated: u32,
    /// Instruction pointers, leaf first: the sampled pc, then return addresses.
    pub ips: [u64; STACK_PIECE_FRAMES],
}

const _: () = assert!(core::mem::size_of::<Stack>() == 8 + 8 * STACK_PIECE_FRAMES);
const _: () = assert!(KERNEL_STACK_CHUNKS <= STACK_CHUNKS);

impl Stack {
    /// The valid frames, leaf first.
    pub fn frames(&self) -> &[u64] {
        let len = (self.len as usize).min(STACK_PIECE_FRAMES);
        &self.ips[..len]
    }
}

/// Folds one frame into a stack hash. The kernel and userspace (the thread dump's walker,
/// the tests) share this so that both agree on a stack's key. A 64-bit multiplicative mix per
/// frame (not per byte) keeps the kernel's walk at a few instructions per frame; the walker
/// folds each frame as it finds it, so a stack is hashed without a second loop over it.
#[inline(always)]
pub fn hash_frame(state: u64, ip: u64) -> u64 {
    let h = (state ^ ip).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    h ^ (h >> 29)
}

/// The starting state of [`hash_frame`] before the key.
pub const HASH_SEED: u64 = 0xcbf2_9ce4_8422_2325;

/// The starting state of [`hash_frame`] under `key` (the load's random
/// `globals::STACK_HASH_KEY`): ids of crafted stacks cannot be made to collide without it.
#[inline(always)]
pub fn hash_start(key: u64) -> u64 {
    hash_frame(HASH_SEED, key)
}

/// Ends a stack's hash: folds in its number of frames and makes the result even (the low bit
/// of a map key is its set, see [`set_key`]) and never [`NO_STACK`] (nor [`OVER_SHARE_STACK`],
/// which is odd).
#[inline(always)]
pub fn finish_hash(state: u64, len: u32) -> u64 {
    nonzero(hash_frame(state, (1 << 63) | len as u64))
}

/// The hash of a whole stack under `key`, leaf first: what the kernel computes frame by frame.
pub fn stack_hash(key: u64, frames: &[u64]) -> u64 {
    finish_hash(frames.iter().fold(hash_start(key), |h, &ip| hash_frame(h, ip)), frames.len() as u32)
}

/// The key of piece `chunk` (1, 2, …) of the stack whose hash is `hash`.
#[inline(always)]
pub fn chunk_key(hash: u64, chunk: u32) -> u64 {
    nonzero(hash_frame(hash, 0x5ca1_ab1e_0000_0000 | chunk as u64))
}

/// The stack map's key of the entry stored under `key` (a stack's hash or a [`chunk_key`]) by
/// map set `set`: its low bit is the set.
#[inline(always)]
pub const fn set_key(key: u64, set: u32) -> u64 {
    key | (set & 1) as u64
}

/// `h` made even and not [`NO_STACK`].
#[inline(always)]
fn nonzero(h: u64) -> u64 {
    let even = h & !1;
    if even == NO_STACK {
        2
    } else {
        even
    }
}

#[cfg(feature = "user")]
// SAFETY: repr(C), only integers, no padding bytes (size asserted above).
unsafe impl aya::Pod for Stack {}

#[cfg(test)]
mod tests {
    use super::*;

    fn hash(frames: &[u64]) -> u64 {
        stack_hash(0, frames)
    }

    #[test]
    fn the_key_changes_every_id() {
        assert_ne!(stack_hash(1, &[1, 2]), stack_hash(2, &[1, 2]));
    }

    #[test]
    fn hashes_depend_on_order_and_length_and_are_never_no_stack() {
        assert_ne!(hash(&[1, 2]), hash(&[2, 1]));
        assert_ne!(hash(&[0]), hash(&[0, 0]));
        assert_ne!(hash(&[]), NO_STACK);
        assert_eq!(nonzero(NO_STACK), 2);
        assert_eq!(nonzero(OVER_SHARE_STACK), 2);
        assert_eq!(nonzero(7), 6);
        assert_eq!(hash(&[0x401000, 0x401234]), hash(&[0x401000, 0x401234]));
    }

    #[test]
    fn chunk_keys_differ_from_the_head_and_each_other() {
        let head = hash(&[1, 2, 3]);
        assert_ne!(chunk_key(head, 1), head);
        assert_ne!(chunk_key(head, 1), chunk_key(head, 2));
        const { assert!(STACK_CHUNKS * STACK_PIECE_FRAMES >= MAX_USER_STACK_DEPTH) };
    }

    /// Both sets' entries of one stack live side by side in the one map, and a key's set is
    /// its low bit.
    #[test]
    fn ids_and_piece_keys_leave_the_low_bit_to_the_set() {
        for frames in [&[1u64, 2, 3][..], &[0x401000], &[]] {
            let head = hash(frames);
            for key in [head, chunk_key(head, 1), chunk_key(head, 8)] {
                assert_eq!(key & 1, 0, "{key:#x}");
                assert_ne!(set_key(key, 0), set_key(key, 1));
                assert_eq!(set_key(key, 1) & !1, key);
            }
        }
    }

    #[test]
    fn frames_are_capped_at_the_depth_limit() {
        let mut stack = Stack { len: STACK_PIECE_FRAMES as u32 + 5, truncated: 1, ips: [7; STACK_PIECE_FRAMES] };
        assert_eq!(stack.frames().len(), STACK_PIECE_FRAMES);
        stack.len = 2;
        assert_eq!(stack.frames(), &[7, 7]);
    }
}
