//! The kernel's process events (see [`crate::sideband`]) applied to the catalogue: a fork
//! gives the child its parent's mappings, an `exec` retires the old image's mappings and
//! renames the process, each executable mapping is added as it appears, an exit is noted.
//! Events come in time order; a mapping from before the process's last `exec` (one whose
//! record was read late) is kept as retired, not as current.

use std::{path::PathBuf, time::Instant};

use super::{Catalog, KnownProcess};
use crate::{
    ids::Pid,
    procs::{MapEntry, ProcessInfo},
    sideband::ProcessEvent,
};

/// What a batch of events changed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Applied {
    /// Processes whose current mappings changed (new, forked, exec'd, mapped a file): the
    /// unwinder registers them again.
    pub changed: Vec<Pid>,
    /// Processes that exited.
    pub exited: Vec<Pid>,
    /// Pids of processes that exited and were reused by a new process: what was counted or
    /// attached for the old one must not show under the new one.
    pub reused: Vec<Pid>,
    /// Records the kernel dropped (a ring was full).
    pub lost: u64,
    /// Cgroups created: (id, path).
    pub cgroups: Vec<(u64, String)>,
    /// Processes forked (and not exec'd since, in this batch), with their parents: each
    /// has its parent's mappings.
    pub forked: Vec<(Pid, Pid)>,
}

impl Catalog {
    /// Applies `events` (in time order).
    pub fn apply(&mut self, events: &[ProcessEvent]) -> Applied {
        let mut applied = Applied::default();
        for event in events {
            match event {
                ProcessEvent::Forked { pid, parent, .. } => {
                    let child = self.forked(*pid, *parent);
                    if self.replace(child) {
                        applied.reused.push(*pid);
                    }
                    applied.forked.push((*pid, *parent));
                    applied.changed.push(*pid);
                }
                ProcessEvent::Exec { pid, time, name } => {
                    applied.forked.retain(|(child, _)| child != pid);
                    let process = self.known_from_events(*pid, name);
                    process.name.clone_from(name);
                    process.exec_time = *time;
                    let info = process.info.get_or_insert_with(|| ProcessInfo::from_events(pid.0, name));
                    for map in &mut info.maps {
                        map.unmapped = true;
                    }
                    info.name.clone_from(name);
                    // The new image is named by its first mapping; `/proc` says for sure later.
                    info.exe = None;
                    // Who it is may have changed (a setuid program): read again at its next sample.
                    process.inspected = false;
                    process.maps_version += 1;
                    applied.changed.push(*pid);
                }
                ProcessEvent::Renamed { pid, name, .. } => {
                    if let Some(process) = self.processes.get_mut(pid) {
                        process.name.clone_from(name);
                    }
                }
                ProcessEvent::Mapped { pid, time, map } => {
                    applied.forked.retain(|(child, _)| child != pid);
                    let process = self.known_from_events(*pid, "");
                    let current = *time >= process.exec_time;
                    let info = process.info.get_or_insert_with(|| ProcessInfo::from_events(pid.0, ""));
                    if current && info.exe.is_none() && map.is_file() {
                        info.exe = Some(PathBuf::from(&*map.path));
                    }
                    add_mapping(&mut info.maps, map, current);
                    process.maps_version += 1;
                    applied.changed.push(*pid);
                }
                ProcessEvent::Exited { pid, .. } => {
                    if let Some(process) = self.processes.get_mut(pid) {
                        process.last_seen = Instant::now();
                        process.exited = true;
                    }
                    applied.exited.push(*pid);
                }
                ProcessEvent::Lost { count } => {
                    applied.lost += count;
                    self.exits_lost = true;
                }
                ProcessEvent::Cgroup { id, path } => applied.cgroups.push((*id, path.clone())),
            }
        }
        applied.changed.sort_unstable();
        applied.changed.dedup();
        applied
    }

    /// The process `pid`, created (known from events only) if new.
    fn known_from_events(&mut self, pid: Pid, name: &str) -> &mut KnownProcess {
        let process = self.processes.entry(pid).or_insert_with(|| KnownProcess {
            pid,
            name: name.to_string(),
            info: Some(ProcessInfo::from_events(pid.0, name)),
            inspected: false,
            exec_time: 0,
            exited: false,
            last_seen: Instant::now(),
            maps_version: 0,
            sampled: false,
            stacks_over_share: 0,
        });
        process.last_seen = Instant::now();
        process
    }

    /// A child forked from `parent`: the parent's name, owner and current mappings (what a
    /// fork copies), read again from `/proc` at its first sample.
    fn forked(&self, pid: Pid, parent: Pid) -> KnownProcess {
        let mut info = match self.processes.get(&parent).and_then(|p| p.info.clone()) {
            Some(mut info) => {
                info.maps.retain(|m| !m.unmapped);
                info
            }
            None => ProcessInfo::from_events(pid.0, ""),
        };
        info.pid = pid.0;
        info.ns_pid = pid.0;
        let name = self.processes.get(&parent).map_or_else(String::new, |p| p.name.clone());
        KnownProcess {
            pid,
            name,
            info: Some(info),
            inspected: false,
            exec_time: 0,
            exited: false,
            last_seen: Instant::now(),
            maps_version: 0,
            sampled: false,
            stacks_over_share: 0,
        }
    }

    /// Puts `process` in place of whatever was known under its pid: a pid reused after its
    /// process exited names the new one from now on, and the old one is remembered as
    /// departed. Returns whether a process that exited was replaced (the pid was reused).
    fn replace(&mut self, process: KnownProcess) -> bool {
        match self.processes.insert(process.pid, process) {
            Some(old) => {
                let reused = old.exited;
                self.remember_departed(old);
                reused
            }
            None => false,
        }
    }
}

