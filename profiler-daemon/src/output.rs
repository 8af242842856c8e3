//! Where profiles go on disk: `DIR/<name>-<pid>/<type>.pb.gz`, written atomically (a
//! temporary file in the same directory, made durable, then renamed) so no reader sees a
//! partial file, even after a crash. One file is [`write_atomic`]; a dump's many files are a
//! [`Batch`], made durable together.
//!
//! The output directory `DIR` is trusted as configured (a symbolic link in its path is the
//! operator's choice). Below it, the daemon trusts nothing it did not create itself: it
//! opens `DIR` once, then creates and opens each component below it relative to the open
//! directory (`mkdirat`, `openat` with `O_NOFOLLOW`), so a symbolic link planted at a
//! process directory or at a file name (e.g. `DIR/bash-1234 -> /etc` in a shared
//! directory) is refused, never followed. Temporary names are random and created with
//! `O_CREAT|O_EXCL`, so nobody can plant one in advance. Modes are explicit, not left to
//! the umask: directories [`DIR_MODE`], files [`FILE_MODE`] (a stricter umask narrows them
//! further).

use std::{
    collections::BTreeMap,
    ffi::{CString, OsStr, OsString},
    fs,
    io::{self, Write},
    os::unix::{
        ffi::OsStrExt,
        fs::{DirBuilderExt, MetadataExt, OpenOptionsExt},
        io::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd},
    },
    path::{Component, Path, PathBuf},
    sync::Arc,
};

use crate::error::{Error, Result};

/// The mode of every directory the daemon creates for profiles: owner and group may list
/// it, nobody else (profiles name every process's functions, executables and units).
pub const DIR_MODE: u32 = 0o750;
/// The mode of every profile file: owner writes, group reads, nobody else.
pub const FILE_MODE: u32 = 0o640;
/// Attempts at a free random temporary name before giving up (a collision of 64 random
/// bits means something else is wrong).
const TEMP_ATTEMPTS: usize = 4;

/// The directory name of a process: its name (with `/`, whitespace and control characters
/// replaced by `_`) and its pid.
pub fn process_dir_name(name: &str, pid: u32) -> String {
    let clean: String =
        name.chars().map(|c| if c == '/' || c.is_whitespace() || c.is_control() { '_' } else { c }).collect();
    let clean = if clean.is_empty() || clean == "." || clean == ".." { "unknown".into() } else { clean };
    format!("{clean}-{pid}")
}

/// The directory `path` is written in, as [`write_atomic`]'s trusted root when a single
/// file is named on the command line: its parent, or `.` for a bare file name.
pub fn parent_dir(path: &Path) -> &Path {
    path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."))
}

/// Creates `dir` if needed (mode [`DIR_MODE`]) and proves it is writable by creating and
/// removing a file.
pub fn ensure_writable_dir(dir: &Path) -> Result<()> {
    let fail = |cause| Error::OutputDir { path: dir.to_path_buf(), cause };
    let root = open_root(dir).map_err(fail)?;
    let (_, probe) = create_temp(root.as_fd(), OsStr::new("profiler-probe"), dir).map_err(fail)?;
    unlink_at(root.as_fd(), &probe).map_err(fail)
}

/// Writes `bytes` to `path` atomically, creating the directories between `root` (trusted,
/// created if missing) and `path`, which must lie below `root`.
pub fn write_atomic(root: &Path, path: &Path, bytes: &[u8]) -> Result<()> {
    let fail = |cause| Error::Write { path: path.to_path_buf(), cause };
    let (dir, name) = open_parent(root, path).map_err(fail)?;
    let (file, tmp) = write_temp(dir.as_fd(), name, path, bytes).map_err(fail)?;
    let result = file.sync_all().and_then(|()| install(dir.as_fd(), &tmp, name, path));
    if result.is_err() {
        let _ = unlink_at(dir.as_fd(), &tmp);
    }
    result.map_err(fail)
}

/// Opens the directory `path` is to be written in: `root` (created with [`DIR_MODE`] if
/// missing, followed if a symbolic link), then each component between, never following a
/// symbolic link. Returns it with `path`'s file name.
fn open_parent<'a>(root: &Path, path: &'a Path) -> io::Result<(OwnedFd, &'a OsStr)> {
    let outside = || io::Error::new(io::ErrorKind::InvalidInput, format!("not a file below {}", root.display()));
    // `a.pb.gz` lies below `.` although it does not start with it.
    let rel = match path.strip_prefix(root) {
        Ok(rel) => rel,
        Err(_) if root == Path::new(".") && path.is_relative() => path,
        Err(_) => return Err(outside()),
    };
    let mut parts = Vec::new();
    for part in rel.components() {
        match part {
            Component::Normal(name) => parts.push(name),
            _ => return Err(outside()),
        }
    }
    let name = parts.pop().ok_or_else(outside)?;
    let mut dir = open_root(root)?;
    let mut shown = root.to_path_buf();
    for part in parts {
        shown.push(part);
        dir = open_subdir(dir.as_fd(), part, &shown)?;
    }
    Ok((dir, name))
}

