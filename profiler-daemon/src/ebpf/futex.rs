//! The futex programs' side of the session (block and mutex profiles): attach them to their
//! tracepoints (the futex2 ones only where the kernel has them), read their counters and
//! drain their wait totals. Each thread's in-flight entry is the kernel's to remove (at the
//! thread's exit, or its exec as another thread's id): userspace deleting entries that live
//! programs write through pointers could hand one thread's element to another.

use std::path::Path;

use aya::{
    maps::{Array, MapData},
    programs::TracePoint,
    Ebpf,
};
use profiler_common::{
    futex::{FUTEX_CONFIG_BLOCK_RATE_NS, FUTEX_CONFIG_MUTEX_FRACTION},
    maps, programs, tracepoint as tp, FutexCounter, WaitKey, WaitTotals,
};

use super::{drain_counts, map_error, map_mut, missing, program_error, sum_counters, Result};
use crate::ids::{Pid, StackId};

/// The maps only the futex programs use (created with one entry when they are off).
pub(super) const MAPS: [&str; 7] = [
    maps::BLOCK_COUNTS_0,
    maps::BLOCK_COUNTS_1,
    maps::MUTEX_COUNTS_0,
    maps::MUTEX_COUNTS_1,
    maps::FUTEX_PENDING,
    maps::FUTEX_PENDING_SPILL,
    maps::FUTEX_WAKERS,
];
const BLOCK_COUNTS: [&str; 2] = [maps::BLOCK_COUNTS_0, maps::BLOCK_COUNTS_1];
const MUTEX_COUNTS: [&str; 2] = [maps::MUTEX_COUNTS_0, maps::MUTEX_COUNTS_1];

/// (program, tracepoint category, tracepoint name, required). The futex2 syscalls came in
/// Linux 5.16 (`futex_waitv`) and 6.7 (`futex_wait`, `futex_wake`, `futex_requeue`). In this
/// order: the programs that end a wait and free a thread's state first, so that no wait
/// begins that nothing would end.
/// (program, category, tracepoint, required, the record's fields the program reads).
const TRACEPOINTS: [(&str, &str, &str, bool, &[usize]); 9] = [
    (programs::FUTEX_THREAD_EXIT, "sched", "sched_process_exit", true, &[]),
    (programs::FUTEX_EXIT, "syscalls", "sys_exit_futex", true, tp::SYSCALL_EXIT_FIELDS),
    (programs::FUTEX_EXIT, "syscalls", "sys_exit_futex_wait", false, tp::SYSCALL_EXIT_FIELDS),
    (programs::FUTEX_EXIT, "syscalls", "sys_exit_futex_waitv", false, tp::SYSCALL_EXIT_FIELDS),
    (programs::FUTEX_ENTER, "syscalls", "sys_enter_futex", true, tp::FUTEX_ENTER_FIELDS),
    (programs::FUTEX_WAIT_ENTER, "syscalls", "sys_enter_futex_wait", false, tp::FUTEX2_WAIT_FIELDS),
    (programs::FUTEX_WAITV_ENTER, "syscalls", "sys_enter_futex_waitv", false, &[]),
    (programs::FUTEX_WAKE_ENTER, "syscalls", "sys_enter_futex_wake", false, tp::FUTEX2_WAKE_FIELDS),
    (programs::FUTEX_REQUEUE_ENTER, "syscalls", "sys_enter_futex_requeue", false, tp::FUTEX2_REQUEUE_FIELDS),
];

/// Tracepoints attached, `category:name`, and the optional ones this kernel lacks.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FutexAttachment {
    pub attached: Vec<String>,
    pub missing: Vec<String>,
}

