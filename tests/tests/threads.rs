//! `profiler threads PID`: thread dumps of fixtures whose threads block in known functions
//! (C and Rust, with and without frame pointers), checked against the fixtures' own chains,
//! against `eu-stack -p PID` frame for frame, against the fixture's watchdog (no pause while
//! it is dumped), and read back by `go tool pprof`.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use profiler_tests::{
    assert_success,
    daemon::{Daemon, DaemonConfig},
    eu_stack, go_pprof,
    pprof::Sample,
    preflight, run_profiler, Fixture, FixtureKind, Profile, TempDir,
};

/// Whether the kernel can dump threads: the task iterator's `task_struct` offsets come from
/// its BTF. Says why when it cannot (the only reason these tests skip).
fn thread_dumps_supported() -> bool {
    let btf = Path::new("/sys/kernel/btf/vmlinux").exists();
    if !btf {
        eprintln!("skipping: the kernel has no BTF (/sys/kernel/btf/vmlinux), which thread dumps need");
    }
    btf
}

/// Long enough for every dump of a test; the guard kills the fixture after.
const FIXTURE_S: u32 = 120;

/// A thread the fixture blocks in a known place: its name (`None`: the main thread, named
/// after the process), the system call, a pattern of the blocking function (a substring: the
/// C library's internal names vary), and its own chain, leaf to root. `wakes` marks a thread
/// that wakes on a timer (every 1 or 10 ms): /proc's state, syscall and wchan files are read one
/// after another, so the dump may find it running, or woken between two of those reads.
struct Blocked {
    thread: Option<&'static str>,
    wakes: bool,
    syscall: &'static str,
    blocking: &'static str,
    chain: &'static [&'static str],
}

const C_THREADS: &[Blocked] = &[
    Blocked {
        thread: Some("cond_wait"),
        wakes: false,
        syscall: "futex",
        blocking: "pthread_cond_wait",
        chain: &["wait_on_cond", "cond_thread", "start_thread"],
    },
    Blocked {
        thread: Some("pipe_read"),
        wakes: false,
        syscall: "read",
        blocking: "read",
        chain: &["read_pipe", "pipe_thread", "start_thread"],
    },
    Blocked {
        thread: Some("nanosleep"),
        wakes: false,
        syscall: "clock_nanosleep",
        blocking: "nanosleep",
        chain: &["sleep_long", "sleep_thread", "start_thread"],
    },
    Blocked {
        thread: Some("mutex_lock"),
        wakes: false,
        syscall: "futex",
        blocking: "pthread_mutex_lock",
        chain: &["lock_held_mutex", "lock_thread", "start_thread"],
    },
    Blocked {
        thread: Some("epoll_wait"),
        wakes: false,
        syscall: "epoll_wait",
        blocking: "epoll_wait",
        chain: &["poll_nothing", "epoll_thread", "start_thread"],
    },
    Blocked {
        thread: Some("watchdog"),
        wakes: true,
        syscall: "clock_nanosleep",
        blocking: "nanosleep",
        chain: &["watchdog_tick", "watchdog_thread", "start_thread"],
    },
    Blocked {
        thread: None,
        wakes: false,
        syscall: "clock_nanosleep",
        blocking: "nanosleep",
        chain: &["main_wait", "main"],
    },
    Blocked {
        thread: Some("ticker"),
        wakes: true,
        syscall: "futex",
        blocking: "pthread_cond",
        chain: &["tick_wait", "ticker_thread", "start_thread"],
    },
];

const RUST_THREADS: &[Blocked] = &[
    Blocked {
        thread: Some("rust_mutex"),
        wakes: false,
        syscall: "futex",
        blocking: "Mutex<T>::lock",
        chain: &["lock_contended", "locker", "start_thread"],
    },
    Blocked {
        thread: Some("rust_sleep"),
        wakes: false,
        syscall: "clock_nanosleep",
        blocking: "sleep",
        chain: &["sleep_long", "sleeper", "start_thread"],
    },
    Blocked {
        thread: None,
        wakes: false,
        syscall: "clock_nanosleep",
        blocking: "sleep",
        chain: &["main_wait", "main"],
    },
];

