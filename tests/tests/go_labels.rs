//! Go's pprof labels on our CPU samples, against the fixture's own clock and Go's own CPU
//! profile of the same process.
//!
//! The fixture (`tests/fixtures/go_labels.go`) runs two worker goroutines started under
//! `pprof.Do(ctx, pprof.Labels("handler", "a"|"b", "pool", "spinners"))`, one at a time,
//! 75% / 25% of their threads' CPU time by its own thread clocks, and profiles itself with
//! `runtime/pprof` meanwhile. Under `profiler snapshot --pid` (beside a C fixture, which must
//! get no labels), our profile's `handler=a` share of the labelled samples, read by our
//! decoder and by `go tool pprof -tagfocus`, and Go's own profile's, must each be within 3.5σ
//! of the truth; every sample in the workers' `main.spin` must carry both labels. Built two
//! ways: static (Go sets the thread pointer itself, `g` at -8 from it) and cgo linked
//! externally with C thread-locals (`g` at -48: found from the ELF file's TLS segment and
//! `runtime.tlsg`); and static with the fetched Go 1.21 (`g` moved) and 1.24 (the labels
//! are a sorted list, not a map).

use profiler_tests::fixture::{Fixture, FixtureKind};
use profiler_tests::go_build::{GoLabelsBuild, GoProcess, Toolchain};
use profiler_tests::go_text::raw_samples;
use profiler_tests::{assert_success, expect, go_pprof, preflight, run_profiler, Profile, TempDir};

/// Long enough to outlast the profiler's start and its capture; its end is waited for. Go's
/// own profile samples at 100 Hz for the whole run: on a machine whose cores are shared,
/// the workers get a fraction of one, and 14 s keep its sample count (about 500-1,000) above
/// the 280 that make 3.5σ at most 10 points; ours at 499 Hz for 8 s, 3.5σ about 3 points.
const FIXTURE_S: u32 = 14;
const CAPTURE_S: &str = "8s";
const FREQUENCY_HZ: &str = "499";
/// Samples in `main.spin` that may lack the labels (none should: a worker runs it only on
/// its own goroutine, which has them from its creation).
const MAX_UNLABELLED_SPIN: f64 = 0.01;

#[test]
fn static_go_build_labels_split_75_25() {
    check(GoLabelsBuild::Plain);
}

#[test]
fn cgo_external_build_labels_split_75_25() {
    check(GoLabelsBuild::Cgo);
}

/// Go 1.24 keeps a goroutine's labels as a sorted list, not a map: the kernel's other read.
#[test]
fn go_1_24_labels_list_split_75_25() {
    check_with(&Toolchain::fetched("1.24"), GoLabelsBuild::Plain);
}

/// Go 1.21 moved `g.labels` (and most of `g`) from 1.19's place.
#[test]
fn go_1_21_labels_split_75_25() {
    check_with(&Toolchain::fetched("1.21"), GoLabelsBuild::Plain);
}

fn check(build: GoLabelsBuild) {
    check_with(&Toolchain::machine(), build);
}

