use super::{files::open_file_info, *};
use crate::elf::{self, LoadSegment};

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
