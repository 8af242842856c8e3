//! Python frames in the sampled profiles (CPU and block), as the thread dumps already have
//! them (tests/tests/python.rs): under each supported CPython (Debian's static 3.11, pyenv's
//! shared 3.11, 3.12, 3.13), the interpreter loop's `_PyEval_EvalFrameDefault` frames give way
//! to the Python functions they ran, with files and lines, and a C extension's native frames
//! stay above the Python function that called it.
//!
//! The fixtures measure their own truth and log it with CLOCK_MONOTONIC stamps
//! (tests/fixtures/py_cpu.py: each function's and each thread's CPU time, on the thread CPU
//! clock the kernel samples on; py_lock.py: every wait for a `threading.Lock`). Each test
//! compares the profile with what the log says of the capture window, from the profiler's
//! `capturing` line to the end of its duration.

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::Duration,
};

use profiler_tests::{
    assert_success, go_pprof, listing,
    pprof::Sample,
    preflight, process_dir,
    python::{fixture_path, interpreters, marked_lines, py_spy, Interpreter, PythonFixture},
    run::{wait_with_timeout, Running},
    Frame, Profile, TempDir,
};

const PYTHON_MAPPING: &str = "[python]";
const EVAL: &str = "_PyEval_EvalFrameDefault";
const FREQUENCY_HZ: &str = "999";
/// About 2,000 samples of one busy thread (or of two taking turns on the GIL) at 999 Hz:
/// over three times the samples that [`SHARE_TOLERANCE`] needs to be [`MIN_SIGMAS`].
const CPU_CAPTURE: Duration = Duration::from_secs(2);
/// About 270 waits of ~8 ms by py_lock.py's waiter, ~2.2 s of delay.
const BLOCK_CAPTURE: Duration = Duration::from_secs(3);
/// Long enough to outlast the profiler's start and any capture; the guard kills it after.
const FIXTURE_S: &str = "120";
/// A sampled CPU share against the fixture's own clock: ±6 points...
const SHARE_TOLERANCE: f64 = 0.06;
/// ...which must be at least this many binomial standard deviations, √(p(1−p)/n): for
/// p = 0.75 that takes n ≥ 638 samples (851 for p = 0.5); a capture with fewer fails as such.
const MIN_SIGMAS: f64 = 3.5;
/// hot_a's Python frames, leaf first, in py_cpu.py's `split` mode.
const HOT_A_CHAIN: [&str; 4] = ["hot_a", "dispatch", "main", "<module>"];
/// Of hot_a's samples, those with the whole chain (the others hold a prefix of it: a walk
/// cut short, never a frame out of order).
const MIN_WHOLE_CHAIN: f64 = 0.90;
/// Of a function's samples, those on the marked line where it loops (the rest: its other
/// lines, a few instructions each).
const MIN_ON_MARKED_LINE: f64 = 0.90;
/// Of all samples, those whose Python frames were placed (a Python frame, no
/// `_PyEval_EvalFrameDefault` left): every sample of the window is in Python code.
const MIN_PLACED: f64 = 0.90;
/// zlib's share of hot_a's samples against the fixture's: ±8 points, ~6σ at ~1,300 hot_a
/// samples with p ≈ 0.35; the rest for the CPython glue of the call (argument parsing,
/// the GIL's release), which the fixture counts and the zlib frames may not show.
const ZLIB_TOLERANCE: f64 = 0.08;
/// The block delay under `waiter` against the waits it measured, as tests/tests/futex.rs.
const DELAY_TOLERANCE: f64 = 0.15;

/// Split: the 75/25 shares, the chain, the lines and zlib's frames above hot_a.
#[test]
fn python_cpu_profile_splits_hot_a_and_hot_b_with_chain_lines_and_zlib_frames() {
    if !preflight() {
        return;
    }
    for python in supported() {
        eprintln!("checking {} ({})", python.label, python.path.display());
        check_split(&python);
    }
}

/// Two Python threads spinning in their own functions: each thread's samples (label `tid`)
/// hold its function and never the other's, in the shares the threads measured.
#[test]
fn python_threads_cpu_samples_are_each_their_own() {
    if !preflight() {
        return;
    }
    for python in supported() {
        eprintln!("checking {} ({})", python.label, python.path.display());
        check_threads(&python);
    }
}

/// A `threading.Lock` contended from Python: the block profile charges the waits to the
/// Python function `waiter`, on the line of its `acquire()`, within 15% of what it measured.
#[test]
fn python_lock_waits_name_the_waiting_python_function() {
    if !preflight() {
        return;
    }
    for python in supported() {
        eprintln!("checking {} ({})", python.label, python.path.display());
        check_lock(&python);
    }
}

/// A CPython process in its own pid namespace (as in a container): it knows its threads by
/// their ids there, and the walker asks the kernel for those. One interpreter is enough:
/// the namespace, not the version, is what differs.
#[test]
fn python_frames_of_a_process_in_another_pid_namespace() {
    if !preflight() {
        return;
    }
    let python = &supported()[0];
    let out = TempDir::new("python-pidns");
    let script = fixture_path("py_cpu.py");
    let log_path = out.path().join("split.log");
    let fixture =
        PythonFixture::spawn_in_new_pid_namespace(&python.path, &script, &["split", path_str(&log_path), FIXTURE_S]);
    let ns_pid = std::fs::read_to_string(format!("/proc/{}/status", fixture.pid()))
        .ok()
        .and_then(|status| status.lines().find(|l| l.starts_with("NSpid:")).map(str::to_string));
    let what = format!("CPython {} in a new pid namespace ({ns_pid:?})", python.label);
    assert!(ns_pid.as_deref().is_some_and(|l| l.trim_end().ends_with("\t1")), "{what}: pid 1 in its namespace");
    let capture = capture(&fixture, &out, "cpu", CPU_CAPTURE);
    let truth = Log::read(&log_path).delta("cpu", capture.window);
    let profile = &capture.profile;
    check_comment(profile, python, &what);
    check_placed(profile, "samples", &what);
    let got = (samples_in(profile, "hot_a"), samples_in(profile, "hot_b"));
    check_share(profile, ("hot_a", "hot_b"), got, (truth["hot_a"], truth["hot_b"]), &what);
}

