//! Program names: each is the name of its function in `profiler-ebpf`.

/// perf_event on the CPU clock.
pub const CPU_SAMPLE: &str = "cpu_sample";
/// Allocator entry uprobes.
pub const MALLOC_ENTER: &str = "malloc_enter";
pub const CALLOC_ENTER: &str = "calloc_enter";
pub const REALLOC_ENTER: &str = "realloc_enter";
pub const REALLOCARRAY_ENTER: &str = "reallocarray_enter";
pub const POSIX_MEMALIGN_ENTER: &str = "posix_memalign_enter";
pub const MEMALIGN_ENTER: &str = "memalign_enter";
pub const PVALLOC_ENTER: &str = "pvalloc_enter";
pub const FREE_ENTER: &str = "free_enter";
/// The uretprobe shared by every allocator function but `free`.
pub const ALLOC_EXIT: &str = "alloc_exit";
/// `syscalls:sys_enter_futex`.
pub const FUTEX_ENTER: &str = "futex_enter";
/// `syscalls:sys_exit_futex` and the futex2 waits' exits.
pub const FUTEX_EXIT: &str = "futex_exit";
pub const FUTEX_WAIT_ENTER: &str = "futex_wait_enter";
pub const FUTEX_WAITV_ENTER: &str = "futex_waitv_enter";
pub const FUTEX_WAKE_ENTER: &str = "futex_wake_enter";
pub const FUTEX_REQUEUE_ENTER: &str = "futex_requeue_enter";
/// `sched:sched_process_exit` (every thread's exit): drops the thread's wait entry.
pub const FUTEX_THREAD_EXIT: &str = "futex_thread_exit";
/// `task:task_newtask`.
pub const THREAD_CREATE: &str = "thread_create";
/// `syscalls:sys_enter_execve` and `sys_enter_execveat`.
pub const UNWIND_EXEC: &str = "unwind_exec";
/// `syscalls:sys_exit_execve` and `sys_exit_execveat`, attached only while the side band
/// follows execs: a successful exec leaves `UNWIND_EXECS`, which then tells failed ones.
pub const UNWIND_EXEC_DONE: &str = "unwind_exec_done";
/// `iter/task`: one record per thread of one process (the thread dump).
pub const THREAD_DUMP: &str = "thread_dump";
/// BTF tracepoint `sched_switch`: the off-CPU profile's sampled switch-outs.
pub const OFFCPU_SWITCH: &str = "offcpu_switch";
/// BTF tracepoint `sched_exit_tp` (the end of `__schedule`): the off-CPU profile's
/// switch-ins, where a sampled switch's stacks are walked and its time charged.
pub const OFFCPU_SWITCH_IN: &str = "offcpu_switch_in";
/// Empty programs on the same two tracepoints, attached instead of the two above for a
/// benchmark's floor (`PROFILER_BENCH_OFFCPU_EMPTY`).
pub const OFFCPU_EMPTY_SWITCH: &str = "offcpu_empty_switch";
pub const OFFCPU_EMPTY_SWITCH_IN: &str = "offcpu_empty_switch_in";

/// The heap profile's programs.
pub const HEAP: [&str; 9] = [
    MALLOC_ENTER,
    CALLOC_ENTER,
    REALLOC_ENTER,
    REALLOCARRAY_ENTER,
    POSIX_MEMALIGN_ENTER,
    MEMALIGN_ENTER,
    PVALLOC_ENTER,
    FREE_ENTER,
    ALLOC_EXIT,
];
/// The block and mutex profiles' programs.
pub const FUTEX: [&str; 7] = [
    FUTEX_ENTER,
    FUTEX_EXIT,
    FUTEX_WAIT_ENTER,
    FUTEX_WAITV_ENTER,
    FUTEX_WAKE_ENTER,
    FUTEX_REQUEUE_ENTER,
    FUTEX_THREAD_EXIT,
];

/// Every program of the object.
pub const ALL: [&str; 25] = [
    CPU_SAMPLE,
    MALLOC_ENTER,
    CALLOC_ENTER,
    REALLOC_ENTER,
    REALLOCARRAY_ENTER,
    POSIX_MEMALIGN_ENTER,
    MEMALIGN_ENTER,
    PVALLOC_ENTER,
    FREE_ENTER,
    ALLOC_EXIT,
    FUTEX_ENTER,
    FUTEX_EXIT,
    FUTEX_WAIT_ENTER,
    FUTEX_WAITV_ENTER,
    FUTEX_WAKE_ENTER,
    FUTEX_REQUEUE_ENTER,
    FUTEX_THREAD_EXIT,
    THREAD_CREATE,
    UNWIND_EXEC,
    UNWIND_EXEC_DONE,
    THREAD_DUMP,
    OFFCPU_SWITCH,
    OFFCPU_EMPTY_SWITCH,
    OFFCPU_EMPTY_SWITCH_IN,
    OFFCPU_SWITCH_IN,
];
