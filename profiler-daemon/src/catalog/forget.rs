//! When the catalogue forgets a process: after a dump once it is gone and a grace is over,
//! soon after an exit the side band reported, or at once when it exited without data; and
//! the departed processes it remembers for later queries of their pid.

use std::{
    collections::HashSet,
    time::{Duration, Instant, SystemTime},
};

use super::{Catalog, Departed, KnownProcess};
use crate::{
    ids::{Pid, StackId},
    procs,
};

/// Departed processes remembered, most recent last.
const DEPARTED_KEPT: usize = 4096;
/// How long after its reported exit a process is kept at most (see [`Catalog::prune`]):
/// records read late, and a drain, fit in it.
pub(super) const EXIT_REPORTED_GRACE: Duration = Duration::from_secs(3);

impl Catalog {
    /// Forgets processes not seen for `grace` that no longer exist, and keeps only the
    /// stacks in `keep` (those the counts still held reference). The daemon calls it after
    /// each dump: from then on the stacks learnt so far may be evicted for new ones (see
    /// [`Catalog::evict_history`]). A process whose exit the side band reported goes once
    /// the exit is [`EXIT_REPORTED_GRACE`] old, whatever `grace`: its samples were all
    /// taken before it, so drained and dumped by then; a machine running hundreds of
    /// programs a second would otherwise hold `grace`'s worth of those it sampled. Returns
    /// the pids forgotten.
    pub fn prune(&mut self, grace: Duration, keep: &HashSet<StackId>) -> Vec<Pid> {
        let mut gone = Vec::new();
        if self.exits_followed && !self.exits_lost {
            gone = self.forget_exited(EXIT_REPORTED_GRACE.min(grace), |p| p.exited, true);
        }
        gone.extend(self.forget_exited(grace, |_| true, false));
        self.exits_lost = false;
        let mut freed = 0;
        self.stacks.retain(|id, known| {
            let kept = keep.contains(id);
            if !kept {
                freed += known.frames.len();
            }
            kept
        });
        self.frames_held -= freed;
        self.evictable_before = self.batches + 1;
        // Every stack held so far may be evicted from now on.
        self.held.clear();
        gone
    }

    /// Forgets processes that exited without any data and were last seen over `grace` ago
    /// (a few drains: a sample taken just before the exit is drained by then). Returns
    /// their pids.
    pub fn prune_unsampled(&mut self, grace: Duration) -> Vec<Pid> {
        let trust_events = self.exits_followed && !self.exits_lost;
        self.forget_exited(grace, |p| !p.sampled, trust_events)
    }

    /// The processes whose exit the side band reported and that have no data yet. Taken
    /// before the map sets flip: every sample such a process took is then in the set being
    /// drained, so those still without data after it will never have any
    /// ([`Catalog::forget_unsampled`]), and need not wait out a grace. A machine running
    /// hundreds of programs a second otherwise holds seconds' worth of them. Empty when
    /// exits are not followed from events, or some were lost.
    pub fn exited_unsampled(&self) -> Vec<Pid> {
        if !self.exits_followed || self.exits_lost {
            return Vec::new();
        }
        self.processes.values().filter(|p| p.exited && !p.sampled).map(|p| p.pid).collect()
    }

    /// Forgets those of `pids` that exited and still have no data (a new process that took
    /// one of the pids meanwhile stays). Returns them.
    pub fn forget_unsampled(&mut self, pids: &[Pid]) -> Vec<Pid> {
        let gone: Vec<Pid> = pids
            .iter()
            .copied()
            .filter(|pid| self.processes.get(pid).is_some_and(|p| p.exited && !p.sampled))
            .collect();
        for pid in &gone {
            if let Some(process) = self.processes.remove(pid) {
                self.remember_departed(process);
            }
        }
        gone
    }

    /// Removes the processes for which `which` holds that were last seen over `grace` ago
    /// and no longer exist: as the exit events say when `trust_events`, else as the kernel
    /// says now.
    pub(super) fn forget_exited(
        &mut self,
        grace: Duration,
        which: impl Fn(&KnownProcess) -> bool,
        trust_events: bool,
    ) -> Vec<Pid> {
        let now = Instant::now();
        let gone_now = |p: &KnownProcess| if trust_events { p.exited } else { p.exited || !procs::exists(p.pid.0) };
        let gone: Vec<Pid> = self
            .processes
            .values()
            .filter(|p| which(p) && now.duration_since(p.last_seen) > grace && gone_now(p))
            .map(|p| p.pid)
            .collect();
        for pid in &gone {
            if let Some(process) = self.processes.remove(pid) {
                self.remember_departed(process);
            }
        }
        gone
    }

    /// Keeps a forgotten process's name and when it was last seen, for later queries of its
    /// pid.
    pub(super) fn remember_departed(&mut self, process: KnownProcess) {
        if self.departed.len() == DEPARTED_KEPT {
            self.departed.pop_front();
        }
        let (now, wall) = (Instant::now(), SystemTime::now());
        let last_seen = wall.checked_sub(now.duration_since(process.last_seen)).unwrap_or(wall);
        self.departed.push_back(Departed { pid: process.pid, name: process.name, last_seen });
    }
}
