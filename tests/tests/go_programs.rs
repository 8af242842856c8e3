//! Go programs named from their pclntab, against Go's own CPU profile of the same process.
//!
//! The fixture (`tests/fixtures/go_split.go`) spends 75% of its thread's CPU time in
//! `main.hotA` and 25% in `main.hotB` through `main.dispatch`, measured by its own thread
//! clock, and profiles itself with `runtime/pprof` meanwhile. Built four ways (plain,
//! `-s -w`, PIE, cgo), it runs under `profiler snapshot --pid`; our profile and Go's own
//! must each give hotA's share within 3.5σ of the fixture's truth, our stacks must carry
//! `main.hotA ← main.dispatch ← main.main ← runtime.main` (the frame-pointer walk through
//! Go code), the inlined `main.mix` must be an inlined frame of `main.hotA` at its own line
//! (as in Go's profile), and the lines of the fixture's functions must be the ones Go's own
//! profile names. In the cgo build, the C function `c_spin_b` is named, and the walk goes on
//! from it through `runtime.asmcgocall`'s stack switch to `main.hotB` and `runtime.main`.
//! Both profiles are decoded by our decoder: nothing is symbolized from the local binary.
//!
//! The four builds use the machine's Go (Debian's 1.19); the `-s -w` build is also checked
//! with each Go toolchain the test set-up fetched (1.21-1.24: the pclntab layout of 1.20 on,
//! their inline trees and funcdata), one test each.

use std::collections::BTreeMap;

use profiler_tests::go_build::{GoBuild, GoProcess, Toolchain};
use profiler_tests::{assert_success, expect, preflight, run_profiler, Profile, TempDir};

/// Long enough to outlast the profiler's start and its capture; its end is waited for.
const FIXTURE_S: u32 = 9;
const CAPTURE_S: &str = "5s";
const FREQUENCY_HZ: &str = "199";
/// The chain is lost only for samples in a function's first instructions (before it links
/// its frame).
const MIN_CHAIN_SHARE: f64 = 0.90;
/// A line with this share of a function's samples in one profile must be in the other.
const LINE_SHARE: f64 = 0.03;
const FIXTURE_FUNCTIONS: [&str; 4] = ["main.hotA", "main.hotB", "main.mix", "main.dispatch"];

#[test]
fn plain_go_build_is_named_from_its_pclntab() {
    check(GoBuild::Plain);
}

#[test]
fn stripped_go_build_is_named_from_its_pclntab() {
    check(GoBuild::Stripped);
}

#[test]
fn pie_go_build_is_named_from_its_pclntab() {
    check(GoBuild::Pie);
}

/// The cgo build: its C function is named (from the symbol table: it is outside the Go
/// text), under `runtime.asmcgocall` (named from the pclntab), and the walk crosses from
/// the system stack the C code ran on back to the goroutine's stack, up to `main.hotB` and
/// `runtime.main`, as Go's own traceback does; the Go side is checked as in the other builds.
/// The C function is called from `main.hotB` only, so its samples count as hotB's in the
/// share.
#[test]
fn cgo_build_names_its_c_function_and_its_go_code() {
    check(GoBuild::Cgo);
}

/// The cgo build with `-s -w`: no symbol table names asmcgocall, so the walk finds its cgo
/// calls by the pclntab; the C function is still named, from the dynamic symbols cgo
/// exports it by. The chain through asmcgocall back to `main.hotB` must hold as in the
/// plain cgo build.
#[test]
fn stripped_cgo_build_walks_from_its_c_code_to_its_go_caller() {
    check(GoBuild::CgoStripped);
}

#[test]
fn go_1_21_stripped_build_is_named_from_its_pclntab() {
    check_with(&Toolchain::fetched("1.21"), GoBuild::Stripped);
}

#[test]
fn go_1_22_stripped_build_is_named_from_its_pclntab() {
    check_with(&Toolchain::fetched("1.22"), GoBuild::Stripped);
}

#[test]
fn go_1_23_stripped_build_is_named_from_its_pclntab() {
    check_with(&Toolchain::fetched("1.23"), GoBuild::Stripped);
}