/// A Python process that execs a new Python (one pid, two images, as `multiprocessing`'s
/// spawn starts its workers): the new image's Python frames are walked too. The first image
/// sleeps for a second of the capture, so nearly every CPU sample is the second's.
#[test]
fn python_frames_after_an_exec_of_another_python() {
    if !preflight() {
        return;
    }
    let python = &supported()[0];
    let out = TempDir::new("python-reexec");
    let script = fixture_path("py_cpu.py");
    let log_path = out.path().join("split.log");
    let fixture = PythonFixture::spawn(&python.path, &script, &["reexec", path_str(&log_path), FIXTURE_S]);
    let what = format!("CPython {} exec'd by itself", python.label);
    let capture = capture(&fixture, &out, "cpu", Duration::from_secs(3));
    let profile = &capture.profile;
    check_comment(profile, python, &what);
    check_placed(profile, "samples", &what);
    assert!(samples_in(profile, "hot_a") > 0, "{what}: the second image's hot_a");
}

/// A CPython the walker cannot read (3.10) keeps its interpreter loop's native frames in
/// its CPU profile, and the comment says why.
#[test]
fn python_cpu_profile_of_an_unsupported_python_says_why() {
    if !preflight() {
        return;
    }
    let Some(python) = interpreters(&[(3, 10)]).into_iter().next() else {
        eprintln!("no CPython 3.10 on the machine: the unsupported case is not checked");
        return;
    };
    let out = TempDir::new("python-unsupported-cpu");
    let script = fixture_path("py_cpu.py");
    let log_path = out.path().join("split.log");
    let fixture = PythonFixture::spawn(&python.path, &script, &["split", path_str(&log_path), FIXTURE_S]);
    let profile = capture(&fixture, &out, "cpu", Duration::from_millis(500)).profile;
    let comments = &profile.comments;
    assert!(
        comments.iter().any(|c| c.starts_with("python: native frames only: ") && c.contains("3.10")),
        "the comment says why: {comments:?}"
    );
    assert!(profile.samples.iter().all(|s| !s.stack.iter().any(is_python)), "no Python frame");
    assert!(profile.samples.iter().any(|s| s.stack.iter().any(|f| f.function == EVAL)), "the loop's frames stay");
}

/// Heap samples of CPython's allocations are charged to the Python functions that made
/// them: alloc_big's share of the sampled bytes against the bytes the fixture asked for.
#[test]
fn python_heap_profile_names_the_allocating_functions() {
    if !preflight() {
        return;
    }
    for python in supported() {
        eprintln!("checking {} ({})", python.label, python.path.display());
        let out = TempDir::new("python-heap");
        let script = fixture_path("py_alloc.py");
        let lines = marked_lines(&script);
        let log_path = out.path().join("alloc.log");
        let fixture = PythonFixture::spawn(&python.path, &script, &["heap", path_str(&log_path), FIXTURE_S]);
        let capture = capture(&fixture, &out, "heap", CPU_CAPTURE);
        let truth = Log::read(&log_path).delta("alloc", capture.window);
        let what = format!("CPython {} heap", python.label);
        let profile = &capture.profile;
        check_comment(profile, &python, &what);
        let bytes_in = |function: &str| {
            profile.value_where("alloc_space", |s| python_leaf(s).is_some_and(|f| f.function == function))
        };
        let (big, small) = (bytes_in("alloc_big"), bytes_in("alloc_small"));
        // Sampled at one per 512 KiB (the default), so the sampled bytes hold about
        // (big + small) / 512 KiB samples: at least 2,000 make ±6 points over 9σ.
        let samples = (big + small) / (512 * 1024);
        assert!(
            samples >= 2_000,
            "{what}: about {samples} samples in the two functions; comments {:?}",
            profile.comments
        );
        let (share, truth_share) =
            (big as f64 / (big + small) as f64, truth["big"] as f64 / (truth["big"] + truth["small"]) as f64);
        eprintln!(
            "{what}: alloc_big {:.1}% of the sampled bytes, the fixture asked for {:.1}%",
            100.0 * share,
            100.0 * truth_share
        );
        assert!(
            (share - truth_share).abs() <= SHARE_TOLERANCE,
            "{what}: alloc_big {:.1}% of the bytes, the fixture {:.1}%; heaviest:\n{}",
            100.0 * share,
            100.0 * truth_share,
            heaviest(profile, "alloc_space", |_| true)
        );
        for function in ["alloc_big", "alloc_small"] {
            check_line_of(profile, "alloc_space", function, lines[function], &what);
        }
        let placed = profile.fraction_where("alloc_space", |s| {
            python_names(s).starts_with(&["alloc_big", "main", "<module>"])
                || python_names(s).starts_with(&["alloc_small", "main", "<module>"])
        });
        assert!(placed >= MIN_PLACED, "{what}: {:.1}% of the bytes under alloc_* <- main <- <module>", 100.0 * placed);
    }
}

/// Time a Python thread spends asleep is charged, in the off-CPU profile, to the Python
/// function that slept: nearly all of it under sleeper <- main <- <module>, on its line.
#[test]
fn python_offcpu_profile_names_the_sleeping_function() {
    if !preflight() {
        return;
    }
    for python in supported() {
        eprintln!("checking {} ({})", python.label, python.path.display());
        let out = TempDir::new("python-sleep");
        let script = fixture_path("py_alloc.py");
        let lines = marked_lines(&script);
        let log_path = out.path().join("sleep.log");
        let fixture = PythonFixture::spawn(&python.path, &script, &["sleep", path_str(&log_path), FIXTURE_S]);
        let capture = capture(&fixture, &out, "offcpu", Duration::from_secs(3));
        let what = format!("CPython {} offcpu", python.label);
        let profile = &capture.profile;
        check_comment(profile, &python, &what);
        let share =
            profile.fraction_where("off_cpu", |s| python_names(s).starts_with(&["sleeper", "main", "<module>"]));
        let switches = profile.total("switches");
        eprintln!(
            "{what}: {:.1}% of the off-CPU time under sleeper <- main <- <module>, {switches} switches",
            100.0 * share
        );
        assert!(
            switches >= 20 && share >= MIN_PLACED,
            "{what}: {:.1}% of the off-CPU time under sleeper <- main <- <module> ({switches} switches); heaviest:\n{}",
            100.0 * share,
            heaviest(profile, "off_cpu", |_| true)
        );
        check_line_of(profile, "off_cpu", "sleeper", lines["sleeper"], &what);
    }
}

