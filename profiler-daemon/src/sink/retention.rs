//! Deleting old profiles so the output directory stays within `[retention]`: profiles older
//! than `max_age` go first, then the oldest until the directory fits in `max_total_bytes` and
//! the file system has `min_free_bytes` free. Free space is the one limit another writer can
//! break: for it alone, the profiles written within [`FREE_SPACE_FLOOR`] of the newest one
//! are never deleted (the writer skips new profiles instead, so the newest stays put), and a
//! disk filled by someone else, for however long, cannot make the daemon delete them all.
//!
//! Owns: listing `DIR/<name>-<pid>/*.pb.gz`, choosing what to delete, deleting it, removing
//! the per-process directories that deletion emptied, and saying from what a pass found when
//! the next one is due ([`Schedule`]). Does not own writing profiles ([`crate::output`]) nor
//! running a pass (the writer asks the schedule after each dump and calls [`enforce`] from
//! the thread that writes, so removing an emptied directory never races a write into it).
//!
//! A pass lists every profile (a `stat` each), and a week of profiles is hundreds of
//! thousands of files on a busy machine, so passes run only when something may be due: the
//! bytes written since the last pass exceed what the size limit left free, the oldest
//! profile left reaches `max_age` (plus [`late_by`]: a profile goes at most that late), free
//! space is low (checked before each dump), the last pass failed somewhere, or an hour has
//! gone by (someone else changed the directory). A pass that deletes for size goes down to
//! 15/16 of `max_total_bytes`, so that the next is not due after the very next dump.
//!
//! Nothing here panics or gives up on the first failure: a file that cannot be deleted is
//! counted in the report and the next one is tried, and a file that vanished meanwhile is
//! simply gone. Only this module deletes under the output directory.

use std::{
    collections::BTreeSet,
    ffi::CString,
    fmt, fs, io,
    os::unix::ffi::OsStrExt,
    path::{Path, PathBuf},
    time::{Duration, SystemTime},
};

use crate::{config::Retention, units::format_bytes};

/// The suffix of every profile file; anything else in the directory is left alone.
const PROFILE_SUFFIX: &str = ".pb.gz";

/// Profiles written within this of the newest are never deleted to make free space: only
/// `max_age` and `max_total_bytes`, which bound the profiler's own use, may delete them.
pub const FREE_SPACE_FLOOR: Duration = Duration::from_secs(3600);

/// What one [`enforce`] pass did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RetentionReport {
    /// Profiles this pass deleted, and their total size in bytes (files that vanished
    /// meanwhile are not counted).
    pub deleted_files: u64,
    pub deleted_bytes: u64,
    /// Profiles left after the pass, and their total size in bytes.
    pub remaining_files: u64,
    pub remaining_bytes: u64,
    /// Per-process directories removed because the pass emptied them.
    pub removed_dirs: u64,
    /// Whether free space stayed below `min_free_bytes` with only the profiles within
    /// [`FREE_SPACE_FLOOR`] of the newest left to delete (the space is someone else's to free).
    pub kept_for_floor: bool,
    /// When the oldest profile left was written, if any is left.
    pub oldest_remaining: Option<SystemTime>,
    /// Failures (listing, deleting, reading free space); the pass went on after each.
    pub errors: u64,
    /// The last failure, naming the file and the cause.
    pub last_error: Option<String>,
}

impl RetentionReport {
    fn record(&mut self, error: String) {
        self.errors += 1;
        self.last_error = Some(error);
    }
}

/// One line for the log.
impl fmt::Display for RetentionReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "deleted {} profile(s) ({}), {} left ({})",
            self.deleted_files,
            format_bytes(self.deleted_bytes),
            self.remaining_files,
            format_bytes(self.remaining_bytes),
        )?;
        if let Some(error) = &self.last_error {
            write!(f, "; {} error(s), last: {error}", self.errors)?;
        }
        Ok(())
    }
}

/// A profile file found in the output directory.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct ProfileFile {
    // Field order is the deletion order: oldest first, then by path so ties are stable.
    modified: SystemTime,
    path: PathBuf,
    bytes: u64,
}

