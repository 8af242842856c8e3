//! [`Unwinder`]: gives the kernel walker the tables it needs. For each process it is told
//! about, with the mappings the catalogue captured, finds each executable file's table by
//! build id (building it the first time, from the file as the process sees it through
//! `/proc/PID/map_files`), loads the rows into the kernel's row memory and writes the
//! process's mapping list. One owner: the thread that owns the [`Session`]. The files are
//! the processes' to control, so every stat, open, map and read of one runs on an offload
//! worker, time-boxed (see [`crate::offload`]); a file that stalls gets no table (its frames
//! fall back to frame pointers, counted by the walker) and is counted here.

use std::{
    collections::HashMap,
    fs::File,
    os::unix::fs::MetadataExt,
    time::{Duration, Instant},
};

use profiler_common::{
    maps::UNWIND_TABLES_MAX_ENTRIES,
    unwind::{MAX_PROCESS_MAPPINGS, MAX_TABLE_SHARDS, NO_TABLE, SHARD_ROWS},
    UnwindMapping, UnwindProcess, UnwindTableInfo,
};

use super::{
    refused::Refused,
    registry::{FileKey, NoRoom, Registry},
};
use crate::{
    ebpf::{Result, Session, UnwindMap},
    elf::{self, load_segments, LoadSegment, MappedFile},
    ids::Pid,
    offload::{Charge, Offload},
    opened::{self, OpenedFile},
    procs::{Device, MapEntry},
    runtimes::{self, RegistrationStats, Runtime, Walked},
};

/// Tables from this many rows on are large enough to trim the heap after building.
const LARGE_TABLE_ROWS: usize = 64 * 1024;
/// How long a mapped file's `stat` stands for it (see [`Unwinder::version_of`]): a file
/// rewritten in place within a second of a registration may keep its old table, an
/// unlikely race a `stat` per process would only narrow.
const STAT_FRESH: Duration = Duration::from_secs(1);
/// Recent `stat`s kept before the stale ones are dropped.
const RECENT_STATS_KEPT: usize = 4096;

/// Default unwind-table memory: 32 MiB of rows.
pub const DEFAULT_TABLE_BYTES: u64 = 32 << 20;

/// The rows of the kernel's row array for a memory budget (whole shards, at least one).
pub fn rows_for_budget(bytes: u64) -> u32 {
    let shards = (bytes / (u64::from(SHARD_ROWS) * 8)).clamp(1, u64::from(u16::MAX) + 1);
    (shards * u64::from(SHARD_ROWS)) as u32
}

/// What the unwinder did, for `/status`, profile comments and the bench.
#[derive(Debug, Clone, Default)]
pub struct UnwinderStats {
    /// Processes whose mappings the kernel walker has.
    pub processes: usize,
    /// Tables built, and their total build time.
    pub builds: u64,
    pub build_time: Duration,
    /// Files with no table: build failed (no CFI, not ELF, ...), by file; never retried.
    pub build_failures: u64,
    /// Tables too large for one table or the whole budget.
    pub too_large: u64,
    /// Tables not loaded because the tables in use filled the budget (retried later).
    pub budget_full: u64,
    /// Tables evicted (unused) to make room.
    pub evictions: u64,
    /// Executable mappings beyond the per-process limit (those fall back to frame pointers).
    pub mappings_over_limit: u64,
    /// Registrations refused because both kernel process maps were full (retried at the
    /// next drain; meanwhile the process is walked with frame pointers).
    pub process_maps_full: u64,
    /// Registrations written before an exec of their process (inherited at its fork, or the
    /// old image's after a failed exec), which the exec deleted in the kernel: dropped at the
    /// next drain and written anew.
    pub undone_by_exec: u64,
    /// Mapped files that could not be opened or parsed.
    pub unreadable_files: u64,
    /// Mapped files not read because their file system did not answer (see
    /// [`crate::offload`]).
    pub stalled_files: u64,
    /// Processes given to the runtimes' walkers (see [`crate::runtimes`]), by runtime.
    pub runtimes: RegistrationStats,
    /// Bytes of row memory in use, and the budget.
    pub table_bytes: u64,
    pub budget_bytes: u64,
    /// Loaded tables: (file, rows, bytes, build time), largest first.
    pub tables: Vec<TableReport>,
}

