//! The interpreters' walkers, behind one dispatcher: after the native walk of a user stack
//! ([`crate::user_stack`]), each runtime the process may run appends its own frames, one
//! word each tagged with its `profiler_common::FrameKind`, through [`crate::walk_state`].
//!
//! The set is closed: one module per runtime (today [`cpython`]), one arm here per hook.
//! Go ([`go`]) adds no frames (its code keeps frame pointers): the sampling programs ask it
//! for the goroutine's pprof labels, and its entries are forgotten at exec with the others.
//! A runtime's walker has its own maps (its per-process entries, written by userspace at
//! registration, and its counters), and the unwind entry of a process carries one flag per
//! runtime (`profiler_common::unwind::process_runtime`) so that a process that runs none
//! costs no lookup of theirs.

use profiler_common::{unwind::process_runtime, FrameKind};

pub mod cpython;
pub mod go;

/// Appends the interpreted frames of the current thread of process `tgid` to the walk of
/// scratch slot `slot`, for each runtime whose flag `runtimes` has (the process's unwind
/// entry's flags, or every flag when the walk did not read the entry).
#[inline(always)]
pub fn walk(slot: u32, tgid: u32, runtimes: u32) {
    if runtimes & process_runtime(FrameKind::Python) != 0 {
        cpython::walk(slot, tgid);
    }
}

/// Forgets process `tgid`'s entries in every runtime's walker, at its exec.
#[inline(always)]
pub fn forget(tgid: u32) {
    cpython::forget(tgid);
    go::forget(tgid);
}