/// Applies `policy` to the profiles under `dir` as of `now` (a parameter so tests control
/// age). `min_free_bytes` is checked on `dir`'s file system after each deletion.
pub fn enforce(dir: &Path, policy: &Retention, now: SystemTime) -> RetentionReport {
    let mut report = RetentionReport::default();
    let mut profiles = list_profiles(dir, &mut report);
    profiles.sort();
    let mut touched_dirs = BTreeSet::new();
    let kept = delete_expired(profiles, policy.max_age, now, &mut report, &mut touched_dirs);
    let kept = delete_oldest_over_limits(kept, dir, policy, &mut report, &mut touched_dirs);
    report.remaining_files = kept.len() as u64;
    report.remaining_bytes = kept.iter().map(|profile| profile.bytes).sum();
    report.oldest_remaining = kept.iter().map(|profile| profile.modified).min();
    remove_emptied_dirs(&touched_dirs, &mut report);
    report
}

/// Whether `dir`'s file system has at least `min_free_bytes` available to unprivileged users.
/// 0 is always satisfied, without asking the file system.
pub fn free_space_ok(dir: &Path, min_free_bytes: u64) -> Result<bool, io::Error> {
    if min_free_bytes == 0 {
        return Ok(true);
    }
    Ok(available_bytes(dir)? >= min_free_bytes)
}

/// Bytes available on `dir`'s file system to unprivileged users (`f_bavail × f_frsize`). The
/// blocks reserved for root are not counted: the daemon runs as root, but leaving them alone
/// is what keeps the host usable when the disk fills.
pub fn available_bytes(dir: &Path) -> Result<u64, io::Error> {
    let name = || dir.display();
    let path = CString::new(dir.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, format!("{} contains a NUL byte", name())))?;
    // SAFETY: statvfs is plain old data; all-zero bytes are a valid value.
    let mut stats: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `path` is NUL-terminated and `stats` is writable, both live across the call.
    if unsafe { libc::statvfs(path.as_ptr(), &mut stats) } != 0 {
        let err = io::Error::last_os_error();
        return Err(io::Error::new(err.kind(), format!("failed to read free space of {}: {err}", name())));
    }
    Ok((stats.f_bavail as u64).saturating_mul(stats.f_frsize as u64))
}

/// `dir/*/*.pb.gz`, one level of per-process directories. Names starting with `.` (the
/// writer's temporary files, probes) and symlinks are skipped, so a pass never deletes a
/// half-written file or anything outside `dir`.
fn list_profiles(dir: &Path, report: &mut RetentionReport) -> Vec<ProfileFile> {
    let mut profiles = Vec::new();
    for process_dir in read_dir_entries(dir, report) {
        if is_visible(&process_dir) && process_dir.file_type().is_ok_and(|kind| kind.is_dir()) {
            for file in read_dir_entries(&process_dir.path(), report) {
                if let Some(profile) = profile_of(&file, report) {
                    profiles.push(profile);
                }
            }
        }
    }
    profiles
}

/// The entries of `dir`; a failure is recorded and yields none (a directory that vanished
/// meanwhile yields none silently).
fn read_dir_entries(dir: &Path, report: &mut RetentionReport) -> Vec<fs::DirEntry> {
    let mut entries = Vec::new();
    let fail = |err: io::Error, report: &mut RetentionReport| {
        if err.kind() != io::ErrorKind::NotFound {
            report.record(format!("failed to list {}: {err}", dir.display()));
        }
    };
    match fs::read_dir(dir) {
        Ok(iter) => {
            for entry in iter {
                match entry {
                    Ok(entry) => entries.push(entry),
                    Err(err) => fail(err, report),
                }
            }
        }
        Err(err) => fail(err, report),
    }
    entries
}

fn is_visible(entry: &fs::DirEntry) -> bool {
    !entry.file_name().as_bytes().starts_with(b".")
}

/// The entry as a profile, if it is a regular `*.pb.gz` file that still exists.
fn profile_of(entry: &fs::DirEntry, report: &mut RetentionReport) -> Option<ProfileFile> {
    let name = entry.file_name();
    if !is_visible(entry) || !name.as_bytes().ends_with(PROFILE_SUFFIX.as_bytes()) {
        return None;
    }
    let path = entry.path();
    // `DirEntry::metadata` does not follow symlinks; `is_file` then rules them out.
    match entry.metadata().and_then(|meta| Ok((meta.is_file(), meta.len(), meta.modified()?))) {
        Ok((true, bytes, modified)) => Some(ProfileFile { modified, path, bytes }),
        Ok((false, ..)) => None,
        Err(err) if err.kind() == io::ErrorKind::NotFound => None,
        Err(err) => {
            report.record(format!("failed to read the size and age of {}: {err}", path.display()));
            None
        }
    }
}

