//! The dump directory as the exporters' spool. The profile files themselves are the queue:
//! nothing is copied or held in memory. Beside them, in `DIR/.spool/` (hidden, so retention
//! never lists it), each dump that an export will send leaves a *manifest*: its sequence
//! number, its window, and per file the path and what the labels need (pid, name, exe,
//! unit, container), captured while the process was known, since a pid means nothing after
//! the process is gone. Each export keeps a *cursor*, `<export>.cursor`: the first file (manifest
//! and index) it has not had acknowledged. Sending in manifest order and moving the cursor
//! only past acknowledged files gives at-least-once delivery, in order, across restarts.
//!
//! Retention stays the only thing that deletes profiles: a file it deleted before an export sent
//! it is counted as dropped by that export, and everything it keeps is still sent. Manifests
//! every export has passed are deleted ([`remove_before`]).
//!
//! Owns: the manifest and cursor formats and their files. Does not own: when to write them
//! (the dump, [`super::IntervalFiles`]; the exports, `super::export`).

use std::{
    collections::{BTreeMap, BTreeSet},
    fs, io,
    path::{Path, PathBuf},
};

use serde::{Deserialize, Serialize};

/// The spool's directory under the output directory.
pub const SPOOL_DIR: &str = ".spool";
const MANIFEST_SUFFIX: &str = ".json";
const CURSOR_SUFFIX: &str = ".cursor";

/// One dump's files, in the order they are to be sent.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    pub seq: u64,
    /// When the dump's interval ended, in nanoseconds since the epoch.
    pub end_unix_ns: u64,
    pub files: Vec<Entry>,
}

/// One profile file and the facts its labels are made of.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    /// Relative to the output directory: `<name>-<pid>/<kind>-<stamp>.pb.gz`.
    pub path: String,
    /// The profile type's config name (`cpu`, `heap`, …).
    pub kind: String,
    pub pid: u32,
    /// The process name (`comm`).
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exe: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unit: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container: Option<String>,
}

/// Where an export stands: the next file to send is `files[index]` of manifest `seq` (an index
/// past the end means the manifest is done).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Cursor {
    pub seq: u64,
    pub index: usize,
}

/// `DIR/.spool`.
pub fn spool_dir(output_dir: &Path) -> PathBuf {
    output_dir.join(SPOOL_DIR)
}

fn manifest_path(output_dir: &Path, seq: u64) -> PathBuf {
    // Zero-padded, so names sort as numbers do.
    spool_dir(output_dir).join(format!("{seq:020}{MANIFEST_SUFFIX}"))
}

fn cursor_path(output_dir: &Path, export: &str) -> PathBuf {
    spool_dir(output_dir).join(format!("{export}{CURSOR_SUFFIX}"))
}

/// The sequence numbers of the manifests in the spool (names only; nothing is read).
pub fn seqs(output_dir: &Path) -> io::Result<BTreeSet<u64>> {
    let entries = match fs::read_dir(spool_dir(output_dir)) {
        Ok(entries) => entries,
        Err(err) if err.kind() == io::ErrorKind::NotFound => return Ok(BTreeSet::new()),
        Err(err) => return Err(err),
    };
    let mut seqs = BTreeSet::new();
    for entry in entries {
        let name = entry?.file_name();
        if let Some(seq) = name.to_str().and_then(|n| n.strip_suffix(MANIFEST_SUFFIX)).and_then(|n| n.parse().ok()) {
            seqs.insert(seq);
        }
    }
    Ok(seqs)
}

/// The first manifest numbered `seq` or later.
pub fn first_from(output_dir: &Path, seq: u64) -> Option<u64> {
    seqs(output_dir).ok()?.range(seq..).next().copied()
}

/// The manifests in the spool, by sequence number, with their file counts. A manifest that
/// cannot be read counts as empty (it is skipped, and removed with the others).
pub fn list(output_dir: &Path) -> io::Result<BTreeMap<u64, usize>> {
    let seqs = seqs(output_dir)?;
    Ok(seqs.into_iter().map(|seq| (seq, read(output_dir, seq).map_or(0, |m| m.files.len()))).collect())
}

/// Writes a manifest atomically and durably (it is the record that its files are to be sent).
pub fn write(output_dir: &Path, manifest: &Manifest) -> crate::error::Result<()> {
    let path = manifest_path(output_dir, manifest.seq);
    let json = serde_json::to_vec(manifest).expect("a manifest serializes");
    crate::output::write_atomic(output_dir, &path, &json)
}

