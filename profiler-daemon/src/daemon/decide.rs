//! The collector's decisions, as pure functions of what it knows: which profiles a dump
//! writes, which processes the index lists, and whether a query may be answered. No session,
//! no `/proc`, no I/O, so they are unit-tested here.

use std::collections::{BTreeMap, BTreeSet};

use crate::{
    catalog::{Catalog, KnownProcess},
    config::{Config, ProcessSelection},
    control::{IndexEntry, ProfileQuery, QueryError, Viewer},
    ids::Pid,
    procs::Credentials,
    profiles::{Counts, ProcessCounts, ProfileKind, Source},
};

/// The credentials of a live process, read now (`None`: gone, or unreadable).
pub type CredentialsNow<'a> = dyn FnMut(Pid) -> Option<Credentials> + 'a;

/// Whether `viewer` may see `process` now. Root sees every process. Any other uid sees only
/// one it could ptrace: every uid of it (real, effective, saved, file system) is the
/// viewer's and it is dumpable, as read `now` while it lives, not at first sight (a setuid
/// program, or one that changed uid in place, is not its invoker's to see). A process that
/// has exited (or whose pid now belongs to a newcomer, with another start time) is judged
/// by the credentials it last had as read by the catalogue (at first sight and each exec).
/// Credentials are read only for a process first seen as the viewer's.
pub fn visible(viewer: Viewer, process: &KnownProcess, now: &mut CredentialsNow<'_>) -> bool {
    if viewer == Viewer::ROOT {
        return true;
    }
    let Some(info) = process.info.as_ref().filter(|info| info.uid == viewer.uid) else { return false };
    match now(process.pid).filter(|creds| creds.start_time == info.start_time) {
        Some(live) => live.all_of(viewer.uid),
        None => info.credentials.all_of(viewer.uid),
    }
}

/// What the collector reads of a queried process before the query is judged.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BeforeQuery {
    /// What the catalogue knows is what a query is judged on.
    Nothing,
    /// A dump of a process not known yet (its threads all sleep, so it has no samples):
    /// register it, which reads its credentials, if it lives.
    Track,
    /// A process known only from the kernel's events, whose owner was never read (it has had
    /// no sample since the profiler saw it start): read it now. Otherwise [`visible`] judges
    /// it as no one's but root's, and an idle program's owner could not dump it until root
    /// did.
    Inspect,
}

/// What to read of `process` (`None`: not in the catalogue) before a query of `kind` is
/// judged. A process whose exit was seen is not read: its pid may be a newcomer's.
pub fn before_query(kind: ProfileKind, process: Option<&KnownProcess>) -> BeforeQuery {
    match process {
        None if kind == ProfileKind::Threads => BeforeQuery::Track,
        None => BeforeQuery::Nothing,
        Some(process) if !process.inspected && !process.exited => BeforeQuery::Inspect,
        Some(_) => BeforeQuery::Nothing,
    }
}

/// What the daemon serves now: the kinds enabled in the configuration whose programs are
/// attached (a reload can turn one off; turning one on needs a restart), and the processes
/// with heap probes (heap is per process).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Serving {
    pub kinds: BTreeSet<ProfileKind>,
    pub heap_pids: BTreeSet<Pid>,
    /// Processes the `[heap]` matchers select whose probes could not be attached, and why.
    pub heap_refused: BTreeMap<Pid, String>,
    /// Whether interval dumps write a thread dump of each process they write
    /// (`[threads] interval_dumps`).
    pub interval_thread_dumps: bool,
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

/// (pid, kinds) to write for an interval: the selected processes with data of a kind they
/// have. A heap profile is written for every probed process, data or not: its `inuse` is a
/// state, and an unchanged state is still an answer. A thread dump (when interval dumps
/// take them) goes with every process written.
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
            if !selection.matches(&process.facts()) {
                return None;
            }
            let mut kinds: Vec<ProfileKind> = serving
                .kinds_of(pid)
                .filter(|&kind| kind == ProfileKind::Heap || (kind != ProfileKind::Threads && kind.events(counts) > 0))
                .collect();
            if !kinds.is_empty() && serving.interval_thread_dumps && serving.kinds.contains(&ProfileKind::Threads) {
                kinds.push(ProfileKind::Threads);
            }
            (!kinds.is_empty()).then_some((pid, kinds))
        })
        .collect()
}

