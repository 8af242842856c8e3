//! Draining the capture into the counts: every drained batch is counted in the interval, the
//! since-start totals and every open window; pids reused by a new process are forgotten in all
//! of them; and the stacks new in a batch are symbolized ahead of the dump.

use std::{
    collections::{BTreeMap, HashSet},
    time::Instant,
};

use super::{Collector, DRAIN_INTERVAL};
use crate::{
    capture::{log_slow, Drained},
    ids::{Pid, StackId},
    resolve::{self, StackSample},
};

impl Collector {
    /// Drains one map set into every open window and symbolizes what is new. Returns the
    /// pids reused meanwhile, already forgotten in the collector's counts (a dump forgets
    /// them in the interval it is writing too).
    pub(super) fn drain(&mut self) -> Vec<Pid> {
        self.next_drain = Instant::now() + DRAIN_INTERVAL;
        match self.capture.drain() {
            Ok(drained) => self.take(drained),
            Err(err) => {
                self.record_error(&err);
                Vec::new()
            }
        }
    }

    /// Counts a drained batch in every window, and forgets what the capture forgot. Returns
    /// the pids reused (see [`Collector::drain`]).
    fn take(&mut self, drained: Drained) -> Vec<Pid> {
        let Drained { batch, new_stacks, gone, mut reused, problems } = drained;
        self.forget_reused(&reused);
        self.interval.add(&batch);
        self.total.add(&batch);
        for window in &mut self.windows {
            // A window answers for one process: keep only its counts, not the machine's.
            window.counts.add(&batch);
            window.counts.retain_only(window.query.pid);
        }
        for pid in &gone {
            self.heap_failed.remove(pid);
        }
        if let Some(problem) = problems.last() {
            self.record_error(problem);
        }
        let started = Instant::now();
        reused.extend(self.presymbolize(&batch, &new_stacks));
        log_slow("presymbolize", started);
        reused
    }

    /// Drops what was counted under pids a new process now has (the old process exited):
    /// its profiles would otherwise carry the old process's samples under the new name.
    pub(super) fn forget_reused(&mut self, pids: &[Pid]) {
        if pids.is_empty() {
            return;
        }
        self.interval.forget(pids);
        self.total.forget(pids);
        for window in &mut self.windows {
            window.counts.forget(pids);
        }
        for pid in pids {
            self.heap_failed.remove(pid);
        }
    }

    /// Symbolizes the addresses of stacks first seen in this drain, so that the dump finds
    /// them in the symbol cache: the cost of reading a file's symbols is paid a little per
    /// drain as stacks appear, and a dump (or a query) only encodes. Only processes the
    /// output selects are symbolized. Returns the pids reused meanwhile (forgotten).
    fn presymbolize(&mut self, batch: &crate::ebpf::Batch, new_stacks: &HashSet<StackId>) -> Vec<Pid> {
        let mut reused = Vec::new();
        if new_stacks.is_empty() {
            return reused;
        }
        let mut by_pid: BTreeMap<Pid, Vec<StackSample>> = BTreeMap::new();
        for seen in crate::profiles::sightings(batch) {
            if new_stacks.contains(&seen.user_stack) || new_stacks.contains(&seen.kernel_stack) {
                by_pid.entry(seen.pid).or_default().push(StackSample {
                    user_stack: seen.user_stack,
                    kernel_stack: seen.kernel_stack,
                    user_leaf_is_return: seen.user_leaf_is_return,
                    values: Vec::new(),
                    unscaled: Vec::new(),
                    labels: Vec::new(),
                });
            }
        }
        for (pid, samples) in by_pid {
            // A process's first files take tens of ms to read (libc's symbols: ~60 ms): new
            // processes are registered with the unwinder between processes, not after all.
            let more = self.capture.follow();
            self.forget_reused(&more);
            reused.extend(more);
            if reused.contains(&pid) {
                continue;
            }
            let catalog = self.capture.catalog();
            let Some(process) = catalog.process(pid) else { continue };
            if self.config.processes.matches(&process.facts()) {
                // The result is dropped: what is kept is the symbolizer's cache.
                let _ = resolve::resolve(process, catalog, samples, &mut self.sym);
            }
        }
        reused
    }

    /// Reads the live heap blocks into every window (then drains, so the stacks they name
    /// are known).
    pub(super) fn refresh_live(&mut self) {
        if self.capture.heap_pids().is_empty() {
            return;
        }
        let live = match self.capture.live() {
            Ok(live) => live,
            Err(err) => return self.record_error(&err),
        };
        self.live_blocks = live.blocks.len();
        self.interval.set_live(&live.pids, &live.blocks);
        self.total.set_live(&live.pids, &live.blocks);
        for window in &mut self.windows {
            window.counts.set_live(&live.pids, &live.blocks);
        }
        self.take(live.drained);
    }
}