/// Threads started from Python are charged to the Python function that started them.
#[test]
fn python_threadcreate_profile_names_the_spawning_function() {
    if !preflight() {
        return;
    }
    for python in supported() {
        eprintln!("checking {} ({})", python.label, python.path.display());
        let out = TempDir::new("python-spawn");
        let script = fixture_path("py_alloc.py");
        let lines = marked_lines(&script);
        let log_path = out.path().join("spawn.log");
        let fixture = PythonFixture::spawn(&python.path, &script, &["spawn", path_str(&log_path), FIXTURE_S]);
        let capture = capture(&fixture, &out, "threadcreate", CPU_CAPTURE);
        let started = Log::read(&log_path).delta("spawn", capture.window)["threads"];
        let what = format!("CPython {} threadcreate", python.label);
        let profile = &capture.profile;
        check_comment(profile, &python, &what);
        let under =
            profile.value_where("threadcreate", |s| python_names(s).starts_with(&["Thread.start", "spawner", "main"]));
        let total = profile.total("threadcreate");
        eprintln!(
            "{what}: {under} of {total} threads under Thread.start <- spawner <- main; the fixture started {started}"
        );
        // The log's records are 20 ms apart: a few threads of the window's edges fall
        // either side.
        assert!(
            started >= 100 && (under - started).abs() <= 10,
            "{what}: {under} threads counted, {started} started; heaviest:\n{}",
            heaviest(profile, "threadcreate", |_| true)
        );
        check_line_of(profile, "threadcreate", "spawner", lines["spawner"], &what);
    }
}

fn supported() -> Vec<Interpreter> {
    let found = interpreters(&[(3, 11), (3, 12), (3, 13)]);
    assert!(!found.is_empty(), "no CPython 3.11-3.13 on the machine: nothing would be tested");
    found
}

fn check_split(python: &Interpreter) {
    let out = TempDir::new("python-split");
    let script = fixture_path("py_cpu.py");
    let lines = marked_lines(&script);
    let log_path = out.path().join("split.log");
    let fixture = PythonFixture::spawn(&python.path, &script, &["split", path_str(&log_path), FIXTURE_S]);
    let capture = capture(&fixture, &out, "cpu", CPU_CAPTURE);
    let truth = Log::read(&log_path).delta("cpu", capture.window);
    let what = format!("CPython {}", python.label);
    let profile = &capture.profile;
    check_comment(profile, python, &what);
    check_placed(profile, "samples", &what);
    let got = (samples_in(profile, "hot_a"), samples_in(profile, "hot_b"));
    check_share(profile, ("hot_a", "hot_b"), got, (truth["hot_a"], truth["hot_b"]), &what);
    check_hot_a_chain(profile, &lines, &script, &what);
    check_on_line(profile, "hot_b", lines["hot_b_loop"], |_| true, &what);
    check_on_line(profile, "hot_a", lines["hot_a_loop"], |s| !s.stack.iter().any(is_zlib), &what);
    check_zlib(profile, &truth, lines["hot_a_zlib"], &what);
    let raw = go_pprof::raw(&capture.file);
    for name in ["hot_a", "dispatch", "<module>"] {
        assert!(raw.contains(name), "{what}: `go tool pprof -raw` does not name {name}:\n{raw}");
    }
}

fn check_threads(python: &Interpreter) {
    let out = TempDir::new("python-threads-cpu");
    let script = fixture_path("py_cpu.py");
    let lines = marked_lines(&script);
    let log_path = out.path().join("threads.log");
    let fixture = PythonFixture::spawn(&python.path, &script, &["threads", path_str(&log_path), FIXTURE_S]);
    let capture = capture(&fixture, &out, "cpu", CPU_CAPTURE);
    let log = Log::read(&log_path);
    let tids = log.first("tids");
    let truth = log.delta("spin", capture.window);
    let what = format!("CPython {}", python.label);
    let profile = &capture.profile;
    check_comment(profile, python, &what);
    check_placed(profile, "samples", &what);
    let threads = [(tids["a"], "thread_a_spin", "thread_a_loop"), (tids["b"], "thread_b_spin", "thread_b_loop")];
    // A sample taken while a thread enters a new activation of the interpreter loop (its
    // Python frame is current, its native `_PyEval_EvalFrameDefault` not yet on the stack)
    // has more runs of Python frames than loop frames: the outer ones are not placed, and
    // the sample says so (label `python`). Rare; counted, not checked for its chain.
    let total = profile.value_where("samples", |_| true);
    let unplaced = profile.value_where("samples", |s| s.label_str("python").is_some());
    eprintln!("{what}: {unplaced} of {total} samples with outer Python frames not placed");
    assert!(
        (unplaced as f64) <= 0.02 * total as f64,
        "{what}: {unplaced} of {total} samples with Python frames not placed"
    );
    for sample in &profile.samples {
        let placed = sample.label_str("python").is_none();
        let tid = sample.label_num("tid");
        let python_names = python_names(sample);
        for &(own_tid, function, _) in &threads {
            let mine = tid == Some(own_tid);
            assert!(
                mine || !python_names.contains(&function),
                "{what}: {function} (thread {own_tid}) in a sample of thread {tid:?}: {}",
                stack_label(sample)
            );
            assert!(
                !mine || !placed || python_names.is_empty() || python_names.starts_with(&[function, "Thread.run"]),
                "{what}: a sample of thread {own_tid} not under {function} <- Thread.run: {}",
                stack_label(sample)
            );
        }
    }
    for &(_, function, marker) in &threads {
        check_on_line(profile, function, lines[marker], |_| true, &what);
    }
    let of_thread =
        |tid: i64| profile.value_where("samples", |s| s.label_num("tid") == Some(tid) && python_leaf(s).is_some());
    let got = (of_thread(threads[0].0), of_thread(threads[1].0));
    check_share(profile, ("thread_a_spin", "thread_b_spin"), got, (truth["a"], truth["b"]), &what);
}