/// Deletes the profiles older than `max_age` and returns the rest, in the same order. A file
/// stamped in the future counts as new.
fn delete_expired(
    profiles: Vec<ProfileFile>,
    max_age: Duration,
    now: SystemTime,
    report: &mut RetentionReport,
    touched_dirs: &mut BTreeSet<PathBuf>,
) -> Vec<ProfileFile> {
    let mut kept = Vec::with_capacity(profiles.len());
    for profile in profiles {
        let age = now.duration_since(profile.modified).unwrap_or(Duration::ZERO);
        if age <= max_age || !delete(&profile, report, touched_dirs) {
            kept.push(profile);
        }
    }
    kept
}

/// Deletes oldest first while the total exceeds `max_total_bytes` or the file system has less
/// than `min_free_bytes` free; returns what is left. A file that cannot be deleted still
/// counts towards the total, so newer files may go in its place: the limits are what the
/// operator asked for. Deleting only ever helps, so the first file that may stay ends the
/// pass (and free space is not asked about once per remaining file). For free space alone,
/// a profile within [`FREE_SPACE_FLOOR`] of the newest also ends the pass.
fn delete_oldest_over_limits(
    profiles: Vec<ProfileFile>,
    dir: &Path,
    policy: &Retention,
    report: &mut RetentionReport,
    touched_dirs: &mut BTreeSet<PathBuf>,
) -> Vec<ProfileFile> {
    let newest = profiles.last().map(|profile| profile.modified);
    let mut total: u64 = profiles.iter().map(|profile| profile.bytes).sum();
    // Over the limit: down to the low-water mark (see the module's doc).
    let target = if total > policy.max_total_bytes { low_water(policy.max_total_bytes) } else { total };
    let mut free_space = FreeSpace::new(dir, policy.min_free_bytes);
    let mut kept = Vec::with_capacity(profiles.len());
    let mut oldest_first = profiles.into_iter();
    for profile in oldest_first.by_ref() {
        if total <= target {
            let age = newest.and_then(|newest| newest.duration_since(profile.modified).ok()).unwrap_or_default();
            let young = age < FREE_SPACE_FLOOR;
            let low = free_space.is_low(report);
            if !low || young {
                report.kept_for_floor = low;
                kept.push(profile);
                break;
            }
        }
        if delete(&profile, report, touched_dirs) {
            total -= profile.bytes;
        } else {
            kept.push(profile);
        }
    }
    kept.extend(oldest_first);
    kept
}

/// What a pass that deletes for size leaves at most.
fn low_water(max_total_bytes: u64) -> u64 {
    max_total_bytes - max_total_bytes / 16
}

/// How late after reaching `max_age` a profile may be deleted: 1/64 of it, at most
/// 10 minutes (a week's limit: 10 minutes; a minute's: about a second).
pub fn late_by(max_age: Duration) -> Duration {
    (max_age / 64).min(Duration::from_secs(600))
}

/// A pass is due at least this often, whatever the last one found: another writer, or an
/// operator, may have added or removed files.
const PASS_AT_LEAST_EVERY: Duration = Duration::from_secs(3600);

/// When the next pass is due, from what the last one found (see the module's doc).
#[derive(Clone, Debug, Default)]
pub struct Schedule {
    /// When the last pass ran; `None` before the first, or to ask for one at once.
    last_pass: Option<SystemTime>,
    /// Bytes the size limit left free after the last pass, less what was written since.
    headroom: u64,
    /// When the oldest profile left reaches `max_age` (plus [`late_by`]).
    next_expiry: Option<SystemTime>,
}

impl Schedule {
    /// Notes `bytes` of profiles written.
    pub fn wrote(&mut self, bytes: u64) {
        self.headroom = self.headroom.saturating_sub(bytes);
    }

    /// Whether a pass is due at `now`.
    pub fn due(&self, now: SystemTime) -> bool {
        let Some(last) = self.last_pass else { return true };
        self.headroom == 0
            || self.next_expiry.is_some_and(|expiry| now >= expiry)
            || now.duration_since(last).map_or(true, |since| since >= PASS_AT_LEAST_EVERY)
    }

