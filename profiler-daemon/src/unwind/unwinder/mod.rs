//! [`Unwinder`]: gives the kernel walker the tables it needs. For each process it is told
//! about, with the mappings the catalogue captured, finds each executable file's table by
//! build id (building it the first time, from the file as the process sees it through
//! `/proc/PID/map_files`), loads the rows into the kernel's row memory and writes the
//! process's mapping list. One owner: the thread that owns the [`Session`]. The files are
//! the processes' to control, so every stat, open, map and read of one runs on an offload
//! worker, time-boxed (see [`crate::offload`]); a file that stalls gets no table (its frames
//! fall back to frame pointers, counted by the walker) and is counted here.
//!
//! The registration of processes is here; [`stats`] owns what it reports, [`files`] the
//! mapped files' identities and reads, [`mappings`] which mappings the walker's list holds,
//! [`tables`] building and loading a file's table, and [`runtime`] what the runtimes'
//! walkers are given.

mod files;
mod mappings;
mod runtime;
mod stats;
mod tables;
#[cfg(test)]
mod tests;

use std::{
    collections::HashMap,
    time::{Duration, Instant},
};

use profiler_common::{
    maps::unwind_table_slots,
    runtimes::go::GoProcess,
    unwind::{MAX_PROCESS_MAPPINGS, NO_TABLE, SHARD_ROWS},
    UnwindMapping, UnwindProcess,
};

pub use self::stats::{TableReport, UnwinderStats};
use self::{
    files::{FileIdentity, FileInfo},
    mappings::{bias, kept_mappings},
};
use super::{
    refused::Refused,
    registry::{FileKey, Registry},
};
use crate::{
    ebpf::{Result, Session, UnwindMap},
    ids::Pid,
    offload::Offload,
    procs::{Device, MapEntry},
    runtimes::Walked,
};

/// Default unwind-table memory: 32 MiB of rows.
pub const DEFAULT_TABLE_BYTES: u64 = 32 << 20;

/// The rows of the kernel's row array for a memory budget (whole shards, at least one).
pub fn rows_for_budget(bytes: u64) -> u32 {
    let shards = (bytes / (u64::from(SHARD_ROWS) * 8)).clamp(1, u64::from(u16::MAX) + 1);
    (shards * u64::from(SHARD_ROWS)) as u32
}

/// A registered process: the tables its mappings hold a reference on, and the mapping
/// version it was registered with.
#[derive(Debug)]
struct Registered {
    keys: Vec<FileKey>,
    version: u32,
    /// The mapping list last written to the kernel: one unchanged is not written again,
    /// and a forked child gets its parent's as it is.
    written: Vec<UnwindMapping>,
    /// When it was written (`CLOCK_MONOTONIC`, taken before the write): an exec after it
    /// deleted it in the kernel (see [`Unwinder::take_execs`]).
    written_ns: u64,
    /// The kernel map that holds it.
    map: UnwindMap,
    /// What a runtime's walker was given of the process (see [`crate::runtimes`]), if any.
    runtime: Option<Walked>,
    /// Where the sampling program reads a Go process's goroutine labels, if it was given.
    go: Option<GoProcess>,
}

/// Tables held loaded for a walk in userspace ([`Unwinder::hold`]); give them back with
/// [`Unwinder::release_held`].
#[derive(Debug)]
#[must_use = "held tables stay loaded until released"]
pub struct HeldTables(Vec<FileKey>);

/// The owner of the unwind tables and of the walker's per-process mappings.
pub struct Unwinder {
    registry: Registry,
    /// Where the files are read.
    offload: Offload,
    /// By file identity: the same file mapped by many processes is parsed once, and a path
    /// that names another file now (rebuilt, upgraded) is parsed again.
    files: HashMap<FileIdentity, FileInfo>,
    /// Recent `stat`s of mapped files, by (device, inode): when, and (size, mtime).
    recent_stats: HashMap<(Device, u64), (Instant, (u64, i64))>,
    /// The vDSO image's, by its mapping's size.
    vdso: HashMap<u64, FileInfo>,
    /// Files whose table will never be built, with the reason.
    failed: HashMap<FileKey, String>,
    /// Those of them refused for what building them would cost, kept across restarts.
    refused: Refused,
    /// Files whose table was built but did not fit the memory, by its rows: not built again
    /// until the registry has room for that many (building one can take a second).
    no_room: HashMap<FileKey, u32>,
    processes: HashMap<Pid, Registered>,
    stats: UnwinderStats,
    /// A large table was built since the heap was last trimmed.
    trim_pending: bool,
    /// Tables loaded so far: the last table's load id (see `UnwindTableInfo::id`).
    tables_loaded: u32,
}