/// The busy thread of each fixture, and its chain when its stack could be walked.
const C_BUSY: (&str, &[&str]) = ("busy", &["spin", "busy_thread", "start_thread"]);
const RUST_BUSY: (&str, &[&str]) = ("rust_busy", &["spin", "busy", "start_thread"]);

fn expected(kind: FixtureKind) -> (&'static [Blocked], (&'static str, &'static [&'static str])) {
    match kind {
        FixtureKind::ThreadDumpC | FixtureKind::ThreadDumpCNoFp => (C_THREADS, C_BUSY),
        _ => (RUST_THREADS, RUST_BUSY),
    }
}

const FIXTURES: [FixtureKind; 4] = [
    FixtureKind::ThreadDumpC,
    FixtureKind::ThreadDumpCNoFp,
    FixtureKind::ThreadDumpRust,
    FixtureKind::ThreadDumpRustNoFp,
];

/// `profiler threads PID --debug 0 -o FILE`, decoded.
fn dump(fixture: &Fixture, out: &TempDir) -> Profile {
    let file = out.path().join(format!("threads-{}.pb.gz", fixture.pid()));
    let path = file.to_str().unwrap();
    let args = ["threads", &fixture.pid().to_string(), "--debug", "0", "--output", path];
    assert_success(&run_profiler(&args), "profiler threads");
    Profile::decode(&file)
}

fn thread<'a>(profile: &'a Profile, name: &str) -> &'a Sample {
    let found: Vec<&Sample> = profile.samples.iter().filter(|s| s.label_str("thread") == Some(name)).collect();
    assert_eq!(found.len(), 1, "one thread named {name:?}; the dump has {:?}", names(profile));
    found[0]
}

fn names(profile: &Profile) -> Vec<&str> {
    profile.samples.iter().filter_map(|s| s.label_str("thread")).collect()
}

/// The blocking function, then the thread's own chain, in order, all in user frames.
fn has_blocking_chain(sample: &Sample, blocked: &Blocked) -> bool {
    let user = sample.user_frames();
    let Some(at) = user.iter().position(|f| f.function.contains(blocked.blocking)) else { return false };
    profiler_tests::pprof::has_chain(&user[at..], blocked.chain)
}

#[test]
fn every_thread_appears_with_its_state_syscall_and_whole_chain() {
    if !preflight() || !thread_dumps_supported() {
        return;
    }
    let out = TempDir::new("threads-chains");
    for kind in FIXTURES {
        let fixture = Fixture::spawn(kind, FIXTURE_S);
        let profile = dump(&fixture, &out);
        assert_eq!(profile.sample_types, [("goroutine".to_string(), "count".to_string())]);
        let (blocked, (busy, busy_chain)) = expected(kind);
        assert_eq!(profile.samples.len(), blocked.len() + 1, "{kind:?}: one sample per thread: {:?}", names(&profile));
        for b in blocked {
            let sample = thread(&profile, b.thread.unwrap_or(fixture.comm()));
            let what = format!("{kind:?} thread {:?}: {:?}", b.thread, sample.names());
            if b.wakes && sample.label_str("state") == Some("R") {
                continue; // caught awake: where it runs is the busy thread's case
            }
            assert_eq!(sample.label_str("state"), Some("S"), "{what}");
            assert_eq!(sample.label_str("syscall"), Some(b.syscall), "{what}");
            // A timer thread found asleep may be awake again by the time wchan is read.
            assert!(b.wakes || sample.label_str("wchan").is_some(), "{what}");
            assert_eq!(sample.values, [1], "{what}");
            assert!(sample.kernel_frames().next().is_some(), "a blocked thread has a kernel stack: {what}");
            assert!(has_blocking_chain(sample, b), "{what}");
            let tid = sample.label_num("tid").expect("a tid label");
            assert!(Path::new(&format!("/proc/{}/task/{tid}", fixture.pid())).exists(), "{what}: tid {tid}");
        }
        let sample = thread(&profile, busy);
        let how = sample.label_str("stack").unwrap_or_default();
        let what = format!("{kind:?} busy thread ({how}): {:?}", sample.names());
        assert_eq!(sample.label_str("state"), Some("R"), "{what}");
        match how {
            // Off the CPU at that moment (preempted): walked from where it was interrupted.
            "walked" => assert!(sample.has_chain(busy_chain), "{what}"),
            // On a CPU: its saved registers are stale; without a daemon there is no sample.
            "running, no cpu sample" => assert!(sample.user_frames().is_empty(), "{what}"),
            other => panic!("unexpected stack source {other:?}: {what}"),
        }
    }
}

