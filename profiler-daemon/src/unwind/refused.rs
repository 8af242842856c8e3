//! Files whose unwind table was refused for what building it would cost
//! ([`super::BuildError::is_over_budget`]), remembered across restarts: a file built to
//! exhaust the daemon is read once, not again after every restart (or crash) while it stays
//! mapped. Kept in memory and in one small file beside the profiles (a dot-file, which
//! retention leaves alone), keyed like the tables: by GNU build id, else by device, inode,
//! size and mtime, so a file rebuilt or upgraded is tried afresh. At most [`MAX_ENTRIES`],
//! the oldest dropped first; written whole to a temporary file renamed over the old one, so
//! a crash mid-write leaves the old record or the new one.

use std::collections::VecDeque;
use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};

use super::registry::FileKey;

/// The record's name in its directory.
pub const FILE_NAME: &str = ".unwind-refused";
/// Files remembered: far more than the hostile files one machine's users could plant before
/// an administrator notices, and at most a few hundred KiB on disk.
pub const MAX_ENTRIES: usize = 4096;
/// A reason is cut to this many characters: the record stays small whatever the error says.
const MAX_REASON_CHARS: usize = 200;
/// The most bytes read back: [`MAX_ENTRIES`] lines of a key and a reason, with room to
/// spare. A larger file was not written by this module and is ignored beyond this.
const MAX_FILE_BYTES: u64 = 4 << 20;

/// The refused files, oldest first, and where they are kept.
#[derive(Debug, Default)]
pub struct Refused {
    path: Option<PathBuf>,
    entries: VecDeque<(FileKey, String)>,
}

impl Refused {
    /// The record kept in `dir` (read now if it exists), or one in memory only without a
    /// directory. An unreadable record is logged and started afresh: it only saves work.
    pub fn load(dir: Option<&Path>) -> Self {
        let Some(dir) = dir else { return Self::default() };
        let path = dir.join(FILE_NAME);
        let mut text = String::new();
        let read = File::open(&path).and_then(|file| file.take(MAX_FILE_BYTES).read_to_string(&mut text));
        match read {
            Ok(_) => {}
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
            Err(err) => tracing::warn!(
                "ignoring the record of refused unwind tables {}: {err}; refused files will be read once more",
                path.display()
            ),
        }
        let mut refused = Self { path: Some(path), entries: VecDeque::new() };
        for line in text.lines() {
            if let Some((key, reason)) = line.split_once('\t') {
                refused.push(key.to_string(), reason.to_string());
            }
        }
        refused
    }

    /// The refused files and why, oldest first.
    pub fn entries(&self) -> impl Iterator<Item = (&FileKey, &str)> {
        self.entries.iter().map(|(key, reason)| (key, reason.as_str()))
    }

    /// Remembers `key` as refused for `reason`, in memory and (if kept in a directory) on
    /// disk. A failed write is logged: the file is then read again after a restart.
    pub fn add(&mut self, key: &FileKey, reason: &str) {
        if self.entries.iter().any(|(known, _)| known == key) {
            return;
        }
        self.push(key.clone(), reason.to_string());
        let Some(path) = &self.path else { return };
        if let Err(err) = crate::output::write_atomic(crate::output::parent_dir(path), path, self.text().as_bytes()) {
            tracing::warn!(
                "failed to record a refused unwind table: {}; it will be read again after a restart",
                crate::error::chain(&err)
            );
        }
    }

    /// Adds one entry (a key without tabs or line breaks; the reason made so), dropping
    /// the oldest past [`MAX_ENTRIES`].
    fn push(&mut self, key: FileKey, reason: String) {
        if key.is_empty() || key.contains(['\t', '\n', '\r']) {
            return;
        }
        let reason =
            reason.chars().map(|c| if c.is_control() { ' ' } else { c }).take(MAX_REASON_CHARS).collect::<String>();
        self.entries.push_back((key, reason));
        while self.entries.len() > MAX_ENTRIES {
            self.entries.pop_front();
        }
    }

    fn text(&self) -> String {
        self.entries.iter().map(|(key, reason)| format!("{key}\t{reason}\n")).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(test: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("profiler-refused-{test}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn refusals_outlive_a_restart_and_stay_bounded() {
        let dir = scratch("restart");
        let mut refused = Refused::load(Some(&dir));
        assert_eq!(refused.entries().count(), 0, "no record yet");
        refused.add(&"build-id:ab12".to_string(), "the CFI row count would pass\tthe cap\nof 8");
        refused.add(&"file:2049:77:270000:1700000000".to_string(), "over the cap");
        refused.add(&"build-id:ab12".to_string(), "again");
        drop(refused);

        let reloaded = Refused::load(Some(&dir));
        let entries: Vec<_> = reloaded.entries().map(|(k, r)| (k.clone(), r.to_string())).collect();
        assert_eq!(
            entries,
            vec![
                ("build-id:ab12".to_string(), "the CFI row count would pass the cap of 8".to_string()),
                ("file:2049:77:270000:1700000000".to_string(), "over the cap".to_string()),
            ]
        );

        // Fills it in memory (one write per entry would take long), then adds through the
        // record.
        let mut full = reloaded;
        for i in 0..MAX_ENTRIES - 1 {
            full.push(format!("build-id:{i:x}"), "over the cap".to_string());
        }
        full.add(&"build-id:last".to_string(), "over the cap");
        let reloaded = Refused::load(Some(&dir));
        assert_eq!(reloaded.entries().count(), MAX_ENTRIES);
        let first = reloaded.entries().next().map(|(k, _)| k.clone());
        assert_eq!(first.as_deref(), Some("build-id:0"), "the two oldest were dropped");
        let on_disk = std::fs::metadata(dir.join(FILE_NAME)).unwrap().len();
        assert!(on_disk < MAX_FILE_BYTES, "{on_disk} bytes");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn without_a_directory_refusals_are_kept_in_memory() {
        let mut refused = Refused::load(None);
        refused.add(&"vdso:1".to_string(), "over the cap");
        assert_eq!(refused.entries().count(), 1);
    }
}
