//! What the runtimes' walkers (see [`crate::runtimes`]) are given of a registered process:
//! its interpreter found from its mappings, written for the kernel walker, and forgotten;
//! and for a Go executable, where the sampling program reads its goroutines' labels.

use profiler_common::runtimes::go::GoProcess;

use super::{Registered, Unwinder};
use crate::{
    ebpf::{Result, Session},
    ids::Pid,
    offload::Charge,
    opened,
    procs::MapEntry,
    runtimes::{self, Walked},
};

impl Unwinder {
    /// The interpreter of `pid`: the one the walker was given already (an image's
    /// interpreter stays where it is until an exec, which ends the registration), else
    /// looked for when a mapped file is named like a runtime's. `(interpreter, new)`.
    pub(super) fn find_runtime(&mut self, pid: Pid, maps: &[MapEntry]) -> Option<(Walked, bool)> {
        if let Some(known) = self.processes.get(&pid).and_then(|r| r.runtime) {
            return Some((known, false));
        }
        let runtime = runtimes::candidate(maps)?;
        let owned = maps.to_vec();
        let found = self
            .offload
            .call(&format!("{runtime:?} of pid {pid}"), Charge::path(pid), move |state| {
                let charger = state.charger();
                runtime.find(pid, &owned, &|map: &MapEntry| opened::open_on_worker(&charger, pid, map))
            })
            .map_err(|stall| stall.to_string())
            .and_then(|found| found);
        match found {
            Ok(Some(walked)) => Some((walked, true)),
            Ok(None) => None,
            Err(why) => {
                tracing::debug!(%pid, ?runtime, reason = %why, "no interpreted frames from the kernel walker");
                let stats = self.stats.runtimes.of_mut(runtime);
                stats.unsupported += 1;
                stats.unsupported_reason = Some(why);
                None
            }
        }
    }

    /// Writes `pid`'s interpreter found by [`Self::find_runtime`] for the walker, if it is
    /// new. Returns it, or `None` when the map is full (counted).
    pub(super) fn give_runtime(
        &mut self,
        session: &mut Session,
        pid: Pid,
        (walked, new): (Walked, bool),
    ) -> Result<Option<Walked>> {
        if new && !walked.give(session, pid)? {
            self.stats.runtimes.of_mut(walked.runtime()).map_full += 1;
            return Ok(None);
        }
        Ok(Some(walked))
    }

    /// Deletes `pid`'s interpreter from the walker's map, if it was given one (rare enough
    /// to go at once, unlike the mapping lists' batched deletions). A failure is logged: the
    /// entry then stays until the pid registers again, walking a dead process's addresses
    /// in whichever process reuses it, whose words userspace checks before naming them.
    pub(super) fn forget_runtime(&mut self, session: &mut Session, pid: Pid, old: &Registered) {
        let Some(walked) = old.runtime else { return };
        if let Err(err) = walked.forget(session, pid) {
            let runtime = walked.runtime();
            tracing::warn!(%pid, ?runtime, error = %err, "could not remove a process from a runtime walker's map");
        }
    }
}

impl Unwinder {
    /// Gives the sampling program `pid`'s Go label entry if its executable is a Go binary
    /// whose labels it can read (`given`: the entry it has already). Returns the entry it has.
    pub(super) fn give_go(
        &mut self,
        session: &mut Session,
        pid: Pid,
        maps: &[MapEntry],
        given: Option<GoProcess>,
    ) -> Result<Option<GoProcess>> {
        let found = self.find_go(pid, maps);
        if found == given {
            return Ok(given);
        }
        match found {
            Some(entry) if session.set_go_process(pid, Some(&entry))? => Ok(Some(entry)),
            Some(_) => {
                self.stats.go_labels.map_full += 1;
                Ok(None)
            }
            None => {
                session.set_go_process(pid, None)?;
                Ok(None)
            }
        }
    }

    /// The Go label entry of `pid`'s executable (its lowest file mapping), from the file's
    /// facts read with its unwind table's (no read of its own).
    fn find_go(&mut self, pid: Pid, maps: &[MapEntry]) -> Option<GoProcess> {
        let exe = maps.iter().filter(|m| !m.unmapped && m.is_file()).min_by_key(|m| m.start)?;
        match self.file_info(pid, exe)?.go {
            Ok(entry) => entry,
            Err(why) => {
                tracing::debug!(%pid, reason = %why, "no Go labels on this process's samples");
                self.stats.go_labels.unsupported += 1;
                self.stats.go_labels.unsupported_reason = Some(why);
                None
            }
        }
    }

    /// Deletes `pid`'s Go label entry, if it was given one.
    pub(super) fn forget_go(&mut self, session: &mut Session, pid: Pid, old: &Registered) {
        if old.go.is_none() {
            return;
        }
        if let Err(err) = session.set_go_process(pid, None) {
            tracing::warn!(%pid, error = %err, "could not remove a process from the Go labels map");
        }
    }
}
