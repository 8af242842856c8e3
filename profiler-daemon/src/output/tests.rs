use std::{fs, os::unix::fs::MetadataExt, path::PathBuf};

use super::*;

#[test]
fn dir_names_are_safe() {
    assert_eq!(process_dir_name("cpu_split", 42), "cpu_split-42");
    assert_eq!(process_dir_name("kworker/0:1", 7), "kworker_0:1-7");
    assert_eq!(process_dir_name("a b\n", 1), "a_b_-1");
    assert_eq!(process_dir_name("..", 1), "unknown-1");
    assert_eq!(process_dir_name("", 1), "unknown-1");
}

#[test]
fn utc_timestamps() {
    use std::time::{Duration, UNIX_EPOCH};
    assert_eq!(utc_timestamp(UNIX_EPOCH), "19700101T000000Z");
    assert_eq!(utc_timestamp(UNIX_EPOCH + Duration::from_secs(951_782_400)), "20000229T000000Z");
    assert_eq!(utc_timestamp(UNIX_EPOCH + Duration::from_secs(1_796_109_296)), "20261201T071456Z");
}

#[test]
fn writes_atomically_and_reports_bad_dirs() {
    let dir = std::env::temp_dir().join(format!("profiler-output-test-{}", std::process::id()));
    let file = dir.join("p-1/cpu.pb.gz");
    write_atomic(&dir, &file, b"abc").unwrap();
    assert_eq!(fs::read(&file).unwrap(), b"abc");
    assert_eq!(fs::read_dir(file.parent().unwrap()).unwrap().count(), 1, "no temp left");
    let blocked = file.join("sub");
    assert!(matches!(ensure_writable_dir(&blocked), Err(Error::OutputDir { .. })));
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_batch_appears_on_commit_and_leaves_no_temporaries() {
    let dir = std::env::temp_dir().join(format!("profiler-batch-test-{}", std::process::id()));
    let (a, b) = (dir.join("p-1/cpu.pb.gz"), dir.join("q-2/heap.pb.gz"));
    let mut batch = StagedFiles::default();
    batch.stage(&dir, &a, b"abc").unwrap();
    batch.stage(&dir, &b, b"hello").unwrap();
    assert!(!a.exists() && !b.exists(), "nothing visible before commit");
    let done = batch.commit();
    assert!(done.failed.is_empty(), "{:?}", done.failed);
    assert_eq!(done.written, vec![(a.clone(), 3), (b.clone(), 5)]);
    assert_eq!(fs::read(&a).unwrap(), b"abc");
    assert_eq!(fs::read(&b).unwrap(), b"hello");
    for sub in ["p-1", "q-2"] {
        assert_eq!(fs::read_dir(dir.join(sub)).unwrap().count(), 1, "no temp left in {sub}");
    }

    // Staged but dropped without a commit: neither the file nor its temporary remains.
    let c = dir.join("p-1/block.pb.gz");
    StagedFiles::default().stage(&dir, &c, b"x").unwrap();
    assert!(!c.exists());
    assert_eq!(fs::read_dir(dir.join("p-1")).unwrap().count(), 1);

    // A directory that cannot be created fails at stage time, naming the file.
    let blocked = a.join("sub/cpu.pb.gz");
    let err = StagedFiles::default().stage(&dir, &blocked, b"x").unwrap_err();
    assert!(err.to_string().contains("sub/cpu.pb.gz"), "{err}");
    fs::remove_dir_all(&dir).unwrap();
}

/// A fresh scratch directory for `test` (not created: the code under test creates it).
fn scratch(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("profiler-output-{test}-{}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    dir
}

/// Sets the process's umask for the guard's life. The umask is process-wide: tests that
/// set it hold the lock, and the value they set (022, a shell's usual) only ever
/// narrows what concurrent tests create compared with a looser one.
struct Umask {
    old: libc::mode_t,
    _lock: std::sync::MutexGuard<'static, ()>,
}

impl Umask {
    fn set(mask: libc::mode_t) -> Self {
        static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
        let lock = LOCK.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        // SAFETY: umask has no preconditions and cannot fail.
        let old = unsafe { libc::umask(mask) };
        Self { old, _lock: lock }
    }
}

impl Drop for Umask {
    fn drop(&mut self) {
        // SAFETY: as in `set`.
        unsafe { libc::umask(self.old) };
    }
}

fn mode(path: &Path) -> u32 {
    fs::symlink_metadata(path).unwrap().mode() & 0o7777
}

#[test]
fn files_are_0640_and_directories_0750_under_umask_022() {
    let _umask = Umask::set(0o022);
    let dir = scratch("modes");
    ensure_writable_dir(&dir).unwrap();
    let (one, two) = (dir.join("p-1/cpu.pb.gz"), dir.join("q-2/heap.pb.gz"));
    write_atomic(&dir, &one, b"abc").unwrap();
    let mut batch = StagedFiles::default();
    batch.stage(&dir, &two, b"hello").unwrap();
    assert!(batch.commit().failed.is_empty());
    // What the umask alone gives (0644 and 0755), for contrast: readable by everyone.
    let loose = dir.join("loose");
    fs::create_dir(&loose).unwrap();
    fs::write(loose.join("f"), b"").unwrap();
    assert_eq!((mode(&loose), mode(&loose.join("f"))), (0o755, 0o644), "the umask is 022");
    for file in [&one, &two] {
        assert_eq!(mode(file), FILE_MODE, "{}", file.display());
        assert_eq!(mode(file.parent().unwrap()), DIR_MODE, "{}", file.display());
    }
    assert_eq!(mode(&dir), DIR_MODE, "the output directory, created by ensure_writable_dir");
    // A process directory an older version left at 0755 is narrowed when written to.
    write_atomic(&dir, &loose.join("cpu.pb.gz"), b"x").unwrap();
    assert_eq!(mode(&loose), DIR_MODE);
    fs::remove_dir_all(&dir).unwrap();
}

/// `DIR` with a process directory `p-1` that is a symbolic link to `victim`, outside it.
fn planted_dir(test: &str) -> (PathBuf, PathBuf) {
    let dir = scratch(test);
    let victim = dir.with_extension("victim");
    let _ = fs::remove_dir_all(&victim);
    fs::create_dir_all(&dir).unwrap();
    fs::create_dir_all(&victim).unwrap();
    std::os::unix::fs::symlink(&victim, dir.join("p-1")).unwrap();
    (dir, victim)
}

#[test]
fn a_symlink_at_a_process_directory_is_refused() {
    let (dir, victim) = planted_dir("dirlink");
    let file = dir.join("p-1/cpu.pb.gz");
    let err = write_atomic(&dir, &file, b"abc").unwrap_err().to_string();
    assert!(err.contains(&format!("{} is a symbolic link", dir.join("p-1").display())), "{err}");
    assert!(err.contains("remove it"), "{err}");
    let err = StagedFiles::default().stage(&dir, &file, b"abc").unwrap_err().to_string();
    assert!(err.contains("symbolic link"), "{err}");
    let spool = dir.join(".spool");
    std::os::unix::fs::symlink(&victim, &spool).unwrap();
    assert!(write_atomic(&dir, &spool.join("1.json"), b"{}").is_err());
    assert_eq!(fs::read_dir(&victim).unwrap().count(), 0, "nothing written through the links");
    fs::remove_dir_all(&dir).unwrap();
    fs::remove_dir_all(&victim).unwrap();
}

#[test]
fn a_symlink_at_a_file_name_is_refused_and_temp_names_are_not_predictable() {
    let (dir, victim) = planted_dir("filelink");
    fs::remove_file(dir.join("p-1")).unwrap();
    fs::create_dir(dir.join("p-1")).unwrap();
    let target = victim.join("shadow");
    fs::write(&target, b"secret").unwrap();
    let file = dir.join("p-1/cpu.pb.gz");
    std::os::unix::fs::symlink(&target, &file).unwrap();
    // The temporary name the daemon once used, planted too.
    std::os::unix::fs::symlink(&target, dir.join(format!("p-1/.cpu.pb.gz.tmp-{}", std::process::id()))).unwrap();
    let err = write_atomic(&dir, &file, b"abc").unwrap_err().to_string();
    assert!(err.contains(&format!("{} exists and is not a regular file", file.display())), "{err}");
    let mut batch = StagedFiles::default();
    batch.stage(&dir, &file, b"abc").unwrap();
    let done = batch.commit();
    assert!(done.written.is_empty() && done.failed.len() == 1, "{done:?}");
    assert_eq!(fs::read(&target).unwrap(), b"secret", "the link's target is untouched");
    assert!(fs::symlink_metadata(&file).unwrap().file_type().is_symlink(), "the link is left for root to see");
    assert_eq!(fs::read_dir(dir.join("p-1")).unwrap().count(), 2, "no temporary left behind");
    fs::remove_dir_all(&dir).unwrap();
    fs::remove_dir_all(&victim).unwrap();
}

#[test]
fn two_writes_never_share_a_temporary_name() {
    let dir = scratch("tempnames");
    let file = dir.join("p-1/cpu.pb.gz");
    let mut batch = StagedFiles::default();
    batch.stage(&dir, &file, b"one").unwrap();
    batch.stage(&dir, &file, b"two").unwrap();
    let temps: Vec<_> = fs::read_dir(dir.join("p-1")).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(temps.len(), 2, "two temporaries: {temps:?}");
    let done = batch.commit();
    assert!(done.failed.is_empty(), "{:?}", done.failed);
    assert_eq!(fs::read(&file).unwrap(), b"two", "the later write wins");
    assert_eq!(fs::read_dir(dir.join("p-1")).unwrap().count(), 1, "no temporary left behind");
    fs::remove_dir_all(&dir).unwrap();
}
