//! The catalogue's stack table: every stack drained so far, by id, within a count and a
//! number of frames; each process's share of the stacks learnt since the last dump; and the
//! eviction of stacks only history names when the table is full.

use std::{
    collections::{HashMap, HashSet},
    sync::Arc,
};

use super::{Catalog, Sighting};
use crate::ids::{Pid, StackId};

/// A stack's frames and the batch that last named it.
#[derive(Debug)]
pub(super) struct KnownStack {
    pub(super) frames: Arc<[u64]>,
    pub(super) last_batch: u64,
}

impl Catalog {
    /// Stores the batch's stacks not known yet, as far as the table and the shares allow.
    /// Returns those stored, and the refusals over a share, by process.
    pub(super) fn learn_stacks(
        &mut self,
        stacks: &HashMap<StackId, Vec<u64>>,
        sightings: &[Sighting<'_>],
    ) -> (HashSet<StackId>, Vec<(Pid, u64)>) {
        let mut new_stacks = HashSet::new();
        // The processes naming each stack, for the shares: a stack many share (a common
        // kernel path) is refused only when every one of them holds its share, and charged
        // to one that does not.
        let mut named_by: HashMap<StackId, Vec<Pid>> = HashMap::new();
        if self.process_share.is_some() {
            for seen in sightings {
                for id in [seen.user_stack, seen.kernel_stack] {
                    let pids = named_by.entry(id).or_default();
                    if !pids.contains(&seen.pid) {
                        pids.push(seen.pid);
                    }
                }
            }
        }
        let mut refused = Vec::new();
        for (&id, frames) in stacks {
            if let Some(known) = self.stacks.get_mut(&id) {
                known.last_batch = self.batches;
                continue;
            }
            let pids = named_by.get(&id).map_or(&[][..], |p| &p[..]);
            let owner = pids.iter().copied().find(|&pid| !self.over_share(pid));
            if let (None, Some(&first)) = (owner, pids.first()) {
                refused.push((first, 1));
                continue;
            }
            if !self.room_for(frames.len()) {
                self.dropped_stacks += 1;
                continue;
            }
            self.frames_held += frames.len();
            self.stacks.insert(id, KnownStack { frames: frames.as_slice().into(), last_batch: self.batches });
            new_stacks.insert(id);
            if let Some(pid) = owner {
                *self.held.entry(pid).or_default() += 1;
            }
        }
        (new_stacks, refused)
    }

    /// Caps each process at `percent` of the table among the stacks learnt since the last
    /// dump, once the table is half full, as the kernel caps its own table: without it, one
    /// process making new stacks every second (each second's within the kernel's share)
    /// would fill the table before the next dump and every other process's new stacks
    /// would be dropped until then. 100: no cap.
    pub fn set_process_share(&mut self, percent: u32) {
        let cap = profiler_common::share::cap(self.max_stacks as u64, percent) as usize;
        self.process_share = (cap != 0 && self.max_stacks != usize::MAX).then_some(cap);
    }

    /// Adds refusals over a share (see [`Catalog::stacks_over_share`]).
    pub fn note_over_share(&mut self, refused: &[(Pid, u64)]) {
        for &(pid, count) in refused {
            self.stacks_over_share += count;
            if let Some(process) = self.processes.get_mut(&pid) {
                process.stacks_over_share += count;
            }
        }
    }

    /// Whether `pid` may not add a stack now: it holds its share and the table is half full.
    pub(super) fn over_share(&self, pid: Pid) -> bool {
        self.process_share.is_some_and(|share| {
            self.stacks.len() >= self.max_stacks / 2 && self.held.get(&pid).is_some_and(|&held| held >= share)
        })
    }

    /// Number of stacks kept.
    pub fn stack_count(&self) -> usize {
        self.stacks.len()
    }

    /// The frames of a stack (leaf first); `None` for a stack not (yet) drained.
    pub fn stack(&self, id: StackId) -> Option<&[u64]> {
        if id == StackId::NONE || id == StackId::OVER_SHARE || id == StackId::EVICTED {
            return Some(&[]);
        }
        self.stacks.get(&id).map(|known| &known.frames[..])
    }

    /// Whether a new stack of `frames` frames fits, after evicting history if the table is
    /// full (of stacks or of frames).
    pub(super) fn room_for(&mut self, frames: usize) -> bool {
        while self.stacks.len() >= self.max_stacks || self.frames_held + frames > self.max_frames {
            if !self.evict_history() {
                return false;
            }
        }
        true
    }

    /// Frames of the stacks held.
    pub fn frames_held(&self) -> usize {
        self.frames_held
    }

    /// Makes room in a full table by forgetting the stacks seen least recently, among those
    /// last seen before the last dump, so a new stack is never refused because of history.
    /// Evicts a sixteenth of the stacks held at once, so the sort is paid once per many new
    /// stacks.
    /// False when every stack was seen since the last dump.
    pub(super) fn evict_history(&mut self) -> bool {
        let mut old: Vec<(u64, StackId)> = self
            .stacks
            .iter()
            .filter(|(_, known)| known.last_batch < self.evictable_before)
            .map(|(&id, known)| (known.last_batch, id))
            .collect();
        if old.is_empty() {
            return false;
        }
        old.sort_unstable();
        let count = (self.stacks.len() / 16).clamp(1, old.len());
        for (_, id) in &old[..count] {
            if let Some(gone) = self.stacks.remove(id) {
                self.frames_held -= gone.frames.len();
            }
        }
        self.evicted_stacks += count as u64;
        tracing::debug!(evicted = count, "stack table full: forgot stacks seen before the last dump");
        true
    }
}
