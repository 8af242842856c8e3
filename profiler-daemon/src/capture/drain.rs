//! Reading the kernel's maps: [`Capture::drain`] flips the map sets and learns what the idle
//! one names, [`Capture::live`] reads the live heap, and [`Capture::prune`] and its helper forget
//! what exited (the unwinder's tables, heap probes, kernel state).

use std::{
    collections::{HashMap, HashSet},
    time::{Duration, Instant},
};

use super::{
    log_slow,
    scope::{in_scope, seen},
    Capture, CaptureError, Drained, Live,
};
use crate::{
    ebpf::Batch,
    ids::{Pid, StackId},
    procs, profiles,
    profiles::Source,
    sideband::Sideband,
};

/// Time per drain spent registering newly seen processes with the unwinder (building their
/// tables); the rest wait for the next drain.
const UNWIND_SYNC_BUDGET: Duration = Duration::from_millis(250);

/// How long a drain registers backlog processes before it follows new ones again.
const UNWIND_SYNC_SLICE: Duration = Duration::from_millis(10);

/// How long a process that exited without any data is kept (see `KnownProcess::sampled`): a
/// few drains, so a sample taken just before its exit still finds it.
const UNSAMPLED_GRACE: Duration = Duration::from_secs(3);

impl Capture {
    /// Flips the map sets and drains the idle one: learns the processes and stacks it names,
    /// registers the processes that called `execve` (before their first sample) and the new
    /// ones with the unwinder, and forgets processes that exited without data.
    pub fn drain(&mut self) -> Result<Drained, CaptureError> {
        // Before the samples: the processes they name are known with their mappings.
        let mut reused = std::mem::take(&mut self.reused_since_drain);
        reused.extend(self.follow());
        let exited_unsampled = self.catalog.exited_unsampled();
        let batch = self.read_maps(&mut reused)?;
        let new_stacks = self.learn(&batch);
        let mut problems = Vec::new();
        let (catalog, selection, scope) = (&self.catalog, &self.selection, &self.scope);
        if let Err(err) = self.declined.settle(&mut self.session, |pid| seen(catalog, selection, scope, pid)) {
            problems.push(CaptureError::Decline(err));
        }
        self.note_execs(&mut problems);
        let gone = self.forget_gone(&exited_unsampled, &mut problems);
        self.sync_backlog(&mut problems);
        self.count_registered_execs();
        for problem in &problems {
            tracing::warn!("{}", crate::error::chain(problem));
        }
        Ok(Drained { batch, new_stacks, gone, reused, problems })
    }

    /// Flips the map sets and reads the idle one once it settles, following process events
    /// meanwhile (the pids they reused go to `reused`).
    fn read_maps(&mut self, reused: &mut Vec<Pid>) -> Result<Batch, CaptureError> {
        let started = Instant::now();
        let settled = self.session.flip().map_err(CaptureError::Drain)?;
        // Until the old set settles, process events are followed as they come.
        while let Some(left) = settled.checked_duration_since(Instant::now()).filter(|d| !d.is_zero()) {
            if self.wait(None, left).records {
                reused.extend(self.follow());
            }
        }
        let batch = self.session.drain_flipped().map_err(CaptureError::Drain)?;
        log_slow("drain: read the maps", started);
        Ok(batch)
    }

    /// Learns the processes and stacks `batch` names; returns the stacks new to the catalogue.
    fn learn(&mut self, batch: &Batch) -> HashSet<StackId> {
        self.read_asks();
        let new_stacks = self.catalog.learn(&batch.stacks, &profiles::sightings(batch));
        // A process whose fork's record was lost (the side band's rings overflow under a
        // storm of thread events while this thread is busy) and that exited before `/proc`
        // was read has no name but the one its walker's ask gave.
        let catalog = &mut self.catalog;
        age_asked_names(&mut self.asked_names, |pid, name| catalog.name_if_unnamed(pid, name));
        self.catalog.note_over_share(&batch.over_share);
        new_stacks
    }

    /// Takes the processes the kernel saw call `execve`. A new image is registered now, not
    /// after its first sample: until then its stacks would be walked with frame pointers only
    /// (see [`execs_to_mark`]).
    fn note_execs(&mut self, problems: &mut Vec<CaptureError>) {
        match self.unwinder.take_execs(&mut self.session) {
            Ok(pids) => {
                for pid in execs_to_mark(self.sideband.is_some(), pids, &self.scope) {
                    self.catalog.exec_seen(pid);
                }
            }
            Err(err) => problems.push(CaptureError::Execs(err)),
        }
    }

