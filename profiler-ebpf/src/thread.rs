//! The threadcreate profile: `task:task_newtask`, which runs in the creating thread's context
//! with the new task's `clone_flags`. Only clones with `CLONE_THREAD` are threads of the
//! creator's process; a fork or vfork (a new process) is not counted.

use aya_ebpf::{helpers::bpf_get_current_pid_tgid, macros::tracepoint, programs::TracePointContext};
use profiler_common::{futex::CLONE_THREAD, FutexCounter, ThreadKey};

use crate::{
    futex::{read_field, user_stack},
    maps::{active_set, add_or_insert, bump_futex, wanted, STACKS_0, STACKS_1, THREAD_COUNTS_0, THREAD_COUNTS_1},
};

/// Offset of `u64 clone_flags` in the record (`/sys/kernel/tracing/events/task/task_newtask/format`).
const CLONE_FLAGS: usize = 32;

#[tracepoint]
pub fn thread_create(ctx: TracePointContext) -> u32 {
    let flags = read_field(&ctx, CLONE_FLAGS);
    if flags & CLONE_THREAD == 0 {
        return 0;
    }
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    if !wanted(tgid) {
        return 0;
    }
    let (counts, stacks) =
        if active_set() == 0 { (&THREAD_COUNTS_0, &STACKS_0) } else { (&THREAD_COUNTS_1, &STACKS_1) };
    let stack = user_stack(stacks);
    let key = ThreadKey { tgid, _pad: 0, stack };
    if add_or_insert(counts, &key, &1, |n| *n += 1) {
        bump_futex(FutexCounter::ThreadsCreated);
    } else {
        bump_futex(FutexCounter::ThreadMapFull);
    }
    0
}
