//! `profiler threads PID` of a Go process is its goroutines, checked against the process's
//! own `pprof.Lookup("goroutine")` taken at the same moment (tests/fixtures/go_goroutines.go:
//! 10 goroutines in `main.waitA`, 5 in `main.sleepB`, 3 in `main.lockC`, 2 running
//! `main.spinD`, each group under its own pprof label): `debug=1`'s labelled records (their
//! labels, frames and counts) equal Go's, `debug=2` has each of them with Go's id, state and
//! creator, `go tool pprof` reads `debug=0`, and the fixture's 1 ms ticker shows it was not
//! stopped; the same with each Go toolchain the test set-up fetched (1.21-1.24: their `g`
//! layouts, wait reasons, `created by … in goroutine N`, and 1.24's label lists). The daemon's `/debug/pprof/goroutine` answers the same, and its OS threads with
//! `threads=os`.

use std::{
    collections::BTreeMap,
    io::{BufRead, BufReader, Write},
    path::{Path, PathBuf},
    process::{Child, ChildStdin, ChildStdout, Command, Stdio},
    time::{Duration, Instant},
};

use profiler_tests::{
    assert_success,
    daemon::{wait_for, Daemon, DaemonConfig},
    go_build::Toolchain,
    go_pprof, preflight, run_profiler, workspace_root, TempDir,
};

/// How long the goroutines may take to reach their places (a loaded machine).
const SETTLE: Duration = Duration::from_secs(60);
/// The ticker's longest gap allowed while the dumps are taken: two spinners keep both CPUs
/// of a test machine busy, so the ticker waits for Go's 10 ms preemption; a dumper that
/// stopped the process would add the dump's whole time.
const MAX_GAP: Duration = Duration::from_secs(1);

/// The fixture, fed commands on stdin; killed when dropped.
struct GoFixture {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl GoFixture {
    fn start(binary: &Path, out: &Path) -> Self {
        let mut child = Command::new(binary)
            .arg(out)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("failed to start {}: {e}", binary.display()));
        let stdin = child.stdin.take().expect("piped");
        let stdout = BufReader::new(child.stdout.take().expect("piped"));
        let mut fixture = GoFixture { child, stdin, stdout };
        assert_eq!(fixture.line(), "ready");
        fixture
    }

    fn send(&mut self, command: &str) {
        writeln!(self.stdin, "{command}").expect("write to the fixture");
        self.stdin.flush().expect("flush to the fixture");
    }

    fn line(&mut self) -> String {
        let mut line = String::new();
        self.stdout.read_line(&mut line).expect("read from the fixture");
        line.trim().to_string()
    }

    fn pid(&self) -> String {
        self.child.id().to_string()
    }
}

impl Drop for GoFixture {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Builds the fixture into `scratch` with the machine's Go (no module proxy needed).
fn build(scratch: &Path) -> PathBuf {
    build_with(&Toolchain::machine(), scratch, &[])
}

/// Like [`build`], with `toolchain` and extra `go build` flags.
fn build_with(toolchain: &Toolchain, scratch: &Path, flags: &[&str]) -> PathBuf {
    let binary = scratch.join("go_goroutines");
    let source = workspace_root().join("tests/fixtures/go_goroutines.go");
    let output = toolchain
        .command(scratch)
        .arg("build")
        .args(flags)
        .arg("-o")
        .arg(&binary)
        .arg(&source)
        .output()
        .expect("run go build (install golang-go)");
    assert!(output.status.success(), "go build: {}", String::from_utf8_lossy(&output.stderr));
    binary
}

/// One `debug=1` record's key: its labels line and the functions its frame lines name.
type Record = (String, Vec<String>);

/// The labelled records of a `debug=1` text, with their counts (the unlabelled ones are the
/// fixture's main goroutine and ticker, which the two dumps see at different moments).
fn labelled_records(text: &str) -> BTreeMap<Record, u64> {
    let mut records = BTreeMap::new();
    for block in text.split("\n\n") {
        let mut lines = block.lines().skip_while(|l| l.starts_with("goroutine profile:"));
        let Some(head) = lines.next() else { continue };
        let Some((count, _)) = head.split_once(" @ ") else { continue };
        let mut labels = None;
        let mut functions = Vec::new();
        for line in lines {
            if let Some(l) = line.strip_prefix("# labels: ") {
                labels = Some(l.to_string());
            } else if let Some(frame) = line.strip_prefix("#\t") {
                let name = frame.split('\t').nth(1).and_then(|f| f.rsplit_once('+')).map(|(n, _)| n.to_string());
                functions.push(name.unwrap_or_else(|| "?".into()));
            }
        }
        if let Some(labels) = labels {
            *records.entry((labels, functions)).or_insert(0) += count.parse::<u64>().expect("a count");
        }
    }
    records
}

/// A `debug=2` goroutine: its bracket text, its functions, its creator.
#[derive(Debug, PartialEq, Eq)]
struct Goroutine {
    state: String,
    functions: Vec<String>,
    creator: Option<String>,
}

/// Each goroutine of a `debug=2` text by id.
fn goroutines(text: &str) -> BTreeMap<i64, Goroutine> {
    let mut all = BTreeMap::new();
    for block in text.split("\n\n") {
        let mut lines = block.lines();
        let Some(head) = lines.next().and_then(|l| l.strip_prefix("goroutine ")) else { continue };
        let (id, rest) = head.split_once(" [").expect("goroutine N [state]:");
        let state = rest.trim_end_matches("]:").to_string();
        let mut g = Goroutine { state, functions: Vec::new(), creator: None };
        for line in lines.filter(|l| !l.starts_with('\t')) {
            match line.strip_prefix("created by ") {
                Some(creator) => g.creator = Some(creator.to_string()),
                None => g.functions.push(line.rsplit_once('(').map_or(line, |(name, _)| name).to_string()),
            }
        }
        all.insert(id.parse().expect("a goroutine id"), g);
    }
    all
}

fn ours(pid: &str, debug: &str) -> String {
    let output = run_profiler(&["threads", pid, "--debug", debug]);
    assert_success(&output, "profiler threads");
    String::from_utf8(output.stdout).expect("UTF-8")
}

/// What the fixture's groups are, by their label.
fn expected() -> BTreeMap<&'static str, (&'static str, u64)> {
    BTreeMap::from([
        ("a", ("main.waitA", 10)),
        ("b", ("main.sleepB", 5)),
        ("c", ("main.lockC", 3)),
        ("d", ("main.spinD", 2)),
    ])
}

