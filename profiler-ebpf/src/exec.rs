//! `sched:sched_process_exec`: a process that calls `execve` replaces every mapping, so the
//! walker forgets the old ones at once (they would unwind the new image with the old
//! tables), and every exec is told to userspace, which registers the new image at its next
//! drain instead of after the process's first sample.

#![allow(non_upper_case_globals)]

use aya_ebpf::{
    macros::{map, tracepoint},
    maps::HashMap,
    programs::TracePointContext,
};
use profiler_common::maps::UNWIND_EXECS_MAX_ENTRIES;

use crate::{
    maps::current_task,
    user_stack::{UNWIND_PROCESSES, UNWIND_PROCESSES_LARGE},
};

#[map]
pub static UNWIND_EXECS: HashMap<u32, u8> = HashMap::with_max_entries(UNWIND_EXECS_MAX_ENTRIES, 0);

#[tracepoint]
pub fn unwind_exec(_ctx: TracePointContext) -> u32 {
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
    let _ = UNWIND_EXECS.insert(&tgid, &1, 0);
    0
}