    /// Notes a pass at `now` under `policy` and what it found. After a failure the next
    /// one is due at once.
    pub fn passed(&mut self, report: &RetentionReport, policy: &Retention, now: SystemTime) {
        if report.errors > 0 {
            *self = Self::default();
            return;
        }
        self.last_pass = Some(now);
        self.headroom = policy.max_total_bytes.saturating_sub(report.remaining_bytes);
        self.next_expiry = report.oldest_remaining.map(|oldest| oldest + policy.max_age + late_by(policy.max_age));
    }
}

/// The `min_free_bytes` check during one pass. After the first failure to read free space it
/// stops asking (the error is recorded once) and only the size limit applies.
struct FreeSpace<'a> {
    dir: &'a Path,
    min_free_bytes: u64,
    failed: bool,
}

impl<'a> FreeSpace<'a> {
    fn new(dir: &'a Path, min_free_bytes: u64) -> Self {
        Self { dir, min_free_bytes, failed: false }
    }

    fn is_low(&mut self, report: &mut RetentionReport) -> bool {
        if self.failed {
            return false;
        }
        match free_space_ok(self.dir, self.min_free_bytes) {
            Ok(ok) => !ok,
            Err(err) => {
                self.failed = true;
                report.record(err.to_string());
                false
            }
        }
    }
}

/// Deletes one profile. Returns whether it is gone, which includes having vanished already
/// (then it is not counted as deleted by this pass).
fn delete(profile: &ProfileFile, report: &mut RetentionReport, touched_dirs: &mut BTreeSet<PathBuf>) -> bool {
    match fs::remove_file(&profile.path) {
        Ok(()) => {
            report.deleted_files += 1;
            report.deleted_bytes += profile.bytes;
        }
        Err(err) if err.kind() == io::ErrorKind::NotFound => {}
        Err(err) => {
            report.record(format!(
                "failed to delete old profile {}: {err}; check the output directory's permissions",
                profile.path.display()
            ));
            return false;
        }
    }
    if let Some(parent) = profile.path.parent() {
        touched_dirs.insert(parent.to_path_buf());
    }
    true
}