/// Whether `records` has every group with its count, each naming its function.
fn settled(records: &BTreeMap<Record, u64>) -> bool {
    expected().into_iter().all(|(group, (function, n))| {
        let labels = format!("{{\"group\":\"{group}\"}}");
        records
            .iter()
            .any(|((l, functions), &count)| *l == labels && count == n && functions.iter().any(|f| f == function))
    })
}

/// The machine's Go, a plain build: the offsets come from the binary's DWARF.
#[test]
fn a_go_process_dump_is_its_goroutines_as_go_itself_sees_them() {
    dump_is_as_go_sees_it(&Toolchain::machine(), &[], "offsets from its DWARF");
}

#[test]
fn go_1_21_dump_is_its_goroutines_as_go_itself_sees_them() {
    dump_is_as_go_sees_it(&Toolchain::fetched("1.21"), &["-ldflags=-w"], "offsets from the Go 1.21 table (no DWARF)");
}

#[test]
fn go_1_22_dump_is_its_goroutines_as_go_itself_sees_them() {
    dump_is_as_go_sees_it(&Toolchain::fetched("1.22"), &["-ldflags=-w"], "offsets from the Go 1.22 table (no DWARF)");
}

#[test]
fn go_1_23_dump_is_its_goroutines_as_go_itself_sees_them() {
    dump_is_as_go_sees_it(&Toolchain::fetched("1.23"), &["-ldflags=-w"], "offsets from the Go 1.23 table (no DWARF)");
}

#[test]
fn go_1_24_dump_is_its_goroutines_as_go_itself_sees_them() {
    dump_is_as_go_sees_it(&Toolchain::fetched("1.24"), &["-ldflags=-w"], "offsets from the Go 1.24 table (no DWARF)");
}

