//! The mapped files as the unwinder sees them: their identity (so one file mapped by many
//! processes is read once, and a file rebuilt in place is read again), their table key and
//! load segments, and every read of one, on the offload worker (see [`crate::offload`]).

use std::{
    fs::File,
    os::unix::fs::MetadataExt,
    time::{Duration, Instant},
};

use profiler_common::runtimes::go::GoProcess;

use super::{FileKey, Unwinder};
use crate::{
    elf::{self, load_segments, LoadSegment, MappedFile},
    ids::Pid,
    offload::Charge,
    opened::{self, OpenedFile},
    procs::{Device, MapEntry},
};

/// How long a mapped file's `stat` stands for it (see [`Unwinder::version_of`]): a file
/// rewritten in place within a second of a registration may keep its old table, an
/// unlikely race a `stat` per process would only narrow.
const STAT_FRESH: Duration = Duration::from_secs(1);
/// Recent `stat`s kept before the stale ones are dropped.
const RECENT_STATS_KEPT: usize = 4096;

/// What a file needs to be unwound: its table key and load segments.
#[derive(Debug, Clone)]
pub(super) struct FileInfo {
    pub(super) key: FileKey,
    pub(super) segments: Vec<LoadSegment>,
    /// For a Go executable, where the sampling program reads its goroutines' labels (see
    /// `runtimes::go::kernel`), or why it cannot; `Ok(None)` for any other file.
    pub(super) go: Result<Option<GoProcess>, String>,
}

impl Unwinder {
    /// The key and segments of a mapped file, opened as the process sees it.
    pub(super) fn file_info(&mut self, pid: Pid, entry: &MapEntry) -> Option<FileInfo> {
        if &*entry.path == "[vdso]" {
            // Every process maps the same vDSO image of the running kernel (one per size: a
            // 32-bit process's differs), read from memory once.
            let len = entry.end - entry.start;
            if let Some(info) = self.vdso.get(&len) {
                return Some(info.clone());
            }
            let bytes = read_vdso(pid, entry)?;
            let segments = load_segments(&bytes).ok()?;
            let info = FileInfo { key: format!("vdso:{}", hash_bytes(&bytes)), segments, go: Ok(None) };
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
    pub(super) fn version_of(&mut self, pid: Pid, entry: &MapEntry) -> Option<(u64, i64)> {
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
    pub(super) fn on_file<T: Send + 'static>(
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
}

/// A mapped file's identity: from the kernel's mapping event (device, inode and the
/// inode's generation, which changes when an inode number is reused), or from a `stat` of
/// it for mappings read from `/proc` (device, inode, size, mtime). A file rebuilt or
/// upgraded in place is another file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) enum FileIdentity {
    Event { device: Device, inode: u64, generation: u64 },
    Stat { device: Device, inode: u64, size: u64, mtime: i64 },
}

/// The file's segments, and the key its table is shared by: its build id when root owns it,
/// else its identity. A build id is the file's own word, and any user can copy libc's onto
/// a file whose CFI lies: shared by build id, that file's table would unwind every other
/// process's libc (and a hostile file would be refused under libc's key).
pub(super) fn open_file_info(opened: &OpenedFile) -> Option<FileInfo> {
    let file = opened.file();
    let meta = file.metadata().ok()?;
    let mapped = MappedFile::map(file).ok()?;
    let segments = load_segments(mapped.bytes()).ok()?;
    let key = match elf::build_id(mapped.bytes()) {
        Some(id) if meta.uid() == 0 => format!("build-id:{id}"),
        _ => format!("file:{}:{}:{}:{}", meta.dev(), meta.ino(), meta.size(), opened.version().1),
    };
    // Read with the rest of the file's facts, on the same mapping: the executable of a
    // process is read once, and never again on a file system that stopped answering.
    let go = crate::runtimes::go::kernel::entry(mapped.bytes());
    Some(FileInfo { key, segments, go })
}

/// The vDSO image, read from the process's memory.
pub(super) fn read_vdso(pid: Pid, entry: &MapEntry) -> Option<Vec<u8>> {
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