/// One loaded table, for reports.
#[derive(Debug, Clone)]
pub struct TableReport {
    pub name: String,
    pub rows: u32,
    pub bytes: u64,
    pub build_duration: Duration,
}

/// What a file needs to be unwound: its table key and load segments.
#[derive(Debug, Clone)]
struct FileInfo {
    key: FileKey,
    segments: Vec<LoadSegment>,
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
            registry: Registry::new(shards, UNWIND_TABLES_MAX_ENTRIES),
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

    /// What the unwinder did so far.
    pub fn stats(&self) -> UnwinderStats {
        let mut stats = self.stats.clone();
        stats.processes = self.processes.len();
        for runtime in Runtime::ALL {
            stats.runtimes.of_mut(runtime).processes =
                self.processes.values().filter(|r| r.runtime.is_some_and(|w| w.runtime() == runtime)).count() as u64;
        }
        stats.evictions = self.registry.evictions;
        (stats.table_bytes, stats.budget_bytes) = self.registry.usage();
        stats.tables = self
            .registry
            .tables()
            .map(|(_, t)| TableReport {
                name: t.name.clone(),
                rows: t.rows,
                bytes: t.bytes(),
                build_duration: t.build_duration,
            })
            .collect();
        stats.tables.sort_by(|a, b| b.bytes.cmp(&a.bytes).then_with(|| a.name.cmp(&b.name)));
        stats
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
        // Released after the new references are taken, so shared tables stay loaded.
        if let Some(old) = self.processes.insert(pid, Registered { keys, version, written, written_ns, map, runtime }) {
            self.release(&old.keys);
        }
        Ok(())
    }

    /// The interpreter of `pid`: the one the walker was given already (an image's
    /// interpreter stays where it is until an exec, which ends the registration), else
    /// looked for when a mapped file is named like a runtime's. `(interpreter, new)`.
    fn find_runtime(&mut self, pid: Pid, maps: &[MapEntry]) -> Option<(Walked, bool)> {
        if let Some(known) = self.processes.get(&pid).and_then(|r| r.runtime) {
            return Some((known, false));
        }
        let runtime = runtimes::candidate(maps)?;
        let owned = maps.to_vec();
        let found = self
            .offload
            .call(&format!("{runtime:?} of pid {pid}"), Charge::path(pid), move |state| {
                let charger = state.charger();
                runtime.find(pid, &owned, &|map: &MapEntry| opened::open_on_worker(&charger, pid, map))
            })
            .map_err(|stall| stall.to_string())
            .and_then(|found| found);
        match found {
            Ok(Some(walked)) => Some((walked, true)),
            Ok(None) => None,
            Err(why) => {
                tracing::debug!(%pid, ?runtime, reason = %why, "no interpreted frames from the kernel walker");
                let stats = self.stats.runtimes.of_mut(runtime);
                stats.unsupported += 1;
                stats.unsupported_reason = Some(why);
                None
            }
        }
    }

    /// Writes `pid`'s interpreter found by [`Self::find_runtime`] for the walker, if it is
    /// new. Returns it, or `None` when the map is full (counted).
    fn give_runtime(
        &mut self,
        session: &mut Session,
        pid: Pid,
        (walked, new): (Walked, bool),
    ) -> Result<Option<Walked>> {
        if new && !walked.give(session, pid)? {
            self.stats.runtimes.of_mut(walked.runtime()).map_full += 1;
            return Ok(None);
        }
        Ok(Some(walked))
    }