#[test]
fn go_1_24_stripped_build_is_named_from_its_pclntab() {
    check_with(&Toolchain::fetched("1.24"), GoBuild::Stripped);
}

fn check(build: GoBuild) {
    check_with(&Toolchain::machine(), build);
}

fn check_with(toolchain: &Toolchain, build: GoBuild) {
    if !preflight() {
        return;
    }
    let (ours, theirs, truth) = profile(toolchain, build);
    let what = format!("{build:?} (Go: {})", toolchain.name);
    // In the cgo build hotB's work is in C: its samples are the C function's, under hotB.
    let hot_b = if build.is_cgo() { ["main.hotB", "c_spin_b"].as_slice() } else { &["main.hotB"] };
    check_share(&ours, truth, hot_b, &format!("{what}: our profile"));
    check_share(&theirs, truth, &["main.hotB"], &format!("{what}: Go's own profile"));
    check_chain(&ours, &["main.hotA", "main.dispatch", "main.main", "runtime.main"], &what);
    check_inlined(&ours, &format!("{what}: our profile"));
    check_inlined(&theirs, &format!("{what}: Go's own profile"));
    let functions: Vec<&str> = FIXTURE_FUNCTIONS.into_iter().filter(|f| !build.is_cgo() || *f != "main.hotB").collect();
    check_lines(&ours, &theirs, &functions, &what);
    if build.is_cgo() {
        let total = ours.total("samples");
        let in_c = ours.value_where("samples", |s| s.contains("c_spin_b"));
        assert!(in_c * 10 >= total, "{what}: only {in_c} of {total} samples in c_spin_b");
        let c_to_go = [
            "c_spin_b",
            "runtime.asmcgocall",
            "runtime.cgocall",
            "main.hotB",
            "main.dispatch",
            "main.main",
            "runtime.main",
        ];
        check_chain(&ours, &c_to_go, &what);
    }
}

/// Runs `build` of the fixture, built by `toolchain`, under `profiler snapshot --pid`;
/// returns our profile, Go's own and hotA's true share of hotA + hotB.
fn profile(toolchain: &Toolchain, build: GoBuild) -> (Profile, Profile, f64) {
    let scratch = TempDir::new(build.comm());
    let out = TempDir::new(&format!("{}-out", build.comm()));
    let binary = build.build_with(toolchain, scratch.path());
    let go_profile = scratch.path().join("go.pprof");
    let mut go = GoProcess::spawn(&binary, FIXTURE_S, &go_profile);
    let pid = go.pid().to_string();
    let args =
        ["snapshot", "--pid", &pid, "--duration", CAPTURE_S, "--frequency", FREQUENCY_HZ, "--output", &out.path_arg()];
    let output = run_profiler(&args);
    assert_success(&output, "snapshot --pid of the Go fixture");
    // The fixture's truth, once its run (and its own profile) is over.
    let (a, b) = (go.read_value("truth_a_ns"), go.read_value("truth_b_ns"));
    go.expect_line("done");
    let truth = a as f64 / (a + b) as f64;
    let ours = Profile::decode(&expect::profile_written(out.path(), build.comm(), go.pid()));
    let theirs = Profile::decode(&go_profile);
    (ours, theirs, truth)
}

/// hotA's share of the samples in hotA or hotB (a sample in any of `hot_b`) is within 3.5σ
/// of `truth` (σ of a binomial share at the profile's sample count, which must make 3.5σ at
/// most 10 points).
fn check_share(profile: &Profile, truth: f64, hot_b: &[&str], what: &str) {
    let a = profile.value_where("samples", |s| s.contains("main.hotA"));
    let b = profile.value_where("samples", |s| !s.contains("main.hotA") && hot_b.iter().any(|f| s.contains(f)));
    let n = a + b;
    assert!(
        n >= expect::min_samples_for_share(truth, truth - 0.10),
        "{what}: {n} samples in main.hotA/main.hotB, too few to judge a share; functions: {:?}",
        profile.function_names()
    );
    let share = a as f64 / n as f64;
    let sigma = (truth * (1.0 - truth) / n as f64).sqrt();
    eprintln!("{what}: main.hotA's share {share:.3} of {n} samples, truth {truth:.3}, 3.5σ {:.3}", 3.5 * sigma);
    assert!(
        (share - truth).abs() <= 3.5 * sigma,
        "{what}: main.hotA's share {share:.3} ({a} of {n}), the fixture measured {truth:.3} (3.5σ = {:.3})",
        3.5 * sigma
    );
}

