//! The futex and thread-creation programs' side of the session: attach them to their
//! tracepoints (the futex2 ones only where the kernel has them), read their counters, and
//! forget the waits in flight of processes that are gone.

use std::path::Path;

use aya::{
    maps::{HashMap, MapData, PerCpuArray},
    programs::TracePoint,
    Ebpf,
};
use profiler_common::{maps, FutexCounter, PendingWait};

use super::{map_mut, map_ref, missing, program_error, sum_counter};
use crate::error::Result;

/// (program, tracepoint category, tracepoint name, required). The futex2 syscalls came in
/// Linux 5.16 (`futex_waitv`) and 6.7 (`futex_wait`, `futex_wake`, `futex_requeue`).
const FUTEX_TRACEPOINTS: [(&str, &str, &str, bool); 8] = [
    ("futex_enter", "syscalls", "sys_enter_futex", true),
    ("futex_exit", "syscalls", "sys_exit_futex", true),
    ("futex_wait_enter", "syscalls", "sys_enter_futex_wait", false),
    ("futex_exit", "syscalls", "sys_exit_futex_wait", false),
    ("futex_waitv_enter", "syscalls", "sys_enter_futex_waitv", false),
    ("futex_exit", "syscalls", "sys_exit_futex_waitv", false),
    ("futex_wake_enter", "syscalls", "sys_enter_futex_wake", false),
    ("futex_requeue_enter", "syscalls", "sys_enter_futex_requeue", false),
];
const THREAD_TRACEPOINT: (&str, &str, &str) = ("thread_create", "task", "task_newtask");

/// The programs of the block and mutex profiles, which share their tracepoints.
pub const FUTEX_PROGRAMS: [&str; 6] =
    ["futex_enter", "futex_exit", "futex_wait_enter", "futex_waitv_enter", "futex_wake_enter", "futex_requeue_enter"];
/// The threadcreate profile's program.
pub const THREAD_PROGRAM: &str = THREAD_TRACEPOINT.0;

/// Tracepoints attached, `category:name`, and the optional ones this kernel lacks.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FutexAttachment {
    pub attached: Vec<String>,
    pub missing: Vec<String>,
}

/// Totals of the futex and thread counters since load.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FutexCounters {
    pub waits: u64,
    pub mutex_charged: u64,
    pub no_waker: u64,
    pub pending_map_full: u64,
    pub block_map_full: u64,
    pub mutex_map_full: u64,
    pub stack_lost: u64,
    pub threads_created: u64,
    pub thread_map_full: u64,
    pub wakes: u64,
    pub waker_map_full: u64,
}

/// Attaches the futex programs (`waits`) and the thread-creation program (`threads`).
pub(super) fn attach(ebpf: &mut Ebpf, waits: bool, threads: bool) -> Result<FutexAttachment> {
    let mut report = FutexAttachment::default();
    if waits {
        for name in FUTEX_PROGRAMS {
            tracepoint(ebpf, name)?.load().map_err(program_error("load", name))?;
        }
        for (program, category, name, required) in FUTEX_TRACEPOINTS {
            let what = format!("{category}:{name}");
            if !required && !tracepoint_exists(category, name) {
                tracing::debug!(tracepoint = what, "not in this kernel; not attached");
                report.missing.push(what);
                continue;
            }
            tracepoint(ebpf, program)?.attach(category, name).map_err(program_error("attach (tracepoint)", program))?;
            report.attached.push(what);
        }
    }
    if threads {
        let (program, category, name) = THREAD_TRACEPOINT;
        let prog = tracepoint(ebpf, program)?;
        prog.load().map_err(program_error("load", program))?;
        prog.attach(category, name).map_err(program_error("attach (tracepoint)", program))?;
        report.attached.push(format!("{category}:{name}"));
    }
    Ok(report)
}

/// Whether the kernel has tracepoint `category/name` (looked up in tracefs, wherever it is
/// mounted; aya needs it mounted to attach anyway).
fn tracepoint_exists(category: &str, name: &str) -> bool {
    ["/sys/kernel/tracing", "/sys/kernel/debug/tracing"]
        .iter()
        .any(|root| Path::new(root).join("events").join(category).join(name).is_dir())
}

fn tracepoint<'a>(ebpf: &'a mut Ebpf, name: &'static str) -> Result<&'a mut TracePoint> {
    ebpf.program_mut(name).ok_or_else(|| missing(name))?.try_into().map_err(program_error("find", name))
}

/// Deletes the waits in flight of processes that are gone (a thread killed inside a wait
/// leaves its entry). Returns the number removed.
pub(super) fn forget_processes(ebpf: &mut Ebpf, tgids: &[u32]) -> Result<usize> {
    if tgids.is_empty() {
        return Ok(0);
    }
    let mut pending: HashMap<&mut MapData, u64, PendingWait> = map_mut(ebpf, maps::FUTEX_PENDING)?;
    let dead: Vec<u64> =
        pending.keys().filter_map(|k| k.ok()).filter(|k| tgids.contains(&((k >> 32) as u32))).collect();
    Ok(dead.iter().filter(|key| pending.remove(key).is_ok()).count())
}

pub(super) fn counters(ebpf: &Ebpf) -> Result<FutexCounters> {
    let array: PerCpuArray<&MapData, u64> = map_ref(ebpf, maps::FUTEX_COUNTERS)?;
    let get = |c: FutexCounter| sum_counter(&array, c as u32, maps::FUTEX_COUNTERS);
    Ok(FutexCounters {
        waits: get(FutexCounter::Waits)?,
        mutex_charged: get(FutexCounter::MutexCharged)?,
        no_waker: get(FutexCounter::NoWaker)?,
        pending_map_full: get(FutexCounter::PendingMapFull)?,
        block_map_full: get(FutexCounter::BlockMapFull)?,
        mutex_map_full: get(FutexCounter::MutexMapFull)?,
        stack_lost: get(FutexCounter::StackLost)?,
        threads_created: get(FutexCounter::ThreadsCreated)?,
        thread_map_full: get(FutexCounter::ThreadMapFull)?,
        wakes: get(FutexCounter::Wakes)?,
        waker_map_full: get(FutexCounter::WakerMapFull)?,
    })
}
