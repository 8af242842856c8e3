//! Thread dumps of CPython processes: every Python thread's functions, files and lines in
//! place of the interpreter loop's native frames, with the native frames of the blocking
//! call above them and the interpreter's start-up below, under each supported version
//! (Debian's static 3.11, pyenv's shared 3.11, 3.12, 3.13). Running per version is also the
//! check of the 3.11 and 3.12 structure offsets (constants) and of the reading of 3.13's
//! `_Py_DebugOffsets`: a wrong offset gives no frames, wrong names or wrong lines.

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    time::Duration,
};

use profiler_tests::{
    assert_success,
    daemon::{Daemon, DaemonConfig},
    go_pprof,
    pprof::Sample,
    preflight,
    python::{fixture_path, interpreters, marked_lines, Interpreter, PythonFixture},
    run_profiler, Frame, Profile, TempDir,
};

/// Long enough for every dump of a test; the guard kills the fixture after.
const FIXTURE_S: &str = "120";

/// Where each Python thread of `py_threads.py` blocks: its chain of Python functions, leaf
/// first (with the marker naming each one's current line, when it is in the fixture), and a
/// pattern of a native function of the blocking call above it.
struct PyThread {
    chain: &'static [(&'static str, Option<&'static str>)],
    blocking: &'static str,
    /// Whether native frames lie between the first two Python frames (a C function that
    /// called back into Python).
    native_between: bool,
}

const PY_THREADS: &[PyThread] = &[
    PyThread {
        chain: &[("main_wait", Some("main_wait")), ("main", Some("main")), ("<module>", Some("module"))],
        blocking: "nanosleep",
        native_between: false,
    },
    PyThread {
        chain: &[("locked", Some("locked")), ("worker_lock", Some("worker_lock")), ("Thread.run", None)],
        blocking: "PyThread_acquire_lock",
        native_between: false,
    },
    PyThread {
        chain: &[("reader", Some("reader")), ("worker_read", Some("worker_read")), ("Thread.run", None)],
        blocking: "read",
        native_between: false,
    },
    PyThread {
        chain: &[("nested_key", Some("nested_key")), ("nested_outer", Some("nested_outer")), ("Thread.run", None)],
        blocking: "read",
        native_between: true,
    },
];

const PYTHON_MAPPING: &str = "[python]";
const EVAL: &str = "_PyEval_EvalFrameDefault";

/// `profiler threads PID --debug 0 -o OUT/NAME.pb.gz`, decoded, and the file.
fn dump(pid: u32, out: &TempDir, name: &str) -> (Profile, PathBuf) {
    let file = out.path().join(format!("{name}.pb.gz"));
    let args = ["threads", &pid.to_string(), "--debug", "0", "--output", file.to_str().unwrap()];
    assert_success(&run_profiler(&args), "profiler threads");
    (Profile::decode(&file), file)
}

fn is_python(frame: &Frame) -> bool {
    frame.mapping == PYTHON_MAPPING
}

/// The sample whose Python leaf is `function`.
fn thread_in<'a>(profile: &'a Profile, function: &str) -> Option<&'a Sample> {
    profile
        .samples
        .iter()
        .find(|s| s.user_frames().iter().find(|f| is_python(f)).is_some_and(|f| f.function == function))
}

/// A dump in which every Python thread is where the fixture blocks it (they reach their
/// blocking calls just before `ready`; a few tries cover a slow start).
fn settled_dump(pid: u32, out: &TempDir, what: &str) -> (Profile, PathBuf) {
    for attempt in 1..=5 {
        let (profile, file) = dump(pid, out, &format!("{pid}-{attempt}"));
        if PY_THREADS.iter().all(|t| thread_in(&profile, t.chain[0].0).is_some()) {
            return (profile, file);
        }
        std::thread::sleep(Duration::from_millis(300));
    }
    let (profile, _) = dump(pid, out, &format!("{pid}-last"));
    let stacks: Vec<Vec<&str>> = profile.samples.iter().map(|s| s.names()).collect();
    panic!("{what}: not every Python thread found blocked; comments {:?}; stacks {stacks:#?}", profile.comments);
}