impl Unwinder {
    /// An unwinder over the session's row memory, reading files on `offload`, and keeping
    /// the files refused for their cost in `state_dir` (in memory only without one).
    pub fn new(session: &Session, offload: Offload, state_dir: Option<&std::path::Path>) -> Self {
        let shards = session.unwind_rows() / SHARD_ROWS;
        let refused = Refused::load(state_dir);
        let failed: HashMap<FileKey, String> = refused
            .entries()
            .map(|(key, reason)| (key.clone(), format!("refused before a restart: {reason}")))
            .collect();
        Self {
            registry: Registry::new(shards, unwind_table_slots(session.unwind_rows())),
            offload,
            files: HashMap::new(),
            recent_stats: HashMap::new(),
            vdso: HashMap::new(),
            failed,
            refused,
            no_room: HashMap::new(),
            processes: HashMap::new(),
            stats: UnwinderStats::default(),
            trim_pending: false,
            tables_loaded: 0,
        }
    }

    /// The processes that called `execve` since the last call (the kernel noted them, and
    /// dropped their mappings then). A registration written before the exec is forgotten
    /// (and deleted in the kernel, in case the write raced the exec); one written after it
    /// (the side band told of the exec first) is the new image's and stays. The caller makes
    /// them known to the aggregate, and [`Unwinder::sync`] registers their new image.
    pub fn take_execs(&mut self, session: &mut Session) -> Result<Vec<Pid>> {
        let execs = session.take_execs()?;
        for &(pid, exec_ns) in &execs {
            let Some(registered) = self.processes.get(&pid) else { continue };
            if registered.written_ns > exec_ns {
                continue;
            }
            if !registered.written.is_empty() {
                self.stats.undone_by_exec += 1;
            }
            if let Some(old) = self.processes.remove(&pid) {
                self.release(&old.keys);
                session.remove_unwind_process(pid, old.map);
                self.forget_runtime(session, pid, &old);
            }
        }
        Ok(execs.into_iter().map(|(pid, _)| pid).collect())
    }

    /// Registers the processes not registered yet, or registered with an older mapping
    /// `version` (their mappings changed: `dlopen`), each as (pid, version, mappings).
    /// Stops starting new registrations after `budget`, or once `give_way` says something
    /// more urgent waits (after at least one registration, so that each call makes
    /// progress); the rest wait for the next call. `None` registers all. Returns whether
    /// every process was looked at.
    pub fn sync<'a>(
        &mut self,
        session: &mut Session,
        processes: impl IntoIterator<Item = (Pid, u32, &'a [MapEntry])>,
        budget: Option<Duration>,
        give_way: &dyn Fn() -> bool,
    ) -> Result<bool> {
        let started = Instant::now();
        let mut finished = true;
        let mut registered = 0;
        for (pid, version, maps) in processes {
            if budget.is_some_and(|b| started.elapsed() >= b) || (registered > 0 && give_way()) {
                finished = false;
                break;
            }
            let current = self.processes.get(&pid).map(|r| r.version);
            if current == Some(version) {
                continue;
            }
            self.register(session, pid, version, maps)?;
            registered += 1;
        }
        if std::mem::take(&mut self.trim_pending) {
            // Building a large library's table (libLLVM: ~1.3 M rows, with gimli's and the
            // builder's buffers) leaves tens of MiB of freed heap that glibc keeps; give it
            // back so the daemon's resident memory returns to its steady size.
            // SAFETY: malloc_trim only releases free heap memory.
            unsafe { libc::malloc_trim(0) };
        }
        Ok(finished)
    }

    /// The mapping version `pid` is registered with, if it is registered with any mapping.
    pub fn registered_version(&self, pid: Pid) -> Option<u32> {
        self.processes.get(&pid).filter(|r| !r.written.is_empty()).map(|r| r.version)
    }

    /// Forgets processes that are gone (their kernel entries go with the session's next
    /// batch of deletions).
    pub fn forget(&mut self, session: &mut Session, pids: &[Pid]) {
        for pid in pids {
            if let Some(old) = self.processes.remove(pid) {
                self.release(&old.keys);
                session.remove_unwind_process(*pid, old.map);
                self.forget_runtime(session, *pid, &old);
                self.forget_go(session, *pid, &old);
            }
        }
    }

    /// Keeps the tables `pid`'s mappings use loaded until [`Unwinder::release_held`], as a
    /// mapping would: a walk in userspace (a thread dump, on another thread) reads their rows
    /// while the process may change its mappings or exit, and the rows must not be given to
    /// another file meanwhile.
    pub fn hold(&mut self, pid: Pid) -> HeldTables {
        let keys = self.processes.get(&pid).map(|r| r.keys.clone()).unwrap_or_default();
        HeldTables(keys.into_iter().filter(|key| self.registry.acquire(key)).collect())
    }

    /// Lets go of tables held by [`Unwinder::hold`].
    pub fn release_held(&mut self, held: HeldTables) {
        self.release(&held.0);
    }

