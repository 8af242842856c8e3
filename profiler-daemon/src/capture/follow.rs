//! Following the kernel's process events (the side band: forks, execs, mappings, exits) and
//! the walkers' asks to register a process they met unregistered. [`Capture::follow`] applies
//! them to the catalogue and registers what changed with the unwinder at once.

use std::os::fd::{AsFd, BorrowedFd};
use std::time::Duration;

use profiler_common::RegisterAsk;

use super::{scope::seen, Capture, CaptureError};
use crate::{
    ids::Pid,
    sideband::{self, FollowLatency, ProcessEvent, SidebandStats},
};

/// Names from the walkers' asks kept at most until a drain uses them (an ask is made once
/// per process, and its samples come at the next drain or two).
const ASKED_NAMES_KEPT: usize = 4_096;

/// Drains an ask's name waits for its process at most.
const ASKED_NAME_DRAINS: u8 = 2;

/// Time per batch of process events spent registering what they changed.
const FOLLOW_BUDGET: Duration = Duration::from_millis(100);

/// A batch of process events read this long after its oldest event is logged (debug), with
/// how long it waited: the collector was busy with something else meanwhile.
const LATE_EVENTS: Duration = Duration::from_millis(10);

impl Capture {
    /// Waits until process events arrive (then [`Capture::follow`] them), `other` is
    /// readable, or `timeout` passes. Without a side band (it failed to open) only `other`
    /// and the timeout end the wait; events are then read from `/proc` at drains.
    pub fn wait(&mut self, other: Option<BorrowedFd<'_>>, timeout: Duration) -> sideband::Woken {
        let urgent = self.asks.as_ref().map(AsFd::as_fd);
        let woken = match &self.sideband {
            Some(sideband) => sideband.wait(other, urgent, timeout),
            None => {
                let callers = sideband::Callers::new(other, urgent);
                callers.woken(&sideband::poll(callers.fds(), timeout), false)
            }
        };
        if woken.urgent {
            self.read_asks();
        }
        woken
    }

    /// Empties the walkers' asks: what they ask for (the side band read now) is the caller's
    /// next step; the ring must be empty for the next ask to wake the loop again.
    pub(super) fn read_asks(&mut self) {
        let Some(asks) = &mut self.asks else { return };
        while let Some(ask) = asks.next() {
            if let Some((pid, name)) = parse_ask(&ask) {
                tracing::trace!(%pid, name, "a walker asked for a registration");
                if self.asked_names.len() >= ASKED_NAMES_KEPT {
                    self.asked_names.clear();
                }
                if !name.is_empty() {
                    self.asked_names.insert(pid, (name, ASKED_NAME_DRAINS));
                }
                self.declined.asked(pid);
            }
            self.asks_read += 1;
        }
    }

