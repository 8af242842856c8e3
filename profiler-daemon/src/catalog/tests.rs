use std::time::Duration;

use super::{forget::EXIT_REPORTED_GRACE, processes::merge_maps, *};

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
    let batch = |ids: &[u64], len: usize| ids.iter().map(|&id| (StackId(id), vec![id; len])).collect::<HashMap<_, _>>();
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