fn check_thread(sample: &Sample, expected: &PyThread, lines: &HashMap<String, i64>, script: &Path, what: &str) {
    let user = sample.user_frames();
    let what = format!("{what}, thread in {}: {:?}", expected.chain[0].0, sample.names());
    let first_python = user.iter().position(is_python).expect("a Python frame");
    assert!(
        user[..first_python].iter().any(|f| f.function.contains(expected.blocking)),
        "the blocking call's native frames ({}) above the Python frames: {what}",
        expected.blocking
    );
    // The chain, in order, as a subsequence of the Python frames.
    let python: Vec<&Frame> = user.iter().filter(|f| is_python(f)).collect();
    let mut at = 0;
    for (function, marker) in expected.chain {
        let found = python[at..].iter().position(|f| f.function == *function);
        let index = at + found.unwrap_or_else(|| panic!("{function} missing after frame {at}: {what}"));
        let frame = python[index];
        if let Some(marker) = marker {
            assert_eq!(frame.file, script.to_str().unwrap(), "{function}'s file: {what}");
            assert_eq!(frame.line, lines[*marker], "{function}'s line (marker {marker}): {what}");
        }
        at = index + 1;
    }
    for frame in &python {
        assert!(
            !frame.file.is_empty() && frame.line > 0,
            "every Python frame has a file and a line: {frame:?}: {what}"
        );
    }
    let between = |a: &str, b: &str| {
        let i = user.iter().position(|f| is_python(f) && f.function == a).unwrap();
        let j = user.iter().position(|f| is_python(f) && f.function == b).unwrap();
        user[i + 1..j].iter().filter(|f| !is_python(f)).count()
    };
    let native = between(expected.chain[0].0, expected.chain[1].0);
    if expected.native_between {
        assert!(native > 0, "the C function's native frames between the two Python activations: {what}");
    } else {
        assert_eq!(native, 0, "one activation, no native frame inside it: {what}");
    }
    assert!(!user.iter().any(|f| f.function == EVAL), "no {EVAL} left where Python frames replaced it: {what}");
}

fn check_interpreter(python: &Interpreter, out: &TempDir) {
    let script = fixture_path("py_threads.py");
    let lines = marked_lines(&script);
    let fixture = PythonFixture::spawn(&python.path, &script, &[FIXTURE_S]);
    let what = format!("CPython {}", python.label);
    let (profile, file) = settled_dump(fixture.pid(), out, &what);
    let (major, minor) = python.version;
    assert!(
        profile.comments.iter().any(|c| c.starts_with(&format!("python: CPython {major}.{minor} "))),
        "{what}: the comment names the interpreter: {:?}",
        profile.comments
    );
    for expected in PY_THREADS {
        let sample = thread_in(&profile, expected.chain[0].0).unwrap();
        check_thread(sample, expected, &lines, &script, &what);
    }
    let main = thread_in(&profile, "main_wait").unwrap();
    let module = main.user_frames().iter().position(|f| f.function == "<module>").unwrap();
    assert!(
        main.user_frames()[module..].iter().any(|f| f.function == "Py_RunMain"),
        "{what}: the interpreter's start-up below <module>: {:?}",
        main.names()
    );
    assert_eq!(profile.samples.len(), PY_THREADS.len(), "{what}: one sample per thread");
    for sample in &profile.samples {
        assert_eq!(sample.label_str("python"), None, "{what}: every Python frame placed: {:?}", sample.names());
    }
    // Go's reader takes the Python mapping and functions as they are.
    let traces = go_pprof::traces(&file);
    // `<module>` kept whole: pprof would strip it as a C++ template argument, were the
    // Python functions' names not marked final (an empty system name).
    for name in ["main_wait\n", "nested_outer\n", "<module>\n"] {
        assert!(traces.contains(name), "{what}: go tool pprof -traces lacks {name:?}: {traces}");
    }
    // The text form (debug=2) names the Python frames with file:line.
    let text = run_profiler(&["threads", &fixture.pid().to_string(), "--debug", "2"]);
    assert_success(&text, "profiler threads --debug 2");
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(text.contains("main_wait+0x0"), "{what}: {text}");
    assert!(text.contains(&format!("{}:{}\n", script.display(), lines["main_wait"])), "{what}: {text}");
}

