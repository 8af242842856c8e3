//! What the runtimes' walkers (see [`crate::runtimes`]) are given of a registered process:
//! its interpreter found from its mappings, written for the kernel walker, and forgotten.

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