    /// Processes the side band saw call `execve`: the kernel dropped their interpreter's
    /// entry at the exec, and their new image is looked at afresh when it registers (a
    /// process that execs another interpreter, as a process pool's spawn does, gets the
    /// new one's). Their tables and mappings go with their next registration, as before.
    pub fn execed(&mut self, pids: impl IntoIterator<Item = Pid>) {
        for pid in pids {
            if let Some(registered) = self.processes.get_mut(&pid) {
                registered.runtime = None;
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
        if let Some(old) = self.processes.insert(child, Registered { keys, version, written, written_ns, map, runtime })
        {
            self.release(&old.keys);
            if let (Some(old), None) = (old.runtime, runtime) {
                old.forget(session, child)?;
            }
        }
        Ok(true)
    }

    /// Deletes `pid`'s interpreter from the walker's map, if it was given one (rare enough
    /// to go at once, unlike the mapping lists' batched deletions). A failure is logged: the
    /// entry then stays until the pid registers again, walking a dead process's addresses
    /// in whichever process reuses it, whose words userspace checks before naming them.
    fn forget_runtime(&mut self, session: &mut Session, pid: Pid, old: &Registered) {
        let Some(walked) = old.runtime else { return };
        if let Err(err) = walked.forget(session, pid) {
            let runtime = walked.runtime();
            tracing::warn!(%pid, ?runtime, error = %err, "could not remove a process from a runtime walker's map");
        }
    }

    fn release(&mut self, keys: &[FileKey]) {
        for key in keys {
            self.registry.release(key);
        }
    }

    /// The key and segments of a mapped file, opened as the process sees it.
    fn file_info(&mut self, pid: Pid, entry: &MapEntry) -> Option<FileInfo> {
        if &*entry.path == "[vdso]" {
            // Every process maps the same vDSO image of the running kernel (one per size: a
            // 32-bit process's differs), read from memory once.
            let len = entry.end - entry.start;
            if let Some(info) = self.vdso.get(&len) {
                return Some(info.clone());
            }
            let bytes = read_vdso(pid, entry)?;
            let segments = load_segments(&bytes).ok()?;
            let info = FileInfo { key: format!("vdso:{}", hash_bytes(&bytes)), segments };
            self.vdso.insert(len, info.clone());
            return Some(info);
        }
        // The kernel's events give a file's identity with its mapping: no file to stat. A
        // mapping read from /proc is stat'ed for it.
        let identity = if entry.generation != 0 {
            FileIdentity::Event { device: entry.device, inode: entry.inode, generation: entry.generation }
        } else {
            let (size, mtime) = self.version_of(pid, entry)?;
            FileIdentity::Stat { device: entry.device, inode: entry.inode, size, mtime }
        };
        if let Some(info) = self.files.get(&identity) {
            return Some(info.clone());
        }
        let opened = self.on_file(pid, entry, open_file_info);
        let Some(info) = opened? else {
            self.stats.unreadable_files += 1;
            return None;
        };
        self.files.insert(identity, info.clone());
        Some(info)
    }

    /// The (size, mtime) of `entry`'s file, from a `stat` at most [`STAT_FRESH`] old: a file
    /// mapped by hundreds of short processes a second (a shell's commands, the C library
    /// under them) is looked at once a second, not once per process. Many file systems
    /// (ext4 made from an image, tmpfs, overlayfs) give no inode generation in the mapping
    /// event, so this `stat` is what tells a file rebuilt in place.
    fn version_of(&mut self, pid: Pid, entry: &MapEntry) -> Option<(u64, i64)> {
        let key = (entry.device, entry.inode);
        if let Some(&(at, version)) = self.recent_stats.get(&key) {
            if at.elapsed() < STAT_FRESH {
                return Some(version);
            }
        }
        let version = self.on_file(pid, entry, |file| file.version())?;
        if self.recent_stats.len() >= RECENT_STATS_KEPT {
            self.recent_stats.retain(|_, (at, _)| at.elapsed() < STAT_FRESH);
        }
        self.recent_stats.insert(key, (Instant::now(), version));
        Some(version)
    }

    /// Runs `work` on the file of `entry`, opened once and checked (see [`crate::opened`]):
    /// on this thread when it opens here without blocking (through the mapping, on a disk),
    /// else on the offload worker. `None` when it could not be opened (counted unreadable),
    /// stalled or was refused for a stalled device (counted).
    fn on_file<T: Send + 'static>(
        &mut self,
        pid: Pid,
        entry: &MapEntry,
        work: impl FnOnce(&OpenedFile) -> T + Send + 'static,
    ) -> Option<T> {
        let what = format!("{} (pid {pid})", entry.path);
        let charge = Charge::file(entry.device, pid);
        let done = match opened::open_inline(pid, entry) {
            Some(file) => self.offload.run_on_opened(&what, charge, move || Some(work(&file))),
            None => {
                let map = entry.clone();
                self.offload.call(&what, charge, move |state| {
                    opened::open_on_worker(&state.charger(), pid, &map).map(|file| work(&file))
                })
            }
        };
        match done {
            Ok(Some(value)) => Some(value),
            Ok(None) => {
                self.stats.unreadable_files += 1;
                None
            }
            Err(stall) => {
                tracing::debug!("no unwind table: {stall}");
                self.stats.stalled_files += 1;
                None
            }
        }
    }

    /// The slot of the table for `key`, building and loading it if needed; `None` when the
    /// file has no usable table.
    fn table(&mut self, session: &mut Session, key: &FileKey, pid: Pid, entry: &MapEntry) -> Result<Option<u32>> {
        if let Some(slot) = self.registry.get(key) {
            return Ok(Some(slot));
        }
        if self.failed.contains_key(key) {
            return Ok(None);
        }
        if self.no_room.get(key).is_some_and(|&rows| !self.registry.has_room_for(rows)) {
            self.stats.budget_full += 1;
            return Ok(None);
        }
        let built = if &*entry.path == "[vdso]" {
            read_vdso(pid, entry).map(|bytes| super::build(&bytes))
        } else {
            let build = |file: &OpenedFile| {
                let mapped = MappedFile::map(file.file()).ok()?;
                Some(super::build(mapped.bytes()))
            };
            match self.on_file(pid, entry, build) {
                Some(built) => built,
                // Stalled: no table now; a device that answers again is tried at the next
                // registration.
                None => return Ok(None),
            }
        };
        let table = match built {
            Some(Ok(table)) => table,
            Some(Err(err)) => {
                tracing::debug!(file = %entry.path, error = %err, "no unwind table");
                self.stats.build_failures += 1;
                if err.is_over_budget() {
                    tracing::warn!(file = %entry.path, error = %err, "no unwind table; not read again, even after a restart");
                    self.refused.add(key, &err.to_string());
                }
                self.failed.insert(key.clone(), err.to_string());
                return Ok(None);
            }
            None => {
                self.stats.unreadable_files += 1;
                return Ok(None);
            }
        };
        self.stats.builds += 1;
        self.stats.build_time += table.stats().build_duration;
        self.trim_pending |= table.rows().len() >= LARGE_TABLE_ROWS;
        let rows = table.rows();
        let Ok(count) = u32::try_from(rows.len()) else {
            self.stats.too_large += 1;
            self.failed.insert(key.clone(), "too many rows".into());
            return Ok(None);
        };
        let reservation = match self.registry.reserve(count) {
            Ok(r) => r,
            Err(NoRoom::TooLarge) => {
                self.stats.too_large += 1;
                self.failed.insert(key.clone(), format!("{count} rows do not fit the unwind-table memory"));
                return Ok(None);
            }
            Err(NoRoom::BudgetFull) => {
                self.stats.budget_full += 1;
                self.no_room.insert(key.clone(), count);
                return Ok(None);
            }
        };
        let empty = UnwindTableInfo { base_address: 0, rows: 0, id: 0, shards: [0; MAX_TABLE_SHARDS] };
        for &slot in &reservation.evicted_slots {
            session.set_unwind_table(slot, &empty)?;
        }
        let mut info = empty;
        for (i, (chunk, &shard)) in rows.chunks(SHARD_ROWS as usize).zip(&reservation.shards).enumerate() {
            if let Err(err) = session.write_unwind_shard(shard, chunk) {
                self.registry.cancel(reservation);
                return Err(err);
            }
            info.shards[i] = shard;
        }
        info.base_address = table.base_address();
        info.rows = count;
        self.tables_loaded += 1;
        info.id = self.tables_loaded;
        if let Err(err) = session.set_unwind_table(reservation.slot, &info) {
            self.registry.cancel(reservation);
            return Err(err);
        }
        self.registry.insert(key.clone(), &reservation, count, entry.path.to_string(), table.stats().build_duration);
        self.no_room.remove(key);
        Ok(Some(reservation.slot))
    }
}

/// A mapped file's identity: from the kernel's mapping event (device, inode and the
/// inode's generation, which changes when an inode number is reused), or from a `stat` of
/// it for mappings read from `/proc` (device, inode, size, mtime). A file rebuilt or
/// upgraded in place is another file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum FileIdentity {
    Event { device: Device, inode: u64, generation: u64 },
    Stat { device: Device, inode: u64, size: u64, mtime: i64 },
}

