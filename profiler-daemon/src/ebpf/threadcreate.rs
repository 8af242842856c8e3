//! The thread-creation program's side of the session: attach it to `task:task_newtask`,
//! read its counters and drain its counts.

use aya::{programs::TracePoint, Ebpf};
use profiler_common::{maps, programs, ThreadCounter, ThreadKey};

use super::{drain_counts, missing, program_error, sum_counters, Result};
use crate::ids::{Pid, StackId};

/// The maps only the thread-creation program uses (created with one entry when it is off).
pub(super) const MAPS: [&str; 2] = [maps::THREAD_COUNTS_0, maps::THREAD_COUNTS_1];

/// Totals of the thread-creation counters since load.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ThreadCounters {
    pub created: u64,
    pub map_full: u64,
    pub stack_lost: u64,
}

/// Threads one (process, stack) created in the drained interval.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RawThreadCount {
    pub pid: Pid,
    pub stack: StackId,
    pub count: u64,
}

pub(super) fn attach(ebpf: &mut Ebpf) -> Result<()> {
    let name = programs::THREAD_CREATE;
    let program: &mut TracePoint =
        ebpf.program_mut(name).ok_or_else(|| missing(name))?.try_into().map_err(program_error("find", name))?;
    program.load().map_err(program_error("load", name))?;
    super::tracefs::check_kernel("task", "task_newtask", profiler_common::tracepoint::NEWTASK_FIELDS)?;
    program.attach("task", "task_newtask").map_err(program_error("attach (tracepoint task:task_newtask)", name))?;
    Ok(())
}

pub(super) fn counters(ebpf: &Ebpf) -> Result<ThreadCounters> {
    let c: [u64; ThreadCounter::COUNT as usize] = sum_counters(ebpf, maps::THREAD_COUNTERS)?;
    let get = |counter: ThreadCounter| c[counter as usize];
    Ok(ThreadCounters {
        created: get(ThreadCounter::Created),
        map_full: get(ThreadCounter::MapFull),
        stack_lost: get(ThreadCounter::StackLost),
    })
}

/// Reads and empties set `set`'s thread counts.
pub(super) fn drain(ebpf: &mut Ebpf, set: usize) -> Result<Vec<RawThreadCount>> {
    let entries = drain_counts(ebpf, MAPS[set])?;
    Ok(entries
        .into_iter()
        .map(|(key, count): (ThreadKey, u64)| RawThreadCount { pid: Pid(key.tgid), stack: StackId(key.stack), count })
        .collect())
}