/// The index as `viewer` may see it: the selected processes it may see with data since
/// start, each with its kinds and their events. `only`: that one, even with no data yet (a
/// live idle process can be dumped, or CPU-profiled over `seconds`, now: Go's index lists
/// its profiles from the start).
pub fn index(
    serving: &Serving,
    selection: &ProcessSelection,
    catalog: &Catalog,
    total: &Counts,
    viewer: Viewer,
    only: Option<Pid>,
    now: &mut CredentialsNow<'_>,
) -> Vec<IndexEntry> {
    let nothing_yet = ProcessCounts::default();
    let unsampled = only.filter(|&pid| total.process(pid).is_none()).map(|pid| (pid, &nothing_yet));
    total
        .iter()
        .filter(|(pid, _)| only.is_none_or(|only| only == *pid))
        .chain(unsampled)
        .filter_map(|(pid, counts)| {
            let process = catalog.process(pid)?;
            let uid = process.uid()?;
            if !selection.matches(&process.facts()) || !visible(viewer, process, now) {
                return None;
            }
            let cgroup = process.info.as_ref().and_then(|i| i.cgroup.as_deref());
            Some(IndexEntry {
                pid,
                name: process.name.clone(),
                uid,
                unit: cgroup.and_then(crate::procs::unit_of).map(str::to_string),
                container: cgroup.and_then(crate::procs::container_of).map(str::to_string),
                profiles: serving.kinds_of(pid).map(|kind| (kind, kind.events(counts))).collect(),
            })
        })
        .collect()
}

/// Whether the viewer may have the profile `query` asks for, and if not, the real reason and
/// the fix. Root is told everything; any other uid gets one answer for every process that is
/// not its own (see [`QueryError::NotVisible`]).
pub fn check_query(
    serving: &Serving,
    config: &Config,
    catalog: &Catalog,
    query: &ProfileQuery,
    now: &mut CredentialsNow<'_>,
) -> Result<(), QueryError> {
    let (pid, kind, root) = (query.pid, query.view.kind, query.viewer == Viewer::ROOT);
    let Some(process) = catalog.process(pid) else {
        return Err(match catalog.departed(pid) {
            _ if !root => QueryError::NotVisible(pid),
            Some(gone) => {
                QueryError::Exited { pid, name: gone.name.clone(), when: crate::output::utc_timestamp(gone.last_seen) }
            }
            None => QueryError::UnknownPid(pid),
        });
    };
    if !visible(query.viewer, process, now) {
        return Err(QueryError::NotVisible(pid));
    }
    if !config.processes.matches(&process.facts()) {
        let why = "the [processes] matchers of the configuration do not select it".to_string();
        return Err(QueryError::NotSelected { pid, kind, why });
    }
    if !config.is_enabled(kind) {
        let fix = format!("add \"{kind}\" to profiles in the configuration (needs a restart if not there at start)");
        return Err(QueryError::NotEnabled { kind, fix });
    }
    if !serving.kinds.contains(&kind) {
        let fix = "a reload enabled it; it takes effect after a restart".to_string();
        return Err(QueryError::NotEnabled { kind, fix });
    }
    if serving.has(pid, kind) {
        return Ok(());
    }
    let why = match serving.heap_refused.get(&pid) {
        Some(reason) => format!("its allocator could not be probed: {reason}"),
        None => format!(
            "no [heap] include matcher selects it; add e.g. {{ pid = {pid} }} or {{ name = {:?} }} to [heap] include",
            process.name
        ),
    };
    Err(QueryError::NotSelected { pid, kind, why })
}