/// Most samples in `chain[0]` carry the whole chain.
fn check_chain(profile: &Profile, chain: &[&str], what: &str) {
    let inside = profile.value_where("samples", |s| s.contains(chain[0]));
    let chained = profile.value_where("samples", |s| s.has_chain(chain));
    let broken: Vec<Vec<&str>> = profile
        .samples
        .iter()
        .filter(|s| s.contains(chain[0]) && !s.has_chain(chain))
        .take(5)
        .map(|s| s.names())
        .collect();
    assert!(
        inside > 0 && chained as f64 >= MIN_CHAIN_SHARE * inside as f64,
        "{what}: {chained} of {inside} samples in {} carry {chain:?}; some that do not: {broken:?}",
        chain[0]
    );
}

/// `main.mix` (inlined by the compiler) is a frame of its own at the fixture's MIX_LINE,
/// directly under `main.hotA` at the same address: one location, two lines.
fn check_inlined(profile: &Profile, what: &str) {
    let source = std::fs::read_to_string(profiler_tests::workspace_root().join("tests/fixtures/go_split.go")).unwrap();
    let mix_line = source.lines().position(|l| l.contains("// MIX_LINE")).unwrap() as i64 + 1;
    let mut in_mix = 0;
    for sample in profile.samples.iter().filter(|s| s.contains("main.mix")) {
        let at = sample.stack.iter().position(|f| f.function == "main.mix").unwrap();
        let (mix, caller) = (&sample.stack[at], sample.stack.get(at + 1));
        assert_eq!(mix.line, mix_line, "{what}: main.mix's line: {:?}", sample.stack);
        assert!(
            caller.is_some_and(|c| c.function == "main.hotA" && c.address == mix.address),
            "{what}: main.mix is not an inlined frame of main.hotA: {:?}",
            sample.stack
        );
        in_mix += 1;
    }
    assert!(in_mix > 0, "{what}: no sample in main.mix; functions: {:?}", profile.function_names());
}

/// For each fixture function, the lines carrying a share of its samples in one profile are
/// lines the other names too, and its file is the same.
fn check_lines(ours: &Profile, theirs: &Profile, functions: &[&str], what: &str) {
    for &function in functions {
        let (our_lines, our_files) = lines_of(ours, function);
        let (their_lines, their_files) = lines_of(theirs, function);
        assert_eq!(our_files, their_files, "{what}: {function}'s file");
        for (a, b, side) in [(&our_lines, &their_lines, "ours"), (&their_lines, &our_lines, "Go's")] {
            let total: i64 = a.values().sum();
            for (line, count) in a {
                assert!(
                    (*count as f64) < LINE_SHARE * total as f64 || b.contains_key(line),
                    "{what}: {function} line {line} has {count} of {total} samples in {side} profile, none in the \
                     other; ours {our_lines:?}, Go's {their_lines:?}"
                );
            }
        }
    }
}

/// Samples per line of `function`'s frames, and the files those frames name.
fn lines_of(profile: &Profile, function: &str) -> (BTreeMap<i64, i64>, Vec<String>) {
    let index = profile.value_index("samples");
    let mut lines = BTreeMap::new();
    let mut files = Vec::new();
    for sample in &profile.samples {
        for frame in sample.stack.iter().filter(|f| f.function == function) {
            *lines.entry(frame.line).or_insert(0) += sample.values[index];
            if !files.contains(&frame.file) {
                files.push(frame.file.clone());
            }
        }
    }
    (lines, files)
}