/// The file's segments, and the key its table is shared by: its build id when root owns it,
/// else its identity. A build id is the file's own word, and any user can copy libc's onto
/// a file whose CFI lies: shared by build id, that file's table would unwind every other
/// process's libc (and a hostile file would be refused under libc's key).
fn open_file_info(opened: &OpenedFile) -> Option<FileInfo> {
    let file = opened.file();
    let meta = file.metadata().ok()?;
    let mapped = MappedFile::map(file).ok()?;
    let segments = load_segments(mapped.bytes()).ok()?;
    let key = match elf::build_id(mapped.bytes()) {
        Some(id) if meta.uid() == 0 => format!("build-id:{id}"),
        _ => format!("file:{}:{}:{}:{}", meta.dev(), meta.ino(), meta.size(), opened.version().1),
    };
    Some(FileInfo { key, segments })
}

/// File names every process's stacks run through (the C library, the dynamic loader, the
/// vDSO, the C++ and unwinding runtimes; and an interpreter's library,
/// [`runtimes::is_library`]): kept first when a process maps more files than the walker's
/// list holds.
const RUNTIME_FILES: [&str; 7] =
    ["libc.so", "ld-linux", "[vdso]", "libpthread.so", "libstdc++.so", "libgcc_s.so", "libm.so"];