fn check_lock(python: &Interpreter) {
    let out = TempDir::new("python-lock");
    let script = fixture_path("py_lock.py");
    let lines = marked_lines(&script);
    let log_path = out.path().join("lock.log");
    let fixture = PythonFixture::spawn(&python.path, &script, &[path_str(&log_path), FIXTURE_S]);
    let capture = capture(&fixture, &out, "block", BLOCK_CAPTURE);
    let log = Log::read(&log_path);
    let window = capture.window;
    // The profiler times a wait from its futex call's entry: one that began before the
    // capture or ended after it is not (wholly) in the profile, nor in the truth.
    let waits: Vec<i64> = log
        .records("wait")
        .filter(|w| w["start"] >= window.start_ns && w["end"] <= window.end_ns)
        .map(|w| w["end"] - w["start"])
        .collect();
    let truth: i64 = waits.iter().sum();
    let what = format!("CPython {}", python.label);
    let profile = &capture.profile;
    check_comment(profile, python, &what);
    check_placed(profile, "contentions", &what);
    let waited = |s: &Sample| python_leaf(s).is_some_and(|f| f.function == "waiter");
    let got = profile.value_where("delay", waited);
    eprintln!("{what}: {got} ns of block delay under waiter, the fixture measured {truth} ns in {} waits", waits.len());
    assert!(
        truth > 0 && (got - truth).abs() as f64 <= DELAY_TOLERANCE * truth as f64,
        "{what}: block delay under the Python frame waiter {got} ns, the fixture measured {truth} ns in {} waits \
         within the window ({:.1}% off, tolerance {:.0}%); heaviest stacks by delay:\n{}",
        waits.len(),
        100.0 * (got - truth) as f64 / truth.max(1) as f64,
        100.0 * DELAY_TOLERANCE,
        heaviest(profile, "delay", |_| true)
    );
    for sample in profile.samples.iter().filter(|s| waited(s)) {
        let frame = python_leaf(sample).expect("waited: a Python frame");
        assert!(
            python_names(sample).starts_with(&["waiter", "Thread.run"]) && frame.line == lines["waiter"],
            "{what}: a wait of waiter not on its acquire() (line {} of {}) under Thread.run: {}",
            lines["waiter"],
            script.display(),
            stack_label(sample)
        );
        assert_eq!(frame.file, path_str(&script), "{what}: waiter's file: {}", stack_label(sample));
    }
}

/// hot_a's samples hold the Python frames of [`HOT_A_CHAIN`] (a prefix of it where a walk
/// was cut short), and most the whole of it: one activation of the interpreter loop, so no
/// native frame between them, each caller on the line of its call.
fn check_hot_a_chain(profile: &Profile, lines: &HashMap<String, i64>, script: &Path, what: &str) {
    let count = profile.value_index("samples");
    let (mut total, mut whole) = (0, 0);
    for sample in profile.samples.iter().filter(|s| python_leaf(s).is_some_and(|f| f.function == "hot_a")) {
        let names = python_names(sample);
        assert!(
            HOT_A_CHAIN.starts_with(&names),
            "{what}: hot_a's Python frames are not (a prefix of) {HOT_A_CHAIN:?}: {}",
            stack_label(sample)
        );
        total += sample.values[count];
        if names.len() == HOT_A_CHAIN.len() {
            whole += sample.values[count];
            check_whole_chain(sample, lines, script, what);
        }
    }
    assert!(
        total > 0 && whole as f64 >= MIN_WHOLE_CHAIN * total as f64,
        "{what}: {whole} of {total} hot_a samples hold the chain {HOT_A_CHAIN:?} (wanted {:.0}%); heaviest:\n{}",
        100.0 * MIN_WHOLE_CHAIN,
        heaviest(profile, "samples", |s| python_leaf(s).is_some_and(|f| f.function == "hot_a"))
    );
}

fn check_whole_chain(sample: &Sample, lines: &HashMap<String, i64>, script: &Path, what: &str) {
    let user = sample.user_frames();
    let stack = stack_label(sample);
    assert!(!user.iter().any(|f| f.function == EVAL), "{what}: {EVAL} left beside the Python frames: {stack}");
    let first = user.iter().position(is_python).expect("a Python frame");
    let last = user.iter().rposition(is_python).expect("a Python frame");
    assert!(
        user[first..=last].iter().all(is_python),
        "{what}: native frames between hot_a and <module>, which one activation runs: {stack}"
    );
    let python: Vec<&Frame> = user.iter().filter(|f| is_python(f)).collect();
    for (frame, marker) in python[1..].iter().zip(["dispatch", "main_a", "module"]) {
        assert_eq!(frame.line, lines[marker], "{what}: {}'s line (marker {marker}): {stack}", frame.function);
    }
    for frame in &python {
        assert_eq!(frame.file, path_str(script), "{what}: {}'s file: {stack}", frame.function);
    }
}

/// Of the samples whose leaf Python frame is `function` (and `pred` holds), most are on
/// `line`, where it loops.
fn check_on_line(profile: &Profile, function: &str, line: i64, pred: impl Fn(&Sample) -> bool, what: &str) {
    let of_function = |s: &Sample| python_leaf(s).is_some_and(|f| f.function == function) && pred(s);
    let total = profile.value_where("samples", of_function);
    let on_line = profile.value_where("samples", |s| of_function(s) && python_leaf(s).is_some_and(|f| f.line == line));
    assert!(
        total > 0 && on_line as f64 >= MIN_ON_MARKED_LINE * total as f64,
        "{what}: {on_line} of {total} samples in {function} on its loop's line {line} (wanted {:.0}%); heaviest:\n{}",
        100.0 * MIN_ON_MARKED_LINE,
        heaviest(profile, "samples", of_function)
    );
}