    /// Detaches the heap probes of exited processes, and forgets the processes that exited
    /// without data (see [`forgettable`]). Returns those forgotten.
    fn forget_gone(&mut self, exited_unsampled: &[Pid], problems: &mut Vec<CaptureError>) -> Vec<Pid> {
        // Probes of an exited process go now, not after the catalogue's grace: each holds
        // descriptors, and a pool of short-lived workers would exhaust them. What they
        // counted was drained above.
        let exited: Vec<Pid> = self.heap.keys().copied().filter(|pid| !procs::exists(pid.0)).collect();
        if let Err(err) = self.session.detach_heap(&exited) {
            problems.push(CaptureError::Forget(err));
        }
        let mut gone = self.catalog.prune_unsampled(UNSAMPLED_GRACE);
        gone.extend(self.catalog.forget_unsampled(exited_unsampled));
        let gone = forgettable(gone, &self.scope);
        problems.extend(self.forget(&gone));
        if let Err(err) = self.session.flush_unwind_removals() {
            problems.push(CaptureError::Forget(err));
        }
        gone
    }

    /// Registers the backlog (processes seen in /proc, not yet registered) in slices, the side
    /// band's new processes between them: a program started now must not wait the whole
    /// budget behind processes that have run for hours.
    fn sync_backlog(&mut self, problems: &mut Vec<CaptureError>) {
        let started = Instant::now();
        let deadline = Instant::now() + UNWIND_SYNC_BUDGET;
        loop {
            // Events that came while the maps were read, or while the last slice ran.
            if self.sideband.as_ref().is_some_and(Sideband::has_records) {
                // Reported with the next drain: this batch was taken before the reuse, so
                // its samples are the old process's.
                let more = self.follow();
                self.reused_since_drain.extend(more);
            }
            match self.sync_unwinder(Some(UNWIND_SYNC_SLICE), true) {
                Ok(done) if backlog_continues(done, Instant::now(), deadline) => {}
                Ok(_) => break,
                Err(err) => {
                    problems.push(CaptureError::UnwindTables(err));
                    break;
                }
            }
        }
        log_slow("drain: sync the unwinder", started);
    }

    /// Reads the live heap blocks, then drains (see [`Live`]).
    pub fn live(&mut self) -> Result<Live, CaptureError> {
        let blocks = self.session.live_blocks().map_err(CaptureError::LiveHeap)?;
        let drained = self.drain()?;
        Ok(Live { pids: self.heap_pids(), blocks, drained })
    }

    /// Forgets processes not seen for `grace` that have exited, and stacks not in `keep`.
    /// Returns the pids forgotten, and what could not be cleared in the kernel.
    pub fn prune(&mut self, grace: Duration, keep: &HashSet<StackId>) -> (Vec<Pid>, Vec<CaptureError>) {
        let mut problems = Vec::new();
        let mut keep = std::borrow::Cow::Borrowed(keep);
        if self.has(Source::Switches) {
            // A thread still asleep since a sampled switch-out whose stacks were walked then:
            // its time is charged (and names these stacks) only when it runs again.
            if let Err(err) = self.session.pending_offcpu_stacks(keep.to_mut()) {
                problems.push(CaptureError::PendingStacks(err));
            }
        }
        let gone = self.catalog.prune(grace, &keep);
        problems.extend(self.forget(&gone));
        (gone, problems)
    }

    /// Drops what the unwinder, the kernel maps and the heap attachments hold for `gone`.
    pub(super) fn forget(&mut self, gone: &[Pid]) -> Vec<CaptureError> {
        let mut problems = Vec::new();
        if gone.is_empty() {
            return problems;
        }
        self.unwinder.forget(&mut self.session, gone);
        let heap_gone: Vec<Pid> = gone.iter().copied().filter(|pid| self.heap.contains_key(pid)).collect();
        if let Err(err) = self.session.detach_heap(&heap_gone) {
            problems.push(CaptureError::Forget(err));
        }
        if let Err(err) = self.session.forget_heap(&heap_gone) {
            problems.push(CaptureError::Forget(err));
        }
        for pid in gone {
            self.heap.remove(pid);
        }
        problems
    }
}