#[test]
fn python_threads_show_their_functions_files_and_lines_under_each_version() {
    if !preflight() {
        return;
    }
    let found = interpreters(&[(3, 11), (3, 12), (3, 13)]);
    assert!(!found.is_empty(), "no CPython 3.11-3.13 on the machine: nothing would be tested");
    let out = TempDir::new("python-threads");
    for python in &found {
        eprintln!("checking {} ({})", python.label, python.path.display());
        check_interpreter(python, &out);
    }
}

#[test]
fn an_unsupported_python_keeps_its_native_frames_and_says_why() {
    if !preflight() {
        return;
    }
    let Some(python) = interpreters(&[(3, 10)]).into_iter().next() else { return };
    let out = TempDir::new("python-unsupported");
    let fixture = PythonFixture::spawn(&python.path, &fixture_path("py_threads.py"), &[FIXTURE_S]);
    let (profile, _) = dump(fixture.pid(), &out, "threads");
    assert!(
        profile.comments.iter().any(|c| c.starts_with("python: native frames only: ") && c.contains("3.10")),
        "{:?}",
        profile.comments
    );
    assert!(profile.samples.iter().all(|s| !s.stack.iter().any(is_python)), "no Python frame");
    assert!(profile.samples.iter().any(|s| s.stack.iter().any(|f| f.function == EVAL)), "the loop's frames stay");
}

/// The daemon's `/debug/pprof/goroutine` shows the same Python frames, and a second query
/// names the code objects from its cache (each checked against the process, none re-read).
#[test]
fn the_daemon_answers_python_frames_and_keeps_code_objects() {
    if !preflight() {
        return;
    }
    let python = interpreters(&[(3, 12), (3, 13), (3, 11)]).into_iter().next().expect("a CPython 3.11-3.13");
    let name: &'static str =
        Box::leak(python.path.file_name().unwrap().to_string_lossy().into_owned().into_boxed_str());
    let mut config = DaemonConfig::new(&[name]);
    config.profiles = vec!["threads"];
    let daemon = Daemon::start(&config);
    let script = fixture_path("py_threads.py");
    let lines = marked_lines(&script);
    let fixture = PythonFixture::spawn(&python.path, &script, &[FIXTURE_S]);
    let query = format!("/debug/pprof/goroutine?pid={}&debug=0", fixture.pid());
    let decode = |body: Vec<u8>, name: &str| {
        let file = Path::new(daemon.scratch()).join(name);
        std::fs::write(&file, body).unwrap();
        Profile::decode(&file)
    };
    // Settled as `settled_dump` does: the main thread may still be returning from `print`.
    let settled = |p: &Profile| PY_THREADS.iter().all(|t| thread_in(p, t.chain[0].0).is_some());
    let mut first = decode(daemon.get_ok(&query), "first.pb.gz");
    for _ in 0..5 {
        if settled(&first) {
            break;
        }
        std::thread::sleep(Duration::from_millis(300));
        first = decode(daemon.get_ok(&query), "first.pb.gz");
    }
    let second = decode(daemon.get_ok(&query), "second.pb.gz");
    for profile in [&first, &second] {
        let sample = thread_in(profile, "main_wait").unwrap_or_else(|| panic!("{:?}", profile.comments));
        check_thread(sample, &PY_THREADS[0], &lines, &script, &format!("daemon, {}", python.label));
    }
    let comment = |p: &Profile| p.comments.iter().find(|c| c.starts_with("python: ")).cloned().unwrap_or_default();
    assert!(comment(&second).contains("code objects read 0, cached "), "{}", comment(&second));
}

