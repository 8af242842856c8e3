//! What is *known* about the processes and stacks of a capture: each process's identity and
//! mappings, from the kernel's events as they happen ([`events`]: forks, `exec`s, executable
//! mappings, exits) and from `/proc` while it lives, and every stack drained so far, by id.
//! The counts over a window are [`crate::profiles::Counts`]; a snapshot keeps one catalogue
//! and one `Counts`, the daemon one catalogue and several `Counts` (the interval, since
//! start, on-demand windows) fed by the same batches.//!
//! The catalogue is here; [`stacks`] owns the stack table (its shares and eviction),
//! [`processes`] what is read of a process from `/proc`, and [`forget`] when a process is
//! forgotten and remembered as departed.

mod events;
mod forget;
mod processes;
mod stacks;
#[cfg(test)]
mod tests;

pub use events::Applied;

use std::{
    collections::{BTreeMap, HashMap, HashSet, VecDeque},
    time::{Instant, SystemTime},
};

use self::stacks::KnownStack;
use crate::{
    config::ProcessFacts,
    ids::{Pid, StackId},
    procs::{MapEntry, ProcessInfo},
};

/// A process as known from `/proc` (or only from its samples, if it was gone too soon).
#[derive(Debug, Clone)]
pub struct KnownProcess {
    pub pid: Pid,
    /// The process name (its `comm`).
    pub name: String,
    /// Mappings and owner, from `/proc` and the kernel's events; `None` when the process was
    /// gone before either told anything (its user frames stay unsymbolized and are counted
    /// as such).
    pub info: Option<ProcessInfo>,
    /// Whether `info` was read from `/proc` (its owner, cgroup and start time are known);
    /// a process known from events only is read at its first sample if it still lives.
    pub inspected: bool,
    /// When its last `exec` happened (`CLOCK_MONOTONIC` ns; 0 when none was seen): a
    /// mapping event from before it belongs to the old image.
    pub exec_time: u64,
    /// Its exit was seen (a later fork of the same pid is another process).
    pub exited: bool,
    /// When the process was last seen in a batch.
    pub last_seen: Instant,
    /// Bumped each time re-reading `/proc/PID/maps` found new mappings (`dlopen`), so the
    /// unwinder knows to reload the process's tables.
    pub maps_version: u32,
    /// Whether any batch had data of it. Processes are also tracked before their first
    /// sample (every `execve`, heap targets); one that exits with none is forgotten by
    /// [`Catalog::prune_unsampled`] within seconds rather than after the full grace, or a
    /// machine running thousands of short commands a second would hold a grace period's
    /// worth of them.
    pub sampled: bool,
    /// Refusals of a new stack since it was first seen because it held its share of the
    /// kernel's stack table (one per sample) or of this catalogue (one per stack and drain;
    /// see [`Catalog::set_process_share`]).
    pub stacks_over_share: u64,
}

impl KnownProcess {
    /// The captured mappings, those gone since included (none when the process was never
    /// inspected).
    pub fn maps(&self) -> &[MapEntry] {
        self.info.as_ref().map_or(&[][..], |info| &info.maps[..])
    }

    /// The owner's uid, when the process was inspected.
    pub fn uid(&self) -> Option<u32> {
        self.info.as_ref().map(|info| info.uid)
    }

    /// What the process matchers of the configuration look at.
    pub fn facts(&self) -> ProcessFacts<'_> {
        let info = self.info.as_ref();
        ProcessFacts {
            pid: self.pid.0,
            name: &self.name,
            exe: info.and_then(|i| i.exe.as_deref()),
            cgroup: info.and_then(|i| i.cgroup.as_deref()),
        }
    }
}

/// A process seen in a drained batch, with the stacks one of its samples names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sighting<'a> {
    pub pid: Pid,
    pub user_stack: StackId,
    pub kernel_stack: StackId,
    /// The user stack's leaf is a return address (a stack taken on return from a call).
    pub user_leaf_is_return: bool,
    /// The thread's name when the sample is of the process's main thread (CPU samples).
    pub main_thread_name: Option<&'a str>,
}

/// A process forgotten after it exited, for the answer to a later query of its pid.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Departed {
    pub pid: Pid,
    pub name: String,
    /// When it was last seen alive (in a batch, or tracked).
    pub last_seen: SystemTime,
}