/// Every sample (weighted by `value`) with a Python frame of `function` has it on `line`.
fn check_line_of(profile: &Profile, value: &str, function: &str, line: i64, what: &str) {
    let frame = |s: &Sample| s.stack.iter().find(|f| is_python(f) && f.function == function).map(|f| f.line);
    let total = profile.value_where(value, |s| frame(s).is_some());
    let on_line = profile.value_where(value, |s| frame(s) == Some(line));
    assert!(
        total > 0 && on_line == total,
        "{what}: {on_line} of {total} {value} under {function} on its line {line}; heaviest:\n{}",
        heaviest(profile, value, |s| frame(s).is_some())
    );
}

/// In every sample with zlib's native frames and Python frames, those native frames are
/// leafward of the first Python frame, which is hot_a on the line of its zlib.compress call;
/// their share of hot_a's samples is the share of hot_a's time the fixture measured in zlib.
fn check_zlib(profile: &Profile, truth: &HashMap<String, i64>, zlib_line: i64, what: &str) {
    let count = profile.value_index("samples");
    let mut in_zlib = 0;
    for sample in profile.samples.iter().filter(|s| s.stack.iter().any(is_zlib)) {
        let Some(first_python) = sample.stack.iter().position(is_python) else { continue };
        let last_zlib = sample.stack.iter().rposition(is_zlib).expect("a zlib frame");
        let caller = &sample.stack[first_python];
        assert!(
            last_zlib < first_python && caller.function == "hot_a" && caller.line == zlib_line,
            "{what}: zlib's frames not above hot_a at its zlib.compress call (line {zlib_line}): {}",
            stack_label(sample)
        );
        assert!(
            !sample.user_frames().iter().any(|f| f.function == EVAL),
            "{what}: {EVAL} left beside the Python frames: {}",
            stack_label(sample)
        );
        in_zlib += sample.values[count];
    }
    let hot_a = samples_in(profile, "hot_a");
    let share = in_zlib as f64 / hot_a.max(1) as f64;
    let truth_share = truth["zlib"] as f64 / truth["hot_a"].max(1) as f64;
    eprintln!(
        "{what}: zlib's frames in {:.1}% of {hot_a} hot_a samples, the fixture measured {:.1}%",
        100.0 * share,
        100.0 * truth_share
    );
    assert!(
        in_zlib > 0 && (share - truth_share).abs() <= ZLIB_TOLERANCE,
        "{what}: {in_zlib} of {hot_a} hot_a samples ({:.1}%) have zlib's frames, the fixture measured {:.1}% of \
         hot_a's time in zlib.compress; heaviest hot_a stacks:\n{}",
        100.0 * share,
        100.0 * truth_share,
        heaviest(profile, "samples", |s| python_leaf(s).is_some_and(|f| f.function == "hot_a"))
    );
}

/// `got` (sample counts of two functions) splits as `truth` (their CPU ns by the fixture's
/// clock) within [`SHARE_TOLERANCE`], with enough samples for that to be [`MIN_SIGMAS`].
fn check_share(profile: &Profile, names: (&str, &str), got: (i64, i64), truth: (i64, i64), what: &str) {
    let (n, truth_total) = (got.0 + got.1, truth.0 + truth.1);
    assert!(truth_total > 0, "{what}: the fixture logged no CPU time for {names:?} over the capture window");
    let truth_share = truth.0 as f64 / truth_total as f64;
    let needed = truth_share * (1.0 - truth_share) * (MIN_SIGMAS / SHARE_TOLERANCE).powi(2);
    let stacks = || heaviest(profile, "samples", |_| true);
    assert!(
        n as f64 >= needed,
        "{what}: {n} samples in {} and {}, fewer than the {needed:.0} that make ±{:.0} points {MIN_SIGMAS}σ; \
         comments {:?}; heaviest stacks:\n{}",
        names.0,
        names.1,
        100.0 * SHARE_TOLERANCE,
        profile.comments,
        stacks()
    );
    let share = got.0 as f64 / n as f64;
    eprintln!(
        "{what}: {} {:.1}% of {n} samples, the fixture measured {:.1}%",
        names.0,
        100.0 * share,
        100.0 * truth_share
    );
    assert!(
        (share - truth_share).abs() <= SHARE_TOLERANCE,
        "{what}: {} has {:.1}% of the samples of {} and {} ({} of {n}); the fixture measured {:.1}% \
         ({} of {truth_total} ns); heaviest stacks:\n{}",
        names.0,
        100.0 * share,
        names.0,
        names.1,
        got.0,
        100.0 * truth_share,
        truth.0,
        stacks()
    );
}

/// The profile's comment names the interpreter: `python: CPython 3.X…`.
fn check_comment(profile: &Profile, python: &Interpreter, what: &str) {
    let (major, minor) = python.version;
    let prefix = format!("python: CPython {major}.{minor}");
    let names_it =
        |c: &String| c.strip_prefix(&prefix).is_some_and(|rest| !rest.starts_with(|c: char| c.is_ascii_digit()));
    assert!(profile.comments.iter().any(names_it), "{what}: no comment starts {prefix:?}: {:?}", profile.comments);
}

/// Nearly every sample has Python frames in place of the interpreter loop's.
fn check_placed(profile: &Profile, value: &str, what: &str) {
    let placed = |s: &Sample| python_leaf(s).is_some() && !s.stack.iter().any(|f| f.function == EVAL);
    let share = profile.fraction_where(value, placed);
    assert!(
        share >= MIN_PLACED,
        "{what}: {:.1}% of the {value} have Python frames and no {EVAL} (wanted {:.0}%); comments {:?}; \
         heaviest of the others:\n{}",
        100.0 * share,
        100.0 * MIN_PLACED,
        profile.comments,
        heaviest(profile, value, |s| !placed(s))
    );
}