/// The 3.11 and 3.12 constants field by field against what `gdb` reads from the
/// interpreters' own debug info (pyenv's `libpython3.X.so` carries it; Debian's stripped
/// binary does not, and is covered by the end-to-end test above, as every version is). A
/// wrong constant is named here rather than seen as a missing frame there.
#[test]
fn python_offsets_3_11_and_3_12_match_the_interpreters_debug_info() {
    use profiler_daemon::runtimes::cpython::offsets::{CurrentFrame, EntryMark, Offsets, V3_11, V3_12};
    assert!(
        which("gdb").is_some(),
        "no gdb to read the interpreters' debug info: `cargo xtask setup --for-test` installs it"
    );
    for python in interpreters(&[(3, 11), (3, 12)]) {
        let Some(lib) = libpython(&python) else {
            eprintln!("{}: no libpython with debug info next to it; checked end to end only", python.label);
            continue;
        };
        let o: Offsets = if python.version == (3, 11) { V3_11 } else { V3_12 };
        let (cframe, current_frame) = match o.current_frame {
            CurrentFrame::ViaCFrame { cframe, current_frame } => (cframe, current_frame),
            CurrentFrame::Direct(_) => panic!("3.11 and 3.12 go through cframe"),
        };
        let member = |ty: &str, field: &str| format!("(unsigned long)&(({ty}*)0)->{field}");
        let mut checks = vec![
            (member("struct pyruntimestate", "interpreters.head"), o.runtime_interpreters_head),
            (member("PyInterpreterState", "threads.head"), o.interp_threads_head),
            (member("PyThreadState", "next"), o.thread_next),
            (member("PyThreadState", "native_thread_id"), o.thread_native_id),
            (member("PyThreadState", "cframe"), cframe),
            (member("_PyCFrame", "current_frame"), current_frame),
            (member("_PyInterpreterFrame", "previous"), o.frame_previous),
            (member("_PyInterpreterFrame", "f_code"), o.frame_code),
            (member("_PyInterpreterFrame", "prev_instr"), o.frame_instr),
            (member("_PyInterpreterFrame", "owner"), o.frame_owner),
            (member("PyCodeObject", "co_filename"), o.code_filename),
            (member("PyCodeObject", "co_qualname"), o.code_qualname),
            (member("PyCodeObject", "co_linetable"), o.code_linetable),
            (member("PyCodeObject", "co_firstlineno"), o.code_firstlineno),
            (member("PyCodeObject", "co_code_adaptive"), o.code_adaptive),
            (member("PyVarObject", "ob_size"), o.bytes_size),
            (member("PyBytesObject", "ob_sval"), o.bytes_data),
            (member("PyASCIIObject", "length"), o.unicode_length),
            (member("PyASCIIObject", "state"), o.unicode_state),
            ("sizeof(PyASCIIObject)".to_string(), o.unicode_ascii_size),
            ("sizeof(PyCompactUnicodeObject)".to_string(), o.unicode_compact_size),
        ];
        if let EntryMark::IsEntry(offset) = o.entry {
            checks.push((member("_PyInterpreterFrame", "is_entry"), offset));
        }
        let values = gdb_values(&lib, checks.iter().map(|(e, _)| e.as_str()));
        for ((expr, ours), theirs) in checks.iter().zip(values) {
            assert_eq!(Some(*ours), theirs, "{}: {expr} in {}", python.label, lib.display());
        }
        eprintln!("{}: {} offsets match {}", python.label, checks.len(), lib.display());
    }
}

fn which(program: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")?.to_str()?.split(':').map(|d| Path::new(d).join(program)).find(|p| p.exists())
}

