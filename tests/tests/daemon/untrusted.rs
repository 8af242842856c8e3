//! Files any local user controls, read by the root daemon: a JIT's `/tmp/perf-PID.map`.
//! The owner of a process plants there what would hang, exhaust or leak from a careless
//! reader; the daemon refuses each one, says so in the profile and in `/status`, and keeps
//! answering and dumping.

use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::Path;
use std::time::{Duration, Instant};

use profiler_tests::daemon::{Daemon, DaemonConfig};
use profiler_tests::{preflight, Fixture, FixtureKind, Profile};

use super::{new_files, FIXTURE_S};

/// nobody's uid and gid, as `Fixture::spawn_as_nobody` runs the fixture.
const NOBODY: u32 = 65534;
/// What the daemon may take to answer `/status` while a planted file waits to be read.
const ANSWER_WITHIN: Duration = Duration::from_secs(1);
/// Above the daemon's steady ~50 MiB and a perf map read's buffers, below what a dense
/// 60 MiB map parsed whole (~500 MiB) or a sparse 10 GiB file would take.
const MAX_RSS_KIB: u64 = 200 << 10;

/// Ground truth: jit_spin, run as nobody and writing no perf map of its own, spends its time
/// in code only a perf map can name. Planted in turn at its `/tmp/perf-PID.map`:
///
/// - a FIFO nobody ever writes (a blocking open would hang the collector forever);
/// - a symbolic link to `/dev/zero` (an endless read);
/// - a 10 GiB sparse file owned by nobody (a read into memory would exhaust it);
/// - a symbolic link to, and then a hard link of, a root-only file that names the code
///   `leaked_secret` (a hard link like that is what `fs.protected_hardlinks=0` allows): a
///   daemon that read it would show root's file to the process's owner;
/// - `/dev/null` bind-mounted over it (a device's driver must not run);
///
/// each is refused: the profile's comment names the file and why, `/status` counts it and
/// answers within a second, the dumps go on, and the daemon's memory stays bounded. Then a
/// valid but dense 60 MiB map of nobody's names the code `jit_spin` with the memory still
/// bounded, so the reader does work.
#[test]
fn planted_perf_maps_are_refused_and_a_real_one_is_read() {
    if !preflight() {
        return;
    }
    let mut config = DaemonConfig::new(&["jit_spin"]);
    config.interval = "1s".into();
    let daemon = Daemon::start(&config);
    let mut fixture =
        Fixture::spawn_as_nobody_with_args(FixtureKind::JitSpin, &[&FIXTURE_S.to_string(), "none"], daemon.scratch());
    let (code, length) = (fixture.read_value("code"), fixture.read_value("length"));
    let map = std::path::PathBuf::from(format!("/tmp/perf-{}.map", fixture.pid()));
    let _cleanup = Remove(map.clone());
    // In /tmp too: a hard link cannot cross file systems.
    let secret = std::path::PathBuf::from(format!("/tmp/profiler-root-only-{}.map", std::process::id()));
    let _cleanup_secret = Remove(secret.clone());
    std::fs::write(&secret, format!("{code:x} {length:x} leaked_secret\n")).unwrap();
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();

    let plants: [(&str, &Plant<'_>, &str); 6] = [
        ("a FIFO", &|p| mkfifo(p), "is a FIFO, not a regular file"),
        ("a link to /dev/zero", &|p| symlink("/dev/zero", p).unwrap(), "is a symbolic link, not a regular file"),
        ("a 10 GiB sparse file", &|p| sparse(p, 10 << 30), "over the 67108864-byte cap"),
        ("a link to a root-only file", &|p| symlink(&secret, p).unwrap(), "is a symbolic link, not a regular file"),
        ("a hard link of a root-only file", &|p| std::fs::hard_link(&secret, p).unwrap(), "owned by uid 0"),
        // What a user namespace's bind mount (or a container's mknod) puts there: a device,
        // whose driver must not even be opened.
        ("/dev/null bound over it", &|p| bind_device(p), "is a character device, not a regular file"),
    ];
    let mut refused_before = daemon.status_u64("/refused/perf_maps");
    for (what, plant, why) in plants {
        unbind(&map);
        let _ = std::fs::remove_file(&map);
        plant(&map);
        let profile = profile_after_plant(&daemon, &fixture);
        let comment = profile.comments.iter().find(|c| c.contains("file not fully read"));
        let comment = comment.unwrap_or_else(|| panic!("{what}: no refusal in the comments {:?}", profile.comments));
        assert!(comment.contains(&map.display().to_string()) && comment.contains(why), "{what}: {comment}");
        assert!(
            !profile.function_names().contains(&"leaked_secret"),
            "{what}: root's file was read for nobody's process"
        );
        let started = Instant::now();
        let refused = daemon.status_u64("/refused/perf_maps");
        assert!(started.elapsed() < ANSWER_WITHIN, "{what}: /status took {:?}", started.elapsed());
        assert!(refused > refused_before, "{what}: /status counts {refused} refusals, as before");
        refused_before = refused;
        let rss = rss_kib(daemon.pid());
        assert!(rss < MAX_RSS_KIB, "{what}: the daemon's RSS is {rss} KiB");
    }

    unbind(&map);
    let _ = std::fs::remove_file(&map);
    // Under the cap but dense: 60 MiB of a million one-byte functions elsewhere, then the
    // code's own line. Read as a stream keeping only the addresses sampled, it costs no
    // memory to speak of (parsed whole, it would take several hundred MiB).
    let mut text = String::with_capacity(61 << 20);
    let mut n: u64 = 0x1000;
    while text.len() < 60 << 20 {
        text.push_str(&format!("{n:x} 1 f\n"));
        n += 2;
    }
    text.push_str(&format!("{code:x} {length:x} jit_spin\n"));
    std::fs::write(&map, text).unwrap();
    std::os::unix::fs::chown(&map, Some(NOBODY), Some(NOBODY)).unwrap();
    let profile = profile_after_plant(&daemon, &fixture);
    let rss = rss_kib(daemon.pid());
    assert!(rss < MAX_RSS_KIB, "a dense 60 MiB perf map: the daemon's RSS is {rss} KiB");
    // Nearly all its time is in the generated code; half is far below that, far above 0.
    let named = profile.fraction_where("samples", |s| s.leaf_is("jit_spin"));
    assert!(named > 0.5, "nobody's own perf map named {named:.2} of the samples: {:?}", profile.function_names());
    assert!(!profile.comments.iter().any(|c| c.contains("file not fully read")), "{:?}", profile.comments);
    // Counted by source, in the profile and in /status.
    let by_source = profile.comments.iter().find(|c| c.starts_with("frame names by source")).unwrap();
    assert!(!by_source.contains("perf map 0,"), "{by_source}");
    assert!(daemon.status_u64("/frame_names_by_source/perf_map") > 0, "{:#}", daemon.status());
    assert!(daemon.status_u64("/frame_names_by_source/symbol_table") > 0, "{:#}", daemon.status());
}

/// Puts something at a path.
type Plant<'a> = dyn Fn(&Path) + 'a;

/// The second CPU profile written after now: the first may have been rendered before the
/// plant.
fn profile_after_plant(daemon: &Daemon, fixture: &Fixture) -> Profile {
    let files = new_files(daemon, fixture, 2);
    Profile::decode(files.last().expect("two new files"))
}

fn mkfifo(path: &Path) {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0, "mkfifo {}", path.display());
    std::os::unix::fs::chown(path, Some(NOBODY), Some(NOBODY)).unwrap();
}

fn bind_device(path: &Path) {
    std::fs::write(path, "").unwrap();
    let status = std::process::Command::new("mount").arg("--bind").arg("/dev/null").arg(path).status().unwrap();
    assert!(status.success(), "mount --bind /dev/null {}", path.display());
}

/// Undoes [`bind_device`], if it was done (a failure means nothing was mounted there).
fn unbind(path: &Path) {
    let _ = std::process::Command::new("umount").arg(path).stderr(std::process::Stdio::null()).status();
}

fn sparse(path: &Path, len: u64) {
    std::fs::File::create(path).unwrap().set_len(len).unwrap();
    std::os::unix::fs::chown(path, Some(NOBODY), Some(NOBODY)).unwrap();
}

fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).expect("VmRSS in /proc/PID/status");
    line.split_whitespace().nth(1).and_then(|n| n.parse().ok()).expect("VmRSS in kB")
}

/// Removes the planted file when the test ends, passed or not.
struct Remove(std::path::PathBuf);

impl Drop for Remove {
    fn drop(&mut self) {
        unbind(&self.0);
        let _ = std::fs::remove_file(&self.0);
    }
}