/// A snapshot's profile of one kind, its file and the capture window.
struct Capture {
    profile: Profile,
    file: PathBuf,
    window: Window,
}

/// A capture window in CLOCK_MONOTONIC nanoseconds, the fixtures' `time.monotonic_ns()`.
#[derive(Clone, Copy, Debug)]
struct Window {
    start_ns: i64,
    end_ns: i64,
}

/// `profiler snapshot --pid PID --duration D --frequency 999 --profiles KIND --output DIR`;
/// the window starts when it says it is capturing.
fn capture(fixture: &PythonFixture, out: &TempDir, kind: &str, duration: Duration) -> Capture {
    capture_with(fixture, out, kind, duration, || ()).0
}

/// [`capture`], running `at_start` as soon as the window starts (to start another profiler
/// over the same window) and returning what it returned.
fn capture_with<T>(
    fixture: &PythonFixture,
    out: &TempDir,
    kind: &str,
    duration: Duration,
    at_start: impl FnOnce() -> T,
) -> (Capture, T) {
    let pid = fixture.pid();
    let comm = std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .unwrap_or_else(|e| panic!("failed to read /proc/{pid}/comm: {e}"))
        .trim()
        .to_string();
    let (pid_arg, duration_arg, dir) = (pid.to_string(), format!("{}ms", duration.as_millis()), out.path_arg());
    let args = [
        "snapshot",
        "--pid",
        &pid_arg,
        "--duration",
        &duration_arg,
        "--frequency",
        FREQUENCY_HZ,
        "--profiles",
        kind,
        "--output",
        &dir,
    ];
    let mut running = Running::start(&args);
    running.wait_capturing();
    let start_ns = monotonic_ns();
    let started = at_start();
    let output = running.finish();
    assert_success(&output, &format!("snapshot --profiles {kind} of a CPython process"));
    let file = process_dir(out.path(), &comm, pid).join(format!("{kind}.pb.gz"));
    assert!(file.is_file(), "no {kind} profile at {}; output holds:\n{}", file.display(), listing(out.path()));
    let window = Window { start_ns, end_ns: start_ns + duration.as_nanos() as i64 };
    (Capture { profile: Profile::decode(&file), file, window }, started)
}

fn monotonic_ns() -> i64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes only the timespec it is given, which outlives the call.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_MONOTONIC) failed");
    ts.tv_sec * 1_000_000_000 + ts.tv_nsec
}

/// A fixture's log: `KIND key=value...` records, in the order written.
struct Log {
    path: PathBuf,
    records: Vec<(String, HashMap<String, i64>)>,
}

impl Log {
    fn read(path: &Path) -> Self {
        let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("failed to read {}: {e}", path.display()));
        // The line being written, if any, has no newline yet.
        let complete = &text[..text.rfind('\n').map_or(0, |i| i + 1)];
        Self { path: path.to_path_buf(), records: complete.lines().map(parse_record).collect() }
    }

    fn records<'a>(&'a self, kind: &'a str) -> impl Iterator<Item = &'a HashMap<String, i64>> + 'a {
        self.records.iter().filter(move |(k, _)| k == kind).map(|(_, fields)| fields)
    }

    fn first(&self, kind: &str) -> &HashMap<String, i64> {
        let found = self.records.iter().find(|(k, _)| k == kind).map(|(_, fields)| fields);
        found.unwrap_or_else(|| panic!("no `{kind}` record in {}", self.path.display()))
    }

    /// How much each cumulative counter of the `kind` records (stamped `t`) grew over
    /// `window`: from the last record at its start to the last at its end.
    fn delta(&self, kind: &str, window: Window) -> HashMap<String, i64> {
        let at = |t: i64| self.records(kind).filter(|r| r.get("t").is_some_and(|&rt| rt <= t)).last();
        let (Some(start), Some(end)) = (at(window.start_ns), at(window.end_ns)) else {
            panic!("no `{kind}` record before the start and the end of {window:?} in {}", self.path.display())
        };
        end.iter()
            .filter(|(k, _)| *k != "t")
            .map(|(k, v)| (k.clone(), v - start.get(k).copied().unwrap_or(0)))
            .collect()
    }
}

fn parse_record(line: &str) -> (String, HashMap<String, i64>) {
    let mut words = line.split_whitespace();
    let kind = words.next().unwrap_or_default().to_string();
    let fields = words.filter_map(|w| w.split_once('=').and_then(|(k, v)| Some((k.to_string(), v.parse().ok()?))));
    (kind, fields.collect())
}

fn is_python(frame: &Frame) -> bool {
    frame.mapping == PYTHON_MAPPING
}

/// A native frame of the zlib call: libz (stripped on Debian: names or not) or CPython's
/// zlib module.
fn is_zlib(frame: &Frame) -> bool {
    !is_python(frame)
        && !frame.kernel
        && (frame.mapping.contains("/libz.so")
            || frame.function.starts_with("deflate")
            || frame.function.starts_with("zlib_compress"))
}

/// The leaf-most Python frame.
fn python_leaf(sample: &Sample) -> Option<&Frame> {
    sample.stack.iter().find(|f| is_python(f))
}

/// The Python functions of the stack, leaf first.
fn python_names(sample: &Sample) -> Vec<&str> {
    sample.stack.iter().filter(|f| is_python(f)).map(|f| f.function.as_str()).collect()
}

/// The CPU samples whose leaf-most Python frame is `function`.
fn samples_in(profile: &Profile, function: &str) -> i64 {
    profile.value_where("samples", |s| python_leaf(s).is_some_and(|f| f.function == function))
}

fn path_str(path: &Path) -> &str {
    path.to_str().expect("test paths are UTF-8")
}

/// A stack for failure messages, leaf first: Python frames as `py:NAME:LINE`, a native
/// frame without a name as its mapping's file name.
fn stack_label(sample: &Sample) -> String {
    let frame = |f: &Frame| {
        if is_python(f) {
            format!("py:{}:{}", f.function, f.line)
        } else if f.function.is_empty() {
            format!("[{}]", f.mapping.rsplit('/').next().unwrap_or_default())
        } else {
            f.function.clone()
        }
    };
    sample.stack.iter().map(frame).collect::<Vec<_>>().join(" <- ")
}