/// The keys of a reload from `old` to `new` that take effect only after a restart, with the
/// programs `loaded` at start: the CPU frequency and heap sampling rate are load-time
/// settings; the socket is bound at start; a kind turned on needs its programs loaded; a source all of whose kinds are
/// turned off stops being written now, but keeps running (and costing) until a restart.
pub fn restart_needed(old: &Config, new: &Config, loaded: &[Source]) -> Vec<&'static str> {
    let mut keys = Vec::new();
    if new.cpu.frequency_hz != old.cpu.frequency_hz {
        keys.push("cpu.frequency_hz");
    }
    if new.heap.sample_bytes != old.heap.sample_bytes {
        keys.push("heap.sample_bytes");
    }
    if new.offcpu.rate != old.offcpu.rate {
        keys.push("offcpu.rate");
    }
    if new.offcpu.sample_every != old.offcpu.sample_every {
        keys.push("offcpu.sample_every");
    }
    if new.contention.block_rate != old.contention.block_rate {
        keys.push("block.rate");
    }
    if new.contention.mutex_fraction != old.contention.mutex_fraction {
        keys.push("mutex.fraction");
    }
    if new.limits.process_percent != old.limits.process_percent {
        keys.push("limits.process_share_percent");
    }
    if new.limits.uid_percent != old.limits.uid_percent {
        keys.push("limits.uid_share_percent");
    }
    // The socket is bound once, at start, with its owner and mode.
    if new.socket.path != old.socket.path {
        keys.push("socket.path");
    }
    if new.socket.group != old.socket.group {
        keys.push("socket.group");
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
            labels: crate::ebpf::LabelsId::NONE,
            count: 3,
        }
    }

    /// A catalogue and since-start counts where A has CPU samples and B only block waits.
    fn world() -> (Catalog, Counts) {
        let wait = RawWaitTotals {
            pid: B,
            op: 0,
            outcome: 0,
            stack: StackId(8),
            count: 2 * profiler_common::WAIT_COUNT_ONE,
            delay_ns: 10,
        };
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
        Serving {
            kinds: kinds.iter().copied().collect(),
            heap_pids: heap.iter().copied().collect(),
            heap_refused: BTreeMap::new(),
            interval_thread_dumps: false,
        }
    }

    fn config(kinds: &[ProfileKind]) -> Config {
        Config { profiles: kinds.to_vec(), ..Config::default() }
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
    fn processes_known_only_from_events_are_read_before_a_query() {
        let (catalog, _) = world();
        let threads = ProfileKind::Threads;
        assert_eq!(before_query(threads, None), BeforeQuery::Track, "a sleeping process unknown yet");
        assert_eq!(before_query(ProfileKind::Cpu, None), BeforeQuery::Nothing, "no data: nothing to read");
        // A, never alive, was never read from /proc.
        let mut a = catalog.process(A).unwrap().clone();
        assert!(!a.inspected);
        for kind in [threads, ProfileKind::Cpu] {
            assert_eq!(before_query(kind, Some(&a)), BeforeQuery::Inspect, "{kind}");
        }
        a.exited = true;
        assert_eq!(before_query(threads, Some(&a)), BeforeQuery::Nothing, "its pid may be another's now");
        a.exited = false;
        a.inspected = true;
        assert_eq!(before_query(threads, Some(&a)), BeforeQuery::Nothing, "its owner is known");
    }

    #[test]
    fn queries_are_told_the_real_reason_and_the_fix() {
        // Never alive, so the catalogue has no owner uid for them: only root sees them.
        let (mut catalog, counts) = world();
        let on = serving(&[ProfileKind::Cpu, ProfileKind::Mutex], &[]);
        let live = &mut |_| None;
        assert!(index(&on, &ProcessSelection::default(), &catalog, &counts, Viewer::ROOT, None, live).is_empty());
        let query = |viewer, view| ProfileQuery { viewer, pid: A, view, window: None, debug: 0, os_threads: false };
        let cpu = View::of(ProfileKind::Cpu);
        let enabled = config(&[ProfileKind::Cpu, ProfileKind::Mutex, ProfileKind::Block]);
        let check = |catalog: &Catalog, q: &ProfileQuery| check_query(&on, &enabled, catalog, q, &mut |_| None);
        assert_eq!(check(&catalog, &query(Viewer { uid: 1000 }, cpu)), Err(QueryError::NotVisible(A)));
        assert_eq!(check(&catalog, &query(Viewer::ROOT, cpu)), Ok(()));
        let not_enabled = check(&catalog, &query(Viewer::ROOT, View::ALLOCS)).unwrap_err();
        assert!(not_enabled.to_string().contains("add \"heap\" to profiles"), "{not_enabled}");
        let reloaded = check(&catalog, &query(Viewer::ROOT, View::of(ProfileKind::Block))).unwrap_err();
        assert!(reloaded.to_string().contains("after a restart"), "{reloaded}");
        // Heap enabled and served, but no matcher selects the process: which key to add.
        let heap_on = serving(&[ProfileKind::Heap], &[]);
        let err =
            check_query(&heap_on, &config(&[ProfileKind::Heap]), &catalog, &query(Viewer::ROOT, View::ALLOCS), live);
        assert!(err.unwrap_err().to_string().contains("[heap] include"), "which matcher to add");
        let only_b = Config {
            processes: ProcessSelection { include: vec![Matcher::Pid(B.0)], exclude: vec![] },
            ..enabled.clone()
        };
        let err = check_query(&on, &only_b, &catalog, &query(Viewer::ROOT, cpu), live).unwrap_err();
        assert!(matches!(err, QueryError::NotSelected { .. }), "{err}");
        // Unknown to root: no such process; once departed: when it exited; to others: one answer.
        let unknown = ProfileQuery { pid: Pid(0x7fff_fff9), ..query(Viewer::ROOT, cpu) };
        assert_eq!(check(&catalog, &unknown), Err(QueryError::UnknownPid(unknown.pid)));
        catalog.prune(std::time::Duration::ZERO, &Default::default());
        let exited = check(&catalog, &query(Viewer::ROOT, cpu)).unwrap_err();
        assert!(
            matches!(exited, QueryError::Exited { .. }) && exited.to_string().contains("exited at about"),
            "{exited}"
        );
        let theirs = query(Viewer { uid: 1000 }, cpu);
        assert_eq!(check(&catalog, &theirs).unwrap_err().to_string(), QueryError::NotVisible(A).to_string());
    }

    #[test]
    fn reloads_name_what_needs_a_restart() {
        let config = |profiles: &[ProfileKind]| Config { profiles: profiles.to_vec(), ..Config::default() };
        let old = config(&[ProfileKind::Cpu, ProfileKind::Block]);
        let loaded = [Source::CpuClock, Source::Futex];
        assert!(restart_needed(&old, &old, &loaded).is_empty());
        // Mutex shares block's programs: no restart; heap's are not loaded: restart.
        let more = config(&[ProfileKind::Cpu, ProfileKind::Block, ProfileKind::Mutex, ProfileKind::Heap]);
        assert_eq!(restart_needed(&old, &more, &loaded), ["heap"]);
        // Block off while nothing else uses the futex programs: they run until a restart.
        assert_eq!(restart_needed(&old, &config(&[ProfileKind::Cpu]), &loaded), ["block"]);
        let mut faster = old.clone();
        faster.cpu.frequency_hz = 99;
        assert_eq!(restart_needed(&old, &faster, &loaded), ["cpu.frequency_hz"]);
        // The socket is bound at start (F27: a change was dropped without a word).
        let mut moved = old.clone();
        moved.socket.path = "/run/elsewhere.sock".into();
        moved.socket.group = Some("adm".into());
        assert_eq!(restart_needed(&old, &moved, &loaded), ["socket.path", "socket.group"]);
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
        let all = ProcessSelection::default();
        let live = &mut |pid: Pid| crate::procs::read_credentials(pid.0).ok();
        let entries = index(&on, &all, &catalog, &counts, Viewer { uid }, None, live);
        assert_eq!(entries.len(), 1);
        assert_eq!(entries[0].profiles, [(ProfileKind::Cpu, 3), (ProfileKind::Mutex, 0)]);
        assert!(index(&on, &all, &catalog, &counts, Viewer { uid: uid + 1 }, None, live).is_empty());
        assert_eq!(index(&on, &all, &catalog, &counts, Viewer { uid }, Some(me), live).len(), 1);
        assert!(index(&on, &all, &catalog, &counts, Viewer { uid }, Some(Pid(me.0 + 1)), live).is_empty());
    }

    #[test]
    fn a_live_process_asked_for_by_pid_is_listed_before_it_has_data() {
        let mut catalog = Catalog::default();
        let me = Pid(std::process::id());
        let uid = crate::procs::read_uid(me.0).unwrap();
        catalog.track(me);
        let counts = Counts::default();
        let on = serving(&[ProfileKind::Cpu, ProfileKind::Threads], &[]);
        let all = ProcessSelection::default();
        let live = &mut |pid: Pid| crate::procs::read_credentials(pid.0).ok();
        let entries = index(&on, &all, &catalog, &counts, Viewer { uid }, Some(me), live);
        assert_eq!(entries.len(), 1, "{entries:?}");
        assert_eq!(entries[0].profiles, [(ProfileKind::Cpu, 0), (ProfileKind::Threads, 0)]);
        // The whole index lists processes with data only; another uid sees nothing of it.
        assert!(index(&on, &all, &catalog, &counts, Viewer { uid }, None, live).is_empty());
        assert!(index(&on, &all, &catalog, &counts, Viewer { uid: uid + 1 }, Some(me), live).is_empty());
        // A pid the catalogue does not know is not listed.
        assert!(index(&on, &all, &catalog, &counts, Viewer::ROOT, Some(Pid(me.0 + 1)), live).is_empty());
    }

    #[test]
    fn others_see_a_process_only_while_it_is_wholly_theirs_and_the_same() {
        let (uid, start_time) = (1000, 55);
        let info = crate::procs::ProcessInfo {
            pid: 7,
            name: "app".into(),
            exe: None,
            maps: Vec::new(),
            uid,
            start_time,
            credentials: Credentials { uids: [uid; 4], dump_owner: uid, start_time },
            cgroup: None,
            ns_pid: 7,
        };
        let process = KnownProcess {
            pid: Pid(7),
            name: "app".into(),
            info: Some(info),
            inspected: true,
            exec_time: 0,
            exited: false,
            last_seen: std::time::Instant::now(),
            maps_version: 0,
            sampled: true,
            stacks_over_share: 0,
        };
        let owner = Viewer { uid };
        let creds = |uids: [u32; 4], dump_owner, start_time| Credentials { uids, dump_owner, start_time };
        let sees = |viewer, now: Option<Credentials>| visible(viewer, &process, &mut |_| now);
        assert!(sees(Viewer::ROOT, None), "root sees everything");
        assert!(sees(owner, Some(creds([uid; 4], uid, start_time))));
        assert!(sees(owner, None), "exited: as it last was, the owner's");
        assert!(sees(owner, Some(creds([0; 4], 0, start_time + 1))), "a newcomer on the pid: as it last was");
        assert!(!sees(Viewer { uid: 1001 }, Some(creds([1001; 4], 1001, start_time))), "first seen as 1000's");
        assert!(!sees(owner, Some(creds([uid, 0, 0, 0], 0, start_time))), "setuid: euid 0, not dumpable");
        assert!(!sees(owner, Some(creds([uid, uid, 0, uid], uid, start_time))), "saved uid root");
        assert!(!sees(owner, Some(creds([uid; 4], 0, start_time))), "not dumpable");
        // Exited after an exec made it setuid root: as it last was, not the owner's.
        let mut setuid = process.clone();
        setuid.info.as_mut().unwrap().credentials = creds([uid, 0, 0, 0], 0, start_time);
        assert!(!visible(owner, &setuid, &mut |_| None), "exited setuid");
    }
}