/// A dump's user stack as eu-stack prints it: one pc per location (inlined frames share
/// it), each caller-adjusted address back to the return address it came from.
fn user_pcs(sample: &Sample) -> Vec<u64> {
    let mut pcs: Vec<u64> = sample.user_frames().iter().map(|f| f.address + 1).collect();
    pcs.dedup();
    pcs
}

#[test]
fn stacks_are_eu_stacks_frame_for_frame() {
    if !preflight() || !thread_dumps_supported() {
        return;
    }
    let out = TempDir::new("threads-eu-stack");
    for kind in FIXTURES {
        let fixture = Fixture::spawn(kind, FIXTURE_S);
        let profile = dump(&fixture, &out);
        // After ours: eu-stack stops the threads, and they resume the same calls.
        let (reference, _) = eu_stack::dump(fixture.pid());
        let tids: BTreeMap<i64, &Sample> =
            profile.samples.iter().map(|s| (s.label_num("tid").expect("a tid label"), s)).collect();
        assert_eq!(
            tids.keys().map(|&t| t as u32).collect::<Vec<_>>(),
            reference.keys().copied().collect::<Vec<_>>(),
            "{kind:?}: the same threads"
        );
        let (blocked, (busy, _)) = expected(kind);
        for (tid, sample) in tids {
            if sample.label_str("thread") == Some(busy) {
                continue; // it moved between the two dumps
            }
            let theirs = &reference[&(tid as u32)];
            let their_pcs: Vec<u64> = theirs.iter().map(|f| f.address).collect();
            assert_eq!(
                user_pcs(sample),
                their_pcs,
                "{kind:?} thread {tid} {:?}: ours {:?}, eu-stack's {:?}",
                sample.label_str("thread"),
                sample.names(),
                theirs.iter().map(|f| f.function.as_str()).collect::<Vec<_>>()
            );
            // The program's own functions, which both name from the same symbol table: the
            // frame at each of eu-stack's addresses has eu-stack's name among ours.
            let own = blocked.iter().flat_map(|b| b.chain.iter()).filter(|f| **f != "start_thread");
            for function in own {
                let Some(eu) =
                    theirs.iter().find(|f| profiler_tests::name_matches(&without_hash(&f.function), function))
                else {
                    continue;
                };
                let named = sample
                    .user_frames()
                    .iter()
                    .any(|f| f.address + 1 == eu.address && profiler_tests::name_matches(&f.function, function));
                assert!(
                    named,
                    "{kind:?} thread {tid}: eu-stack's {eu:?} is not {function} in ours: {:?}",
                    sample.names()
                );
            }
        }
    }
}

/// A Rust symbol as eu-stack demangles it, without the legacy mangling's `::h<hash>`.
fn without_hash(name: &str) -> String {
    match name.rsplit_once("::h") {
        Some((path, hash)) if hash.len() == 16 && hash.bytes().all(|b| b.is_ascii_hexdigit()) => path.to_string(),
        _ => name.to_string(),
    }
}

/// CLOCK_MONOTONIC in nanoseconds, the clock of the fixture's watchdog.
fn monotonic_ns() -> i64 {
    let mut t = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `t` is a valid timespec to write.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut t) };
    t.tv_sec * 1_000_000_000 + t.tv_nsec
}

/// The largest late wakeup of the watchdog whose sleep overlaps one of `windows`.
fn worst_in(pauses: &[(i64, i64)], windows: &[(i64, i64)]) -> i64 {
    let overlaps = |at: i64, late: i64| windows.iter().any(|&(s, e)| at + 1_000_000 + late >= s && at <= e);
    pauses.iter().filter(|&&(at, late)| overlaps(at, late)).map(|&(_, late)| late).max().unwrap_or(0)
}