/// Totals of the futex counters since load.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FutexCounters {
    pub waits: u64,
    pub mutex_charged: u64,
    pub no_waker: u64,
    pub pending_map_full: u64,
    pub block_map_full: u64,
    pub mutex_map_full: u64,
    pub stack_lost: u64,
    pub wakes: u64,
    pub waker_map_full: u64,
    /// Block waits shorter than the rate its sampling left out.
    pub block_unsampled: u64,
    /// Woken waits not charged: their wake was not sampled.
    pub mutex_unsampled: u64,
    /// Woken waits of a requeued word charged to the next wake of the word they moved to.
    pub requeued: u64,
}

/// Futex waits of one (process, op, outcome, stack) in the drained interval.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RawWaitTotals {
    pub pid: Pid,
    /// A `profiler_common::WaitOp` as its `u16`.
    pub op: u16,
    /// A `profiler_common::WaitOutcome` as its `u16`.
    pub outcome: u16,
    pub stack: StackId,
    pub count: u64,
    pub delay_ns: u64,
}

pub(super) fn attach(ebpf: &mut Ebpf, block_rate_ns: u64, mutex_fraction: u32) -> Result<FutexAttachment> {
    let mut config: Array<&mut MapData, u64> = map_mut(ebpf, maps::FUTEX_CONFIG)?;
    for (slot, value) in
        [(FUTEX_CONFIG_BLOCK_RATE_NS, block_rate_ns), (FUTEX_CONFIG_MUTEX_FRACTION, mutex_fraction.into())]
    {
        config.set(slot, value, 0).map_err(map_error("write", maps::FUTEX_CONFIG))?;
    }
    let mut report = FutexAttachment::default();
    for name in programs::FUTEX {
        tracepoint(ebpf, name)?.load().map_err(program_error("load", name))?;
    }
    for (program, category, name, required, fields) in TRACEPOINTS {
        let what = format!("{category}:{name}");
        if !required && !tracepoint_exists(category, name) {
            tracing::debug!(tracepoint = what, "not in this kernel; not attached");
            report.missing.push(what);
            continue;
        }
        super::tracefs::check_kernel(category, name, fields)?;
        tracepoint(ebpf, program)?.attach(category, name).map_err(program_error("attach (tracepoint)", program))?;
        report.attached.push(what);
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

pub(super) fn counters(ebpf: &Ebpf) -> Result<FutexCounters> {
    let c: [u64; FutexCounter::COUNT as usize] = sum_counters(ebpf, maps::FUTEX_COUNTERS)?;
    let get = |counter: FutexCounter| c[counter as usize];
    Ok(FutexCounters {
        waits: get(FutexCounter::Waits),
        mutex_charged: get(FutexCounter::MutexCharged),
        no_waker: get(FutexCounter::NoWaker),
        pending_map_full: get(FutexCounter::PendingMapFull),
        block_map_full: get(FutexCounter::BlockMapFull),
        mutex_map_full: get(FutexCounter::MutexMapFull),
        stack_lost: get(FutexCounter::StackLost),
        wakes: get(FutexCounter::Wakes),
        waker_map_full: get(FutexCounter::WakerMapFull),
        block_unsampled: get(FutexCounter::BlockUnsampled),
        mutex_unsampled: get(FutexCounter::MutexUnsampled),
        requeued: get(FutexCounter::Requeued),
    })
}

/// Reads and empties set `set`'s block and mutex totals.
pub(super) fn drain(ebpf: &mut Ebpf, set: usize) -> Result<(Vec<RawWaitTotals>, Vec<RawWaitTotals>)> {
    Ok((drain_waits(ebpf, BLOCK_COUNTS[set])?, drain_waits(ebpf, MUTEX_COUNTS[set])?))
}

fn drain_waits(ebpf: &mut Ebpf, name: &'static str) -> Result<Vec<RawWaitTotals>> {
    Ok(drain_counts(ebpf, name)?
        .into_iter()
        .map(|(key, t): (WaitKey, WaitTotals)| RawWaitTotals {
            pid: Pid(key.tgid),
            op: key.op,
            outcome: key.outcome,
            stack: StackId(key.stack),
            count: t.count,
            delay_ns: t.delay_ns,
        })
        .collect())
}
