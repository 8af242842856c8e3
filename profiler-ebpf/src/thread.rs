//! The threadcreate profile: `task:task_newtask`, which runs in the creating thread's context
//! with the new task's `clone_flags`. Only clones with `CLONE_THREAD` are threads of the
//! creator's process; a fork or vfork (a new process) is not counted.

use aya_ebpf::{
    helpers::bpf_get_current_pid_tgid,
    macros::tracepoint,
    programs::TracePointContext,
    EbpfContext,
};
use profiler_common::{futex::CLONE_THREAD, FutexCounter, ThreadKey, NO_STACK};

use crate::{
    maps::{active_set, add_or_insert, bump_futex, wanted, STACKS_0, STACKS_1, THREAD_COUNTS_0, THREAD_COUNTS_1},
    stack::capture_user,
};

/// Offset of `u64 clone_flags` in the record (`/sys/kernel/tracing/events/task/task_newtask/format`).
const CLONE_FLAGS: usize = 32;


#[tracepoint]
pub fn thread_create(ctx: TracePointContext) -> u32 {
    // SAFETY: an aligned 8-byte field inside the tracepoint record.
    let flags = unsafe { core::ptr::read_volatile(ctx.as_ptr().cast::<u8>().add(CLONE_FLAGS).cast::<u64>()) };
    if flags & CLONE_THREAD == 0 {
        return 0;
    }
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    if !wanted(tgid) {
        return 0;
    }
    let (counts, stacks) = if active_set() == 0 { (&THREAD_COUNTS_0, &STACKS_0) } else { (&THREAD_COUNTS_1, &STACKS_1) };
    let mut truncated = false;
    let stack = match capture_user(stacks, &mut truncated) {
        Ok(hash) => hash,
        Err(_) => {
            bump_futex(FutexCounter::StackLost);
            NO_STACK
        }
    };
    let key = ThreadKey { tgid, _pad: 0, stack };
    if add_or_insert(counts, &key, &1, |n| *n += 1) {
        bump_futex(FutexCounter::ThreadsCreated);
    } else {
        bump_futex(FutexCounter::ThreadMapFull);
    }
    0
}

