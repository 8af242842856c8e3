//! Names for code objects: qualified name, file and first line from a `PyCodeObject`, and
//! the current line from its location table ([`super::linetable`]).
//!
//! A code object is read once per (process, address) and cached with what identifies it:
//! its type pointer and the addresses of its name, file and table objects, re-read (one
//! small read) at every use. A code object freed and another allocated at its address
//! differs in those, and is read afresh rather than named after the old one.
//!
//! The cache is bounded in bytes, not entries ([`CACHE_BYTES`] in all, [`PROCESS_CACHE_BYTES`]
//! a process), counted from what each entry holds and checked before it is inserted; the
//! least recently used entries make room. An entry holds no location table: only the lines
//! asked for so far (see [`CodeCache::name`]). Every read of a code object draws on the
//! dump's [`ReadBudget`], so that a process cannot make one dump read gigabytes either.//!
//! The cache is here; [`read`] owns the reads of a code object and its strings and lines
//! from the process, and the [`ReadBudget`] they draw on.

mod read;
#[cfg(test)]
mod tests;

use std::{
    collections::{BTreeMap, HashMap},
    mem::size_of,
    sync::Arc,
};

pub use self::read::ReadBudget;
use self::read::{identity, line_of, read_code};
use super::{detect::Interpreter, memory::Remote, offsets::CODE_READ_BYTES, ReadFailure};
use crate::ids::Pid;

/// Bytes the cache holds at most, all processes together (one cache per reader).
pub const CACHE_BYTES: usize = 32 << 20;

/// Bytes the cache holds at most for one process: one process's code objects cannot take
/// the room of all the others.
pub const PROCESS_CACHE_BYTES: usize = 8 << 20;

/// Lines kept per cached code object (instruction offset → line): a thread dump asks for
/// one or two a code object; past it the oldest is forgotten and read again if asked.
const LINES_KEPT: usize = 16;

/// Bytes one dump (a thread dump, or the naming of one sampled profile) may read to name
/// code objects: a deep legitimate dump (65,536 frames of cached code objects) reads about
/// 14 MB of headers; past it the rest of its frames are left unnamed, counted.
pub const DUMP_READ_BYTES: usize = 64 << 20;

/// What a code object says of itself.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CodeInfo {
    /// `co_qualname`: `Class.method`, `outer.<locals>.inner`, `<module>`.
    pub qualname: String,
    /// `co_filename`, as the interpreter was given it.
    pub filename: String,
    pub first_line: i32,
    /// The location table's `bytes` object: its data's address and size (at most
    /// [`read::MAX_LINETABLE_BYTES`]). Read, in part, when a line is asked for; never held.
    linetable: (u64, u64),
}

/// The fields that tell one code object from another at the same address.
type Identity = [u64; 4];

/// The process a cache entry belongs to: its pid and start time.
pub type ProcessKey = (Pid, u64);

/// A cached code object.
struct Entry {
    identity: Identity,
    info: Arc<CodeInfo>,
    /// Lines asked for so far: (instruction offset, line), at most [`LINES_KEPT`].
    lines: Vec<(u32, u32)>,
    /// Bytes charged for it (see [`entry_cost`]).
    cost: usize,
    /// Its place in the use order: larger is more recent.
    used: u64,
}

/// Code objects read so far, by (process, address), within a byte budget.
///
/// Lines are kept per code object and instruction offset, not as whole tables. The other
/// way, tables cached by (process, table address, size) and shared, holds one copy of a
/// table that 65,536 code objects share, but still up to 256 KiB for each distinct one, and
/// a freed table's address reused by another of the same size would give wrong lines. A
/// line costs 8 bytes and is read from the live code object's own table, so this is both
/// smaller and never stale past the code object's identity check.
pub struct CodeCache {
    entries: HashMap<(ProcessKey, u64), Entry>,
    /// Least recently used first: `used` → (process, address).
    by_use: BTreeMap<u64, (ProcessKey, u64)>,
    /// The same, per process: (process, `used`) → address.
    by_process: BTreeMap<(ProcessKey, u64), u64>,
    /// Bytes charged per process, and in all.
    held: HashMap<ProcessKey, usize>,
    total: usize,
    clock: u64,
    budget: usize,
    process_budget: usize,
}

