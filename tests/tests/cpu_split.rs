//! CPU-time attribution against fixtures whose split is known by construction: `cpu_split`
//! (C) and `cpu_split_rs` (Rust) spend 75% of their thread CPU time in `hot_a` and 25% in
//! `hot_b`, both called from `work_loop` from `main`. Checks the pprof file's place and format,
//! the 75/25 share within ±6 points, the call chain, the labels, and that Go's pprof reads the
//! file and sees the same share. Also: a process that exits mid-capture is still profiled.

use profiler_tests::run::Running;
use profiler_tests::{assert_success, expect, go_pprof, preflight, run_profiler};
use profiler_tests::{Fixture, FixtureKind, Profile, TempDir};

const FREQUENCY_HZ: i64 = 199;
const CAPTURE_S: u32 = 5;
/// Long enough to outlast profiler startup plus the capture; the guard kills it after.
const FIXTURE_S: u32 = 10;
/// hot_a's share of hot_a + hot_b, by construction of the fixtures.
const HOT_A_SHARE: f64 = 0.75;
/// ±6 points: over 4 standard deviations of a binomial share at ~1000 samples.
const SHARE_TOLERANCE: f64 = 0.06;
/// Frame-pointer unwinding loses the chain only for samples in a prologue or in libc's
/// clock_gettime; those are ~1% of the fixture's time.
const MIN_CHAIN_SHARE: f64 = 0.90;

/// C fixture: 75/25 split, chain hot_X → work_loop → main, format, labels, go tool pprof.
#[test]
fn c_split_matches_ground_truth() {
    if !preflight() {
        return;
    }
    check_split(FixtureKind::CpuSplitC);
}

/// Rust fixture: the same, with demangled names such as `cpu_split_rs::hot_a`.
#[test]
fn rust_split_matches_ground_truth() {
    if !preflight() {
        return;
    }
    check_split(FixtureKind::CpuSplitRust);
}

/// A fixture that exits (and is reaped) 2 s into a 5 s capture: the profiler exits 0 and
/// still writes its profile, with hot_a symbolized by name although the process is gone.
#[test]
fn process_exiting_during_capture_is_still_profiled() {
    if !preflight() {
        return;
    }
    let out = TempDir::new("exit");
    let mut fixture = Fixture::spawn(FixtureKind::CpuSplitC, 2);
    let (pid, out_arg) = (fixture.pid().to_string(), out.path_arg());
    let output = std::thread::scope(|scope| {
        let args = ["snapshot", "--pid", &pid, "--duration", "5s", "--output", &out_arg];
        let profiler = scope.spawn(move || run_profiler(&args));
        // Reap the fixture as soon as it exits, as its parent would: the profiler must not
        // depend on /proc/PID outliving the process.
        let status = fixture.wait();
        assert!(status.success(), "fixture exited with {status}");
        profiler.join().expect("profiler runner panicked")
    });
    assert_success(&output, "snapshot of a process that exits mid-capture");
    let path = expect::profile_written(out.path(), fixture.comm(), fixture.pid());
    let profile = Profile::decode(&path);
    assert!(
        profile.samples.iter().any(|s| s.contains("hot_a")),
        "no sample names hot_a; functions: {:?}",
        profile.function_names()
    );
}

/// Several `--pid`s: the C and the Rust fixture selected, a second C fixture not. Both
/// selected ones get a profile with their own 75/25 split and one thread; the unselected one
/// gets no directory.
#[test]
fn several_pids_are_selected_and_no_other() {
    if !preflight() {
        return;
    }
    let out = TempDir::new("several-pids");
    let c = Fixture::spawn(FixtureKind::CpuSplitC, FIXTURE_S);
    let rust = Fixture::spawn(FixtureKind::CpuSplitRust, FIXTURE_S);
    let other = Fixture::spawn(FixtureKind::CpuSplitC, FIXTURE_S);
    let (c_pid, rust_pid) = (c.pid().to_string(), rust.pid().to_string());
    let output = run_profiler(&[
        "snapshot",
        "--pid",
        &c_pid,
        "--pid",
        &rust_pid,
        "--duration",
        &format!("{CAPTURE_S}s"),
        "--frequency",
        &FREQUENCY_HZ.to_string(),
        "--output",
        &out.path_arg(),
    ]);
    assert_success(&output, "snapshot --pid C --pid RUST");
    for fixture in [&c, &rust] {
        let profile = Profile::decode(&expect::profile_written(out.path(), fixture.comm(), fixture.pid()));
        expect::single_thread_labels(&profile, fixture.pid(), fixture.comm());
        check_share(&profile);
    }
    let stray = profiler_tests::process_dir(out.path(), other.comm(), other.pid());
    assert!(
        !stray.exists(),
        "the unselected pid {} got {}: {}",
        other.pid(),
        stray.display(),
        profiler_tests::listing(out.path())
    );
}

