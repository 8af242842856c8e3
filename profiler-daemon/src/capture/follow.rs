//! Following the kernel's process events (the side band: forks, execs, mappings, exits) and
//! the walkers' asks to register a process they met unregistered. [`Capture::follow`] applies
//! them to the catalogue and registers what changed with the unwinder at once.

use std::{
    collections::HashMap,
    os::fd::{AsFd, BorrowedFd},
    time::Duration,
};

use profiler_common::RegisterAsk;

use super::{
    scope::{in_scope, seen},
    Capture, CaptureError,
};
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
        let (names, declined, read) = (&mut self.asked_names, &mut self.declined, &mut self.asks_read);
        asks.drain(|ask| {
            if let Some((pid, name)) = parse_ask(ask) {
                tracing::trace!(%pid, name, "a walker asked for a registration");
                note_ask(names, pid, name);
                declined.asked(pid);
            }
            *read += 1;
        });
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
        let scope = &self.scope;
        events.retain(|event| keep_event(scope, event.pid()));
        if events.is_empty() {
            return Vec::new();
        }
        if let Some(waited_ms) = late_by(events.iter().map(ProcessEvent::time), sideband::now_ns()) {
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
        self.forget_reused(&applied.reused);
        if applied.lost > 0 {
            tracing::debug!(lost = applied.lost, "process event records lost (a ring was full)");
        }
        self.forget_exited(&applied.exited);
        self.register_forks(&applied.forked);
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

    /// Drops at once what the kernel holds for pids a new process reused: the new process
    /// must not be walked with the old one's mappings even if it is never registered.
    fn forget_reused(&mut self, reused: &[Pid]) {
        if reused.is_empty() {
            return;
        }
        tracing::debug!(pids = ?reused, "pids reused by new processes");
        let mut problems = self.forget(reused);
        if let Err(err) = self.session.flush_unwind_removals() {
            problems.push(CaptureError::Forget(err));
        }
        for problem in problems {
            tracing::warn!("{}", crate::error::chain(&problem));
        }
    }

    /// An exited process's registration is of no more use to the walker: it leaves the
    /// kernel's process maps now, not when the catalogue forgets the process (a snapshot
    /// keeps every process it sampled until its end; a daemon, until its next dump), or a
    /// machine running hundreds of programs a second would fill them.
    fn forget_exited(&mut self, exited: &[Pid]) {
        let exited: Vec<Pid> =
            exited.iter().copied().filter(|&pid| self.catalog.process(pid).is_some_and(|p| p.exited)).collect();
        self.unwinder.forget(&mut self.session, &exited);
        if self.session.unwind_removals_due() {
            if let Err(err) = self.session.flush_unwind_removals() {
                tracing::warn!("{}", crate::error::chain(&CaptureError::Forget(err)));
            }
        }
    }

    /// Registers each forked child as its parent is, at once (`sync_changed` then finds it up
    /// to date). A process whose exit is in this same batch (most of a shell's short
    /// commands) is not registered: every sample it will ever have was already walked, so its
    /// tables would be written only to be removed (a 776 B or 6 KiB map entry each, most of
    /// what following 500 execs a second cost).
    fn register_forks(&mut self, forked: &[(Pid, Pid)]) {
        for &(child, parent) in forked {
            let selected = self.catalog.process(child).filter(|p| !p.exited && self.selection.matches(&p.facts()));
            let parent_version = self.catalog.process(parent).map(|p| p.maps_version);
            if let (Some(process), Some(parent_version)) = (selected, parent_version) {
                let version = process.maps_version;
                if let Err(err) = self.unwinder.inherit(&mut self.session, child, version, parent, parent_version) {
                    tracing::warn!("{}", crate::error::chain(&CaptureError::UnwindTables(err)));
                }
            }
        }
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
            let process = catalog.process(pid).filter(|p| selection.matches(&p.facts()));
            let state = process.map(|p| (p.exited, unwinder.registered_version(pid) == Some(p.maps_version)));
            match exec_registration(state) {
                ExecRegistration::Waiting => true,
                ExecRegistration::LeftOut => false,
                ExecRegistration::ExitedUnregistered => {
                    latency.exited_unregistered += 1;
                    tracing::trace!(pid = pid.0, "exec'd process exited before it was registered with the unwinder");
                    false
                }
                ExecRegistration::Registered => {
                    let latency_us = now.saturating_sub(exec_time) / 1_000;
                    tracing::trace!(pid = pid.0, latency_us, "exec'd process registered with the unwinder");
                    latency.record(latency_us);
                    false
                }
            }
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

/// Whether an event about `pid` (`None`: about no process) is followed: not when a scope of
/// pids is chosen and leaves it out, nor when it is a process outside the profiler's pid
/// namespace (reported with pid 0).
pub(super) fn keep_event(scope: &[Pid], pid: Option<Pid>) -> bool {
    match pid {
        Some(Pid(0)) => false,
        Some(pid) => in_scope(scope, pid),
        None => true,
    }
}

/// How long (ms) a batch of events waited since its oldest (times of 0 are unknown), if that
/// is [`LATE_EVENTS`] or more at `read_at` (both `CLOCK_MONOTONIC` ns).
pub(super) fn late_by(times: impl Iterator<Item = u64>, read_at: u64) -> Option<u64> {
    let oldest = times.filter(|&t| t != 0).min().unwrap_or(read_at);
    let waited = read_at.saturating_sub(oldest);
    (waited >= LATE_EVENTS.as_nanos() as u64).then_some(waited / 1_000_000)
}

/// Keeps the name a walker's ask gave `pid` for the next drains ([`ASKED_NAME_DRAINS`]). The
/// names are bounded by [`ASKED_NAMES_KEPT`]: a full table is emptied (names wait two drains
/// at most, so what is lost is at most a name for a process nothing else names).
pub(super) fn note_ask(names: &mut HashMap<Pid, (String, u8)>, pid: Pid, name: String) {
    if names.len() >= ASKED_NAMES_KEPT {
        names.clear();
    }
    if !name.is_empty() {
        names.insert(pid, (name, ASKED_NAME_DRAINS));
    }
}

/// Where an exec'd process stands with its registration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum ExecRegistration {
    /// Not registered yet: still waited for.
    Waiting,
    /// Registered with its new image: its wait is counted.
    Registered,
    /// Exited before it was registered: counted as such.
    ExitedUnregistered,
    /// Unknown, or left out by the selection: never registered, not counted.
    LeftOut,
}

/// What the process an exec was followed for is now: `state` is `None` when it is unknown or
/// not selected, else (exited, registered with its current mappings).
pub(super) fn exec_registration(state: Option<(bool, bool)>) -> ExecRegistration {
    match state {
        None => ExecRegistration::LeftOut,
        Some((true, _)) => ExecRegistration::ExitedUnregistered,
        Some((false, false)) => ExecRegistration::Waiting,
        Some((false, true)) => ExecRegistration::Registered,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ask_bytes(tgid: u32, comm: &[u8]) -> Vec<u8> {
        let mut ask = RegisterAsk { tgid, ..RegisterAsk::default() };
        ask.comm[..comm.len()].copy_from_slice(comm);
        // SAFETY: a plain `repr(C)` record, read as its bytes.
        let bytes: [u8; size_of::<RegisterAsk>()] = unsafe { std::mem::transmute(ask) };
        bytes.to_vec()
    }

    #[test]
    fn an_ask_gives_its_pid_and_the_name_up_to_its_nul() {
        assert_eq!(parse_ask(&ask_bytes(42, b"worker\0junk")), Some((Pid(42), "worker".to_string())));
        // A name of all 16 bytes has no NUL: every byte is the name.
        assert_eq!(parse_ask(&ask_bytes(7, b"abcdefghijklmnop")), Some((Pid(7), "abcdefghijklmnop".to_string())));
    }

    #[test]
    fn a_short_record_is_no_ask() {
        let bytes = ask_bytes(42, b"worker");
        assert_eq!(parse_ask(&bytes[..bytes.len() - 1]), None);
        assert_eq!(parse_ask(&[]), None);
    }

    #[test]
    fn events_follow_the_scope_and_never_a_process_outside_the_namespace() {
        // Every process, when no scope is chosen; never pid 0 (outside the pid namespace).
        assert!(keep_event(&[], Some(Pid(5))));
        assert!(!keep_event(&[], Some(Pid(0))));
        assert!(!keep_event(&[Pid(0)], Some(Pid(0))));
        // A scope keeps only its pids.
        assert!(keep_event(&[Pid(5), Pid(6)], Some(Pid(6))));
        assert!(!keep_event(&[Pid(5)], Some(Pid(6))));
        // An event about no process (a lost-records note, say) is always applied.
        assert!(keep_event(&[Pid(5)], None));
    }

    #[test]
    fn a_batch_is_late_from_its_oldest_known_event() {
        let ms = 1_000_000;
        let late = LATE_EVENTS.as_nanos() as u64;
        let read_at = 1_000 * ms;
        assert_eq!(late_by([read_at - 1].into_iter(), read_at), None);
        assert_eq!(late_by([read_at - late].into_iter(), read_at), Some(late / ms));
        // The oldest counts, and a time of 0 (unknown) does not.
        assert_eq!(late_by([read_at - ms, 0, read_at - 40 * ms].into_iter(), read_at), Some(40));
        assert_eq!(late_by([0, 0].into_iter(), read_at), None);
        assert_eq!(late_by(std::iter::empty(), read_at), None);
        // An event stamped after the read (another CPU's clock) is not late.
        assert_eq!(late_by([read_at + ms].into_iter(), read_at), None);
    }

    #[test]
    fn asked_names_are_kept_for_two_drains_and_bounded() {
        let mut names = HashMap::new();
        note_ask(&mut names, Pid(1), "one".into());
        assert_eq!(names.get(&Pid(1)), Some(&("one".to_string(), ASKED_NAME_DRAINS)));
        // An empty name names nothing.
        note_ask(&mut names, Pid(2), String::new());
        assert!(!names.contains_key(&Pid(2)));
        for pid in 0..ASKED_NAMES_KEPT as u32 {
            note_ask(&mut names, Pid(100 + pid), "n".into());
        }
        // The table never holds more than its bound: it is emptied when full.
        assert!(names.len() <= ASKED_NAMES_KEPT);
        note_ask(&mut names, Pid(3), "three".into());
        assert!(names.len() <= ASKED_NAMES_KEPT);
        assert!(names.contains_key(&Pid(3)));
    }

    #[test]
    fn an_exec_is_counted_once_registered_or_exited_and_dropped_when_left_out() {
        assert_eq!(exec_registration(None), ExecRegistration::LeftOut);
        assert_eq!(exec_registration(Some((false, false))), ExecRegistration::Waiting);
        assert_eq!(exec_registration(Some((false, true))), ExecRegistration::Registered);
        // Exited is exited, whether or not its last image was registered: a latency would be
        // counted for a process that no longer runs.
        assert_eq!(exec_registration(Some((true, false))), ExecRegistration::ExitedUnregistered);
        assert_eq!(exec_registration(Some((true, true))), ExecRegistration::ExitedUnregistered);
    }
}