impl Default for CodeCache {
    fn default() -> Self {
        CodeCache::with_budget(CACHE_BYTES, PROCESS_CACHE_BYTES)
    }
}

/// What a look-up cost.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CodeStats {
    /// Found in the cache, identity unchanged.
    pub cached: u64,
    /// Read from the process.
    pub read: u64,
    /// Cached under the same address, but another object now: read again.
    pub replaced: u64,
    /// Entries dropped to keep the cache within its byte budgets.
    pub evicted: u64,
    /// Code objects named but not cached: alone larger than a process's budget.
    pub refused: u64,
}

impl CodeStats {
    /// Its part of the profile's comment.
    pub fn describe(&self) -> String {
        format!(
            "code objects read {}, cached {}, replaced at a reused address {}, evicted to keep the cache within \
             {} MiB ({} MiB a process) {}, too large to cache {}",
            self.read,
            self.cached,
            self.replaced,
            CACHE_BYTES >> 20,
            PROCESS_CACHE_BYTES >> 20,
            self.evicted,
            self.refused,
        )
    }
}

impl CodeCache {
    /// A cache that holds at most `budget` bytes, `process_budget` of them for one process.
    pub fn with_budget(budget: usize, process_budget: usize) -> CodeCache {
        CodeCache {
            entries: HashMap::new(),
            by_use: BTreeMap::new(),
            by_process: BTreeMap::new(),
            held: HashMap::new(),
            total: 0,
            clock: 0,
            budget,
            process_budget,
        }
    }

    /// The code object at `addr` of `process`, and the line of its instruction
    /// `instr_offset` (the first line when its table has none).
    pub fn name(
        &mut self,
        remote: &Remote,
        interp: &Interpreter,
        process: ProcessKey,
        (addr, instr_offset): (u64, u32),
        reads: &mut ReadBudget,
        stats: &mut CodeStats,
    ) -> Result<(Arc<CodeInfo>, u32), ReadFailure> {
        let header = reads.bytes(remote, addr, CODE_READ_BYTES)?;
        let identity = identity(&header, interp);
        if let Some(expected) = interp.code_type {
            if identity[0] != expected {
                return Err(ReadFailure::Layout(format!("{addr:#x} is not a code object")));
            }
        }
        let key = (process, addr);
        match self.entries.get(&key) {
            Some(known) if known.identity == identity => {
                stats.cached += 1;
                self.touch(key);
                return self.cached_line(remote, key, instr_offset, reads);
            }
            Some(_) => {
                stats.replaced += 1;
                self.remove(key);
            }
            None => {}
        }
        let info = Arc::new(read_code(remote, interp, &header, identity, reads)?);
        stats.read += 1;
        let line = line_of(remote, &info, instr_offset, reads)?;
        self.insert(key, identity, info.clone(), (instr_offset, line), stats);
        Ok((info, line))
    }

    /// Forgets the code objects of processes not in `live`.
    pub fn retain(&mut self, mut live: impl FnMut(ProcessKey) -> bool) {
        let dead: Vec<ProcessKey> = self.held.keys().copied().filter(|&p| !live(p)).collect();
        for process in dead {
            let addrs: Vec<u64> = self.by_process.range((process, 0)..=(process, u64::MAX)).map(|(_, &a)| a).collect();
            for addr in addrs {
                self.remove((process, addr));
            }
        }
    }

    /// Bytes charged for what the cache holds now.
    #[cfg(test)]
    fn held_bytes(&self) -> usize {
        self.total
    }