fn check_split(kind: FixtureKind) {
    let out = TempDir::new(kind.comm());
    let fixture = Fixture::spawn(kind, FIXTURE_S);
    let pid = fixture.pid().to_string();
    let frequency = FREQUENCY_HZ.to_string();
    let duration = format!("{CAPTURE_S}s");
    let args =
        ["snapshot", "--pid", &pid, "--duration", &duration, "--frequency", &frequency, "--output", &out.path_arg()];
    // The fixture's CPU time over the capture (a little more: read from `capturing` to the
    // end), what its samples are judged by: on a loaded machine it gets less than 5 s.
    let mut profiler = Running::start(&args);
    profiler.wait_capturing();
    let cpu_before = fixture.cpu_ns();
    let output = profiler.finish();
    let cpu_ns = fixture.cpu_ns() - cpu_before;
    assert_success(&output, "snapshot --pid");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        stdout.contains(kind.comm()) && stdout.contains("hot_a"),
        "the summary should name {} and its hottest function hot_a:\n{stdout}",
        kind.comm()
    );

    let path = expect::profile_written(out.path(), fixture.comm(), fixture.pid());
    let profile = Profile::decode(&path);
    expect::cpu_profile_format(&profile, FREQUENCY_HZ);
    expect::single_thread_labels(&profile, fixture.pid(), fixture.comm());
    expect::busy_thread_sample_count(&profile, cpu_ns, FREQUENCY_HZ);
    check_share(&profile);
    check_chains(&profile);
    check_go_pprof(&path);
}

/// hot_a / (hot_a + hot_b) by sample count, over stacks containing each.
fn check_share(profile: &Profile) {
    let in_fn = |f: &str| profile.value_where("samples", |s| s.contains(f)) as f64;
    let (a, b) = (in_fn("hot_a"), in_fn("hot_b"));
    let total = profile.total("samples") as f64;
    assert!(
        a + b >= 0.9 * total,
        "only {a} + {b} of {total} samples are in hot_a/hot_b; functions: {:?}",
        profile.function_names()
    );
    let share = a / (a + b);
    assert!(
        (share - HOT_A_SHARE).abs() <= SHARE_TOLERANCE,
        "hot_a share {share:.3} ({a} of {} samples), expected {HOT_A_SHARE} ± {SHARE_TOLERANCE}",
        a + b
    );
}

/// Samples in hot_X carry hot_X → work_loop → main.
fn check_chains(profile: &Profile) {
    for hot in ["hot_a", "hot_b"] {
        let chain = [hot, "work_loop", "main"];
        let inside = profile.value_where("samples", |s| s.contains(hot));
        let chained = profile.value_where("samples", |s| s.contains(hot) && s.has_chain(&chain));
        let broken: Vec<Vec<&str>> = profile
            .samples
            .iter()
            .filter(|s| s.contains(hot) && !s.has_chain(&chain))
            .take(5)
            .map(|s| s.names())
            .collect();
        assert!(
            chained as f64 >= MIN_CHAIN_SHARE * inside as f64,
            "only {chained} of {inside} samples in {hot} carry {chain:?}; some that do not: {broken:?}"
        );
    }
}

