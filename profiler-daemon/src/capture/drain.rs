//! Reading the kernel's maps: [`Capture::drain`] flips the map sets and learns what the idle
//! one names, [`Capture::live`] reads the live heap, and [`Capture::prune`] and its helper forget
//! what exited (the unwinder's tables, heap probes, kernel state).

use std::{
    collections::HashSet,
    time::{Duration, Instant},
};

use super::{log_slow, scope::seen, Capture, CaptureError, Drained, Live};
use crate::{
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
        self.read_asks();
        let new_stacks = self.catalog.learn(&batch.stacks, &profiles::sightings(&batch));
        // A process whose fork's record was lost (the side band's rings overflow under a
        // storm of thread events while this thread is busy) and that exited before `/proc`
        // was read has no name but the one its walker's ask gave.
        self.asked_names.retain(|&pid, (name, drains)| {
            *drains -= 1;
            !self.catalog.name_if_unnamed(pid, name) && *drains > 0
        });
        self.catalog.note_over_share(&batch.over_share);
        let mut problems = Vec::new();
        let (catalog, selection, scope) = (&self.catalog, &self.selection, &self.scope);
        if let Err(err) = self.declined.settle(&mut self.session, |pid| seen(catalog, selection, scope, pid)) {
            problems.push(CaptureError::Decline(err));
        }
        match self.unwinder.take_execs(&mut self.session) {
            // A new image is registered now, not after its first sample: until then its
            // stacks would be walked with frame pointers only.
            // With the side band, the exec's events already told its new mappings (and the
            // unwinder, told of the exec above, registers it again); what the kernel lists
            // then are the failed execs, whose process the unwinder just forgot and
            // registers again below with the mappings it still has.
            Ok(_) if self.sideband.is_some() => {}
            Ok(pids) => {
                for pid in pids {
                    if self.in_scope(pid) {
                        self.catalog.exec_seen(pid);
                    }
                }
            }
            Err(err) => problems.push(CaptureError::Execs(err)),
        }
        // Probes of an exited process go now, not after the catalogue's grace: each holds
        // descriptors, and a pool of short-lived workers would exhaust them. What they
        // counted was drained above.
        let exited: Vec<Pid> = self.heap.keys().copied().filter(|pid| !procs::exists(pid.0)).collect();
        if let Err(err) = self.session.detach_heap(&exited) {
            problems.push(CaptureError::Forget(err));
        }
        let scope = self.scope.clone();
        let mut gone = self.catalog.prune_unsampled(UNSAMPLED_GRACE);
        gone.extend(self.catalog.forget_unsampled(&exited_unsampled));
        gone.retain(|pid| !scope.contains(pid));
        problems.extend(self.forget(&gone));
        if let Err(err) = self.session.flush_unwind_removals() {
            problems.push(CaptureError::Forget(err));
        }
        // The backlog (processes seen in /proc, not yet registered) goes in slices, the side
        // band's new processes between them: a program started now must not wait the whole
        // budget behind processes that have run for hours.
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
                Ok(true) => break,
                Ok(false) if Instant::now() < deadline => {}
                Ok(false) => break,
                Err(err) => {
                    problems.push(CaptureError::UnwindTables(err));
                    break;
                }
            }
        }
        log_slow("drain: sync the unwinder", started);
        self.count_registered_execs();
        for problem in &problems {
            tracing::warn!("{}", crate::error::chain(problem));
        }
        Ok(Drained { batch, new_stacks, gone, reused, problems })
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
