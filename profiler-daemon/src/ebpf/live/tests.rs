//! The live map's reads: the deduplicated, bounded walk against a simulated kernel walk
//! (restarts on deletion), and the batch lookup against a real kernel hash map that a
//! thread churns meanwhile (as root; skipped otherwise, and said so).

use std::os::fd::{AsFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};

use super::*;

/// A hash-map walk as the kernel does it: `get_next_key` from a key deleted meanwhile
/// restarts at the first key. Every `delete_every` steps the key the walk stands on is
/// deleted (a `free` of that block). Returns the walk and the keys left at its end.
fn restarting_walk(
    keys: u32,
    delete_every: usize,
) -> (impl Iterator<Item = Result<u32, ()>>, std::rc::Rc<std::cell::RefCell<Vec<u32>>>) {
    let present = std::rc::Rc::new(std::cell::RefCell::new((0..keys).collect::<Vec<u32>>()));
    let map = present.clone();
    let (mut at, mut step) = (None::<u32>, 0);
    let walk = std::iter::from_fn(move || {
        let mut map = map.borrow_mut();
        step += 1;
        if let Some(prev) = at.filter(|_| step % delete_every == 0) {
            map.retain(|&k| k != prev);
        }
        let next = match at.and_then(|prev| map.iter().position(|&k| k == prev)) {
            Some(i) => map.get(i + 1).copied(),
            None => map.first().copied(),
        };
        at = next;
        next.map(Ok)
    });
    (walk, present)
}

#[test]
fn live_keys_are_read_once_though_the_walk_restarts() {
    let (walk, _) = restarting_walk(100, 30);
    let steps = walk.count();
    assert!(steps > 150, "the simulated walk must restart to test anything: {steps} steps");
    let (walk, present) = restarting_walk(100, 30);
    let read = unique_keys(walk, 10 * steps);
    assert!(!read.cut);
    let mut distinct = read.keys.clone();
    distinct.sort_unstable();
    distinct.dedup();
    assert_eq!(distinct.len(), read.keys.len(), "a key came twice: {:?}", read.keys);
    for key in present.borrow().iter() {
        assert!(read.keys.contains(key), "key {key}, in the map throughout, was missed");
    }
    assert!(read.keys.iter().all(|&k| k < 100));
}

#[test]
fn a_walk_past_its_budget_is_cut_and_says_so() {
    // A deletion every 50 steps restarts the walk before it gets past the 50th key, until
    // fewer than 50 are left: ~47,500 steps for 1,000 keys.
    let (walk, _) = restarting_walk(1_000, 50);
    let steps = walk.count();
    assert!(steps > 4 * 1_000, "quadratic walk: {steps} steps");
    let (walk, _) = restarting_walk(1_000, 50);
    assert!(unique_keys(walk, 4 * 1_000).cut, "stopped at 4,000 steps of a {steps}-step walk");
    let (walk, _) = restarting_walk(1_000, 50);
    assert!(!unique_keys(walk, steps).cut, "the whole walk fits a budget of {steps}");
    // A failing step ends the walk with what was read; that is not a cut.
    let failing = [Ok(1), Ok(2), Err(()), Ok(3)].into_iter();
    assert_eq!(unique_keys(failing, 10), UniqueKeys { keys: vec![1, 2], cut: false });
}

/// `BPF_MAP_CREATE`'s leading fields; the kernel zero-fills the rest of `union bpf_attr`.
#[repr(C)]
struct CreateAttr {
    map_type: u32,
    key_size: u32,
    value_size: u32,
    max_entries: u32,
    map_flags: u32,
}

/// The element member of `union bpf_attr` (update, delete).
#[repr(C)]
struct ElemAttr {
    map_fd: u32,
    _pad: u32,
    key: u64,
    value: u64,
    flags: u64,
}

const BPF_MAP_CREATE: libc::c_long = 0;
const BPF_MAP_UPDATE_ELEM: libc::c_long = 2;
const BPF_MAP_DELETE_ELEM: libc::c_long = 3;
const BPF_MAP_TYPE_HASH: u32 = 1;
const BPF_F_NO_PREALLOC: u32 = 1;