/// Processes and stacks known so far.
#[derive(Debug)]
pub struct Catalog {
    processes: BTreeMap<Pid, KnownProcess>,
    departed: VecDeque<Departed>,
    stacks: HashMap<StackId, KnownStack>,
    max_stacks: usize,
    /// Frames the stacks held may have in all: the table's memory is its frames (a stack of
    /// 50 frames takes 400 bytes of them, a hundred of hash entry), so this bounds it
    /// whatever the depth, where a count of stacks alone let deep ones take 100 MiB.
    max_frames: usize,
    /// Frames of the stacks held now.
    frames_held: usize,
    /// Batches learnt so far: the clock of [`KnownStack::last_batch`].
    batches: u64,
    /// Stacks last seen in an earlier batch than this one have been in a dump already (set
    /// at [`Catalog::prune`], which the daemon runs after each dump): only the since-start
    /// totals and windows still name them, and they may be evicted for new ones.
    evictable_before: u64,
    /// Stacks not kept because the table was full of stacks seen since the last dump (their
    /// samples lose their frames).
    pub dropped_stacks: u64,
    /// Stacks forgotten to make room for new ones: seen last before the last dump, named
    /// only by history (since-start totals, windows), whose samples there lose their frames.
    pub evicted_stacks: u64,
    /// Refusals of a new stack since start because its process held its share: of the
    /// kernel's stack table (or its uid did; one per sample; see `profiler_common::share`) or
    /// of this table (one per stack and drain).
    pub stacks_over_share: u64,
    /// Stacks one process may hold among those learnt since the last dump, once the table
    /// is half full; `None`: no cap.
    process_share: Option<usize>,
    /// Stacks each process brought in (the first to name them) since the last dump: the
    /// ones eviction cannot take, which a share bounds.
    held: HashMap<Pid, usize>,
    /// Every exit comes as an event (the capture's side band is open): between dumps a
    /// process not marked exited is taken to live, without asking the kernel.
    exits_followed: bool,
    /// Event records were lost since the last full check: an exit may be among them.
    exits_lost: bool,
}

impl Default for Catalog {
    fn default() -> Self {
        Self::with_max_stacks(usize::MAX)
    }
}

impl Catalog {
    /// A catalogue that keeps at most `max_stacks` distinct stacks.
    pub fn with_max_stacks(max_stacks: usize) -> Self {
        Self::with_limits(max_stacks, usize::MAX)
    }

    /// A catalogue that keeps at most `max_stacks` distinct stacks of `max_frames` frames in
    /// all.
    pub fn with_limits(max_stacks: usize, max_frames: usize) -> Self {
        Self {
            processes: BTreeMap::new(),
            departed: VecDeque::new(),
            stacks: HashMap::new(),
            max_stacks,
            max_frames,
            frames_held: 0,
            batches: 0,
            evictable_before: 0,
            dropped_stacks: 0,
            evicted_stacks: 0,
            stacks_over_share: 0,
            process_share: None,
            held: HashMap::new(),
            exits_followed: false,
            exits_lost: false,
        }
    }

    /// Every process exit will come as an event from now on ([`Catalog::apply`]), so
    /// [`Catalog::prune_unsampled`] need not ask the kernel about each idle process each
    /// drain (at 2,000 processes that was most of the daemon's CPU). [`Catalog::prune`]
    /// still checks every process, for an exit before the events began or among lost ones.
    pub fn follow_exits(&mut self) {
        self.exits_followed = true;
    }

    /// Learns a batch's stacks and the processes its samples name. Reads `/proc` for
    /// processes seen for the first time, and again for those with user frames outside
    /// their known mappings. Returns the stacks stored for the first time.
    pub fn learn(&mut self, stacks: &HashMap<StackId, Vec<u64>>, sightings: &[Sighting<'_>]) -> HashSet<StackId> {
        self.batches += 1;
        let (new_stacks, refused) = self.learn_stacks(stacks, sightings);
        self.see_processes(stacks, sightings);
        self.note_over_share(&refused);
        new_stacks
    }

    /// A known process.
    pub fn process(&self, pid: Pid) -> Option<&KnownProcess> {
        self.processes.get(&pid)
    }

    /// Known processes by pid.
    pub fn processes(&self) -> impl Iterator<Item = &KnownProcess> {
        self.processes.values()
    }

    /// The last process with this pid that was forgotten after it exited, if remembered.
    pub fn departed(&self, pid: Pid) -> Option<&Departed> {
        self.departed.iter().rev().find(|d| d.pid == pid)
    }
}