/// Go's pprof decodes the file and attributes ~75% flat to hot_a.
fn check_go_pprof(path: &std::path::Path) {
    let raw = go_pprof::raw(path);
    assert!(
        raw.contains("hot_a") && raw.contains("work_loop"),
        "`go tool pprof -raw` output lacks hot_a or work_loop:\n{raw}"
    );
    let top = go_pprof::top(path);
    let flat = go_pprof::flat_percent(&top, "hot_a")
        .unwrap_or_else(|| panic!("`go tool pprof -top` has no hot_a row:\n{top}"));
    let expected = HOT_A_SHARE * 100.0;
    let tolerance = SHARE_TOLERANCE * 100.0;
    assert!(
        (flat - expected).abs() <= tolerance,
        "`go tool pprof -top` flat% of hot_a is {flat}, expected {expected} ± {tolerance}:\n{top}"
    );
}

/// cpu_split with its `.debug_str` replaced by 300 MiB of zeros, zlib-compressed (objcopy,
/// as a file any user can make): blazesym would inflate all of it into memory. The file is
/// named from its symbol table instead (hot_a and its chain are there, without source
/// lines), and the profile's comment names the section and the cap; the fixture built as
/// usual has source lines, so their absence is the refusal's doing.
#[test]
fn a_file_past_the_inflate_cap_is_named_without_its_debug_info() {
    if !preflight() {
        return;
    }
    let scratch = TempDir::new("inflate-cap");
    let zeros = scratch.path().join("zeros");
    std::fs::File::create(&zeros).unwrap().set_len(300 << 20).unwrap();
    let (bloated, bomb) = (scratch.path().join("bloated"), scratch.path().join(FixtureKind::CpuSplitC.comm()));
    // Two steps: objcopy compresses the sections it updates no more in the same run.
    objcopy(&[&format!("--update-section=.debug_str={}", zeros.display())], &FixtureKind::CpuSplitC.build(), &bloated);
    objcopy(&["--compress-debug-sections=zlib"], &bloated, &bomb);
    assert!(std::fs::metadata(&bomb).unwrap().len() < 4 << 20, "the section is not compressed");
    let mut cmd = std::process::Command::new(&bomb);
    cmd.arg(FIXTURE_S.to_string());
    let fixture = Fixture::from_command(FixtureKind::CpuSplitC, cmd);
    let plain = Fixture::spawn(FixtureKind::CpuSplitC, FIXTURE_S);
    let out = TempDir::new("inflate-cap-out");
    let (a, b) = (fixture.pid().to_string(), plain.pid().to_string());
    let output = run_profiler(&["snapshot", "--pid", &a, "--pid", &b, "--duration", "2s", "--output", &out.path_arg()]);
    assert_success(&output, "snapshot of a file past the inflate cap");
    let path = expect::profile_written(out.path(), fixture.comm(), fixture.pid());
    let profile = Profile::decode(&path);
    let chained = profile.samples.iter().any(|s| s.has_chain(&["hot_a", "work_loop", "main"]));
    assert!(chained, "no hot_a ← work_loop ← main chain: {:?}", profile.function_names());
    let comment = profile.comments.iter().find(|c| c.contains(".debug_str") && c.contains("over the"));
    assert!(comment.is_some(), "no comment names the capped section: {:#?}", profile.comments);
    // Source lines in the program's own mapping (the C library may have some of its own).
    let lines = |path: &std::path::Path, program: &std::path::Path| {
        let raw = profiler_daemon::pprof::decode_file(path).unwrap();
        let program = program.display().to_string();
        let ours: Vec<u64> =
            raw.mapping.iter().filter(|m| raw.string_table[m.filename as usize] == program).map(|m| m.id).collect();
        let located = raw.location.iter().filter(|l| ours.contains(&l.mapping_id));
        located.flat_map(|l| &l.line).filter(|l| l.line > 0).count()
    };
    assert_eq!(lines(&path, &bomb), 0, "source lines were read from the capped file");
    let plain_profile = expect::profile_written(out.path(), plain.comm(), plain.pid());
    assert!(lines(&plain_profile, &FixtureKind::CpuSplitC.build()) > 0, "the plain build has lines");
}

fn objcopy(args: &[&str], input: &std::path::Path, output: &std::path::Path) {
    let run = std::process::Command::new("objcopy")
        .args(args)
        .arg(input)
        .arg(output)
        .output()
        .expect("objcopy (binutils) is installed with gcc");
    assert!(run.status.success(), "objcopy {args:?} failed: {}", String::from_utf8_lossy(&run.stderr));
}