fn check_with(toolchain: &Toolchain, build: GoLabelsBuild) {
    if !preflight() {
        return;
    }
    let what = format!("{build:?} (Go: {})", toolchain.name);
    let scratch = TempDir::new(build.comm());
    let out = TempDir::new(&format!("{}-out", build.comm()));
    let binary = build.build_with(toolchain, scratch.path());
    let go_profile = scratch.path().join("go.pprof");
    let mut go = GoProcess::spawn(&binary, FIXTURE_S, &go_profile);
    // A C process sampled in the same capture: its samples must carry no Go labels.
    let c = Fixture::spawn(FixtureKind::CpuSplitC, FIXTURE_S);
    let (go_pid, c_pid) = (go.pid().to_string(), c.pid().to_string());
    let args = [
        "snapshot",
        "--pid",
        &go_pid,
        "--pid",
        &c_pid,
        "--duration",
        CAPTURE_S,
        "--frequency",
        FREQUENCY_HZ,
        "--output",
        &out.path_arg(),
    ];
    let output = run_profiler(&args);
    assert_success(&output, "snapshot --pid of the Go labels fixture and a C fixture");
    let (a, b) = (go.read_value("truth_a_ns"), go.read_value("truth_b_ns"));
    go.expect_line("done");
    let truth = a as f64 / (a + b) as f64;
    let ours_path = expect::profile_written(out.path(), build.comm(), go.pid());
    let ours = Profile::decode(&ours_path);
    let theirs = Profile::decode(&go_profile);

    let (a, b) = (handler_samples(&ours, "a"), handler_samples(&ours, "b"));
    check_share(a, b, truth, &format!("{what}: our profile"));
    let (a, b) = (handler_samples(&theirs, "a"), handler_samples(&theirs, "b"));
    check_share(a, b, truth, &format!("{what}: Go's own profile"));
    let tagfocus = |value: &str| -> i64 {
        let raw = go_pprof::raw_tagfocus(&ours_path, &format!("handler={value}"));
        raw_samples(&raw).iter().map(|(values, _)| values[0]).sum()
    };
    check_share(tagfocus("a"), tagfocus("b"), truth, &format!("{what}: go tool pprof -tagfocus of our profile"));

    check_spin_labelled(&ours, &what);
    let comment = ours.comments.iter().find(|c| c.starts_with("Go pprof labels"));
    let comment = comment.unwrap_or_else(|| panic!("{what}: no Go labels line in {:?}", ours.comments));
    assert!(comment.contains(": 2 label sets;"), "{what}: {comment}");
    assert!(comment.contains("were cut (over 8 labels, keys over 32 bytes or values over 64) 0;"), "{what}: {comment}");

    let c_profile = Profile::decode(&expect::profile_written(out.path(), FixtureKind::CpuSplitC.comm(), c.pid()));
    assert!(c_profile.total("samples") > 0, "{what}: no samples of the C fixture");
    for sample in &c_profile.samples {
        let keys: Vec<&str> = sample.labels.iter().map(|l| l.key.as_str()).collect();
        assert!(keys.iter().all(|k| ["tid", "thread"].contains(k)), "{what}: a C process's sample has {keys:?}");
    }
    assert!(
        !c_profile.comments.iter().any(|c| c.starts_with("Go pprof labels")),
        "{what}: the C process's profile speaks of Go labels: {:?}",
        c_profile.comments
    );
}

/// Samples whose `handler` label is `value`.
fn handler_samples(profile: &Profile, value: &str) -> i64 {
    profile.value_where("samples", |s| s.label_str("handler") == Some(value))
}

/// `a`'s share of `a + b` is within 3.5σ of `truth` (σ of a binomial share at `a + b`
/// samples, which must make 3.5σ at most 10 points).
fn check_share(a: i64, b: i64, truth: f64, what: &str) {
    let n = a + b;
    assert!(n >= expect::min_samples_for_share(truth, truth - 0.10), "{what}: {n} labelled samples, too few");
    let share = a as f64 / n as f64;
    let sigma = (truth * (1.0 - truth) / n as f64).sqrt();
    eprintln!("{what}: handler=a's share {share:.3} of {n} samples, truth {truth:.3}, 3.5σ {:.3}", 3.5 * sigma);
    assert!(
        (share - truth).abs() <= 3.5 * sigma,
        "{what}: handler=a's share {share:.3} ({a} of {n}), the fixture measured {truth:.3} (3.5σ = {:.3})",
        3.5 * sigma
    );
}

/// Every sample in `main.spin` (run by the labelled workers only) carries both labels.
fn check_spin_labelled(profile: &Profile, what: &str) {
    let spin = profile.value_where("samples", |s| s.contains("main.spin"));
    let labelled = profile.value_where("samples", |s| {
        s.contains("main.spin")
            && matches!(s.label_str("handler"), Some("a" | "b"))
            && s.label_str("pool") == Some("spinners")
    });
    assert!(spin > 0, "{what}: no sample in main.spin; functions: {:?}", profile.function_names());
    assert!(
        (spin - labelled) as f64 <= MAX_UNLABELLED_SPIN * spin as f64,
        "{what}: {labelled} of {spin} samples in main.spin carry handler and pool"
    );
}