/// The `libpython3.X.so.1.0` a pyenv interpreter links, when it has debug info.
fn libpython(python: &Interpreter) -> Option<PathBuf> {
    let (major, minor) = python.version;
    let lib = python.path.parent()?.parent()?.join(format!("lib/libpython{major}.{minor}.so.1.0"));
    let sections = std::process::Command::new("readelf").arg("-S").arg(&lib).output().ok()?;
    String::from_utf8_lossy(&sections.stdout).contains(".debug_info").then_some(lib)
}

/// Each expression's value as `gdb -batch` prints it (`$N = VALUE`), `None` if it could not.
fn gdb_values<'a>(file: &Path, exprs: impl Iterator<Item = &'a str>) -> Vec<Option<u64>> {
    let mut cmd = std::process::Command::new("gdb");
    cmd.args(["-batch", "-nx"]).arg(file);
    let mut count = 0;
    for expr in exprs {
        cmd.arg("-ex").arg(format!("print {expr}"));
        count += 1;
    }
    let out = cmd.output().expect("gdb runs");
    let text = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    let mut values = vec![None; count];
    for line in text.lines() {
        let Some((var, value)) = line.strip_prefix('$').and_then(|l| l.split_once(" = ")) else { continue };
        if let (Ok(n), Ok(v)) = (var.parse::<usize>(), value.trim().parse::<u64>()) {
            values[n - 1] = Some(v);
        }
    }
    values
}

/// Security review N3: 3,600 code objects (4 threads, 900 each) that share one 256 KiB
/// location table, made by nobody. A thread dump of them once took the profiler from 75 MB
/// to 995 MB; with the cache bounded in bytes and lines kept instead of tables, its peak RSS
/// stays under the unit's `MemoryHigh` (384 MiB), read from the kernel's own count for
/// the `profiler threads` process (`wait4`'s `ru_maxrss`).
#[test]
fn code_objects_sharing_a_huge_line_table_do_not_blow_up_a_thread_dump() {
    use std::os::unix::fs::PermissionsExt;
    if !preflight() {
        return;
    }
    // Debian's static build: nobody can run it (pyenv's are under /root).
    let python = PathBuf::from("/usr/bin/python3.11");
    assert!(python.exists(), "this test needs {}", python.display());
    let scratch = TempDir::new("python-codes");
    std::fs::set_permissions(scratch.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let script = scratch.path().join("py_codes.py");
    std::fs::copy(fixture_path("py_codes.py"), &script).unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o644)).unwrap();
    let fixture = PythonFixture::spawn_as_nobody(&python, &script, &[FIXTURE_S]);
    let file = scratch.path().join("threads.pb.gz");
    // Reaped by `wait4` below, for its `rusage`, which `Child::wait` does not give.
    #[allow(clippy::zombie_processes)]
    let child = std::process::Command::new(profiler_tests::run::profiler_bin())
        .args(["threads", &fixture.pid().to_string(), "--debug", "0", "--output", file.to_str().unwrap()])
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("failed to start profiler threads");
    // SAFETY: `rusage` is plain integers, for which zero is a valid value.
    let (mut status, mut usage) = (0, unsafe { std::mem::zeroed::<libc::rusage>() });
    // SAFETY: waits for our own child (not waited for elsewhere), writing to the two locals.
    let waited = unsafe { libc::wait4(child.id() as libc::pid_t, &mut status, 0, &mut usage) };
    assert_eq!(waited, child.id() as libc::pid_t, "wait4: {}", std::io::Error::last_os_error());
    assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0, "profiler threads failed: status {status:#x}");
    let peak_kib = usage.ru_maxrss;
    assert!(peak_kib < 384 * 1024, "profiler threads peaked at {peak_kib} KiB, over 384 MiB");
    // And it did name the attack's frames (up to its budgets), so the bound is not from
    // reading nothing.
    let profile = Profile::decode(&file);
    let named = profile
        .samples
        .iter()
        .flat_map(|s| s.user_frames())
        .filter(|f| is_python(f) && f.function.starts_with("s0_"))
        .count();
    assert!(named > 0, "no frame of the chains was named; comments {:?}", profile.comments);
}