/// Creates `root` with [`DIR_MODE`] (and any missing parents) and opens it.
fn open_root(root: &Path) -> io::Result<OwnedFd> {
    fs::DirBuilder::new().recursive(true).mode(DIR_MODE).create(root)?;
    let dir = fs::OpenOptions::new().read(true).custom_flags(libc::O_DIRECTORY | libc::O_CLOEXEC).open(root)?;
    Ok(dir.into())
}

/// Creates `name` in `parent` with [`DIR_MODE`] if missing and opens it, refusing a symbolic
/// link, a non-directory, or a directory of another user. A directory of ours that others
/// may read (an older version's 0755) is narrowed to [`DIR_MODE`]. `shown` is its path,
/// for errors.
fn open_subdir(parent: BorrowedFd<'_>, name: &OsStr, shown: &Path) -> io::Result<OwnedFd> {
    let c_name = c_name(name)?;
    // SAFETY: `parent` is an open descriptor and `c_name` a NUL-terminated string.
    if unsafe { libc::mkdirat(parent.as_raw_fd(), c_name.as_ptr(), DIR_MODE) } != 0 {
        let err = io::Error::last_os_error();
        if err.kind() != io::ErrorKind::AlreadyExists {
            return Err(err);
        }
    }
    let flags = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC;
    let dir = open_at(parent, &c_name, flags, 0).map_err(|err| match err.raw_os_error() {
        Some(libc::ELOOP | libc::ENOTDIR) => refused(shown, "is a symbolic link or not a directory"),
        _ => err,
    })?;
    let meta = fs::File::from(dir.try_clone()?).metadata()?;
    // SAFETY: geteuid has no preconditions and cannot fail.
    let euid = unsafe { libc::geteuid() };
    if meta.uid() != euid {
        return Err(refused(shown, &format!("belongs to uid {}, not to the daemon's uid {euid}", meta.uid())));
    }
    if meta.mode() & 0o777 & !DIR_MODE != 0 {
        fchmod(dir.as_fd(), meta.mode() & DIR_MODE)?;
    }
    Ok(dir)
}

/// The error for a path the daemon will not write through, saying what to do.
fn refused(path: &Path, what: &str) -> io::Error {
    io::Error::other(format!("{} {what}; refusing to write through it: remove it", path.display()))
}

/// Writes `bytes` to a new temporary file beside `name` in `dir`, and returns it, still
/// open, with its name; on failure nothing is left behind.
fn write_temp(dir: BorrowedFd<'_>, name: &OsStr, path: &Path, bytes: &[u8]) -> io::Result<(fs::File, OsString)> {
    let (mut file, tmp) = create_temp(dir, name, path)?;
    match file.write_all(bytes) {
        Ok(()) => Ok((file, tmp)),
        Err(err) => {
            let _ = unlink_at(dir, &tmp);
            Err(err)
        }
    }
}

/// Creates `.<name>.tmp-<16 random hex digits>` in `dir` with [`FILE_MODE`], exclusively:
/// a name that exists (whatever it is, a symbolic link too) is never opened, another
/// random name is tried. The leading dot keeps retention from listing it.
fn create_temp(dir: BorrowedFd<'_>, name: &OsStr, path: &Path) -> io::Result<(fs::File, OsString)> {
    let flags = libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_CLOEXEC;
    for _ in 0..TEMP_ATTEMPTS {
        let mut tmp = OsString::from(".");
        tmp.push(name);
        tmp.push(format!(".tmp-{:016x}", random_u64()?));
        match open_at(dir, &c_name(&tmp)?, flags, FILE_MODE) {
            Ok(fd) => return Ok((fd.into(), tmp)),
            Err(err) if err.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(err) => return Err(err),
        }
    }
    Err(io::Error::new(
        io::ErrorKind::AlreadyExists,
        format!("no free temporary name beside {} after {TEMP_ATTEMPTS} random tries", path.display()),
    ))
}