/// The fetched toolchains build with `-ldflags=-w` (symbol table, no DWARF), so their
/// version's table is what is read (the unit tests check each table equals the DWARF of that
/// version's binaries). `source`: what the comment must say the offsets came from.
fn dump_is_as_go_sees_it(toolchain: &Toolchain, flags: &[&str], source: &str) {
    if !preflight() {
        return;
    }
    let scratch = TempDir::new("go-goroutines");
    let binary = build_with(toolchain, scratch.path(), flags);
    eprintln!("Go toolchain: {} ({})", toolchain.name, toolchain.go.display());
    let mut fixture = GoFixture::start(&binary, scratch.path());
    let pid = fixture.pid();

    // The goroutines reach their places in their own time: wait for ours to show them all.
    let deadline = Instant::now() + SETTLE;
    let mut ours1 = ours(&pid, "1");
    while !settled(&labelled_records(&ours1)) {
        assert!(Instant::now() < deadline, "the goroutines never all showed in our dump:\n{ours1}");
        ours1 = ours(&pid, "1");
    }

    // The same moment: the fixture writes its own while ours are taken.
    fixture.send("start");
    fixture.send("dump");
    let ours1 = ours(&pid, "1");
    let ours2 = ours(&pid, "2");
    let pprof_file = scratch.path().join("ours.pb.gz");
    let output = run_profiler(&["threads", &pid, "--debug", "0", "--output", pprof_file.to_str().unwrap()]);
    assert_success(&output, "profiler threads --debug 0");
    assert_eq!(fixture.line(), "dumped");
    fixture.send("gap");
    let gap_us: u64 = fixture.line().strip_prefix("gap_us ").and_then(|n| n.parse().ok()).expect("gap_us N");
    let theirs1 = std::fs::read_to_string(scratch.path().join("goroutine.1.txt")).unwrap();
    let theirs2 = std::fs::read_to_string(scratch.path().join("goroutine.2.txt")).unwrap();

    // debug=1: the labelled records, their frames and counts, are Go's own.
    let (our_records, their_records) = (labelled_records(&ours1), labelled_records(&theirs1));
    assert!(settled(&their_records), "the fixture's own profile lacks a group:\n{theirs1}");
    assert_eq!(our_records, their_records, "ours:\n{ours1}\nGo's own:\n{theirs1}");

    // debug=2: every goroutine of the groups, by Go's id, with Go's state and creator.
    let (our_gs, their_gs) = (goroutines(&ours2), goroutines(&theirs2));
    let mut compared = 0;
    for (id, theirs) in &their_gs {
        let Some((_, (function, _))) =
            expected().into_iter().find(|(_, (f, _))| theirs.functions.iter().any(|t| t == f))
        else {
            continue;
        };
        let ours = our_gs.get(id).unwrap_or_else(|| panic!("goroutine {id} ({function}) missing from ours:\n{ours2}"));
        assert!(ours.functions.iter().any(|f| f == function), "goroutine {id}: {ours:?}, Go's {theirs:?}");
        assert_eq!(ours.creator, theirs.creator, "goroutine {id}'s creator");
        if function != "main.spinD" {
            assert_eq!(ours.state, theirs.state, "goroutine {id}'s state");
        }
        compared += 1;
    }
    assert_eq!(compared, 20, "Go's own debug=2:\n{theirs2}");

    // debug=0: go tool pprof reads it, labels included; its comment says where the offsets
    // came from.
    let raw = go_pprof::raw(&pprof_file);
    assert!(raw.contains(source), "the comment does not say `{source}`:\n{raw}");
    let traces = go_pprof::traces(&pprof_file);
    for (group, (function, _)) in expected() {
        assert!(traces.contains(function), "{function} not in go tool pprof -traces:\n{traces}");
        let label = format!("group:  {group}");
        assert!(traces.lines().any(|l| l.trim() == label), "label group={group} not in -traces:\n{traces}");
    }

    let gap = Duration::from_micros(gap_us);
    eprintln!("the fixture's 1 ms ticker's longest gap while dumped: {gap:?}");
    assert!(gap < MAX_GAP, "the fixture's ticker stalled {gap:?} while dumped");
}

#[test]
fn the_daemon_serves_goroutines_and_the_os_threads_on_request() {
    if !preflight() {
        return;
    }
    let mut config = DaemonConfig::new(&["go_goroutines"]);
    config.profiles = vec!["threads"];
    let daemon = Daemon::start(&config);
    let scratch = TempDir::new("go-goroutines-daemon");
    let binary = build(scratch.path());
    let fixture = GoFixture::start(&binary, scratch.path());
    let pid = fixture.pid();

    let mut grouped = String::new();
    let complete = wait_for(SETTLE, || {
        grouped =
            String::from_utf8_lossy(&daemon.get_ok(&format!("/debug/pprof/goroutine?pid={pid}&debug=1"))).into_owned();
        settled(&labelled_records(&grouped))
    });
    assert!(complete, "the daemon's goroutine dump never showed every group:\n{grouped}");
    assert!(grouped.starts_with("goroutine profile: total "), "{grouped}");

    let threads = std::fs::read_dir(format!("/proc/{pid}/task")).expect("the fixture's threads").count();
    let os = String::from_utf8_lossy(&daemon.get_ok(&format!("/debug/pprof/goroutine?pid={pid}&debug=2&threads=os")))
        .into_owned();
    let dumped = os.lines().filter(|l| l.starts_with("thread ")).count();
    // Go starts a thread now and then (a spinner's P handed off): within a few of /proc's.
    assert!(dumped > 0 && dumped.abs_diff(threads) <= 3, "{dumped} threads dumped, /proc has {threads}:\n{os}");
    assert!(!os.contains("goroutine "), "threads=os shows no goroutine:\n{os}");
}

/// A binary built with `-ldflags=-s -w` has no symbol table to find `runtime.allgs` by: its
/// dump is of its OS threads, and the comment says why.
#[test]
fn a_stripped_go_binary_falls_back_to_its_threads_and_says_why() {
    if !preflight() {
        return;
    }
    let scratch = TempDir::new("go-goroutines-stripped");
    let binary = build_with(&Toolchain::machine(), scratch.path(), &["-ldflags=-s -w"]);
    let fixture = GoFixture::start(&binary, scratch.path());
    let file = scratch.path().join("stripped.pb.gz");
    let output = run_profiler(&["threads", &fixture.pid(), "--debug", "0", "--output", file.to_str().unwrap()]);
    assert_success(&output, "profiler threads of a stripped Go binary");
    let raw = go_pprof::raw(&file);
    assert!(raw.contains("Go binary without symbols (go1."), "{raw}");
    let text = ours(&fixture.pid(), "2");
    assert!(text.starts_with("thread "), "OS threads:\n{text}");
}
