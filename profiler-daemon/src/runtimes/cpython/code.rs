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
//! dump's [`ReadBudget`], so that a process cannot make one dump read gigabytes either.

use std::{
    collections::{BTreeMap, HashMap},
    mem::size_of,
    sync::Arc,
};

use super::{
    detect::Interpreter,
    linetable,
    memory::{field_u32, field_u64, Remote},
    offsets::{CODE_READ_BYTES, OBJECT_TYPE},
    ReadFailure,
};
use crate::ids::Pid;

/// Characters of a name or path kept at most.
const MAX_STRING_CHARS: u64 = 4096;

/// Bytes of a location table read at most.
const MAX_LINETABLE_BYTES: u64 = 256 * 1024;

/// Bytes of one location-table entry at most: its first byte and at most four varints (the
/// long form), each of at most 11 bytes ([`linetable::line_at`] gives up on a longer one).
const MAX_ENTRY_BYTES: u64 = 1 + 4 * 11;

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
    /// [`MAX_LINETABLE_BYTES`]). Read, in part, when a line is asked for; never held.
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

/// Bytes a dump may still read to name code objects. Checked before each read; a read it
/// cannot pay for spends it all, so the rest of the dump is left unnamed, not a lucky part.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReadBudget {
    left: usize,
}

impl ReadBudget {
    pub fn new(bytes: usize) -> ReadBudget {
        ReadBudget { left: bytes }
    }

    /// Whether reads are refused from now on.
    pub fn spent(&self) -> bool {
        self.left == 0
    }

    fn take(&mut self, len: usize) -> Result<(), ReadFailure> {
        if len > self.left {
            self.left = 0;
            return Err(ReadFailure::OverBudget);
        }
        self.left -= len;
        Ok(())
    }