/// Renames the temporary file `tmp` to `name`, both in `dir`, unless `name` is something
/// other than a regular file. `rename` itself never follows a symbolic link at `name` (it
/// would replace the link), so the check only turns that into a clear refusal.
fn install(dir: BorrowedFd<'_>, tmp: &OsStr, name: &OsStr, path: &Path) -> io::Result<()> {
    let c_target = c_name(name)?;
    // SAFETY: an all-zero `stat` is a valid value of this plain C struct.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `dir` is open, `c_target` NUL-terminated, `st` valid to write.
    let rc = unsafe { libc::fstatat(dir.as_raw_fd(), c_target.as_ptr(), &mut st, libc::AT_SYMLINK_NOFOLLOW) };
    if rc == 0 && st.st_mode & libc::S_IFMT != libc::S_IFREG {
        return Err(refused(path, "exists and is not a regular file (a symbolic link?)"));
    }
    if rc != 0 {
        let err = io::Error::last_os_error();
        if err.kind() != io::ErrorKind::NotFound {
            return Err(err);
        }
    }
    let c_tmp = c_name(tmp)?;
    // SAFETY: as above; both names are relative to the same open directory.
    let rc = unsafe { libc::renameat(dir.as_raw_fd(), c_tmp.as_ptr(), dir.as_raw_fd(), c_target.as_ptr()) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// `openat(2)`.
fn open_at(dir: BorrowedFd<'_>, name: &CString, flags: i32, mode: u32) -> io::Result<OwnedFd> {
    // SAFETY: `dir` is open and `name` NUL-terminated; the mode is passed as the variadic
    // argument `openat` reads only with O_CREAT.
    let fd = unsafe { libc::openat(dir.as_raw_fd(), name.as_ptr(), flags, mode as libc::c_uint) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just opened and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// `unlinkat(2)` of a file.
fn unlink_at(dir: BorrowedFd<'_>, name: &OsStr) -> io::Result<()> {
    let c_name = c_name(name)?;
    // SAFETY: `dir` is open and `c_name` NUL-terminated.
    if unsafe { libc::unlinkat(dir.as_raw_fd(), c_name.as_ptr(), 0) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// `fchmod(2)`.
fn fchmod(fd: BorrowedFd<'_>, mode: u32) -> io::Result<()> {
    // SAFETY: `fd` is open.
    if unsafe { libc::fchmod(fd.as_raw_fd(), mode) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

fn c_name(name: &OsStr) -> io::Result<CString> {
    CString::new(name.as_bytes()).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a NUL byte in a file name"))
}

/// 64 bits from the kernel's random pool (`getrandom(2)`), for temporary names nobody can
/// predict.
fn random_u64() -> io::Result<u64> {
    let mut buf = [0u8; 8];
    loop {
        // SAFETY: `buf` is valid for `buf.len()` bytes.
        let n = unsafe { libc::getrandom(buf.as_mut_ptr().cast(), buf.len(), 0) };
        match usize::try_from(n) {
            Ok(n) if n == buf.len() => return Ok(u64::from_ne_bytes(buf)),
            Ok(_) => return Err(io::Error::other("getrandom returned fewer bytes than asked for")),
            Err(_) => {
                let err = io::Error::last_os_error();
                if err.kind() != io::ErrorKind::Interrupted {
                    return Err(err);
                }
            }
        }
    }
}

/// Files open at once in a [`Batch`]: a dump of thousands of processes commits every this
/// many files. With one open directory per process directory among them (at most as many
/// again), that stays below the usual limit of 1024 descriptors.
pub const BATCH_MAX_OPEN: usize = 256;

/// Several files written atomically with one flush of the disk: each is written to a
/// temporary file in its directory, then one `syncfs` makes them all durable, then each is
/// renamed into place.
///
/// Why not `fsync` per file: every `fsync` sleeps until the disk answers, and on a machine
/// whose cores are all busy, each wakeup then waits for a core. A 115-file dump among 20
/// spinning processes took 1–2.6 s that way, of which under 0.1 s was CPU; with one
/// `syncfs` it blocks once. The price: `syncfs` also writes back other dirty data of the
/// output directory's file system (as ext4's journal commit on `fsync` largely does too).
///
/// Each file is renamed relative to its directory as opened when it was staged, so a
/// directory swapped for a symbolic link in between is not followed.
///
/// Uncommitted temporary files are removed on drop.
#[derive(Default)]
pub struct Batch {
    staged: Vec<Staged>,
    /// The directories of the staged files, opened once each (by path, until the commit).
    dirs: BTreeMap<PathBuf, Arc<OwnedFd>>,
}

struct Staged {
    file: fs::File,
    dir: Arc<OwnedFd>,
    tmp: OsString,
    path: PathBuf,
    bytes: u64,
}

/// What a [`Batch::commit`] did: the files now in place (with their sizes), and the errors
/// of those that are not.
#[derive(Debug, Default)]
pub struct Committed {
    pub written: Vec<(PathBuf, u64)>,
    pub failed: Vec<Error>,
}

impl Batch {
    /// Writes `bytes` to a temporary file beside `path`, creating the directories between
    /// `root` and `path` as [`write_atomic`] does; the file appears at `path` on
    /// [`Batch::commit`].
    pub fn stage(&mut self, root: &Path, path: &Path, bytes: &[u8]) -> Result<()> {
        let fail = |cause| Error::Write { path: path.to_path_buf(), cause };
        let parent = path.parent().unwrap_or(path).to_path_buf();
        let (dir, name) = match self.dirs.get(&parent) {
            Some(dir) => (dir.clone(), path.file_name().unwrap_or_default()),
            None => {
                let (dir, name) = open_parent(root, path).map_err(fail)?;
                let dir = Arc::new(dir);
                self.dirs.insert(parent, dir.clone());
                (dir, name)
            }
        };
        let (file, tmp) = write_temp(dir.as_fd(), name, path, bytes).map_err(fail)?;
        self.staged.push(Staged { file, dir, tmp, path: path.to_path_buf(), bytes: bytes.len() as u64 });
        Ok(())
    }

    /// Whether [`BATCH_MAX_OPEN`] files are staged and the batch should be committed.
    pub fn is_full(&self) -> bool {
        self.staged.len() >= BATCH_MAX_OPEN
    }

    /// Makes the staged files durable (one `syncfs` per file system), renames them into
    /// place, and makes the names durable. When a file system's `syncfs` fails, each of its
    /// files is `fsync`ed to find which ones failed: those are removed, not renamed.
    pub fn commit(&mut self) -> Committed {
        let mut done = Committed::default();
        let staged = std::mem::take(&mut self.staged);
        self.dirs.clear();
        let mut by_fs: BTreeMap<u64, Vec<Staged>> = BTreeMap::new();
        for s in staged {
            match s.file.metadata() {
                Ok(meta) => by_fs.entry(meta.dev()).or_default().push(s),
                Err(cause) => done.failed.push(abandon(s, cause)),
            }
        }
        for files in by_fs.into_values() {
            let durable: Vec<Staged> = match syncfs(&files[0].file) {
                Ok(()) => files,
                Err(_) => files
                    .into_iter()
                    .filter_map(|s| match s.file.sync_all() {
                        Ok(()) => Some(s),
                        Err(cause) => {
                            done.failed.push(abandon(s, cause));
                            None
                        }
                    })
                    .collect(),
            };
            let fs_file = durable.first().and_then(|s| s.file.try_clone().ok());
            for s in durable {
                match install(s.dir.as_fd(), &s.tmp, s.path.file_name().unwrap_or_default(), &s.path) {
                    Ok(()) => done.written.push((s.path, s.bytes)),
                    Err(cause) => done.failed.push(abandon(s, cause)),
                }
            }
            // The renames, durable too; they are in place already, so a failure here is
            // reported but does not undo them.
            if let Some(file) = fs_file {
                if let Err(cause) = syncfs(&file) {
                    let path = done.written.last().map_or_else(PathBuf::new, |(p, _)| p.clone());
                    done.failed.push(Error::Write { path, cause });
                }
            }
        }
        done
    }
}

impl Drop for Batch {
    fn drop(&mut self) {
        for s in &self.staged {
            let _ = unlink_at(s.dir.as_fd(), &s.tmp);
        }
    }
}

/// Removes a staged file's temporary file; the error names the file it was for.
fn abandon(s: Staged, cause: std::io::Error) -> Error {
    let _ = unlink_at(s.dir.as_fd(), &s.tmp);
    Error::Write { path: s.path, cause }
}

/// `syncfs(2)` on the file system holding `file`.
fn syncfs(file: &fs::File) -> std::io::Result<()> {
    // SAFETY: the descriptor is open for the duration of the call.
    if unsafe { libc::syncfs(file.as_raw_fd()) } == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// `SystemTime` as a compact UTC timestamp for file names: `20261201T071500Z`.
pub fn utc_timestamp(time: std::time::SystemTime) -> String {
    let secs = time.duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let (y, m, d) = civil_from_days(days as i64);
    format!("{y:04}{m:02}{d:02}T{:02}{:02}{:02}Z", rem / 3600, rem % 3600 / 60, rem % 60)
}

/// Days since 1970-01-01 to (year, month, day) in the proleptic Gregorian calendar
/// (Howard Hinnant's algorithm; no date library needed for one conversion).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

#[cfg(test)]
mod tests {
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
        let mut batch = Batch::default();
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
        Batch::default().stage(&dir, &c, b"x").unwrap();
        assert!(!c.exists());
        assert_eq!(fs::read_dir(dir.join("p-1")).unwrap().count(), 1);

        // A directory that cannot be created fails at stage time, naming the file.
        let blocked = a.join("sub/cpu.pb.gz");
        let err = Batch::default().stage(&dir, &blocked, b"x").unwrap_err();
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
        let mut batch = Batch::default();
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
        let err = Batch::default().stage(&dir, &file, b"abc").unwrap_err().to_string();
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
        let mut batch = Batch::default();
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
        let mut batch = Batch::default();
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
}