    fn register(&mut self, session: &mut Session, pid: Pid, version: u32, maps: &[MapEntry]) -> Result<()> {
        let mut process =
            Box::new(UnwindProcess { len: 0, flags: 0, mappings: [UnwindMapping::default(); MAX_PROCESS_MAPPINGS] });
        let mut keys = Vec::new();
        let mut len = 0;
        // The mappings the process has now: one unmapped since cannot be opened, and its
        // addresses cannot be sampled any more.
        let current: Vec<&MapEntry> =
            maps.iter().filter(|m| !m.unmapped && (m.is_file() || &*m.path == "[vdso]")).collect();
        let kept = kept_mappings(&current, MAX_PROCESS_MAPPINGS);
        self.stats.mappings_over_limit += (current.len() - kept.len()) as u64;
        for entry in kept {
            let Some(file) = self.file_info(pid, entry) else { continue };
            let Some(bias) = bias(entry, &file.segments) else {
                self.stats.unreadable_files += 1;
                continue;
            };
            let table = match self.table(session, &file.key, pid, entry)? {
                Some(slot) => {
                    self.registry.acquire(&file.key);
                    keys.push(file.key.clone());
                    slot
                }
                None => NO_TABLE,
            };
            process.mappings[len] = UnwindMapping::new(entry.start, entry.end, bias, table);
            len += 1;
        }
        process.len = len as u32;
        let written = process.mappings[..len].to_vec();
        // The interpreter is found before the list is written and given to the walker after
        // it: the list's flag tells the walker whether to look for one.
        let runtime = self.find_runtime(pid, maps);
        if let Some((walked, _)) = &runtime {
            process.flags = walked.flag();
        }
        let old = self.processes.get(&pid);
        let (written_ns, map) = match old {
            Some(old) if old.written == written && old.runtime.is_some() == runtime.is_some() => {
                (old.written_ns, old.map)
            }
            _ => {
                let now = crate::sideband::now_ns();
                let Some(map) = session.set_unwind_process(pid, &process, old.map(|o| o.map))? else {
                    self.stats.process_maps_full += 1;
                    self.release(&keys);
                    return Ok(());
                };
                (now, map)
            }
        };
        let runtime = match runtime {
            Some(found) => self.give_runtime(session, pid, found)?,
            None => None,
        };
        let given = self.processes.get(&pid).and_then(|o| o.go);
        let go = self.give_go(session, pid, maps, given)?;
        // Released after the new references are taken, so shared tables stay loaded.
        if let Some(old) =
            self.processes.insert(pid, Registered { keys, version, written, written_ns, map, runtime, go })
        {
            self.release(&old.keys);
        }
        Ok(())
    }

    /// Processes the side band saw call `execve`: the kernel dropped their interpreter's
    /// entry at the exec, and their new image is looked at afresh when it registers (a
    /// process that execs another interpreter, as a process pool's spawn does, gets the
    /// new one's). Their tables and mappings go with their next registration, as before.
    pub fn execed(&mut self, pids: impl IntoIterator<Item = Pid>) {
        for pid in pids {
            if let Some(registered) = self.processes.get_mut(&pid) {
                registered.runtime = None;
                registered.go = None;
            }
        }
    }

    /// Registers `child`, just forked from `parent`, with its parent's mapping list as it is
    /// (a fork copies the address space): no file is looked up. Returns false when the
    /// parent is not registered with its mappings as of `parent_version` (the child is then
    /// registered from its own mappings, not from a stale copy marked up to date).
    pub fn inherit(
        &mut self,
        session: &mut Session,
        child: Pid,
        version: u32,
        parent: Pid,
        parent_version: u32,
    ) -> Result<bool> {
        let Some(from) = self.processes.get(&parent).filter(|from| from.version == parent_version) else {
            return Ok(false);
        };
        let (keys, written, parent_runtime) = (from.keys.clone(), from.written.clone(), from.runtime);
        let mut process =
            Box::new(UnwindProcess { len: 0, flags: 0, mappings: [UnwindMapping::default(); MAX_PROCESS_MAPPINGS] });
        process.mappings[..written.len()].copy_from_slice(&written);
        process.len = written.len() as u32;
        if let Some(walked) = &parent_runtime {
            process.flags = walked.flag();
        }
        let written_ns = crate::sideband::now_ns();
        let was = self.processes.get(&child).map(|old| old.map);
        let Some(map) = session.set_unwind_process(child, &process, was)? else {
            self.stats.process_maps_full += 1;
            return Ok(true);
        };
        for key in &keys {
            self.registry.acquire(key);
        }
        // The child's interpreter is its parent's, at the same addresses.
        let runtime = match parent_runtime {
            Some(walked) if walked.give(session, child)? => Some(walked),
            Some(walked) => {
                self.stats.runtimes.of_mut(walked.runtime()).map_full += 1;
                None
            }
            None => None,
        };
        // A forked Go process is not Go's way (it forks only to exec): its child gets no
        // labels until it registers with its own mappings.
        let go = None;
        if let Some(old) =
            self.processes.insert(child, Registered { keys, version, written, written_ns, map, runtime, go })
        {
            self.release(&old.keys);
            if let (Some(old), None) = (old.runtime, runtime) {
                old.forget(session, child)?;
            }
        }
        Ok(true)
    }

    fn release(&mut self, keys: &[FileKey]) {
        for key in keys {
            self.registry.release(key);
        }
    }
}