    /// The line of a cached entry's instruction, kept or read (and then kept).
    fn cached_line(
        &mut self,
        remote: &Remote,
        key: (ProcessKey, u64),
        instr_offset: u32,
        reads: &mut ReadBudget,
    ) -> Result<(Arc<CodeInfo>, u32), ReadFailure> {
        let entry = self.entries.get_mut(&key).expect("a cached entry");
        if let Some(&(_, line)) = entry.lines.iter().find(|(offset, _)| *offset == instr_offset) {
            return Ok((entry.info.clone(), line));
        }
        let line = line_of(remote, &entry.info, instr_offset, reads)?;
        if entry.lines.len() == LINES_KEPT {
            entry.lines.remove(0);
        }
        entry.lines.push((instr_offset, line));
        Ok((entry.info.clone(), line))
    }

    /// Caches `info`, after making room; not at all when it alone is over a budget.
    fn insert(
        &mut self,
        key: (ProcessKey, u64),
        identity: Identity,
        info: Arc<CodeInfo>,
        line: (u32, u32),
        stats: &mut CodeStats,
    ) {
        let cost = entry_cost(&info);
        if cost > self.process_budget.min(self.budget) {
            stats.refused += 1;
            return;
        }
        self.make_room(key.0, cost, stats);
        let mut lines = Vec::with_capacity(LINES_KEPT);
        lines.push(line);
        self.clock += 1;
        let used = self.clock;
        self.by_use.insert(used, key);
        self.by_process.insert((key.0, used), key.1);
        *self.held.entry(key.0).or_default() += cost;
        self.total += cost;
        self.entries.insert(key, Entry { identity, info, lines, cost, used });
    }

    /// Evicts least recently used entries until `cost` more bytes for `process` fit both
    /// budgets: the process's own entries first, then anyone's.
    fn make_room(&mut self, process: ProcessKey, cost: usize, stats: &mut CodeStats) {
        while self.held.get(&process).copied().unwrap_or(0) + cost > self.process_budget {
            let Some((&(_, _), &addr)) = self.by_process.range((process, 0)..=(process, u64::MAX)).next() else {
                break;
            };
            self.remove((process, addr));
            stats.evicted += 1;
        }
        while self.total + cost > self.budget {
            let Some((_, &oldest)) = self.by_use.iter().next() else { break };
            self.remove(oldest);
            stats.evicted += 1;
        }
    }

    /// Marks `key` as used now.
    fn touch(&mut self, key: (ProcessKey, u64)) {
        self.clock += 1;
        let now = self.clock;
        let Some(entry) = self.entries.get_mut(&key) else { return };
        let before = std::mem::replace(&mut entry.used, now);
        self.by_use.remove(&before);
        self.by_process.remove(&(key.0, before));
        self.by_use.insert(now, key);
        self.by_process.insert((key.0, now), key.1);
    }

    fn remove(&mut self, key: (ProcessKey, u64)) {
        let Some(entry) = self.entries.remove(&key) else { return };
        self.by_use.remove(&entry.used);
        self.by_process.remove(&(key.0, entry.used));
        self.total -= entry.cost;
        if let Some(held) = self.held.get_mut(&key.0) {
            *held -= entry.cost;
            if *held == 0 {
                self.held.remove(&key.0);
            }
        }
    }
}

/// Bytes an entry holds: its strings and kept lines, the shared [`CodeInfo`] (with its
/// reference counts), and its places in the map and the two orders, each counted three
/// times over for the spare room a hash map (up to 2.3 times) and a B-tree's half-full
/// nodes (up to 2.2 times) keep.
fn entry_cost(info: &CodeInfo) -> usize {
    let key = size_of::<(ProcessKey, u64)>();
    let places = 3 * ((key + size_of::<Entry>() + 1) + (size_of::<u64>() + key) + (key + size_of::<u64>()));
    let shared = 2 * size_of::<usize>() + size_of::<CodeInfo>();
    places + shared + info.qualname.capacity() + info.filename.capacity() + LINES_KEPT * size_of::<(u32, u32)>()
}