/// The fixture's watchdog (1 ms sleeps, late wakeups noted with CLOCK_MONOTONIC) while a
/// daemon dumps it again and again: no wakeup later than its undisturbed jitter. The daemon,
/// loaded and warm, is what dumps a process in production; a cold `profiler threads` run
/// also loads BPF programs and symbolizes, CPU work that competes with the watchdog on a
/// two-CPU machine without stopping it. eu-stack's pause on the same watchdog is printed
/// for contrast (`cargo xtask bench threads` measures it at 10-1,000 threads).
#[test]
fn dumping_never_pauses_the_process() {
    if !preflight() || !thread_dumps_supported() {
        return;
    }
    let mut config = DaemonConfig::new(&[FixtureKind::ThreadDumpC.comm()]);
    config.profiles = vec!["threads"];
    let daemon = Daemon::start(&config);
    let mut fixture = Fixture::spawn(FixtureKind::ThreadDumpC, 10);
    let query = format!("/debug/pprof/goroutine?pid={}&debug=1", fixture.pid());
    daemon.get_ok(&query); // warm: the first dump builds tables and reads symbols
    let (mut quiet, mut dumping, mut eu) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..5 {
        let start = monotonic_ns();
        std::thread::sleep(Duration::from_millis(300));
        quiet.push((start, monotonic_ns()));
        for _ in 0..5 {
            let start = monotonic_ns();
            daemon.get_ok(&query);
            dumping.push((start, monotonic_ns()));
        }
        let start = monotonic_ns();
        eu_stack::dump(fixture.pid());
        eu.push((start, monotonic_ns()));
    }
    let pauses = watchdog_pauses(&mut fixture);
    let (worst_quiet, worst_dumping, worst_eu) =
        (worst_in(&pauses, &quiet), worst_in(&pauses, &dumping), worst_in(&pauses, &eu));
    eprintln!(
        "watchdog: worst late wakeup {worst_quiet} ns undisturbed, {worst_dumping} ns while the daemon dumped it \
         ({} dumps), {worst_eu} ns while eu-stack did",
        dumping.len()
    );
    // Normal jitter on a shared two-CPU machine reaches milliseconds; 5 ms is the floor.
    let allowed = (2 * worst_quiet).max(5_000_000);
    assert!(worst_dumping <= allowed, "a pause of {worst_dumping} ns while dumped; undisturbed: {worst_quiet} ns");
}

/// The fixture's late wakeups (start, lateness in ns), printed when it exits.
fn watchdog_pauses(fixture: &mut Fixture) -> Vec<(i64, i64)> {
    fixture.read_value("watchdog ticks");
    let mut pauses = Vec::new();
    loop {
        let mut line = String::new();
        fixture.read_line(&mut line);
        let fields: Vec<&str> = line.split_whitespace().collect();
        match fields.as_slice() {
            ["pause", at, late] => pauses.push((at.parse().unwrap(), late.parse().unwrap())),
            ["done"] => return pauses,
            other => panic!("unexpected fixture line {other:?}"),
        }
    }
}

#[test]
fn go_tool_pprof_reads_the_dump_with_its_labels() {
    if !preflight() || !thread_dumps_supported() {
        return;
    }
    let out = TempDir::new("threads-go");
    let fixture = Fixture::spawn(FixtureKind::ThreadDumpC, FIXTURE_S);
    let file = out.path().join("threads.pb.gz");
    let args = ["threads", &fixture.pid().to_string(), "--debug", "0", "--output", file.to_str().unwrap()];
    assert_success(&run_profiler(&args), "profiler threads --debug 0");
    let traces = go_pprof::traces(&file);
    // Labels as `-traces` prints them: `    thread:  cond_wait`.
    for needle in ["thread:  cond_wait\n", "syscall:  epoll_wait\n", "wait_on_cond\n", "start_thread\n", "state:  S\n"]
    {
        assert!(traces.contains(needle), "go tool pprof -traces lacks {needle:?}:\n{traces}");
    }
    let text = run_profiler(&["threads", &fixture.pid().to_string(), "--debug", "2"]);
    assert_success(&text, "profiler threads --debug 2");
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(text.contains("\"cond_wait\" [futex, S, wchan "), "{text}");
    assert!(text.contains(&format!("thread {} \"{}\" [clock_nanosleep, S", fixture.pid(), fixture.comm())), "{text}");
    let grouped = run_profiler(&["threads", &fixture.pid().to_string(), "--debug", "1"]);
    let grouped = String::from_utf8_lossy(&grouped.stdout);
    assert!(grouped.starts_with("threads profile: total 9\n"), "{grouped}");
}

