//! What is *known* about the processes and stacks of a capture: each process's identity and
//! mappings, from the kernel's events as they happen ([`events`]: forks, `exec`s, executable
//! mappings, exits) and from `/proc` while it lives, and every stack drained so far, by id.
//! The counts over a window are [`crate::profiles::Counts`]; a snapshot keeps one catalogue
//! and one `Counts`, the daemon one catalogue and several `Counts` (the interval, since
//! start, on-demand windows) fed by the same batches.

mod events;

pub use events::Applied;

use std::{
    collections::{BTreeMap, HashMap, HashSet, VecDeque},
    sync::Arc,
    time::{Duration, Instant, SystemTime},
};

use crate::{
    config::ProcessFacts,
    ids::{Pid, StackId},
    procs::{self, MapEntry, ProcessInfo},
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

/// Departed processes remembered, most recent last.
const DEPARTED_KEPT: usize = 4096;
/// How long after its reported exit a process is kept at most (see [`Catalog::prune`]):
/// records read late, and a drain, fit in it.
const EXIT_REPORTED_GRACE: Duration = Duration::from_secs(3);

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

/// A stack's frames and the batch that last named it.
#[derive(Debug)]
struct KnownStack {
    frames: Arc<[u64]>,
    last_batch: u64,
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
        let mut new_stacks = HashSet::new();
        self.batches += 1;
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
        let now = Instant::now();
        let mut uncovered = Vec::new();
        for seen in sightings {
            let process = self.processes.entry(seen.pid).or_insert_with(|| first_sight(seen.pid, ""));
            if !process.inspected {
                inspect(process);
            }
            process.last_seen = now;
            process.sampled = true;
            if let (None, Some(name)) = (&process.info, seen.main_thread_name) {
                if !name.is_empty() {
                    process.name = name.to_string();
                }
            }
            let frames = stacks.get(&seen.user_stack).map_or(&[][..], |f| &f[..]);
            if let Some(info) = &process.info {
                if frames.iter().any(|&ip| info.mapping_of(ip).is_none()) {
                    uncovered.push(seen.pid);
                }
            }
        }
        uncovered.sort_unstable();
        uncovered.dedup();
        for pid in uncovered {
            self.refresh_mappings(pid);
        }
        self.note_over_share(&refused);
        new_stacks
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
    fn over_share(&self, pid: Pid) -> bool {
        self.process_share.is_some_and(|share| {
            self.stacks.len() >= self.max_stacks / 2 && self.held.get(&pid).is_some_and(|&held| held >= share)
        })
    }

    /// Registers a process before it has data (heap targets, chosen processes), so its
    /// mappings are captured while it is surely alive.
    pub fn track(&mut self, pid: Pid) {
        let process = self.processes.entry(pid).or_insert_with(|| first_sight(pid, ""));
        process.last_seen = Instant::now();
    }

    /// Reads `/proc` now for `pid` if it is known from events only (see [`inspect`]).
    pub fn inspect(&mut self, pid: Pid) {
        if let Some(process) = self.processes.get_mut(&pid).filter(|p| !p.inspected) {
            inspect(process);
        }
    }

    /// A process called `execve`: its mappings are read again (or for the first time), so
    /// its new image is known before its first sample.
    pub fn exec_seen(&mut self, pid: Pid) {
        if self.processes.contains_key(&pid) {
            self.refresh_mappings(pid);
        }
        self.track(pid);
    }

    /// Names `pid` `name` if it is known without a name (nothing told it: no fork record,
    /// no `/proc` read, no main-thread sample). Returns whether the name is settled (it had
    /// one, or got this one); `false` while the process is not known yet.
    pub fn name_if_unnamed(&mut self, pid: Pid, name: &str) -> bool {
        let Some(process) = self.processes.get_mut(&pid) else { return false };
        if process.name.is_empty() {
            process.name = name.to_string();
            if let Some(info) = process.info.as_mut().filter(|info| info.name.is_empty()) {
                info.name = name.to_string();
            }
        }
        true
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
    fn room_for(&mut self, frames: usize) -> bool {
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
    fn evict_history(&mut self) -> bool {
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
    fn forget_exited(
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
    fn remember_departed(&mut self, process: KnownProcess) {
        if self.departed.len() == DEPARTED_KEPT {
            self.departed.pop_front();
        }
        let (now, wall) = (Instant::now(), SystemTime::now());
        let last_seen = wall.checked_sub(now.duration_since(process.last_seen)).unwrap_or(wall);
        self.departed.push_back(Departed { pid: process.pid, name: process.name, last_seen });
    }

    fn refresh_mappings(&mut self, pid: Pid) {
        let Some(process) = self.processes.get_mut(&pid) else { return };
        let Some(info) = process.info.as_mut() else { return };
        // An exec may change who the process is (a setuid program): who may see it after it
        // exits follows what it became.
        if let Ok(credentials) = procs::read_credentials(pid.0) {
            if credentials.start_time == info.start_time {
                info.uid = credentials.uids[0];
                info.credentials = credentials;
            }
        }
        if let Ok(fresh) = procs::read_maps(pid.0) {
            let merged = merge_maps(fresh, &info.maps);
            if merged != info.maps {
                process.maps_version += 1;
            }
            info.maps = merged;
        }
    }
}

fn first_sight(pid: Pid, comm: &str) -> KnownProcess {
    let info = procs::read_process(pid.0).ok();
    let name = info.as_ref().map_or_else(|| comm.to_string(), |i| i.name.clone());
    let inspected = info.is_some();
    KnownProcess {
        pid,
        name,
        info,
        inspected,
        exec_time: 0,
        exited: false,
        last_seen: Instant::now(),
        maps_version: 0,
        sampled: false,
        stacks_over_share: 0,
    }
}

/// Reads `/proc` for a process known from events only, if it still lives: its owner,
/// cgroup and start time, and mappings the events may have missed (before the profiler
/// started, or lost), merged with theirs.
fn inspect(process: &mut KnownProcess) {
    let Ok(mut read) = procs::read_process(process.pid.0) else { return };
    if let Some(known) = process.info.take() {
        let fresh = std::mem::take(&mut read.maps);
        read.maps = merge_maps(fresh, &known.maps);
        read.exe = read.exe.or(known.exe);
        if read.maps != known.maps {
            process.maps_version += 1;
        }
    } else {
        process.maps_version += 1;
    }
    process.name.clone_from(&read.name);
    process.info = Some(read);
    process.inspected = true;
}

/// `fresh` plus every entry of `old` that overlaps nothing in `fresh`, marked unmapped, sorted
/// by address: a library unmapped since stays known, so samples drained after the `dlclose`
/// (or the `execve`) still resolve. A fresh entry that is an old one read again keeps what
/// the kernel's event told of it (the inode's generation, which `/proc` does not show): the
/// process's mappings are then unchanged, and its registration with the unwinder stands
/// without a `stat` of each of its files.
fn merge_maps(mut fresh: Vec<MapEntry>, old: &[MapEntry]) -> Vec<MapEntry> {
    for entry in fresh.iter_mut().filter(|f| f.generation == 0) {
        if let Some(known) = old.iter().find(|o| !o.unmapped && o.same_mapping(entry) && o.path == entry.path) {
            entry.generation = known.generation;
        }
    }
    let kept: Vec<MapEntry> = old
        .iter()
        .filter(|o| !fresh.iter().any(|f| f.start < o.end && o.start < f.end))
        .map(|o| MapEntry { unmapped: true, ..o.clone() })
        .collect();
    fresh.extend(kept);
    fresh.sort_by_key(|m| m.start);
    fresh
}

#[cfg(test)]
mod tests {
    use super::*;

    // pids far above pid_max: never alive, so nothing is read from /proc.
    const PID: Pid = Pid(0x7fff_fff0);

    fn seen(pid: Pid, user: u64, name: Option<&str>) -> Sighting<'_> {
        Sighting {
            pid,
            user_stack: StackId(user),
            kernel_stack: StackId::NONE,
            user_leaf_is_return: false,
            main_thread_name: name,
        }
    }

    fn stacks() -> HashMap<StackId, Vec<u64>> {
        [(StackId(7), vec![0x10, 0x20])].into()
    }

    #[test]
    fn learns_processes_named_after_their_main_thread_and_stacks() {
        let mut catalog = Catalog::default();
        let new = catalog.learn(&stacks(), &[seen(PID, 7, Some("main")), seen(Pid(PID.0 + 5), 0, None)]);
        assert_eq!(new, [StackId(7)].into());
        assert!(catalog.learn(&stacks(), &[]).is_empty(), "known stacks are not new");
        assert_eq!(catalog.processes().count(), 2);
        assert_eq!(catalog.process(PID).unwrap().name, "main");
        assert!(catalog.process(PID).unwrap().sampled);
        assert_eq!(catalog.stack(StackId(7)), Some(&[0x10, 0x20][..]));
        assert_eq!(catalog.stack(StackId::NONE), Some(&[][..]));
        assert_eq!(catalog.stack(StackId(99)), None);
    }

    #[test]
    fn stack_table_is_capped_and_pruned() {
        let mut catalog = Catalog::with_max_stacks(1);
        let mut two = stacks();
        two.insert(StackId(8), vec![0x30]);
        catalog.learn(&two, &[seen(PID, 7, None), seen(Pid(PID.0 + 1), 8, None)]);
        assert_eq!((catalog.stack_count(), catalog.dropped_stacks), (1, 1));
        let gone = catalog.prune(Duration::ZERO, &HashSet::new());
        assert_eq!(catalog.stack_count(), 0, "nothing references the stack");
        assert_eq!(gone.len(), 2, "neither pid exists");
        assert_eq!(catalog.departed(PID).map(|d| d.pid), Some(PID), "remembered as departed");
        assert!(catalog.departed(Pid(PID.0 + 7)).is_none());
    }

    #[test]
    fn a_full_table_evicts_history_not_new_stacks() {
        let mut catalog = Catalog::with_max_stacks(2);
        let batch = |ids: &[u64]| ids.iter().map(|&id| (StackId(id), vec![id])).collect::<HashMap<_, _>>();
        catalog.learn(&batch(&[1, 2]), &[]);
        // Nothing dumped yet: both stacks are current, the new one is refused.
        assert!(catalog.learn(&batch(&[3]), &[]).is_empty());
        assert_eq!((catalog.dropped_stacks, catalog.evicted_stacks), (1, 0));
        // After a dump that still references both (the since-start totals), 1 is seen
        // again; 2 is only history and makes room for 3.
        catalog.prune(Duration::from_secs(3600), &[StackId(1), StackId(2)].into());
        catalog.learn(&batch(&[1]), &[]);
        assert_eq!(catalog.learn(&batch(&[3]), &[]), [StackId(3)].into());
        assert_eq!((catalog.dropped_stacks, catalog.evicted_stacks), (1, 1));
        assert!(catalog.stack(StackId(2)).is_none());
        assert!(catalog.stack(StackId(1)).is_some() && catalog.stack(StackId(3)).is_some());
    }

    #[test]
    fn a_table_full_of_frames_evicts_history_too() {
        // Room for any number of stacks but 10 frames: two of 4 frames, then a third of 4.
        let mut catalog = Catalog::with_limits(usize::MAX, 10);
        let batch =
            |ids: &[u64], len: usize| ids.iter().map(|&id| (StackId(id), vec![id; len])).collect::<HashMap<_, _>>();
        catalog.learn(&batch(&[2, 4], 4), &[]);
        assert_eq!(catalog.frames_held(), 8);
        // Both current: the third does not fit and nothing may be evicted yet.
        assert!(catalog.learn(&batch(&[6], 4), &[]).is_empty());
        assert_eq!((catalog.dropped_stacks, catalog.evicted_stacks, catalog.frames_held()), (1, 0, 8));
        // After a dump both are history: one goes (the table evicts a sixteenth, at least
        // one), the new stack fits.
        catalog.prune(Duration::from_secs(3600), &[StackId(2), StackId(4)].into());
        assert_eq!(catalog.learn(&batch(&[6], 4), &[]), [StackId(6)].into());
        assert_eq!((catalog.evicted_stacks, catalog.frames_held()), (1, 8));
        // A prune that keeps nothing frees every frame.
        catalog.prune(Duration::from_secs(3600), &HashSet::new());
        assert_eq!((catalog.stack_count(), catalog.frames_held()), (0, 0));
    }

    #[test]
    fn a_process_past_its_share_of_a_half_full_table_is_refused_and_others_are_not() {
        let mut catalog = Catalog::with_max_stacks(8);
        catalog.set_process_share(25); // 2 stacks, binding from 4 in the table
        let (flood, other) = (PID, Pid(PID.0 + 1));
        let ids: Vec<u64> = (10..16).collect();
        let stacks = ids.iter().map(|&id| (StackId(id), vec![id])).collect::<HashMap<_, _>>();
        let sightings: Vec<Sighting> = ids.iter().map(|&id| seen(flood, id, None)).collect();
        // First come, first served up to half the table; then the flood is at its share.
        assert_eq!(catalog.learn(&stacks, &sightings).len(), 4);
        assert_eq!(catalog.stacks_over_share, 2);
        assert_eq!(catalog.process(flood).unwrap().stacks_over_share, 2);
        // Another process's new stack still goes in, and so does one it shares with the
        // flood (a common kernel path), whoever named it first.
        let new = catalog.learn(&[(StackId(20), vec![20])].into(), &[seen(other, 20, None)]);
        assert_eq!(new, [StackId(20)].into());
        let shared = catalog.learn(&[(StackId(21), vec![21])].into(), &[seen(flood, 21, None), seen(other, 21, None)]);
        assert_eq!(shared, [StackId(21)].into());
        assert_eq!(catalog.stacks_over_share, 2, "no refusal for the shared stack");
        // After a dump every stack is history: the flood may add again.
        catalog.prune(Duration::from_secs(3600), &HashSet::new());
        assert_eq!(catalog.learn(&stacks, &sightings).len(), 4);
    }

    #[test]
    fn exited_processes_without_data_go_first() {
        let mut catalog = Catalog::default();
        catalog.learn(&stacks(), &[seen(PID, 7, None)]);
        catalog.track(Pid(PID.0 + 9));
        catalog.exec_seen(Pid(PID.0 + 10));
        let live = Pid(std::process::id());
        catalog.track(live);
        let mut gone = catalog.prune_unsampled(Duration::ZERO);
        gone.sort_unstable();
        assert_eq!(gone, vec![Pid(PID.0 + 9), Pid(PID.0 + 10)], "only the exited ones without data");
        assert!(catalog.process(PID).is_some(), "sampled ones wait for prune");
        assert!(catalog.process(live).is_some(), "a live process stays");
        assert!(catalog.prune_unsampled(Duration::from_secs(60)).is_empty());
    }

    /// With exits followed from events, the drain-time prune forgets only processes whose
    /// exit event came (nothing is asked of the kernel); every full prune, and drain-time
    /// prunes after lost records until the next full one, ask the kernel.
    #[test]
    fn followed_exits_are_taken_from_the_events() {
        use crate::sideband::ProcessEvent;
        let mut catalog = Catalog::default();
        catalog.follow_exits();
        let (reported, silent) = (Pid(PID.0 + 9), Pid(PID.0 + 10));
        catalog.track(reported);
        catalog.track(silent);
        catalog.apply(&[ProcessEvent::Exited { pid: reported, time: 1 }]);
        assert_eq!(catalog.prune_unsampled(Duration::ZERO), vec![reported]);
        assert!(catalog.process(silent).is_some(), "no exit event: taken to live");
        assert_eq!(catalog.prune(Duration::ZERO, &HashSet::new()), vec![silent], "a full prune asks");
        catalog.track(silent);
        assert!(catalog.prune_unsampled(Duration::ZERO).is_empty());
        catalog.apply(&[ProcessEvent::Lost { count: 3 }]);
        assert_eq!(catalog.prune_unsampled(Duration::ZERO), vec![silent], "records were lost: asked");
    }

    /// Processes whose exit came before a flip and that the drained set did not name go at
    /// that drain, without a grace; one sampled, or one whose pid a new process took, stays.
    #[test]
    fn processes_exited_before_a_flip_without_data_go_at_its_drain() {
        use crate::sideband::ProcessEvent;
        let mut catalog = Catalog::default();
        assert!(catalog.exited_unsampled().is_empty(), "exits not followed: none");
        catalog.follow_exits();
        let (quiet, sampled, reused, alive) = (Pid(PID.0 + 11), Pid(PID.0 + 12), Pid(PID.0 + 13), Pid(PID.0 + 14));
        for pid in [quiet, sampled, reused, alive] {
            catalog.track(pid);
        }
        catalog.apply(&[quiet, sampled, reused].map(|pid| ProcessEvent::Exited { pid, time: 1 }));
        let mut before_flip = catalog.exited_unsampled();
        before_flip.sort();
        assert_eq!(before_flip, vec![quiet, sampled, reused]);
        // The drain: one was sampled before its exit; another's pid went to a new process.
        catalog.learn(&stacks(), &[seen(sampled, 7, None)]);
        catalog.apply(&[ProcessEvent::Forked { pid: reused, parent: alive, time: 2 }]);
        assert_eq!(catalog.forget_unsampled(&before_flip), vec![quiet]);
        assert!(catalog.process(quiet).is_none());
        for pid in [sampled, reused, alive] {
            assert!(catalog.process(pid).is_some(), "{pid:?} stays");
        }
        catalog.apply(&[ProcessEvent::Lost { count: 1 }]);
        assert!(catalog.exited_unsampled().is_empty(), "records lost: exits not trusted");
    }

    #[test]
    fn a_sampled_process_whose_exit_was_reported_goes_soon_after_it() {
        use crate::sideband::ProcessEvent;
        let (exited, alive) = (PID, Pid(PID.0 + 1));
        let mut catalog = Catalog::default();
        catalog.follow_exits();
        catalog.learn(&stacks(), &[seen(exited, 7, Some("short")), seen(alive, 7, Some("long"))]);
        catalog.apply(&[ProcessEvent::Exited { pid: exited, time: 1 }]);
        let hour = Duration::from_secs(3600);
        assert!(catalog.prune(hour, &HashSet::new()).is_empty(), "its exit is too recent");
        let long_ago = Instant::now() - EXIT_REPORTED_GRACE - Duration::from_secs(1);
        for pid in [exited, alive] {
            catalog.processes.get_mut(&pid).unwrap().last_seen = long_ago;
        }
        assert_eq!(catalog.prune(hour, &HashSet::new()), vec![exited], "not the grace of an hour");
        assert!(catalog.process(alive).is_some(), "no exit reported: kept for the grace");
        catalog.apply(&[ProcessEvent::Lost { count: 1 }, ProcessEvent::Exited { pid: alive, time: 2 }]);
        catalog.processes.get_mut(&alive).unwrap().last_seen = long_ago;
        assert!(catalog.prune(hour, &HashSet::new()).is_empty(), "records lost: exits not trusted");
    }

    /// A mapping of `/x` (inode 1) as `/proc` shows it.
    fn entry(start: u64, end: u64) -> MapEntry {
        MapEntry {
            start,
            end,
            offset: 0,
            path: "/x".into(),
            inode: 1,
            device: Default::default(),
            generation: 0,
            unmapped: false,
        }
    }

    #[test]
    fn merge_keeps_unmapped_old_entries() {
        let merged = merge_maps(vec![entry(100, 200)], &[entry(150, 250), entry(300, 400)]);
        assert_eq!(merged, vec![entry(100, 200), MapEntry { unmapped: true, ..entry(300, 400) }]);
    }

    #[test]
    fn a_mapping_read_again_from_proc_is_unchanged() {
        let from_proc = entry(100, 200);
        let from_event = MapEntry { generation: 9, ..from_proc.clone() };
        let other_file = MapEntry { start: 300, end: 400, inode: 2, ..from_event.clone() };
        let fresh = vec![from_proc, entry(300, 400)];
        let merged = merge_maps(fresh, &[from_event.clone(), other_file]);
        assert_eq!(merged[0], from_event, "same mapping: the event's generation kept");
        assert_eq!(merged[1].generation, 0, "another file at the same addresses is a new mapping");
    }
}