/// The exec'd processes (`execs`, as the kernel listed them) whose catalogue entry is read
/// again now. With the side band, none: the exec's events already told its new mappings (and
/// the unwinder, told of the exec then, registers it again); what the kernel lists then are
/// the failed execs, whose process the unwinder just forgot and registers again with the
/// mappings it still has. Without it, those of the chosen `scope` (empty: every process).
pub(super) fn execs_to_mark(sideband_open: bool, execs: Vec<Pid>, scope: &[Pid]) -> Vec<Pid> {
    if sideband_open {
        return Vec::new();
    }
    execs.into_iter().filter(|&pid| in_scope(scope, pid)).collect()
}

/// Of the processes that exited without data, those a drain forgets: all but the pids
/// chosen by name (a snapshot of `-p PID` keeps its process to the end, data or not).
pub(super) fn forgettable(mut gone: Vec<Pid>, scope: &[Pid]) -> Vec<Pid> {
    gone.retain(|pid| !scope.contains(pid));
    gone
}

/// Ages the names the walkers' asks gave by one drain: a name `name_it` used (it named a
/// process nothing else names) goes, and so does one that waited [`super::follow`]'s
/// `ASKED_NAME_DRAINS` drains, so that a pid reused later never takes an old name.
pub(super) fn age_asked_names(names: &mut HashMap<Pid, (String, u8)>, mut name_it: impl FnMut(Pid, &str) -> bool) {
    names.retain(|&pid, (name, drains)| {
        *drains = drains.saturating_sub(1);
        !name_it(pid, name) && *drains > 0
    });
}

/// Whether the backlog's registration goes on after a slice: not when it is `done`, nor past
/// the drain's `deadline` ([`UNWIND_SYNC_BUDGET`]; the rest waits for the next drain).
pub(super) fn backlog_continues(done: bool, now: Instant, deadline: Instant) -> bool {
    !done && now < deadline
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_the_side_band_the_scopes_execs_are_read_again_and_with_it_none() {
        let execs = vec![Pid(1), Pid(2), Pid(3)];
        assert_eq!(execs_to_mark(false, execs.clone(), &[]), execs);
        assert_eq!(execs_to_mark(false, execs.clone(), &[Pid(2), Pid(9)]), [Pid(2)]);
        // The side band told the execs' mappings already; the kernel's list is of failed ones.
        assert!(execs_to_mark(true, execs.clone(), &[]).is_empty());
        assert!(execs_to_mark(true, execs, &[Pid(2)]).is_empty());
    }

    #[test]
    fn a_drain_forgets_every_process_gone_but_those_chosen_by_pid() {
        let gone = vec![Pid(1), Pid(2), Pid(3)];
        assert_eq!(forgettable(gone.clone(), &[]), gone);
        assert_eq!(forgettable(gone.clone(), &[Pid(2)]), [Pid(1), Pid(3)]);
        assert!(forgettable(gone, &[Pid(3), Pid(1), Pid(2)]).is_empty());
    }

    #[test]
    fn an_asked_name_is_dropped_once_used_or_after_its_drains() {
        let mut names: HashMap<Pid, (String, u8)> = HashMap::new();
        super::super::follow::note_ask(&mut names, Pid(1), "used".into());
        super::super::follow::note_ask(&mut names, Pid(2), "waits".into());
        let mut asked = Vec::new();
        age_asked_names(&mut names, |pid, name| {
            asked.push((pid, name.to_string()));
            pid == Pid(1)
        });
        asked.sort();
        assert_eq!(asked, [(Pid(1), "used".to_string()), (Pid(2), "waits".to_string())]);
        // The name used is gone; the other waits for its process one more drain...
        assert_eq!(names.keys().copied().collect::<Vec<_>>(), [Pid(2)]);
        // ...and no longer, used or not: a pid reused later must not take it.
        age_asked_names(&mut names, |_, _| false);
        assert!(names.is_empty());
    }

    #[test]
    fn the_backlog_is_registered_until_done_or_past_its_budget() {
        let now = Instant::now();
        let deadline = now + UNWIND_SYNC_BUDGET;
        assert!(backlog_continues(false, now, deadline));
        assert!(!backlog_continues(true, now, deadline));
        assert!(!backlog_continues(false, deadline, deadline));
        assert!(!backlog_continues(false, deadline + Duration::from_millis(1), deadline));
    }
}