/// Which of `maps` (sorted by address) the walker's list of `cap` holds: all when they fit,
/// else the runtime's files ([`RUNTIME_FILES`]) and then the lowest addresses (the
/// executable's, below the libraries'), in address order. A process with hundreds of
/// libraries (a plugin host) loses the last ones it loaded, not the C library every stack
/// runs through.
fn kept_mappings<'a>(maps: &[&'a MapEntry], cap: usize) -> Vec<&'a MapEntry> {
    if maps.len() <= cap {
        return maps.to_vec();
    }
    let is_runtime = |m: &MapEntry| {
        let name = m.path.rsplit('/').next().unwrap_or("");
        RUNTIME_FILES.iter().any(|runtime| name.starts_with(runtime)) || runtimes::is_library(name)
    };
    let mut chosen: Vec<usize> = (0..maps.len()).filter(|&i| is_runtime(maps[i])).take(cap).collect();
    let rest: Vec<usize> = (0..maps.len()).filter(|&i| !is_runtime(maps[i])).take(cap - chosen.len()).collect();
    chosen.extend(rest);
    chosen.sort_unstable();
    chosen.into_iter().map(|i| maps[i]).collect()
}

/// The bias of an executable mapping: address − bias is the file's virtual address.
fn bias(entry: &MapEntry, segments: &[LoadSegment]) -> Option<u64> {
    const PAGE: u64 = 4096;
    // lld packs segments into shared pages, so the page an executable mapping starts at may
    // also hold the end of the read-only segment before it: prefer the executable segment.
    let covers = |s: &&LoadSegment| {
        let first = s.file_offset & !(PAGE - 1);
        (first..s.file_offset + s.file_size.max(1)).contains(&entry.offset)
    };
    let segment = segments.iter().filter(|s| s.executable).find(covers).or_else(|| segments.iter().find(covers))?;
    let vaddr = entry.offset.wrapping_sub(segment.file_offset).wrapping_add(segment.vaddr);
    Some(entry.start.wrapping_sub(vaddr))
}

/// The vDSO image, read from the process's memory.
fn read_vdso(pid: Pid, entry: &MapEntry) -> Option<Vec<u8>> {
    use std::os::unix::fs::FileExt;
    let mem = File::open(format!("/proc/{pid}/mem")).ok()?;
    let mut bytes = vec![0; (entry.end - entry.start) as usize];
    mem.read_exact_at(&mut bytes, entry.start).ok()?;
    Some(bytes)
}

