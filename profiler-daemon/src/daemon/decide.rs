//! The collector's decisions, as pure functions of what it knows: which profiles a dump
//! writes, which processes the index lists, and whether a query may be answered. No session,
//! no `/proc`, no I/O, so they are unit-tested here.

use std::collections::BTreeSet;

use crate::{
    catalog::{Catalog, KnownProcess},
    config::{Config, ProcessFacts, ProcessSelection},
    control::{IndexEntry, ProfileQuery, QueryError, Viewer},
    ids::Pid,
    profiles::{Counts, ProfileKind, Source},
};

/// What the daemon serves now: the kinds enabled in the configuration whose programs are
/// attached (a reload can turn one off; turning one on needs a restart), and the processes
/// with heap probes (heap is per process).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Serving {
    pub kinds: BTreeSet<ProfileKind>,
    pub heap_pids: BTreeSet<Pid>,
}

impl Serving {
    /// Whether `pid` has `kind`.
    pub fn has(&self, pid: Pid, kind: ProfileKind) -> bool {
        self.kinds.contains(&kind) && (kind != ProfileKind::Heap || self.heap_pids.contains(&pid))
    }

    /// The kinds `pid` has, in [`ProfileKind::ALL`] order.
    pub fn kinds_of(&self, pid: Pid) -> impl Iterator<Item = ProfileKind> + '_ {
        ProfileKind::ALL.into_iter().filter(move |&kind| self.has(pid, kind))
    }
}

/// What the process matchers look at.
pub fn facts(process: &KnownProcess) -> ProcessFacts<'_> {
    let info = process.info.as_ref();
    ProcessFacts {
        pid: process.pid.0,
        name: &process.name,
        exe: info.and_then(|i| i.exe.as_deref()),
        cgroup: info.and_then(|i| i.cgroup.as_deref()),
    }
}

/// (pid, kinds) to write for an interval: the selected processes with data of a kind they
/// have. A heap profile is written for every probed process, data or not: its `inuse` is a
/// state, and an unchanged state is still an answer.
pub fn dump_targets(
    serving: &Serving,
    selection: &ProcessSelection,
    catalog: &Catalog,
    interval: &Counts,
) -> Vec<(Pid, Vec<ProfileKind>)> {
    interval
        .iter()
        .filter_map(|(pid, counts)| {
            let process = catalog.process(pid)?;
            if !selection.matches(&facts(process)) {
                return None;
            }
            let kinds: Vec<ProfileKind> =
                serving.kinds_of(pid).filter(|&kind| kind == ProfileKind::Heap || kind.events(counts) > 0).collect();
            (!kinds.is_empty()).then_some((pid, kinds))
        })
        .collect()
}

/// The index as `viewer` may see it: the selected processes it may see with data since
/// start, each with its kinds and their events.
pub fn index(
    serving: &Serving,
    selection: &ProcessSelection,
    catalog: &Catalog,
    total: &Counts,
    viewer: Viewer,
) -> Vec<IndexEntry> {
    total
        .iter()
        .filter_map(|(pid, counts)| {
            let process = catalog.process(pid)?;
            let uid = process.uid()?;
            if !viewer.may_see(uid) || !selection.matches(&facts(process)) {
                return None;
            }
            let profiles = serving.kinds_of(pid).map(|kind| (kind, kind.events(counts))).collect();
            Some(IndexEntry { pid, name: process.name.clone(), uid, profiles })
        })
        .collect()
}

/// Whether the viewer may have the profile `query` asks for, and whether it exists.
pub fn check_query(
    serving: &Serving,
    selection: &ProcessSelection,
    catalog: &Catalog,
    query: &ProfileQuery,
) -> Result<(), QueryError> {
    let process = catalog.process(query.pid).ok_or(QueryError::UnknownPid(query.pid))?;
    if !process.uid().is_some_and(|uid| query.viewer.may_see(uid)) && query.viewer != Viewer::ROOT {
        return Err(QueryError::Forbidden(query.pid));
    }
    if !selection.matches(&facts(process)) {
        return Err(QueryError::UnknownPid(query.pid));
    }
    let kind = query.view.kind;
    if serving.has(query.pid, kind) {
        Ok(())
    } else {
        Err(QueryError::NotEnabled(kind))
    }
}

