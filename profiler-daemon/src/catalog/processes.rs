//! What the catalogue reads of a process from `/proc`: at first sight, when it is known from
//! events only, and again when its samples fall outside its known mappings (`dlopen`) or it
//! calls `execve`; and how mappings read again merge with those known.

use std::{collections::HashMap, time::Instant};

use super::{Catalog, KnownProcess, Sighting};
use crate::{
    ids::{Pid, StackId},
    procs::{self, MapEntry},
};

impl Catalog {
    /// Notes the processes a batch's samples name: seen now, sampled, named after their main
    /// thread until `/proc` names them; those with user frames outside their known mappings
    /// have their mappings read again.
    pub(super) fn see_processes(&mut self, stacks: &HashMap<StackId, Vec<u64>>, sightings: &[Sighting<'_>]) {
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

    pub(super) fn refresh_mappings(&mut self, pid: Pid) {
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

pub(super) fn first_sight(pid: Pid, comm: &str) -> KnownProcess {
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
pub(super) fn inspect(process: &mut KnownProcess) {
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
pub(super) fn merge_maps(mut fresh: Vec<MapEntry>, old: &[MapEntry]) -> Vec<MapEntry> {
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