/// The heaviest stacks (by value `value`) of the samples for which `pred` holds, one a line.
fn heaviest(profile: &Profile, value: &str, pred: impl Fn(&Sample) -> bool) -> String {
    let index = profile.value_index(value);
    let mut by_stack: HashMap<String, i64> = HashMap::new();
    for sample in profile.samples.iter().filter(|s| pred(s)) {
        *by_stack.entry(stack_label(sample)).or_default() += sample.values[index];
    }
    let mut stacks: Vec<(String, i64)> = by_stack.into_iter().collect();
    stacks.sort_by_key(|(_, v)| std::cmp::Reverse(*v));
    stacks.iter().take(12).map(|(stack, v)| format!("{v:>12} {stack}")).collect::<Vec<_>>().join("\n")
}

/// Both profilers' window: ~750 py-spy samples at [`PY_SPY_RATE`], ~3,000 of ours at 999 Hz.
const AGREEMENT_CAPTURE: Duration = Duration::from_secs(3);
/// py-spy's sampling rate, in Hz (its default is 100).
const PY_SPY_RATE: &str = "250";
/// The histogram intersection, Σ min(p_f, q_f) over the leaf-most Python functions f, of
/// our shares p and py-spy's q: 1 − their total variation distance. py_cpu.py's split is
/// ~75/25, so the intersection is about 1 − |Δ| for Δ the difference of hot_a's shares...
const MIN_INTERSECTION: f64 = 0.9;
/// ...whose noise is √(p(1−p)(1/n + 1/m)): at p = 0.75 with m ≈ 3,000 samples of ours and
/// at least this many of py-spy's, 0.1 is over 4σ.
const MIN_PY_SPY_SAMPLES: i64 = 400;
/// Past this share of its wanted CPU time spent waiting for one, the fixture's wall time (what
/// py-spy samples) is no longer its CPU time, and the splits are not compared.
const MAX_RUNNABLE_SHARE: f64 = 0.05;
/// py-spy's own limit: its start (it reads the process's memory maps and symbols) and its
/// duration.
const PY_SPY_TIMEOUT: Duration = Duration::from_secs(60);

/// Agreement with py-spy (PyPI's `py-spy`, the reference) on the same process over the same
/// window: the shares of the samples by leaf-most Python function, ours and py-spy's,
/// intersect to at least [`MIN_INTERSECTION`]. py-spy runs `--nonblocking`: otherwise it
/// stops the process at each of its samples, time our CPU profile would not see. Fails (not
/// skips) without the venv's py-spy: `cargo xtask test` sets it up before the tests run.
#[test]
fn python_cpu_profile_agrees_with_py_spy() {
    if !preflight() {
        return;
    }
    let py_spy = py_spy().unwrap_or_else(|| {
        panic!(
            "no py-spy at {}: run `cargo xtask setup --for-test` (`cargo xtask test` does), which installs it \
             in the test venv",
            profiler_tests::target_dir().join("test-venv/bin/py-spy").display()
        )
    });
    for python in supported() {
        eprintln!("checking {} ({})", python.label, python.path.display());
        check_py_spy(&python, &py_spy);
    }
}

fn check_py_spy(python: &Interpreter, py_spy: &Path) {
    let out = TempDir::new("python-py-spy");
    let script = fixture_path("py_cpu.py");
    let log_path = out.path().join("split.log");
    let fixture = PythonFixture::spawn(&python.path, &script, &["split", path_str(&log_path), FIXTURE_S]);
    let raw_path = out.path().join("py-spy.txt");
    let (pid, seconds) = (fixture.pid().to_string(), AGREEMENT_CAPTURE.as_secs().to_string());
    let mut record = Command::new(py_spy);
    record
        .args(["record", "--pid", &pid, "--duration", &seconds, "--rate", PY_SPY_RATE, "--format", "raw"])
        .args(["--nonblocking", "--output", path_str(&raw_path)])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // py-spy starts as soon as our window does and runs as long: the same window, but for
    // its attach (milliseconds).
    let before = schedstat(fixture.pid());
    let (capture, child) = capture_with(&fixture, &out, "cpu", AGREEMENT_CAPTURE, || {
        record.spawn().unwrap_or_else(|e| panic!("failed to start {record:?}: {e}"))
    });
    let output = wait_with_timeout(child, "py-spy record", PY_SPY_TIMEOUT);
    let after = schedstat(fixture.pid());
    let what = format!("CPython {}", python.label);
    let said = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{what}: {record:?} failed ({}):\n{said}", output.status);
    let raw =
        std::fs::read_to_string(&raw_path).unwrap_or_else(|e| panic!("failed to read {}: {e}", raw_path.display()));
    let theirs = py_spy_leaves(&raw, &what);
    let ours = our_leaves(&capture.profile);
    let (n_theirs, n_ours) = (theirs.values().sum::<i64>(), ours.values().sum::<i64>());
    assert!(
        n_theirs >= MIN_PY_SPY_SAMPLES,
        "{what}: py-spy took {n_theirs} samples in {seconds} s at {PY_SPY_RATE} Hz, fewer than {MIN_PY_SPY_SAMPLES}; \
         it said:\n{said}"
    );
    let (intersection, table) = intersect(&ours, &theirs);
    eprintln!(
        "{what}: leaf-most Python functions, {n_ours} samples of ours and {n_theirs} of py-spy's \
         (ours / py-spy's share):\n{table}\n{what}: histogram intersection {intersection:.3}"
    );
    let heaviest = || heaviest(&capture.profile, "samples", |_| true);
    // The split between the two hot functions, ours against py-spy's, within 3.5σ of the
    // two counts. py-spy reads the interpreter's frames without stopping it, and on a loaded
    // machine its reads are preempted halfway more often: a torn read charges the caller
    // (`dispatch`, 14% of its samples beside two CPU hogs, against 0.2% of ours), which moves
    // the histograms apart but not the split between hot_a and hot_b.
    let share = |by: &HashMap<String, i64>| {
        let (a, b) = (by.get("hot_a").copied().unwrap_or(0) as f64, by.get("hot_b").copied().unwrap_or(0) as f64);
        (a / (a + b).max(1.0), a + b)
    };
    let ((p, n), (q, m)) = (share(&ours), share(&theirs));
    let sigma = (p * (1.0 - p) * (1.0 / n.max(1.0) + 1.0 / m.max(1.0))).sqrt();
    eprintln!("{what}: hot_a / (hot_a + hot_b): ours {p:.3} of {n}, py-spy's {q:.3} of {m}, σ {sigma:.3}");
    // py-spy samples wall time: a thread that waits for a CPU is sampled where it waits, and
    // one function may be preempted more than the other. Its split is the CPU split only
    // while the fixture got a CPU whenever it asked; otherwise our split is held to the
    // program's own clock by `python_cpu_profile_splits_hot_a_and_hot_b_…`, not to py-spy.
    let (ran, waited) = (after.0.saturating_sub(before.0), after.1.saturating_sub(before.1));
    let waiting = waited as f64 / (ran + waited).max(1) as f64;
    if waiting > MAX_RUNNABLE_SHARE {
        eprintln!(
            "{what}: the fixture waited for a CPU {:.0}% of the time it wanted one (over {:.0}%): py-spy's \
             wall-time split is not compared",
            waiting * 100.0,
            MAX_RUNNABLE_SHARE * 100.0
        );
        assert!(q > 0.5 && m >= MIN_PY_SPY_SAMPLES as f64 / 2.0, "{what}: py-spy does not see hot_a ahead");
        return;
    }
    assert!(
        (p - q).abs() <= 3.5 * sigma,
        "{what}: hot_a's share of the hot functions is {p:.3} in ours and {q:.3} in py-spy's, more than 3.5σ \
         ({:.3}) apart; ours / py-spy's:\n{table}\nour heaviest stacks:\n{}\npy-spy's output:\n{raw}",
        3.5 * sigma,
        heaviest()
    );
    // And py-spy's histogram is near ours, torn reads aside: on a quiet machine it is over
    // 0.9 (within 4σ); a loaded one tears more of py-spy's reads.
    assert!(
        intersection >= MIN_INTERSECTION - torn_share(&theirs),
        "{what}: the shares by leaf-most Python function intersect to {intersection:.3} with py-spy's (wanted \
         {MIN_INTERSECTION} less py-spy's torn reads); ours / py-spy's:\n{table}\nour heaviest stacks:\n{}\n\
         py-spy's output:\n{raw}",
        heaviest()
    );
}