/// A hash map shaped as `HEAP_LIVE` (16-byte keys and values, allocated as used).
fn live_map(max_entries: u32) -> std::io::Result<OwnedFd> {
    let mut attr = CreateAttr {
        map_type: BPF_MAP_TYPE_HASH,
        key_size: std::mem::size_of::<LiveKey>() as u32,
        value_size: std::mem::size_of::<LiveAlloc>() as u32,
        max_entries,
        map_flags: BPF_F_NO_PREALLOC,
    };
    // SAFETY: `attr` holds no pointers.
    let fd = unsafe { super::super::bpf_call(BPF_MAP_CREATE, &mut attr) }?;
    // SAFETY: the kernel returned a new map fd, owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// Updates (`Some`) or deletes (`None`) `key` in map `fd`.
fn set(fd: i32, key: LiveKey, value: Option<LiveAlloc>) -> std::io::Result<i64> {
    let mut attr = ElemAttr {
        map_fd: fd as u32,
        _pad: 0,
        key: &key as *const LiveKey as u64,
        value: value.as_ref().map_or(0, |v| v as *const LiveAlloc as u64),
        flags: 0,
    };
    let cmd = if value.is_some() { BPF_MAP_UPDATE_ELEM } else { BPF_MAP_DELETE_ELEM };
    // SAFETY: `key` and `value` outlive the call and have the map's sizes.
    unsafe { super::super::bpf_call(cmd, &mut attr) }
}

/// Block `i` of process `tgid`: its value names its key, so a torn read shows.
fn block(tgid: u32, i: u64) -> (LiveKey, LiveAlloc) {
    (LiveKey { tgid, _pad: 0, addr: 0x1000 + 16 * i }, LiveAlloc { size: i, stack: u64::from(tgid) << 32 | i })
}

/// A map of 30,000 blocks that stay (process 1) and 30,000 that a second thread frees and
/// allocates again and again (process 2), read by batch while it does. Each read must hold
/// each key once, every staying block, its own value with each key, and at most the
/// churned blocks that exist. (That a `get_next_key` walk restarts on deletion is the
/// simulated walk's test above: from outside, the key a real walk stands on cannot be
/// deleted on purpose.)
#[test]
fn a_batch_read_under_churn_holds_each_block_once() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("creating a BPF map needs root: the batch read is not checked as this user");
        return;
    }
    const N: u64 = 30_000;
    let map = live_map(4 * N as u32).expect("failed to create a BPF hash map (as root)");
    let fd = map.as_fd().as_raw_fd();
    for i in 0..N {
        for tgid in [1, 2] {
            let (key, value) = block(tgid, i);
            set(fd, key, Some(value)).expect("failed to fill the test map");
        }
    }
    let stop = AtomicBool::new(false);
    std::thread::scope(|scope| {
        let churn = scope.spawn(|| {
            let mut churned = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let (key, value) = block(2, churned % N);
                let _ = set(fd, key, None);
                let _ = set(fd, key, Some(value));
                churned += 1;
            }
            churned
        });
        for _ in 0..20 {
            let Some(entries) = lookup_batch(map.as_fd(), 4 * N as usize).expect("batch lookup failed") else {
                eprintln!("this kernel has no BPF_MAP_LOOKUP_BATCH (before 5.6): only the walk is used");
                break;
            };
            let mut seen = HashSet::new();
            for (key, value) in &entries {
                assert!(seen.insert(*key), "key {key:?} read twice in one read of {} entries", entries.len());
                assert_eq!((*key, *value), block(key.tgid, value.size), "a key read with another's value");
            }
            let stayed = entries.iter().filter(|(k, _)| k.tgid == 1).count() as u64;
            assert_eq!(stayed, N, "blocks present throughout were missed");
            assert!(entries.len() as u64 <= 2 * N, "{} entries of at most {}", entries.len(), 2 * N);
        }
        stop.store(true, Ordering::Relaxed);
        let churned = churn.join().expect("the churn thread panicked");
        assert!(churned > 0, "the map was never churned during the reads");
    });
}