/// Adds `map` to `maps` (sorted by address): a current mapping retires the ones it overlaps
/// (`mmap` over them); one from before the last `exec` is kept as retired.
fn add_mapping(maps: &mut Vec<MapEntry>, map: &MapEntry, current: bool) {
    if maps.iter().any(|m| m == map || (m.unmapped != current && m.same_mapping(map))) {
        return;
    }
    if current {
        for old in maps.iter_mut().filter(|m| !m.unmapped && m.start < map.end && map.start < m.end) {
            old.unmapped = true;
        }
    }
    let at = maps.partition_point(|m| m.start <= map.start);
    maps.insert(at, MapEntry { unmapped: !current, ..map.clone() });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::procs::Device;

    // pids far above pid_max: never alive, so nothing is read from /proc.
    const PARENT: Pid = Pid(0x7fff_ff00);
    const CHILD: Pid = Pid(0x7fff_ff01);

    fn map(start: u64, path: &str) -> MapEntry {
        MapEntry {
            start,
            end: start + 0x1000,
            offset: 0,
            path: path.into(),
            // A file per path.
            inode: path.bytes().map(u64::from).sum::<u64>(),
            device: Device { major: 8, minor: 1 },
            generation: 7,
            unmapped: false,
        }
    }

    fn mapped(pid: Pid, time: u64, start: u64, path: &str) -> ProcessEvent {
        ProcessEvent::Mapped { pid, time, map: map(start, path) }
    }

    fn current(catalog: &Catalog, pid: Pid) -> Vec<String> {
        catalog.process(pid).unwrap().maps().iter().filter(|m| !m.unmapped).map(|m| m.path.to_string()).collect()
    }

    #[test]
    fn a_short_process_is_known_with_its_mappings_from_events_alone() {
        let mut catalog = Catalog::default();
        let applied = catalog.apply(&[
            ProcessEvent::Forked { pid: CHILD, parent: PARENT, time: 1 },
            ProcessEvent::Exec { pid: CHILD, time: 2, name: "grep".into() },
            mapped(CHILD, 3, 0x5000, "/usr/bin/grep"),
            mapped(CHILD, 4, 0x9000, "/usr/lib/libc.so.6"),
            ProcessEvent::Exited { pid: CHILD, time: 5 },
        ]);
        assert_eq!(applied.changed, vec![CHILD]);
        assert_eq!(applied.exited, vec![CHILD]);
        let process = catalog.process(CHILD).unwrap();
        assert_eq!(process.name, "grep");
        assert!(!process.inspected);
        assert_eq!(process.uid(), Some(crate::procs::UNKNOWN_UID), "an owner nobody but root matches");
        assert_eq!(current(&catalog, CHILD), ["/usr/bin/grep", "/usr/lib/libc.so.6"]);
        let info = process.info.as_ref().unwrap();
        assert_eq!(info.exe.as_deref(), Some(std::path::Path::new("/usr/bin/grep")));
        assert!(info.mapping_of(0x9010).is_some());
    }

    #[test]
    fn a_fork_copies_the_parent_and_an_exec_retires_its_image() {
        let mut catalog = Catalog::default();
        catalog.apply(&[
            ProcessEvent::Exec { pid: PARENT, time: 1, name: "server".into() },
            mapped(PARENT, 2, 0x5000, "/usr/bin/server"),
            ProcessEvent::Forked { pid: CHILD, parent: PARENT, time: 3 },
        ]);
        assert_eq!(current(&catalog, CHILD), ["/usr/bin/server"], "a fork-only child maps its parent's files");
        assert_eq!(catalog.process(CHILD).unwrap().name, "server");
        catalog.apply(&[
            ProcessEvent::Exec { pid: CHILD, time: 10, name: "worker".into() },
            mapped(CHILD, 11, 0x7000, "/usr/bin/worker"),
            // Read late: a mapping of the old image, before the exec.
            mapped(CHILD, 9, 0x6000, "/usr/lib/old.so"),
        ]);
        assert_eq!(current(&catalog, CHILD), ["/usr/bin/worker"]);
        let all: Vec<&str> = catalog.process(CHILD).unwrap().maps().iter().map(|m| &*m.path).collect();
        assert_eq!(all, ["/usr/bin/server", "/usr/lib/old.so", "/usr/bin/worker"], "old ones kept, retired");
        assert_eq!(current(&catalog, PARENT), ["/usr/bin/server"], "the parent is untouched");
    }

    #[test]
    fn a_mapping_over_another_retires_it_and_a_reused_pid_is_a_new_process() {
        let mut catalog = Catalog::default();
        catalog.apply(&[
            ProcessEvent::Exec { pid: CHILD, time: 1, name: "old".into() },
            mapped(CHILD, 2, 0x5000, "/a.so"),
            mapped(CHILD, 3, 0x5000, "/b.so"),
        ]);
        assert_eq!(current(&catalog, CHILD), ["/b.so"]);
        let applied = catalog.apply(&[
            ProcessEvent::Exited { pid: CHILD, time: 4 },
            ProcessEvent::Forked { pid: CHILD, parent: PARENT, time: 5 },
        ]);
        assert_eq!(applied.reused, vec![CHILD]);
        assert!(current(&catalog, CHILD).is_empty(), "nothing of the old process");
        assert_eq!(catalog.departed(CHILD).map(|d| d.name.as_str()), Some("old"));
    }
}