/// The keys of a reload from `old` to `new` that take effect only after a restart, with the
/// programs `loaded` at start: the CPU frequency and heap sampling rate are load-time
/// settings; a kind turned on needs its programs loaded; a source all of whose kinds are
/// turned off stops being written now, but keeps running (and costing) until a restart.
pub fn restart_needed(old: &Config, new: &Config, loaded: &[Source]) -> Vec<&'static str> {
    let mut keys = Vec::new();
    if new.cpu.frequency_hz != old.cpu.frequency_hz {
        keys.push("cpu.frequency_hz");
    }
    if new.heap.sample_bytes != old.heap.sample_bytes {
        keys.push("heap.sample_bytes");
    }
    for kind in ProfileKind::ALL {
        let source = kind.source();
        let wanted = ProfileKind::ALL.into_iter().any(|k| k.source() == source && new.is_enabled(k));
        let turned_on = new.is_enabled(kind) && !loaded.contains(&source);
        let turned_off = !wanted && loaded.contains(&source) && old.is_enabled(kind);
        if turned_on || turned_off {
            keys.push(kind.as_str());
        }
    }
    keys
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;
    use crate::{
        catalog::Sighting,
        config::Matcher,
        ebpf::{Batch, RawCpuSample, RawWaitTotals},
        ids::{StackId, Tid},
        profiles::View,
    };

    // pids far above pid_max: never alive, so the catalogue reads nothing from /proc.
    const A: Pid = Pid(0x7fff_ff00);
    const B: Pid = Pid(0x7fff_ff01);

    fn cpu(pid: Pid) -> RawCpuSample {
        RawCpuSample {
            pid,
            tid: Tid(pid.0),
            comm: format!("p{}", pid.0 & 0xff),
            user_stack: StackId(7),
            kernel_stack: StackId::NONE,
            count: 3,
        }
    }

    /// A catalogue and since-start counts where A has CPU samples and B only block waits.
    fn world() -> (Catalog, Counts) {
        let wait = RawWaitTotals { pid: B, op: 0, outcome: 0, stack: StackId(8), count: 2, delay_ns: 10 };
        let batch = Batch { cpu: vec![cpu(A)], block: vec![wait], ..Batch::default() };
        let mut catalog = Catalog::default();
        let stacks: HashMap<StackId, Vec<u64>> = HashMap::new();
        let seen: Vec<Sighting<'_>> = crate::profiles::sightings(&batch);
        catalog.learn(&stacks, &seen);
        let mut counts = Counts::default();
        counts.add(&batch);
        (catalog, counts)
    }

    fn serving(kinds: &[ProfileKind], heap: &[Pid]) -> Serving {
        Serving { kinds: kinds.iter().copied().collect(), heap_pids: heap.iter().copied().collect() }
    }

    #[test]
    fn dumps_write_the_kinds_with_data_and_heap_for_probed_processes() {
        let (catalog, counts) = world();
        let all = ProcessSelection::default();
        let on = serving(&[ProfileKind::Cpu, ProfileKind::Heap, ProfileKind::Block], &[B]);
        let targets = dump_targets(&on, &all, &catalog, &counts);
        assert_eq!(targets, [(A, vec![ProfileKind::Cpu]), (B, vec![ProfileKind::Heap, ProfileKind::Block])]);
        // Heap turned off by a reload: probed processes get no heap file.
        let off = serving(&[ProfileKind::Cpu, ProfileKind::Block], &[B]);
        assert_eq!(dump_targets(&off, &all, &catalog, &counts)[1], (B, vec![ProfileKind::Block]));
        let only_a = ProcessSelection { include: vec![Matcher::Pid(A.0)], exclude: vec![] };
        assert_eq!(dump_targets(&on, &only_a, &catalog, &counts), [(A, vec![ProfileKind::Cpu])]);
    }

    #[test]
    fn uninspected_processes_are_in_no_index_and_not_served() {
        // Never alive, so the catalogue has no owner uid for them: nobody may see them but root.
        let (catalog, counts) = world();
        let on = serving(&[ProfileKind::Cpu], &[]);
        assert!(index(&on, &ProcessSelection::default(), &catalog, &counts, Viewer::ROOT).is_empty());
        let query = |viewer, view| ProfileQuery { viewer, pid: A, view, window: None, text: false };
        let all = ProcessSelection::default();
        assert_eq!(
            check_query(&on, &all, &catalog, &query(Viewer { uid: 1000 }, View::of(ProfileKind::Cpu))),
            Err(QueryError::Forbidden(A))
        );
        assert_eq!(check_query(&on, &all, &catalog, &query(Viewer::ROOT, View::of(ProfileKind::Cpu))), Ok(()));
        assert_eq!(
            check_query(&on, &all, &catalog, &query(Viewer::ROOT, View::ALLOCS)),
            Err(QueryError::NotEnabled(ProfileKind::Heap))
        );
        let unknown = ProfileQuery { pid: Pid(0x7fff_fff9), ..query(Viewer::ROOT, View::of(ProfileKind::Cpu)) };
        assert_eq!(check_query(&on, &all, &catalog, &unknown), Err(QueryError::UnknownPid(unknown.pid)));
    }

    #[test]
    fn reloads_name_what_needs_a_restart() {
        let config = |profiles: &[ProfileKind]| Config { profiles: profiles.to_vec(), ..Config::default() };
        let old = config(&[ProfileKind::Cpu, ProfileKind::Block]);
        let loaded = [Source::CpuClock, Source::FutexWaits];
        assert!(restart_needed(&old, &old, &loaded).is_empty());
        // Mutex shares block's programs: no restart; heap's are not loaded: restart.
        let more = config(&[ProfileKind::Cpu, ProfileKind::Block, ProfileKind::Mutex, ProfileKind::Heap]);
        assert_eq!(restart_needed(&old, &more, &loaded), ["heap"]);
        // Block off while nothing else uses the futex programs: they run until a restart.
        assert_eq!(restart_needed(&old, &config(&[ProfileKind::Cpu]), &loaded), ["block"]);
        let mut faster = old.clone();
        faster.cpu.frequency_hz = 99;
        assert_eq!(restart_needed(&old, &faster, &loaded), ["cpu.frequency_hz"]);
    }

    #[test]
    fn the_index_lists_visible_processes_with_their_kinds() {
        let mut catalog = Catalog::default();
        let me = Pid(std::process::id());
        let uid = crate::procs::read_uid(me.0).unwrap();
        let batch = Batch { cpu: vec![cpu(me)], ..Batch::default() };
        catalog.learn(&HashMap::new(), &crate::profiles::sightings(&batch));
        let mut counts = Counts::default();
        counts.add(&batch);
        let on = serving(&[ProfileKind::Cpu, ProfileKind::Mutex], &[]);
        let entries = index(&on, &ProcessSelection::default(), &catalog, &counts, Viewer { uid });
        assert_eq!(entries.len(), 1);
        assert_eq!(entries[0].profiles, [(ProfileKind::Cpu, 3), (ProfileKind::Mutex, 0)]);
        assert!(index(&on, &ProcessSelection::default(), &catalog, &counts, Viewer { uid: uid + 1 }).is_empty());
    }
}
