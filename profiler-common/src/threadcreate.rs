//! The threadcreate profile's map layout: threads created, by (process, creating stack).

/// Key of the thread-creation counts: (creating process, creating thread's user stack).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ThreadKey {
    pub tgid: u32,
    pub _pad: u32,
    pub stack: u64,
}

const _: () = assert!(core::mem::size_of::<ThreadKey>() == 16);

/// `CLONE_THREAD` of `clone(2)`: the new task shares the creator's thread group.
pub const CLONE_THREAD: u64 = 0x0001_0000;

/// Indices into the `THREAD_COUNTERS` per-CPU array.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ThreadCounter {
    /// Threads created and counted.
    Created = 0,
    /// Thread creations lost because the threadcreate map was full.
    MapFull = 1,
    /// Creating stacks not stored (stack map full or unreadable); counted with no stack.
    StackLost = 2,
}

impl ThreadCounter {
    /// Number of counters (the length of the `THREAD_COUNTERS` array).
    pub const COUNT: u32 = 3;
    /// All counters, in index order.
    pub const ALL: [ThreadCounter; Self::COUNT as usize] =
        [ThreadCounter::Created, ThreadCounter::MapFull, ThreadCounter::StackLost];
}

#[cfg(feature = "user")]
// SAFETY: repr(C), only integers, padding explicit (size asserted above).
unsafe impl aya::Pod for ThreadKey {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_are_numbered_in_order() {
        for (i, c) in ThreadCounter::ALL.iter().enumerate() {
            assert_eq!(*c as usize, i);
        }
    }
}