/// Reads manifest `seq`.
pub fn read(output_dir: &Path, seq: u64) -> io::Result<Manifest> {
    let path = manifest_path(output_dir, seq);
    let bytes = fs::read(&path)?;
    serde_json::from_slice(&bytes)
        .map_err(|err| io::Error::new(io::ErrorKind::InvalidData, format!("{}: {err}", path.display())))
}

/// The cursor of `export`, if it has one.
pub fn read_cursor(output_dir: &Path, export: &str) -> io::Result<Option<Cursor>> {
    match fs::read(cursor_path(output_dir, export)) {
        Ok(bytes) => {
            serde_json::from_slice(&bytes).map(Some).map_err(|err| io::Error::new(io::ErrorKind::InvalidData, err))
        }
        Err(err) if err.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(err) => Err(err),
    }
}

/// Records that `export` has everything before `cursor` acknowledged.
pub fn write_cursor(output_dir: &Path, export: &str, cursor: Cursor) -> crate::error::Result<()> {
    let json = serde_json::to_vec(&cursor).expect("a cursor serializes");
    crate::output::write_atomic(output_dir, &cursor_path(output_dir, export), &json)
}

/// Deletes the manifests numbered below `seq`; returns how many went.
pub fn remove_before(output_dir: &Path, seq: u64) -> usize {
    let Ok(seqs) = seqs(output_dir) else { return 0 };
    seqs.range(..seq).filter(|&&old| fs::remove_file(manifest_path(output_dir, old)).is_ok()).count()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(test: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("profiler-spool-{test}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn manifest(seq: u64, files: usize) -> Manifest {
        let entry =
            |i: usize| Entry { path: format!("app-1/cpu-{i}.pb.gz"), kind: "cpu".into(), pid: 1, ..Entry::default() };
        Manifest { seq, end_unix_ns: 2, files: (0..files).map(entry).collect() }
    }

    #[test]
    fn manifests_round_trip_in_numeric_order() {
        let dir = scratch("order");
        for seq in [10, 9, 100] {
            write(&dir, &manifest(seq, seq as usize % 7)).unwrap();
        }
        // The spool is written as the profiles are: nothing for others, whatever the umask.
        use std::os::unix::fs::MetadataExt;
        for path in [spool_dir(&dir), manifest_path(&dir, 9)] {
            let mode = fs::symlink_metadata(&path).unwrap().mode();
            assert_eq!(mode & 0o027, 0, "{} has mode {mode:o}", path.display());
        }
        fs::write(spool_dir(&dir).join("notes.txt"), "x").unwrap();
        let listed: Vec<(u64, usize)> = list(&dir).unwrap().into_iter().collect();
        assert_eq!(listed, [(9, 2), (10, 3), (100, 2)]);
        assert_eq!(read(&dir, 10).unwrap(), manifest(10, 3));
        assert_eq!((first_from(&dir, 10), first_from(&dir, 11), first_from(&dir, 101)), (Some(10), Some(100), None));
        assert_eq!(remove_before(&dir, 10), 1);
        assert_eq!(list(&dir).unwrap().keys().copied().collect::<Vec<_>>(), [10, 100]);
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_missing_spool_is_empty_and_cursors_persist() {
        let dir = scratch("cursor");
        assert!(list(&dir).unwrap().is_empty());
        assert_eq!(read_cursor(&dir, "pyroscope").unwrap(), None);
        write_cursor(&dir, "pyroscope", Cursor { seq: 4, index: 2 }).unwrap();
        assert_eq!(read_cursor(&dir, "pyroscope").unwrap(), Some(Cursor { seq: 4, index: 2 }));
        assert!(list(&dir).unwrap().is_empty(), "a cursor is not a manifest");
        fs::write(cursor_path(&dir, "otlp"), "garbage").unwrap();
        assert!(read_cursor(&dir, "otlp").is_err());
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn an_unreadable_manifest_counts_as_empty() {
        let dir = scratch("corrupt");
        write(&dir, &manifest(1, 2)).unwrap();
        fs::write(manifest_path(&dir, 2), "{").unwrap();
        assert_eq!(list(&dir).unwrap().into_iter().collect::<Vec<_>>(), [(1, 2), (2, 0)]);
        assert!(read(&dir, 2).unwrap_err().to_string().contains("00000000000000000002.json"));
        fs::remove_dir_all(&dir).unwrap();
    }
}
