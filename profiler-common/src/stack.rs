//! Stacks as the kernel stores them: a length and up to [`MAX_STACK_DEPTH`] instruction
//! pointers, leaf first, keyed by a 64-bit hash of the frames.

/// Frames kept per stack: the kernel's `perf_event_max_stack` default.
pub const MAX_STACK_DEPTH: usize = 127;

/// The stack hash recorded when no stack was taken (kernel thread with no user stack, a
/// sample in user mode with no kernel stack, or a failed walk, which is counted).
pub const NO_STACK: u64 = 0;

/// One stack, leaf first. Only `ips[..len]` is meaningful.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Stack {
    /// Number of valid frames in `ips`.
    pub len: u32,
    /// 1 when the walk stopped at [`MAX_STACK_DEPTH`] frames (the stack may be deeper).
    pub truncated: u32,
    /// Instruction pointers, leaf first: the sampled pc, then return addresses.
    pub ips: [u64; MAX_STACK_DEPTH],
}

const _: () = assert!(core::mem::size_of::<Stack>() == 8 + 8 * MAX_STACK_DEPTH);

impl Stack {
    /// The valid frames, leaf first.
    pub fn frames(&self) -> &[u64] {
        let len = (self.len as usize).min(MAX_STACK_DEPTH);
        &self.ips[..len]
    }
}

/// Folds one frame into a stack hash. The kernel and the userspace tests share this so that
/// both agree on a stack's key. A 64-bit multiplicative mix per frame (not per byte) keeps the
/// kernel loop at one iteration per frame.
#[inline(always)]
pub fn hash_frame(state: u64, ip: u64) -> u64 {
    let h = (state ^ ip).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    h ^ (h >> 29)
}

/// The starting state of [`hash_frame`] for a stack of `len` frames.
#[inline(always)]
pub fn hash_seed(len: u32) -> u64 {
    0xcbf2_9ce4_8422_2325 ^ len as u64
}

/// Maps a finished hash away from [`NO_STACK`].
#[inline(always)]
pub fn finish_hash(h: u64) -> u64 {
    if h == NO_STACK {
        1
    } else {
        h
    }
}

#[cfg(feature = "user")]
// SAFETY: repr(C), only integers, no padding bytes (size asserted above).
unsafe impl aya::Pod for Stack {}

#[cfg(test)]
mod tests {
    use super::*;

    fn hash(frames: &[u64]) -> u64 {
        finish_hash(frames.iter().fold(hash_seed(frames.len() as u32), |h, &ip| hash_frame(h, ip)))
    }

    #[test]
    fn hashes_depend_on_order_and_length_and_are_never_no_stack() {
        assert_ne!(hash(&[1, 2]), hash(&[2, 1]));
        assert_ne!(hash(&[0]), hash(&[0, 0]));
        assert_ne!(hash(&[]), NO_STACK);
        assert_eq!(finish_hash(NO_STACK), 1);
        assert_eq!(hash(&[0x401000, 0x401234]), hash(&[0x401000, 0x401234]));
    }

    #[test]
    fn frames_are_capped_at_the_depth_limit() {
        let mut stack = Stack { len: MAX_STACK_DEPTH as u32 + 5, truncated: 1, ips: [7; MAX_STACK_DEPTH] };
        assert_eq!(stack.frames().len(), MAX_STACK_DEPTH);
        stack.len = 2;
        assert_eq!(stack.frames(), &[7, 7]);
    }
}