/// Removes the per-process directories this pass emptied. `remove_dir` only removes empty
/// directories, so one that still holds files (or got a new one) simply stays.
fn remove_emptied_dirs(dirs: &BTreeSet<PathBuf>, report: &mut RetentionReport) {
    for dir in dirs {
        match fs::remove_dir(dir) {
            Ok(()) => report.removed_dirs += 1,
            Err(err) if matches!(err.kind(), io::ErrorKind::DirectoryNotEmpty | io::ErrorKind::NotFound) => {}
            Err(err) => report.record(format!("failed to remove emptied directory {}: {err}", dir.display())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOUR: Duration = Duration::from_secs(3600);
    const DAY: Duration = Duration::from_secs(24 * 3600);

    /// A fresh output directory, removed on drop; `now` is fixed so ages are exact.
    struct OutputDir {
        root: PathBuf,
        now: SystemTime,
    }

    impl OutputDir {
        fn new(test: &str) -> Self {
            let root = std::env::temp_dir().join(format!("profiler-retention-{test}-{}", std::process::id()));
            let _ = fs::remove_dir_all(&root);
            fs::create_dir_all(&root).unwrap();
            Self { root, now: SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000) }
        }

        /// Writes `bytes` bytes at `relative`, last modified `age` before `now`.
        fn file(&self, relative: &str, bytes: usize, age: Duration) -> PathBuf {
            let path = self.root.join(relative);
            fs::create_dir_all(path.parent().unwrap()).unwrap();
            fs::write(&path, vec![0u8; bytes]).unwrap();
            fs::File::options().write(true).open(&path).unwrap().set_modified(self.now - age).unwrap();
            path
        }

        fn enforce(&self, policy: &Retention) -> RetentionReport {
            enforce(&self.root, policy, self.now)
        }
    }

    impl Drop for OutputDir {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.root);
        }
    }

    fn policy(max_age: Duration, max_total_bytes: u64) -> Retention {
        Retention { max_age, max_total_bytes, min_free_bytes: 0 }
    }

    #[test]
    fn deletes_expired_profiles_and_the_dirs_they_leave_empty() {
        let out = OutputDir::new("age");
        let old = out.file("app-1/cpu-20231101T000000Z.pb.gz", 10, 8 * DAY);
        let new = out.file("app-1/cpu-20231113T000000Z.pb.gz", 20, DAY);
        out.file("gone-2/cpu-20231101T000000Z.pb.gz", 30, 8 * DAY);
        let future = out.file("app-1/heap-20231115T000000Z.pb.gz", 5, Duration::ZERO);
        fs::File::options().write(true).open(&future).unwrap().set_modified(out.now + HOUR).unwrap();

        let report = out.enforce(&policy(7 * DAY, 1 << 30));
        assert_eq!((report.deleted_files, report.deleted_bytes), (2, 40), "{report:?}");
        assert_eq!((report.remaining_files, report.remaining_bytes), (2, 25));
        assert_eq!((report.removed_dirs, report.errors), (1, 0));
        assert!(!old.exists() && new.exists() && future.exists());
        assert!(!out.root.join("gone-2").exists(), "emptied process dir removed");
    }

    #[test]
    fn deletes_oldest_first_until_under_the_size_limit() {
        let out = OutputDir::new("size");
        let oldest = out.file("a-1/cpu-1.pb.gz", 100, 3 * HOUR);
        let tie_first = out.file("b-2/cpu-1.pb.gz", 100, 2 * HOUR);
        let tie_second = out.file("b-2/cpu-2.pb.gz", 100, 2 * HOUR);
        let newest = out.file("a-1/cpu-2.pb.gz", 100, HOUR);

        let report = out.enforce(&policy(7 * DAY, 250));
        assert_eq!((report.deleted_files, report.remaining_bytes), (2, 200), "{report:?}");
        assert!(!oldest.exists() && !tie_first.exists(), "oldest, then by name");
        assert!(tie_second.exists() && newest.exists());
        assert_eq!(report.removed_dirs, 0, "both dirs still hold a profile");
    }

    #[test]
    fn a_pass_over_the_size_limit_goes_down_to_the_low_water_mark() {
        let out = OutputDir::new("low-water");
        for i in 0..20 {
            out.file(&format!("a-1/cpu-{i:02}.pb.gz"), 100, HOUR * (20 - i));
        }
        let report = out.enforce(&policy(7 * DAY, 1600));
        assert_eq!((report.deleted_files, report.remaining_bytes), (5, 1500), "{report:?}");
        assert!(!out.root.join("a-1/cpu-04.pb.gz").exists() && out.root.join("a-1/cpu-05.pb.gz").exists());
        assert_eq!(report.oldest_remaining, Some(out.now - HOUR * 15));
    }

    #[test]
    fn a_pass_is_due_only_when_something_may_be_deleted() {
        let now = SystemTime::UNIX_EPOCH + 1000 * DAY;
        const MINUTE: Duration = Duration::from_secs(60);
        let limits = policy(32 * MINUTE, 1000);
        let mut schedule = Schedule::default();
        assert!(schedule.due(now), "never passed");
        let found = |remaining_bytes, oldest: Duration| RetentionReport {
            remaining_bytes,
            oldest_remaining: Some(now - oldest),
            ..RetentionReport::default()
        };
        schedule.passed(&found(600, MINUTE), &limits, now);
        assert!(!schedule.due(now + Duration::from_secs(60)));
        schedule.wrote(399);
        assert!(!schedule.due(now), "1 byte of headroom left");
        schedule.wrote(1);
        assert!(schedule.due(now), "the size limit is reached");

        schedule.passed(&found(0, MINUTE), &limits, now);
        let expires = now + 31 * MINUTE;
        assert!(!schedule.due(expires), "a profile may go up to late_by after max_age");
        assert!(schedule.due(expires + late_by(limits.max_age)));
        assert_eq!(late_by(limits.max_age), Duration::from_secs(30));
        assert_eq!(late_by(7 * DAY), Duration::from_secs(600));

        schedule.passed(&RetentionReport::default(), &limits, now);
        assert!(!schedule.due(now + PASS_AT_LEAST_EVERY - Duration::from_secs(1)), "nothing left to expire");
        assert!(schedule.due(now + PASS_AT_LEAST_EVERY), "someone else may have written");

        schedule.passed(&RetentionReport { errors: 1, ..RetentionReport::default() }, &limits, now);
        assert!(schedule.due(now), "after a failure");
    }

    #[test]
    fn leaves_everything_but_profiles_alone() {
        let out = OutputDir::new("ignore");
        let age = 30 * DAY;
        let ignored = [
            out.file("app-1/.cpu-1.pb.gz.tmp-42", 10, age),
            out.file("app-1/notes.txt", 10, age),
            out.file("top-level.pb.gz", 10, age),
            out.file(".hidden-1/cpu-1.pb.gz", 10, age),
        ];
        let outside = OutputDir::new("ignore-outside");
        let target = outside.file("elsewhere.pb.gz", 10, age);
        std::os::unix::fs::symlink(&target, out.root.join("app-1/link.pb.gz")).unwrap();
        let profile = out.file("app-1/cpu-1.pb.gz", 10, age);

        let report = out.enforce(&policy(DAY, 1));
        assert_eq!((report.deleted_files, report.remaining_files, report.errors), (1, 0, 0), "{report:?}");
        assert!(!profile.exists());
        assert!(ignored.iter().all(|path| path.exists()) && target.exists());
        assert!(out.root.join("app-1").exists(), "the dir still holds the temp file");
    }

    #[test]
    fn one_failure_does_not_stop_the_pass() {
        let out = OutputDir::new("failure");
        let stuck = out.root.join("app-1/stuck.pb.gz");
        fs::create_dir_all(&stuck).unwrap(); // unlink fails on a directory, even for root
        let vanished = out.root.join("app-1/vanished.pb.gz");
        let real = out.file("app-1/real.pb.gz", 7, 2 * DAY);
        let then = out.now - 2 * DAY;
        let profiles = [&stuck, &vanished, &real]
            .map(|path| ProfileFile { modified: then, path: path.clone(), bytes: 7 })
            .to_vec();

        let mut report = RetentionReport::default();
        let mut touched = BTreeSet::new();
        let kept = delete_expired(profiles, DAY, out.now, &mut report, &mut touched);
        assert_eq!(kept.len(), 1, "only the undeletable one is kept");
        assert_eq!((report.deleted_files, report.errors), (1, 1), "a vanished file is no error");
        assert!(report.last_error.as_deref().unwrap().contains("stuck.pb.gz"), "{report:?}");
        assert!(!real.exists());
        assert!(report.to_string().contains("1 error(s)"), "{report}");
    }

    #[test]
    fn an_unreachable_free_space_floor_keeps_the_last_hour_before_the_newest() {
        // Nothing was written for a day (space has been low since): the hour before the
        // newest profile stays however long that lasts.
        let out = OutputDir::new("free");
        let recent = out.file("a-1/cpu-2.pb.gz", 10, DAY + HOUR - Duration::from_secs(60));
        out.file("a-1/cpu-1.pb.gz", 10, DAY + HOUR + Duration::from_secs(60));
        out.file("b-2/cpu-1.pb.gz", 10, DAY + 2 * HOUR);
        out.file("b-2/cpu-2.pb.gz", 10, DAY);
        let floor = Retention { max_age: 7 * DAY, max_total_bytes: 1 << 30, min_free_bytes: u64::MAX };
        let report = out.enforce(&floor);
        assert_eq!((report.deleted_files, report.remaining_files, report.removed_dirs), (2, 2, 0), "{report:?}");
        assert!(report.kept_for_floor && recent.exists(), "{report:?}");
        assert_eq!(out.enforce(&floor).deleted_files, 0, "the next pass deletes nothing more");
        // The operator's own size limit still applies to young files.
        let size = Retention { max_age: 7 * DAY, max_total_bytes: 5, min_free_bytes: u64::MAX };
        assert_eq!(out.enforce(&size).remaining_files, 0);
    }

    #[test]
    fn free_space_is_read_from_the_file_system() {
        let out = OutputDir::new("statvfs");
        assert!(available_bytes(&out.root).unwrap() > 0);
        assert!(free_space_ok(&out.root, 1).unwrap());
        assert!(!free_space_ok(&out.root, u64::MAX).unwrap());
        let missing = out.root.join("missing");
        assert!(free_space_ok(&missing, 0).unwrap(), "0 disables the check");
        let err = free_space_ok(&missing, 1).unwrap_err();
        assert!(err.to_string().contains("missing"), "{err}");
    }

    #[test]
    fn a_missing_output_dir_is_an_empty_one() {
        let out = OutputDir::new("missing");
        let report = enforce(&out.root.join("nope"), &policy(DAY, 1), out.now);
        assert_eq!(report, RetentionReport::default());
    }
}
