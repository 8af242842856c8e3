//! `sched:sched_process_exec`: a process that calls `execve` replaces every mapping, so the
//! walker forgets the old ones at once (they would unwind the new image with the old
//! tables), and every exec is told to userspace with its time, which registers the new image
//! at its next drain instead of after the process's first sample. The time matters: the
//! side band's records of an exec come before this tracepoint, so userspace may have
//! registered the new image already, and this deletes that registration too; userspace
//! writes it again when its registration predates the exec. A thread other than the leader that
//! execs takes the leader's id: its futex entry under its old id goes here, as no exit of
//! that id will remove it.

#![allow(non_upper_case_globals)]

use aya_ebpf::{
    helpers::{bpf_get_current_pid_tgid, bpf_ktime_get_ns},
    macros::{map, tracepoint},
    maps::HashMap,
    programs::TracePointContext,
};
use profiler_common::maps::UNWIND_EXECS_MAX_ENTRIES;

use crate::{
    futex::FUTEX_PENDING,
    maps::current_task,
    tracepoint::read_field_u32,
    user_stack::{UNWIND_PROCESSES, UNWIND_PROCESSES_LARGE},
};

#[map]
pub static UNWIND_EXECS: HashMap<u32, u64> = HashMap::with_max_entries(UNWIND_EXECS_MAX_ENTRIES, 0);

/// Offsets of `pid` and `old_pid` (machine-wide thread ids, before and after the exec) in
/// the record (`/sys/kernel/tracing/events/sched/sched_process_exec/format`).
const PID: usize = 12;
const OLD_PID: usize = 16;

#[tracepoint]
pub fn unwind_exec(ctx: TracePointContext) -> u32 {
    let (pid, old_pid) = (read_field_u32(&ctx, PID), read_field_u32(&ctx, OLD_PID));
    if pid != old_pid {
        let tgid = bpf_get_current_pid_tgid() & 0xffff_ffff_0000_0000;
        let _ = FUTEX_PENDING.remove(&(tgid | u64::from(old_pid)));
    }
    // A process outside the profiler's pid namespace is not profiled.
    let Some(task) = current_task() else { return 0 };
    let tgid = task.tgid;
    // SAFETY: only checks for presence.
    if unsafe { UNWIND_PROCESSES.get(&tgid) }.is_some() {
        let _ = UNWIND_PROCESSES.remove(&tgid);
    } else if unsafe { UNWIND_PROCESSES_LARGE.get(&tgid) }.is_some() {
        let _ = UNWIND_PROCESSES_LARGE.remove(&tgid);
    }
    // A failure (the map full until the next drain) only delays the registration until the
    // process's first sample, as without this program.
    // SAFETY: a helper without arguments.
    let exec_ns = unsafe { bpf_ktime_get_ns() };
    let _ = UNWIND_EXECS.insert(&tgid, &exec_ns, 0);
    0
}