fn hash_bytes(bytes: &[u8]) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    bytes.hash(&mut h);
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(start: u64, offset: u64) -> MapEntry {
        MapEntry {
            start,
            end: start + 0x1000,
            offset,
            path: "/x".into(),
            inode: 1,
            device: Default::default(),
            generation: 0,
            unmapped: false,
        }
    }

    /// A build id shares a table only when root owns the file: a user's copy of a binary
    /// (the same build id, and CFI it may have changed) gets a table of its own.
    #[test]
    fn only_roots_files_share_tables_by_build_id() {
        use std::os::unix::fs::MetadataExt;
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("giving a file to another owner needs root: not checked as this user");
            return;
        }
        let dir = std::env::temp_dir().join(format!("unwinder-owner-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let key_of = |name: &str, owner: u32| {
            let copy = dir.join(name);
            std::fs::copy("/proc/self/exe", &copy).unwrap();
            std::os::unix::fs::chown(&copy, Some(owner), Some(owner)).unwrap();
            let meta = std::fs::metadata(&copy).unwrap();
            let map = MapEntry {
                path: copy.to_string_lossy().into(),
                inode: meta.ino(),
                device: Device { major: libc::major(meta.dev()), minor: libc::minor(meta.dev()) },
                ..entry(0x1000, 0)
            };
            let opened = crate::opened::open_by_path(Pid(0x7fff_fff0), &map).unwrap();
            open_file_info(&opened).unwrap().key
        };
        let roots = key_of("roots", 0);
        let users = key_of("users", 65534);
        let _ = std::fs::remove_dir_all(&dir);
        assert!(roots.starts_with("build-id:"), "{roots}");
        assert!(users.starts_with("file:"), "{users}");
    }

    /// Past the walker's list, the C library, the loader and the vDSO stay (the review's
    /// F25: the highest addresses, theirs, were the ones dropped), then the lowest.
    #[test]
    fn a_process_with_too_many_files_keeps_the_runtime_and_the_lowest() {
        let named = |start: u64, path: &str| MapEntry { path: path.into(), ..entry(start, 0) };
        let mut maps = vec![named(0x5555_0000_0000, "/usr/bin/host")];
        maps.extend((0..10).map(|i| named(0x7f00_0000_0000 + i * 0x10000, &format!("/plugins/p{i}.so"))));
        maps.push(named(0x7f10_0000_0000, "/usr/lib/x86_64-linux-gnu/libc.so.6"));
        maps.push(named(0x7f20_0000_0000, "/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2"));
        maps.push(named(0x7fff_0000_0000, "[vdso]"));
        let all: Vec<&MapEntry> = maps.iter().collect();
        assert_eq!(kept_mappings(&all, 20).len(), all.len(), "all fit");
        let kept: Vec<&str> = kept_mappings(&all, 5).iter().map(|m| &*m.path).collect();
        assert_eq!(
            kept,
            [
                "/usr/bin/host",
                "/plugins/p0.so",
                "/usr/lib/x86_64-linux-gnu/libc.so.6",
                "/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2",
                "[vdso]"
            ]
        );
    }

    #[test]
    fn bias_maps_addresses_to_file_virtual_addresses() {
        // A PIE's text segment: file offset 0x1000 at vaddr 0x1000, loaded at 0x5555_0000_1000.
        let text = LoadSegment { file_offset: 0x1000, vaddr: 0x1000, file_size: 0x5000, executable: true };
        let b = bias(&entry(0x5555_0000_1000, 0x1000), &[text]).unwrap();
        assert_eq!(0x5555_0000_1234 - b, 0x1234);
        // A non-PIE whose segment is not page-aligned in the file: offset 0x2f0 at 0x4012f0.
        let seg = LoadSegment { file_offset: 0x12f0, vaddr: 0x4012f0, file_size: 0x100, executable: true };
        let b = bias(&entry(0x401000, 0x1000), &[seg]).unwrap();
        assert_eq!(0x4012f4u64.wrapping_sub(b), 0x4012f4);
        assert!(bias(&entry(0x1000, 0x9000), &[text]).is_none());
        // lld: the read-only segment ends in the page where text starts (at another vaddr).
        let rodata = LoadSegment { file_offset: 0, vaddr: 0, file_size: 0x13c20, executable: false };
        let text = LoadSegment { file_offset: 0x13c20, vaddr: 0x14c20, file_size: 0x3e760, executable: true };
        let b = bias(&entry(0x5000_0000_0000, 0x13000), &[rodata, text]).unwrap();
        assert_eq!(0x5000_0000_0c20 - b, 0x14c20);
    }

    #[test]
    fn build_ids_come_from_the_notes_as_the_symbolizer_reads_them() {
        let exe = std::env::current_exe().unwrap();
        let bytes = std::fs::read(&exe).unwrap();
        let id = elf::build_id(&bytes);
        assert!(id.as_ref().is_some_and(|id| id.len() >= 16), "{id:?}");
        assert_eq!(id, crate::symbolize::build_id(&exe));
        assert_eq!(elf::build_id(&[0; 64]), None);
    }

    #[test]
    fn budgets_round_to_whole_shards() {
        assert_eq!(rows_for_budget(DEFAULT_TABLE_BYTES), 4 << 20);
        assert_eq!(rows_for_budget(1), SHARD_ROWS);
    }
}