    fn bytes(&mut self, remote: &Remote, addr: u64, len: usize) -> Result<Vec<u8>, ReadFailure> {
        self.take(len)?;
        Ok(remote.bytes(addr, len)?)
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

fn identity(header: &[u8], interp: &Interpreter) -> Identity {
    let o = &interp.offsets;
    [
        field_u64(header, OBJECT_TYPE),
        field_u64(header, o.code_qualname),
        field_u64(header, o.code_filename),
        field_u64(header, o.code_linetable),
    ]
}

/// Reads what a code object says of itself, its header read already.
fn read_code(
    remote: &Remote,
    interp: &Interpreter,
    header: &[u8],
    identity: Identity,
    reads: &mut ReadBudget,
) -> Result<CodeInfo, ReadFailure> {
    let o = &interp.offsets;
    let linetable = match identity[3] {
        0 => (0, 0),
        table => {
            reads.take(8)?;
            let size = remote.u64(table + o.bytes_size)?.min(MAX_LINETABLE_BYTES);
            (table + o.bytes_data, size)
        }
    };
    Ok(CodeInfo {
        qualname: read_str(remote, interp, identity[1], reads)?,
        filename: read_str(remote, interp, identity[2], reads)?,
        first_line: field_u32(header, o.code_firstlineno) as i32,
        linetable,
    })
}

/// The line of instruction `instr_offset` of `info`, the first line when its table has
/// none. Reads only the table's start that can hold it: instruction `n` is in one of the
/// first `n + 1` entries (each covers at least one code unit).
fn line_of(remote: &Remote, info: &CodeInfo, instr_offset: u32, reads: &mut ReadBudget) -> Result<u32, ReadFailure> {
    let (addr, size) = info.linetable;
    let len = (u64::from(instr_offset) + 1).saturating_mul(MAX_ENTRY_BYTES).min(size);
    let table = if len == 0 { Vec::new() } else { reads.bytes(remote, addr, len as usize)? };
    Ok(linetable::line_at(&table, info.first_line, instr_offset).unwrap_or_else(|| info.first_line.max(0) as u32))
}

/// A `str` object: compact ASCII and compact non-ASCII (1-, 2- and 4-byte kinds) are read;
/// invalid code points become U+FFFD; longer than [`MAX_STRING_CHARS`] is cut.
fn read_str(remote: &Remote, interp: &Interpreter, addr: u64, reads: &mut ReadBudget) -> Result<String, ReadFailure> {
    let o = &interp.offsets;
    if addr == 0 {
        return Ok(String::new());
    }
    let header = reads.bytes(remote, addr, o.unicode_compact_size as usize)?;
    let length = field_u64(&header, o.unicode_length).min(MAX_STRING_CHARS);
    let state = field_u32(&header, o.unicode_state);
    let (kind, compact, ascii) = ((state >> 2) & 7, (state >> 5) & 1 == 1, (state >> 6) & 1 == 1);
    if !compact {
        return Err(ReadFailure::Layout(format!("str at {addr:#x} is not compact")));
    }
    let data = addr + if ascii { o.unicode_ascii_size } else { o.unicode_compact_size };
    let bytes = reads.bytes(remote, data, (length * u64::from(kind.max(1))) as usize)?;
    let mut chars: String = match kind {
        1 => bytes.iter().map(|&b| char::from(b)).collect(),
        2 => bytes.chunks_exact(2).map(|c| code_point(u16::from_le_bytes([c[0], c[1]]).into())).collect(),
        4 => bytes.chunks_exact(4).map(|c| code_point(u32::from_le_bytes([c[0], c[1], c[2], c[3]]))).collect(),
        _ => return Err(ReadFailure::Layout(format!("str at {addr:#x} has kind {kind}"))),
    };
    chars.shrink_to_fit(); // what the cache charges for is what it holds
    Ok(chars)
}

fn code_point(c: u32) -> char {
    char::from_u32(c).unwrap_or(char::REPLACEMENT_CHARACTER)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtimes::cpython::offsets::V3_12;

    /// A 3.12 `str` object in our own memory: header, then the characters.
    fn str_object(kind: u32, ascii: bool, length: u64, data: &[u8]) -> Vec<u8> {
        let o = &V3_12;
        let header = if ascii { o.unicode_ascii_size } else { o.unicode_compact_size } as usize;
        let mut buf = vec![0u8; header + data.len()];
        buf[o.unicode_length as usize..][..8].copy_from_slice(&length.to_le_bytes());
        let state = (kind << 2) | (1 << 5) | (u32::from(ascii) << 6);
        buf[o.unicode_state as usize..][..4].copy_from_slice(&state.to_le_bytes());
        buf[header..].copy_from_slice(data);
        buf
    }

    fn bytes_object(data: &[u8]) -> Vec<u8> {
        let mut buf = vec![0u8; V3_12.bytes_data as usize + data.len()];
        buf[V3_12.bytes_size as usize..][..8].copy_from_slice(&(data.len() as u64).to_le_bytes());
        buf[V3_12.bytes_data as usize..].copy_from_slice(data);
        buf
    }

    fn interp(code_type: u64) -> Interpreter {
        Interpreter {
            version: (3, 12),
            path: "libpython3.12.so".into(),
            runtime: 0,
            code_type: Some(code_type),
            offsets: V3_12,
        }
    }

    fn addr(buf: &[u8]) -> u64 {
        buf.as_ptr() as u64
    }

    /// A 3.12 code object in our own memory: type, name, file, table, first line.
    fn code_object(code_type: u64, name: &[u8], file: &[u8], table: &[u8], first_line: u32) -> Vec<u8> {
        let mut code = vec![0u8; CODE_READ_BYTES];
        put(&mut code, OBJECT_TYPE, code_type);
        put(&mut code, V3_12.code_qualname, addr(name));
        put(&mut code, V3_12.code_filename, addr(file));
        put(&mut code, V3_12.code_linetable, addr(table));
        code[V3_12.code_firstlineno as usize..][..4].copy_from_slice(&first_line.to_le_bytes());
        code
    }

    fn put(code: &mut [u8], offset: u64, value: u64) {
        code[offset as usize..][..8].copy_from_slice(&value.to_le_bytes());
    }

    fn unlimited() -> ReadBudget {
        ReadBudget::new(usize::MAX)
    }

    /// Counts the bytes each thread has live (allocated by it minus freed by it), so that a
    /// test measures what the cache really holds, not what it says it holds. It is the test
    /// binary's allocator, for every test; the count is one thread-local add.
    struct PerThread;

    thread_local! {
        static LIVE: std::cell::Cell<isize> = const { std::cell::Cell::new(0) };
    }

    fn count(delta: isize) {
        // `try_with`: no panic in a thread being torn down; a const `Cell` never allocates.
        let _ = LIVE.try_with(|live| live.set(live.get() + delta));
    }

    fn live_bytes() -> isize {
        LIVE.with(std::cell::Cell::get)
    }

    // SAFETY: every call is passed to `System` with the caller's arguments, whose contract
    // is the same as ours; only sizes are counted, and counting does not allocate.
    unsafe impl std::alloc::GlobalAlloc for PerThread {
        unsafe fn alloc(&self, layout: std::alloc::Layout) -> *mut u8 {
            // SAFETY: as the trait's contract, passed on.
            counted(unsafe { std::alloc::System.alloc(layout) }, layout.size() as isize)
        }

        unsafe fn alloc_zeroed(&self, layout: std::alloc::Layout) -> *mut u8 {
            // SAFETY: as the trait's contract, passed on.
            counted(unsafe { std::alloc::System.alloc_zeroed(layout) }, layout.size() as isize)
        }

        unsafe fn dealloc(&self, ptr: *mut u8, layout: std::alloc::Layout) {
            // SAFETY: as the trait's contract, passed on.
            unsafe { std::alloc::System.dealloc(ptr, layout) };
            count(-(layout.size() as isize));
        }

        unsafe fn realloc(&self, ptr: *mut u8, layout: std::alloc::Layout, new_size: usize) -> *mut u8 {
            // SAFETY: as the trait's contract, passed on.
            let p = unsafe { std::alloc::System.realloc(ptr, layout, new_size) };
            counted(p, new_size as isize - layout.size() as isize)
        }
    }

    fn counted(p: *mut u8, delta: isize) -> *mut u8 {
        if !p.is_null() {
            count(delta);
        }
        p
    }

    #[global_allocator]
    static ALLOCATOR: PerThread = PerThread;

    #[test]
    fn code_objects_sharing_one_huge_line_table_stay_within_the_byte_budget() {
        // The review's attack (N3): 65,536 distinct code objects, one 256 KiB table.
        let me = Remote { pid: Pid(std::process::id()) };
        let code_type = 0x5555_0000_u64;
        let entries = [0x80 | (13 << 3), 2 << 1].repeat(MAX_LINETABLE_BYTES as usize / 2); // each unit: line + 1
        let (name, file, table) =
            (str_object(1, true, 1, b"f"), str_object(1, true, 4, b"a.py"), bytes_object(&entries));
        let codes: Vec<Vec<u8>> = (0..65_536).map(|_| code_object(code_type, &name, &file, &table, 10)).collect();
        let (interp, process) = (interp(code_type), (me.pid, 1));
        let (mut stats, mut reads) = (CodeStats::default(), unlimited());
        let before = live_bytes();
        let mut cache = CodeCache::default();
        for (i, code) in codes.iter().enumerate() {
            let offset = (i % 97) as u32;
            let (info, line) = cache.name(&me, &interp, process, (addr(code), offset), &mut reads, &mut stats).unwrap();
            assert_eq!(info.qualname, "f");
            assert_eq!(Some(line), linetable::line_at(&entries, 10, offset), "code object {i}, offset {offset}");
        }
        let held = live_bytes() - before;
        assert!(
            held <= PROCESS_CACHE_BYTES as isize,
            "the cache holds {held} bytes, more than a process's {PROCESS_CACHE_BYTES}"
        );
        assert!(held <= cache.held_bytes() as isize, "held {held}, counted only {}", cache.held_bytes());
        assert_eq!((stats.read, stats.refused), (65_536, 0));
        assert!(stats.evicted > 0, "{stats:?}");
        drop(cache);
    }

    #[test]
    fn lines_are_right_after_their_code_object_was_evicted() {
        use linetable::tests::{LINES, TABLE};
        let me = Remote { pid: Pid(std::process::id()) };
        let code_type = 0x5555_0000_u64;
        let (name, file) = (str_object(1, true, 1, b"f"), str_object(1, true, 4, b"a.py"));
        let real = bytes_object(TABLE);
        // Long-form entries of the largest size `line_at` reads: 4 varints of 11 bytes, the
        // first +1 line; so the line of unit `n` is in bytes `45 n .. 45 (n + 1)`.
        let widest: Vec<u8> = (0..64)
            .flat_map(|_| {
                let mut entry = vec![0x80 | (14 << 3)];
                for first in [2, 0, 0, 0] {
                    entry.push(0x40 | first);
                    entry.extend([0x40; 9]);
                    entry.push(0);
                }
                entry
            })
            .collect();
        let wide = bytes_object(&widest);
        let (f, g) = (code_object(code_type, &name, &file, &real, 1), code_object(code_type, &name, &file, &wide, 100));
        let fillers: Vec<Vec<u8>> = (0..1000).map(|_| code_object(code_type, &name, &file, &real, 1)).collect();
        let (interp, process) = (interp(code_type), (me.pid, 1));
        let (mut cache, mut stats, mut reads) =
            (CodeCache::with_budget(64 << 10, 64 << 10), CodeStats::default(), unlimited());
        let mut line = |cache: &mut CodeCache, code: &[u8], offset: usize, stats: &mut CodeStats| {
            cache.name(&me, &interp, process, (addr(code), offset as u32), &mut reads, stats).unwrap().1
        };
        for round in 0..3 {
            for (unit, expected) in LINES.iter().enumerate() {
                assert_eq!(line(&mut cache, &f, unit, &mut stats), expected.unwrap_or(1), "round {round}, unit {unit}");
            }
            for unit in (0..64).rev() {
                let expected = linetable::line_at(&widest, 100, unit as u32).unwrap();
                assert_eq!(expected, 100 + unit as u32 + 1, "the table says what this test means");
                assert_eq!(line(&mut cache, &g, unit, &mut stats), expected, "round {round}, unit {unit}");
            }
            let read = stats.read;
            for filler in &fillers {
                line(&mut cache, filler, 0, &mut stats);
            }
            assert!(cache.held_bytes() <= 64 << 10);
            assert_eq!(stats.read, read + 1000, "every filler is read: they do not fit");
        }
        // Evicted and read again each round: what is checked above is lines read afresh.
        assert!(stats.evicted >= 2 * 1000, "{stats:?}");
        assert_eq!(stats.read, 3 * (2 + 1000), "{stats:?}");
    }

    #[test]
    fn once_a_dump_has_read_its_budget_the_rest_is_left_unnamed() {
        let me = Remote { pid: Pid(std::process::id()) };
        let code_type = 0x5555_0000_u64;
        let (name, file, table) =
            (str_object(1, true, 1, b"f"), str_object(1, true, 4, b"a.py"), bytes_object(&[0x80]));
        let codes: Vec<Vec<u8>> = (0..100).map(|_| code_object(code_type, &name, &file, &table, 10)).collect();
        let (interp, process) = (interp(code_type), (me.pid, 1));
        let (mut cache, mut stats) = (CodeCache::default(), CodeStats::default());
        let budget = 20 * CODE_READ_BYTES;
        let mut reads = ReadBudget::new(budget);
        let results: Vec<bool> = codes
            .iter()
            .map(|code| cache.name(&me, &interp, process, (addr(code), 0), &mut reads, &mut stats).is_ok())
            .collect();
        let named = results.iter().take_while(|ok| **ok).count();
        assert!((1..20).contains(&named), "{named} named in a budget of 20 headers");
        assert!(results[named..].iter().all(|ok| !ok), "none named once the budget is spent");
        assert!(reads.spent());
        let again = cache.name(&me, &interp, process, (addr(&codes[0]), 0), &mut reads, &mut stats);
        assert_eq!(again.unwrap_err(), ReadFailure::OverBudget, "not even a cached one: its header is a read");
        // A new dump, a new budget: named again.
        assert!(cache.name(&me, &interp, process, (addr(&codes[0]), 0), &mut unlimited(), &mut stats).is_ok());
    }

    #[test]
    fn a_code_object_larger_than_a_process_budget_is_named_not_cached() {
        let me = Remote { pid: Pid(std::process::id()) };
        let code_type = 0x5555_0000_u64;
        let long = vec![b'x'; MAX_STRING_CHARS as usize];
        let (name, file, table) =
            (str_object(1, true, long.len() as u64, &long), str_object(1, true, 4, b"a.py"), bytes_object(&[]));
        let code = code_object(code_type, &name, &file, &table, 10);
        let (interp, process) = (interp(code_type), (me.pid, 1));
        let (mut cache, mut stats) = (CodeCache::with_budget(1 << 20, 4096), CodeStats::default());
        for _ in 0..2 {
            let (info, line) =
                cache.name(&me, &interp, process, (addr(&code), 0), &mut unlimited(), &mut stats).unwrap();
            assert_eq!((info.qualname.len(), line), (long.len(), 10));
        }
        assert_eq!(stats, CodeStats { read: 2, refused: 2, ..CodeStats::default() });
        assert_eq!(cache.held_bytes(), 0);
    }

    #[test]
    fn strings_of_every_compact_kind() {
        let me = Remote { pid: Pid(std::process::id()) };
        let interp = interp(0);
        let read_str = |addr| read_str(&me, &interp, addr, &mut unlimited());
        let ascii = str_object(1, true, 5, b"hello");
        assert_eq!(read_str(addr(&ascii)).unwrap(), "hello");
        let latin1 = str_object(1, false, 3, &[b'c', 0xe9, b'!']);
        assert_eq!(read_str(addr(&latin1)).unwrap(), "cé!");
        let ucs2 = str_object(2, false, 2, &[0x3b, 0x04, 0xd8, 0x00]); // U+043B, U+00D8
        assert_eq!(read_str(addr(&ucs2)).unwrap(), "лØ");
        let ucs4 = str_object(4, false, 2, &[0x00, 0xf6, 0x01, 0x00, 0x00, 0xd8, 0x00, 0x00]);
        assert_eq!(read_str(addr(&ucs4)).unwrap(), "😀\u{fffd}", "a lone surrogate is replaced");
        let mut legacy = str_object(1, true, 1, b"x");
        legacy[V3_12.unicode_state as usize] &= !(1 << 5);
        assert!(read_str(addr(&legacy)).is_err(), "not compact: refused, not misread");
    }

    #[test]
    fn a_code_object_is_read_once_and_read_again_when_its_address_holds_another() {
        let me = Remote { pid: Pid(std::process::id()) };
        let code_type = 0x5555_0000_u64;
        let (name, other, file) =
            (str_object(1, true, 1, b"f"), str_object(1, true, 1, b"g"), str_object(1, true, 4, b"a.py"));
        let table = bytes_object(&[0x80 | (13 << 3), 2 << 1]); // one unit, line + 2
        let mut code = code_object(code_type, &name, &file, &table, 10);
        let (interp, process) = (interp(code_type), (me.pid, 1));
        let (mut cache, mut stats) = (CodeCache::default(), CodeStats::default());
        let name = |cache: &mut CodeCache, code: &[u8], stats: &mut CodeStats| {
            cache.name(&me, &interp, process, (addr(code), 0), &mut unlimited(), stats)
        };
        let (info, line) = name(&mut cache, &code, &mut stats).unwrap();
        assert_eq!((info.qualname.as_str(), info.filename.as_str(), line), ("f", "a.py", 12));
        name(&mut cache, &code, &mut stats).unwrap();
        assert_eq!(stats, CodeStats { cached: 1, read: 1, ..CodeStats::default() });
        // Freed, and another code object at the same address.
        put(&mut code, V3_12.code_qualname, addr(&other));
        let (info, _) = name(&mut cache, &code, &mut stats).unwrap();
        assert_eq!(info.qualname, "g");
        assert_eq!(stats, CodeStats { cached: 1, read: 2, replaced: 1, ..CodeStats::default() });
        // Not a code object any more.
        put(&mut code, OBJECT_TYPE, 0x1234);
        assert!(name(&mut cache, &code, &mut stats).is_err());
    }
}
