use super::{
    read::{read_str, MAX_LINETABLE_BYTES, MAX_STRING_CHARS},
    *,
};
use crate::runtimes::cpython::{
    linetable,
    offsets::{OBJECT_TYPE, V3_12},
};

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
    let (name, file, table) = (str_object(1, true, 1, b"f"), str_object(1, true, 4, b"a.py"), bytes_object(&entries));
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
    let (name, file, table) = (str_object(1, true, 1, b"f"), str_object(1, true, 4, b"a.py"), bytes_object(&[0x80]));
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
        let (info, line) = cache.name(&me, &interp, process, (addr(&code), 0), &mut unlimited(), &mut stats).unwrap();
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