/// (CPU time, run-queue delay) of `pid`'s main thread, in ns (`/proc/PID/schedstat`).
fn schedstat(pid: u32) -> (u64, u64) {
    let text = std::fs::read_to_string(format!("/proc/{pid}/schedstat")).unwrap_or_default();
    let mut fields = text.split_whitespace().map(|f| f.parse::<u64>().unwrap_or(0));
    (fields.next().unwrap_or(0), fields.next().unwrap_or(0))
}

/// The share of py-spy's samples whose leaf-most Python function is `dispatch`, which only
/// calls the hot functions: reads torn between a call and its frame.
fn torn_share(theirs: &HashMap<String, i64>) -> f64 {
    let total = theirs.values().sum::<i64>().max(1) as f64;
    theirs.get("dispatch").copied().unwrap_or(0) as f64 / total
}

/// Our CPU samples by leaf-most Python function (those without a Python frame left out).
fn our_leaves(profile: &Profile) -> HashMap<String, i64> {
    let count = profile.value_index("samples");
    let mut by_function: HashMap<String, i64> = HashMap::new();
    for sample in &profile.samples {
        if let Some(frame) = python_leaf(sample) {
            *by_function.entry(frame.function.clone()).or_default() += sample.values[count];
        }
    }
    by_function
}

/// py-spy's samples by leaf-most function, from its `--format raw` output: collapsed
/// stacks, `FRAME;FRAME;... COUNT` a line, root first, each frame `NAME (FILE:LINE)`, NAME
/// the code object's qualified name as ours.
fn py_spy_leaves(raw: &str, what: &str) -> HashMap<String, i64> {
    let mut by_function: HashMap<String, i64> = HashMap::new();
    for line in raw.lines().filter(|l| !l.trim().is_empty()) {
        let parsed = line.rsplit_once(' ').and_then(|(stack, count)| Some((stack, count.parse::<i64>().ok()?)));
        let Some((stack, count)) = parsed else { panic!("{what}: not a py-spy raw line: {line:?}") };
        let leaf = stack.rsplit(';').next().unwrap_or_default();
        let function = leaf.split_once(" (").map_or(leaf, |(name, _)| name);
        *by_function.entry(function.to_string()).or_default() += count;
    }
    by_function
}

/// Σ min(p_f, q_f) over the functions in either of `ours` and `theirs` (sample counts, made
/// shares), and the two histograms side by side, heaviest first, one function a line.
fn intersect(ours: &HashMap<String, i64>, theirs: &HashMap<String, i64>) -> (f64, String) {
    let share = |counts: &HashMap<String, i64>, f: &str| {
        counts.get(f).copied().unwrap_or(0) as f64 / counts.values().sum::<i64>().max(1) as f64
    };
    let mut functions: Vec<&String> = ours.keys().chain(theirs.keys()).collect();
    functions.sort();
    functions.dedup();
    let mut rows: Vec<(&str, f64, f64)> =
        functions.iter().map(|f| (f.as_str(), share(ours, f), share(theirs, f))).collect();
    rows.sort_by(|a, b| (b.1.max(b.2)).total_cmp(&a.1.max(a.2)));
    let intersection = rows.iter().map(|&(_, p, q)| p.min(q)).sum();
    let table = rows
        .iter()
        .map(|&(f, p, q)| format!("{:>7.2}% {:>7.2}%  {f}", 100.0 * p, 100.0 * q))
        .collect::<Vec<_>>()
        .join("\n");
    (intersection, table)
}