    /// Applies the kernel's process events since the last call (forks, execs, mappings,
    /// exits) to the catalogue and registers what they changed with the unwinder at once:
    /// a process that lives 20 ms is known, and unwound from tables, before it exits.
    /// Returns the pids a new process reused after the old one exited: what the old one
    /// left in the kernel (its registration, heap probes and blocks, waits) is dropped here,
    /// and the caller drops what it counted for it, so none of it shows under the new one.
    pub fn follow(&mut self) -> Vec<Pid> {
        let Some(sideband) = &mut self.sideband else { return Vec::new() };
        let mut events = sideband.read();
        if !self.scope.is_empty() {
            let scope = &self.scope;
            events.retain(|event| event.pid().is_none_or(|pid| scope.contains(&pid)));
        }
        // A process outside the profiler's pid namespace is reported with pid 0.
        events.retain(|event| event.pid() != Some(Pid(0)));
        if events.is_empty() {
            return Vec::new();
        }
        let read_at = sideband::now_ns();
        let oldest = events.iter().map(ProcessEvent::time).filter(|&t| t != 0).min().unwrap_or(read_at);
        if read_at.saturating_sub(oldest) >= LATE_EVENTS.as_nanos() as u64 {
            let waited_ms = read_at.saturating_sub(oldest) / 1_000_000;
            tracing::debug!(waited_ms, events = events.len(), "process events read late");
        }
        let applied = self.catalog.apply(&events);
        for event in &events {
            if let ProcessEvent::Exec { pid, time, .. } = event {
                self.unregistered_execs.insert(*pid, *time);
                self.unwinder.execed([*pid]);
            }
        }
        self.filter_new_cgroups(&applied.cgroups);
        if !applied.reused.is_empty() {
            tracing::debug!(pids = ?applied.reused, "pids reused by new processes");
            let mut problems = self.forget(&applied.reused);
            // Now, not when due: the new process must not be walked with the old one's
            // mappings even if it is never registered.
            if let Err(err) = self.session.flush_unwind_removals() {
                problems.push(CaptureError::Forget(err));
            }
            for problem in problems {
                tracing::warn!("{}", crate::error::chain(&problem));
            }
        }
        if applied.lost > 0 {
            tracing::debug!(lost = applied.lost, "process event records lost (a ring was full)");
        }
        // An exited process's registration is of no more use to the walker: it leaves the
        // kernel's process maps now, not when the catalogue forgets the process (a snapshot
        // keeps every process it sampled until its end; a daemon, until its next dump), or
        // a machine running hundreds of programs a second would fill them.
        let exited: Vec<Pid> =
            applied.exited.iter().copied().filter(|&pid| self.catalog.process(pid).is_some_and(|p| p.exited)).collect();
        self.unwinder.forget(&mut self.session, &exited);
        if self.session.unwind_removals_due() {
            if let Err(err) = self.session.flush_unwind_removals() {
                tracing::warn!("{}", crate::error::chain(&CaptureError::Forget(err)));
            }
        }
        // A process whose exit is in this same batch (most of a shell's short commands) is
        // not registered: every sample it will ever have was already walked, so its tables
        // would be written only to be removed (a 776 B or 6 KiB map entry each, most of what
        // following 500 execs a second cost).
        for &(child, parent) in &applied.forked {
            // Registered as its parent is, at once; `sync_changed` then finds it up to date.
            let selected = self.catalog.process(child).filter(|p| !p.exited && self.selection.matches(&p.facts()));
            let parent_version = self.catalog.process(parent).map(|p| p.maps_version);
            if let (Some(process), Some(parent_version)) = (selected, parent_version) {
                let version = process.maps_version;
                if let Err(err) = self.unwinder.inherit(&mut self.session, child, version, parent, parent_version) {
                    tracing::warn!("{}", crate::error::chain(&CaptureError::UnwindTables(err)));
                }
            }
        }
        if !applied.changed.is_empty() {
            if let Err(err) = self.sync_changed(&applied.changed, FOLLOW_BUDGET) {
                tracing::warn!("{}", crate::error::chain(&CaptureError::UnwindTables(err)));
            }
        }
        self.count_registered_execs();
        if self.declined.has_pending() {
            let (catalog, selection, scope) = (&self.catalog, &self.selection, &self.scope);
            let settled = self.declined.settle_asks(&mut self.session, |pid| seen(catalog, selection, scope, pid));
            if let Err(err) = settled {
                tracing::warn!("{}", crate::error::chain(&CaptureError::Decline(err)));
            }
        }
        applied.reused
    }

    /// Counts how long after its exec each process just registered waited; forgets those
    /// that exited, or that the selection leaves out, unregistered.
    pub(super) fn count_registered_execs(&mut self) {
        if self.unregistered_execs.is_empty() {
            return;
        }
        let now = sideband::now_ns();
        let (catalog, unwinder, selection) = (&self.catalog, &self.unwinder, &self.selection);
        let latency = &mut self.follow_latency;
        self.unregistered_execs.retain(|&pid, &mut exec_time| {
            let Some(process) = catalog.process(pid).filter(|p| selection.matches(&p.facts())) else {
                return false;
            };
            if process.exited {
                latency.exited_unregistered += 1;
                tracing::trace!(pid = pid.0, "exec'd process exited before it was registered with the unwinder");
                return false;
            }
            if unwinder.registered_version(pid) != Some(process.maps_version) {
                return true;
            }
            let latency_us = now.saturating_sub(exec_time) / 1_000;
            tracing::trace!(pid = pid.0, latency_us, "exec'd process registered with the unwinder");
            latency.record(latency_us);
            false
        });
    }

    /// How long exec'd processes waited for their registration with the unwinder.
    pub fn follow_latency(&self) -> FollowLatency {
        self.follow_latency
    }

    /// What the side band delivered, and why it is closed if it is.
    pub fn sideband_stats(&self) -> (Option<SidebandStats>, Option<&str>) {
        let stats = self.sideband.as_ref().map(|s| SidebandStats { asks: self.asks_read, ..s.stats() });
        (stats, self.sideband_error.as_deref())
    }
}
/// (tgid, thread name) of one `REGISTER_ASKS` record.
fn parse_ask(bytes: &[u8]) -> Option<(Pid, String)> {
    if bytes.len() < size_of::<RegisterAsk>() {
        return None;
    }
    // SAFETY: at least a record's bytes, read unaligned; every bit pattern is a valid record.
    let ask: RegisterAsk = unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast()) };
    let len = ask.comm.iter().position(|&b| b == 0).unwrap_or(ask.comm.len());
    Some((Pid(ask.tgid), String::from_utf8_lossy(&ask.comm[..len]).into_owned()))
}
