//! Where the tracepoint programs read their records' fields. The kernel programs read them at
//! these offsets (no CO-RE relocation); userspace checks each attached tracepoint's
//! `format` file against the offsets its program reads before attaching, so a kernel whose
//! records differ is refused with a clear error rather than read as other fields.

/// `sys_enter_*`: every syscall argument is an 8-byte field from offset 16.
pub const SYSCALL_ARG0: usize = 16;
pub const SYSCALL_ARG1: usize = 24;
pub const SYSCALL_ARG3: usize = 40;
pub const SYSCALL_ARG4: usize = 48;
/// `sys_exit_*`: `long ret` at 16.
pub const SYSCALL_RET: usize = 16;
/// `task:task_newtask`: `u64 clone_flags` at 32.
pub const NEWTASK_CLONE_FLAGS: usize = 32;

/// The 8-byte fields the futex programs read, by tracepoint.
pub const FUTEX_ENTER_FIELDS: &[usize] = &[SYSCALL_ARG0, SYSCALL_ARG1, SYSCALL_ARG3, SYSCALL_ARG4];
pub const FUTEX2_WAIT_FIELDS: &[usize] = &[SYSCALL_ARG0];
pub const FUTEX2_WAKE_FIELDS: &[usize] = &[SYSCALL_ARG0];
pub const FUTEX2_REQUEUE_FIELDS: &[usize] = &[SYSCALL_ARG0, SYSCALL_ARG3];
pub const SYSCALL_EXIT_FIELDS: &[usize] = &[SYSCALL_RET];
pub const NEWTASK_FIELDS: &[usize] = &[NEWTASK_CLONE_FLAGS];
