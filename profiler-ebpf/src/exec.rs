//! `syscalls:sys_enter_execve` and `sys_enter_execveat`: a process that calls `execve`
//! replaces every mapping, so the walker forgets the old ones (they would unwind the new
//! image with the old tables), and every exec is told to userspace with its time, which
//! registers the new image at its next drain instead of after the process's first sample.
//!
//! At the syscall's entry, not at `sched_process_exec` (its end): the side band's records of
//! the new image (the exec's comm, its mappings) are written in between, and userspace,
//! following them, often registered the new image before the end of the exec, which then
//! deleted that registration. An exec that fails leaves its process unregistered until the
//! next drain: userspace writes again every registration older than the exec's time. A
//! thread other than the leader that execs takes the leader's id: its futex entry under its
//! own id goes here, as no exit of that id will remove it.
//!
//! While the side band follows execs, `unwind_exec_done` (at the syscall's exit) takes a
//! successful exec out of `UNWIND_EXECS` again: the side band's records already register
//! the new image, and what is left for userspace to read are the failed execs (a `PATH`
//! search tries several), whose process lost its registration at the entry and runs on
//! with its old image. Reading one entry per exec cost the daemon three system calls for
//! each of the hundreds of programs a busy machine starts each second.

#![allow(non_upper_case_globals)]

use aya_ebpf::{
    helpers::{bpf_get_current_pid_tgid, bpf_ktime_get_ns},
    macros::{map, tracepoint},
    maps::HashMap,
    programs::TracePointContext,
};
use profiler_common::maps::{CONTROL_EXEC_EPOCH, UNWIND_EXECS_MAX_ENTRIES};

use crate::{
    futex::forget_thread,
    maps::{atomic_add_u32, current_task, CONTROL},
    tracepoint::read_field,
    user_stack::{REGISTER_ASKED, REGISTER_DECLINED, UNWIND_PROCESSES, UNWIND_PROCESSES_LARGE},
};

// `sys_exit_*`'s `ret`, checked against the kernel's `format` files before attaching.
use profiler_common::tracepoint::SYSCALL_RET as RET;

#[map]
pub static UNWIND_EXECS: HashMap<u32, u64> = HashMap::with_max_entries(UNWIND_EXECS_MAX_ENTRIES, 0);

#[tracepoint]
pub fn unwind_exec(_ctx: TracePointContext) -> u32 {
    let pid_tgid = bpf_get_current_pid_tgid();
    if pid_tgid as u32 != (pid_tgid >> 32) as u32 {
        // Gone with the thread's old id if the exec succeeds; recreated at its next wait if
        // it fails.
        forget_thread(pid_tgid);
    }
    // A process outside the profiler's pid namespace is not profiled.
    let Some(task) = current_task() else { return 0 };
    let tgid = task.tgid;
    // SAFETY: only checks for presence.
    let registered = if unsafe { UNWIND_PROCESSES.get(&tgid) }.is_some() {
        let _ = UNWIND_PROCESSES.remove(&tgid);
        true
    } else if unsafe { UNWIND_PROCESSES_LARGE.get(&tgid) }.is_some() {
        let _ = UNWIND_PROCESSES_LARGE.remove(&tgid);
        true
    } else {
        false
    };
    // The walkers' kept mappings of the old image are stale from now (see
    // `user_stack::KeptMapping`).
    if registered {
        if let Some(epoch) = CONTROL.get_ptr_mut(CONTROL_EXEC_EPOCH) {
            atomic_add_u32(epoch, 1);
        }
    }
    // Unregistered now: its next walk asks for the new image's registration. Looked up
    // first, as above: most execs are of processes that never asked, and a delete takes the
    // bucket's lock even when it finds nothing.
    // SAFETY: only checks for presence.
    if unsafe { REGISTER_ASKED.get(&tgid) }.is_some() {
        let _ = REGISTER_ASKED.remove(&tgid);
    }
    // A process the selection left out may be selected under its new name or executable.
    // SAFETY: only checks for presence.
    if unsafe { REGISTER_DECLINED.get(&tgid) }.is_some() {
        let _ = REGISTER_DECLINED.remove(&tgid);
    }
    // The new image is another program: its interpreter, if any, is registered anew.
    crate::runtimes::forget(tgid);
    // A failure (the map full until the next drain) only delays the registration until the
    // process's first sample, as without this program.
    // SAFETY: a helper without arguments.
    let exec_ns = unsafe { bpf_ktime_get_ns() };
    let _ = UNWIND_EXECS.insert(&tgid, &exec_ns, 0);
    0
}

#[tracepoint]
pub fn unwind_exec_done(ctx: TracePointContext) -> u32 {
    // A failed exec stays listed: its process runs on, unregistered, until userspace reads it.
    if read_field(&ctx, RET) != 0 {
        return 0;
    }
    let Some(task) = current_task() else { return 0 };
    let _ = UNWIND_EXECS.remove(&task.tgid);
    0
}
