//! The thread dump's record: what the task iterator (`iter/task`) writes, one per thread of
//! the process it is given: ids, scheduler facts, the user registers the thread saved at its
//! last entry into the kernel, and its kernel stack. Userspace walks the user stack from
//! those registers (`profiler-daemon/src/thread_dump/`); nothing here is counted in the kernel.

use crate::KERNEL_STACK_DEPTH;

/// One thread as the iterator saw it.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ThreadRecord {
    /// The thread's id in the profiler's pid namespace (0 when it is not visible there).
    pub tid: u32,
    pub _pad: u32,
    /// `task->on_cpu`: 1 while the thread runs on a CPU. Its saved registers are then those
    /// of its last kernel entry, not where it is now.
    pub on_cpu: u32,
    /// `task->__state` (0 running or runnable, 1 interruptible sleep, 2 uninterruptible, …).
    pub state: u32,
    /// Voluntary plus involuntary context switches when the record was taken: userspace
    /// reads them again after reading the stack to know whether the thread ran meanwhile.
    pub switches: u64,
    /// The user registers saved in the thread's `pt_regs`.
    pub ip: u64,
    pub sp: u64,
    pub bp: u64,
    /// `orig_ax`: the number of the system call the thread is in, or −1 outside one.
    pub syscall: i64,
    /// 1 when the registers were read.
    pub regs_valid: u32,
    /// Valid frames in `kernel`; 0 when the kernel stack could not be read.
    pub kernel_len: u32,
    /// The kernel stack, leaf first.
    pub kernel: [u64; KERNEL_STACK_DEPTH],
}

const _: () = assert!(core::mem::size_of::<ThreadRecord>() == 64 + 8 * KERNEL_STACK_DEPTH);

impl ThreadRecord {
    /// The valid kernel frames, leaf first.
    pub fn kernel_frames(&self) -> &[u64] {
        &self.kernel[..(self.kernel_len as usize).min(KERNEL_STACK_DEPTH)]
    }
}

/// Where the iterator finds what it reads in kernel structures, in bytes, from the running
/// kernel's BTF (`/sys/kernel/btf/vmlinux`), read by userspace at load time: the kernel
/// programs have no CO-RE relocations to do it themselves. One load-time global.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TaskOffsets {
    /// `task_struct.pid`, `.tgid`, `.on_cpu`, `.__state`, `.nvcsw`, `.nivcsw`, `.thread_pid`.
    pub pid: u32,
    pub tgid: u32,
    pub on_cpu: u32,
    pub state: u32,
    pub nvcsw: u32,
    pub nivcsw: u32,
    pub thread_pid: u32,
    /// `struct pid.numbers` and the size of one `struct upid` in it.
    pub pid_numbers: u32,
    pub upid_size: u32,
    /// `struct pid.level`: the depth of the pid namespace a `struct pid` was made in. The
    /// reader's own (`current->thread_pid->level`) is the level of the namespace the
    /// iterator names its threads in; a task's id there is `thread_pid->numbers[level].nr`.
    /// Read in the kernel, not from `/proc/self/status`: a container's own procfs lists
    /// `NSpid:` only from its namespace down, so it cannot tell the absolute level.
    pub pid_level: u32,
}

const _: () = assert!(core::mem::size_of::<TaskOffsets>() == 40);

#[cfg(feature = "user")]
// SAFETY: repr(C), only integers, no padding bytes (size asserted above).
unsafe impl aya::Pod for ThreadRecord {}
#[cfg(feature = "user")]
// SAFETY: as above.
unsafe impl aya::Pod for TaskOffsets {}