/// `snapshot --profiles cpu,threads` writes `threads.pb.gz`, the state at the end of the
/// capture; its busy thread, on a CPU then, shows the stack of its CPU samples, marked.
#[test]
fn a_snapshot_writes_the_threads_at_its_end() {
    if !preflight() || !thread_dumps_supported() {
        return;
    }
    let out = TempDir::new("threads-snapshot");
    let fixture = Fixture::spawn(FixtureKind::ThreadDumpCNoFp, FIXTURE_S);
    let pid = fixture.pid().to_string();
    let dir = out.path().to_str().unwrap();
    let args = ["snapshot", "--profiles", "cpu,threads", "--pid", &pid, "--duration", "2s", "--output", dir];
    assert_success(&run_profiler(&args), "profiler snapshot --profiles cpu,threads");
    let file = profiler_tests::process_dir(out.path(), fixture.comm(), fixture.pid()).join("threads.pb.gz");
    let profile = Profile::decode(&file);
    assert_eq!(profile.samples.len(), 9, "{:?}", names(&profile));
    let busy = thread(&profile, "busy");
    let how = busy.label_str("stack").unwrap_or_default();
    assert!(how == "walked" || how.starts_with("cpu sample"), "{how}");
    assert!(busy.has_chain(C_BUSY.1), "{how}: {:?}", busy.names());
    let cond = thread(&profile, "cond_wait");
    assert!(has_blocking_chain(cond, &C_THREADS[0]), "{:?}", cond.names());
}

/// The two walkers are twins: the ticker's timed condition waits are walked in the kernel
/// at each futex entry (the block profile) and in userspace from the same entry's saved
/// registers (the dump). Same rows, same rules: the same user stack, address for address,
/// with tables (no frame pointers) and with frame pointers.
#[test]
fn the_userspace_walker_finds_the_kernel_walkers_stack() {
    if !preflight() || !thread_dumps_supported() {
        return;
    }
    let out = TempDir::new("threads-twin");
    for kind in [FixtureKind::ThreadDumpCNoFp, FixtureKind::ThreadDumpC] {
        let fixture = Fixture::spawn(kind, FIXTURE_S);
        let pid = fixture.pid().to_string();
        let dir = out.path().join(format!("{kind:?}"));
        let dir = dir.to_str().unwrap();
        let args = ["snapshot", "--profiles", "block,threads", "--pid", &pid, "--duration", "2s", "--output", dir];
        assert_success(&run_profiler(&args), "profiler snapshot --profiles block,threads");
        let process = profiler_tests::process_dir(Path::new(dir), fixture.comm(), fixture.pid());
        let dump = Profile::decode(&process.join("threads.pb.gz"));
        let ticker = thread(&dump, "ticker");
        let ours: Vec<u64> = ticker.user_frames().iter().map(|f| f.address).collect();
        let block = Profile::decode(&process.join("block.pb.gz"));
        let kernels: Vec<Vec<u64>> = block
            .samples
            .iter()
            .filter(|s| s.contains("tick_wait"))
            .map(|s| s.user_frames().iter().map(|f| f.address).collect())
            .collect();
        assert!(!kernels.is_empty(), "{kind:?}: no block sample of tick_wait");
        assert!(
            kernels.contains(&ours),
            "{kind:?}: the dump's ticker stack {:?} is none of the kernel walker's {kernels:x?}",
            ticker.names()
        );
    }
}
