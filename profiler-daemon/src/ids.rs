//! The identities that cross modules, as newtypes: a process id, a thread id and a stack id
//! are all plain integers in the kernel's maps, and a bare `u32` or `u64` passed to the wrong
//! parameter compiles. Conversions happen where the values enter (the drain) and leave (`/proc`
//! paths, file names, labels).

use std::fmt;

use profiler_common::NO_STACK;

/// A process id (the kernel's tgid) in the profiler's pid namespace.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Pid(pub u32);

/// A thread id (the kernel's pid of a task) in the profiler's pid namespace.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Tid(pub u32);

impl Tid {
    /// Threads that exited, folded together in long-lived totals (see
    /// `profiles::exited`); 0 is no user thread's id.
    pub const EXITED: Tid = Tid(0);
}

/// A stack's key: the hash of its frames, as the kernel computes it (the same stack has the
/// same id in both map sets and across drains). [`StackId::NONE`] stands for no stack.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StackId(pub u64);

impl StackId {
    /// No stack was taken (a kernel thread's user stack, a user-mode sample's kernel stack, or
    /// a failed walk, which is counted).
    pub const NONE: StackId = StackId(NO_STACK);

    /// A new stack the kernel did not keep: its process (or uid) held its share of the
    /// stack table (see `profiler_common::share`). Resolves to no frames.
    pub const OVER_SHARE: StackId = StackId(profiler_common::OVER_SHARE_STACK);

    /// The stacks of since-start totals whose frames the daemon's table evicted as history
    /// (see `profiles::evicted`), folded together. Resolves to no frames. Odd, so no kernel
    /// stack id (even, see `profiler_common::stack`) is ever equal to it.
    pub const EVICTED: StackId = StackId(3);

    /// Whether this names a stack.
    pub fn is_some(self) -> bool {
        self != Self::NONE
    }
}

impl fmt::Display for Pid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl fmt::Display for Tid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl fmt::Display for StackId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#x}", self.0)
    }
}
