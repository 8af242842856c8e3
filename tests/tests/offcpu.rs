//! The off-CPU profile against `offcpu_sleeper` (tests/fixtures/offcpu_sleeper.c), whose
//! threads measure with CLOCK_MONOTONIC around each blocking call how long it took: off-CPU
//! nanoseconds per function against those totals, the `state` of a thread preempted by a
//! spinner on its core, and the values unbiased at the default sampling by length (1ms);
//! and `rare_sleeper` (tests/fixtures/rare_sleeper.c), a thread that blocks rarely but long,
//! or 5,000 times 1 ms, against its own clock at the defaults.
//!
//! The profiles are those the real `profiler snapshot` writes, decoded by our reader and read
//! by `go tool pprof -raw`.

use std::path::{Path, PathBuf};

use profiler_tests::pprof::Sample;
use profiler_tests::run::{run_profiler_resuming, run_profiler_until};
use profiler_tests::{assert_success, go_pprof, listing, preflight, process_dir};
use profiler_tests::{Fixture, FixtureKind, Profile, TempDir};

/// The fixture stops itself after `ready`; its threads start when it is continued, once the
/// profiler says it is capturing.
const DELAY_S: &str = "stop";
const LINGER_S: &str = "30";
/// The threads' work takes under 4 s once started.
const CAPTURE: &str = "8s";
/// Every switch recorded: the only error is the fixture's own time on the CPU around the
/// blocking calls, well under this.
const EXACT_TOLERANCE: f64 = 0.10;
/// The floor of a sampled estimate's tolerance, besides its 3.5σ.
const SAMPLED_TOLERANCE: f64 = 0.05;
/// The default `--offcpu-rate` (config/raw.rs), in ns.
const DEFAULT_RATE_NS: f64 = 1e6;
/// Flags that record every switch, on either kind of kernel.
const EVERY_SWITCH: [&str; 4] = ["--offcpu-rate", "1ns", "--offcpu-every", "1"];
/// `SLEEP_SHORT_ROUNDS` of tests/fixtures/offcpu_sleeper.c: sleep_short's nanosleeps.
const SLEEP_SHORT_ROUNDS: i64 = 20_000;

const OFFCPU_TYPES: [(&str, &str); 2] = [("switches", "count"), ("off_cpu", "nanoseconds")];

/// What the fixture printed, in its order.
struct Truth {
    sleep_long: i64,
    sleep_short: i64,
    pipe_read: i64,
    cond_wait: i64,
    starved_wall: i64,
    /// Sum of each short sleep's squared off-CPU time, µs².
    sleep_short_sq_us2: f64,
}

fn run(sampling: &[&str]) -> (Fixture, Truth, PathBuf, TempDir) {
    run_with_env(sampling, &[])
}

fn run_with_env(sampling: &[&str], env: &[(&str, &str)]) -> (Fixture, Truth, PathBuf, TempDir) {
    let out = TempDir::new("offcpu");
    let mut fixture = Fixture::spawn_with_args(FixtureKind::OffCpuSleeper, &[DELAY_S, LINGER_S]);
    let (pid, dir) = (fixture.pid().to_string(), out.path_arg());
    let mut args = vec!["snapshot", "--pid", &pid, "--duration", CAPTURE, "--profiles", "offcpu", "--output", &dir];
    args.extend_from_slice(sampling);
    let output = run_profiler_resuming(&args, env, &fixture);
    assert_success(&output, "snapshot --profiles offcpu");
    let truth = Truth {
        sleep_long: fixture.read_value("sleep_long_ns") as i64,
        sleep_short: fixture.read_value("sleep_short_ns") as i64,
        pipe_read: fixture.read_value("pipe_read_ns") as i64,
        cond_wait: fixture.read_value("cond_wait_ns") as i64,
        starved_wall: fixture.read_value("starved_wall_ns") as i64,
        sleep_short_sq_us2: fixture.read_value("sleep_short_sq_us2") as f64,
    };
    fixture.expect_line("done");
    let path = written(out.path(), &fixture);
    (fixture, truth, path, out)
}

/// Every switch recorded: the time off CPU under sleep_long and sleep_short (nanosleep),
/// read_pipe (a pipe fed on a timer) and wait_cond (a condvar signalled on a timer) is within
/// 10% of what each measured; the thread kept off its core by a spinner shows `runnable` time
/// under starved_work; and `go tool pprof -raw` reads the file.
#[test]
fn offcpu_time_matches_the_programs_own_clock() {
    if !preflight() {
        return;
    }
    let (_fixture, truth, path, _out) = run(&EVERY_SWITCH);
    let profile = Profile::decode(&path);
    offcpu_format(&profile, "offcpu rate 1 ns");
    every_wait_matches(&profile, &truth);
    // Two spinning threads share the core about evenly: the victim waits for it about half
    // the time. Asked: clearly there, and under its own stack.
    let runnable =
        profile.value_where("off_cpu", |s| s.contains("starved_work") && s.label_str("state") == Some("runnable"));
    assert!(
        runnable > truth.starved_wall / 5,
        "runnable time under starved_work {runnable} ns, expected a good part of its {} ns wall time; stacks:\n{}",
        truth.starved_wall,
        stacks(&profile)
    );
    let raw = go_pprof::raw(&path);
    for function in ["sleep_long", "read_pipe", "wait_cond", "starved_work"] {
        assert!(raw.contains(function), "`go tool pprof -raw` lacks {function}:\n{raw}");
    }
    let comments = profile.comments.join("\n");
    assert!(!comments.contains("stacks walked as the thread left"), "a 6.16+ kernel walks at switch-in: {comments}");
}

/// On a kernel without `sched_exit_tp` (before 6.16; forced here) the stacks are walked at the
/// switch-out: recording every switch, the times still match the program's clock within 10%,
/// under the same stacks, and the profile says how its stacks were taken.
#[test]
fn offcpu_without_sched_exit_tp_walks_at_the_switch_out() {
    if !preflight() {
        return;
    }
    let (_fixture, truth, path, _out) =
        run_with_env(&EVERY_SWITCH, &[("PROFILER_TEST_OFFCPU_WALK_AT_SWITCH_OUT", "1")]);
    let profile = Profile::decode(&path);
    offcpu_format(&profile, "1 in 1 switches");
    every_wait_matches(&profile, &truth);
    let comments = profile.comments.join("\n");
    assert!(comments.contains("stacks walked as the thread left the CPU"), "comments should say so: {comments}");
}

/// At the default sampling by length (rate 1ms) the values are unbiased: sleep_short's
/// 20,000 sleeps of ~160 µs (d) are each kept with probability d/rate and counted as rate/d
/// sleeps of rate ns, so they are counted as about 20,000 switches and their time estimates
/// the time the program measured.
#[test]
fn offcpu_sampled_values_are_unbiased() {
    if !preflight() {
        return;
    }
    let (_fixture, truth, path, _out) = run(&[]);
    let profile = Profile::decode(&path);
    offcpu_format(&profile, "offcpu rate 1000000 ns");
    let short = |s: &Sample| s.contains("sleep_short") && s.label_str("state") == Some("blocked");
    // A sleep of d counts rate/d with probability d/rate: variance rate/d − 1 each. With the
    // sleeps' mean d̄ (their time over their number), Σ rate/d ≥ n·rate/d̄ by convexity, so
    // this σ = √(n·(rate/d̄ − 1)) (≈ 320, 1.6%) is a lower bound; the floor covers the rest.
    let switches = profile.value_where("switches", short);
    let n = SLEEP_SHORT_ROUNDS as f64;
    let mean_d = truth.sleep_short as f64 / n;
    let sigma = (n * (DEFAULT_RATE_NS / mean_d - 1.0).max(0.0)).sqrt();
    within(switches, SLEEP_SHORT_ROUNDS, SAMPLED_TOLERANCE + 3.5 * sigma / n, "switches under sleep_short", &profile);
    // The time: a sleep of d adds rate with probability d/rate, variance d·rate − d², so
    // σ = √(rate·Σd − Σd²) over the sleeps' own times (≈ 57 ms of 3.2 s, 1.8%): 3.5σ and the
    // floor. Plus what separates the scheduler's view (switch-out to switch-in) from the
    // program's clock (wall minus its CPU time), which sampling does not remove: up to
    // EXACT_TOLERANCE, as the every-switch test asserts.
    let got = profile.value_where("off_cpu", short);
    let variance = DEFAULT_RATE_NS * truth.sleep_short as f64 - truth.sleep_short_sq_us2 * 1e6;
    let sigma_ns = variance.max(0.0).sqrt();
    let tolerance = SAMPLED_TOLERANCE + 3.5 * sigma_ns / truth.sleep_short as f64 + EXACT_TOLERANCE;
    within(got, truth.sleep_short, tolerance, "off-CPU ns under sleep_short at rate 1ms", &profile);
    let raw = go_pprof::raw(&path);
    assert!(raw.contains("sleep_short"), "`go tool pprof -raw` lacks sleep_short:\n{raw}");
}

/// A thread that blocks rarely but long (issue #44): 30 ms in sleep_a and 10 ms in sleep_b,
/// in turn, for 5 s. At the defaults every one of its 250 sleeps is longer than the rate, so
/// each is recorded as itself, with no sampling error: the profile's off-CPU time is its
/// 5.0 s within 15% (what separates the scheduler's view from the program's clock, and the
/// capture's edges), and sleep_a holds 0.75 of it ± 0.05. (At 1 in 50 switches, before,
/// two runs gave 7.0 s and 9.1 s, sleep_a at 0.86 and 0.67.)
#[test]
fn offcpu_keeps_rare_long_sleeps_at_the_defaults() {
    if !preflight() {
        return;
    }
    let (profile, values) = rare_sleeper("alternate", &[]);
    let (a, b) = (values[0], values[1]);
    let in_a = profile.value_where("off_cpu", |s| s.contains("sleep_a") && s.label_str("state") == Some("blocked"));
    let in_b = profile.value_where("off_cpu", |s| s.contains("sleep_b") && s.label_str("state") == Some("blocked"));
    within(in_a + in_b, a + b, 0.15, "off-CPU ns under sleep_a and sleep_b", &profile);
    let share = in_a as f64 / (in_a + in_b).max(1) as f64;
    let truth_share = a as f64 / (a + b) as f64;
    println!("sleep_a's share: {share:.3} (the program's clock: {truth_share:.3})");
    assert!((share - 0.75).abs() <= 0.05, "sleep_a holds {share:.3} of the off-CPU time, expected 0.75 ± 0.05");
}

/// 5,000 sleeps of 1 ms at the defaults: each a little longer than the rate (timer slack),
/// so recorded as itself; the off-CPU time under sleep_short is the program's within 10%.
#[test]
fn offcpu_short_sleeps_match_at_the_defaults() {
    if !preflight() {
        return;
    }
    let (profile, values) = rare_sleeper("short", &[]);
    let got = profile.value_where("off_cpu", |s| s.contains("sleep_short") && s.label_str("state") == Some("blocked"));
    within(got, values[2], 0.10, "off-CPU ns under sleep_short (1 ms × 5,000)", &profile);
}

/// The same sleeps at `--offcpu-rate 4ms`, where each (d ≈ 1.06 ms) is kept with probability
/// d/rate ≈ 0.27 and counted as rate/d sleeps: the estimate is unbiased, σ = √(rate·Σd − Σd²)
/// ≈ 4.6% of the 5.3 s; 3.5σ (16%) is its tolerance, plus the floor.
#[test]
fn offcpu_short_sleeps_are_unbiased_below_the_rate() {
    if !preflight() {
        return;
    }
    let rate_ns = 4e6;
    let (profile, values) = rare_sleeper("short", &["--offcpu-rate", "4ms"]);
    let (total, squares_us2) = (values[2], values[3] as f64);
    let sigma_ns = (rate_ns * total as f64 - squares_us2 * 1e6).max(0.0).sqrt();
    let tolerance = SAMPLED_TOLERANCE + 3.5 * sigma_ns / total as f64;
    let got = profile.value_where("off_cpu", |s| s.contains("sleep_short") && s.label_str("state") == Some("blocked"));
    within(got, total, tolerance, "off-CPU ns under sleep_short at rate 4ms", &profile);
}

/// Runs `rare_sleeper MODE` under an off-CPU snapshot (`sampling` flags added) that ends
/// when it prints `done`; returns the profile and what it measured (`a_ns`, `b_ns`,
/// `short_ns`, `short_sq_us2`).
fn rare_sleeper(mode: &str, sampling: &[&str]) -> (Profile, [i64; 4]) {
    let out = TempDir::new("offcpu-rare");
    let mut fixture = Fixture::spawn_with_args(FixtureKind::RareSleeper, &[mode, DELAY_S, LINGER_S]);
    let (pid, dir) = (fixture.pid().to_string(), out.path_arg());
    let mut args = vec!["snapshot", "--pid", &pid, "--duration", "100s", "--profiles", "offcpu", "--output", &dir];
    args.extend_from_slice(sampling);
    let output = run_profiler_until(&args, &mut fixture, "done");
    assert_success(&output, &format!("snapshot --profiles offcpu {sampling:?} of rare_sleeper {mode}"));
    let values = ["a_ns", "b_ns", "short_ns", "short_sq_us2"].map(|key| fixture.read_value(key) as i64);
    fixture.expect_line("done");
    let profile = Profile::decode(&written(out.path(), &fixture));
    offcpu_format(&profile, "offcpu rate");
    (profile, values)
}

/// Every switch recorded: the blocked time under each of the fixture's waiting functions is
/// within [`EXACT_TOLERANCE`] of what it measured.
fn every_wait_matches(profile: &Profile, truth: &Truth) {
    for (function, want) in [
        ("sleep_long", truth.sleep_long),
        ("sleep_short", truth.sleep_short),
        ("read_pipe", truth.pipe_read),
        ("wait_cond", truth.cond_wait),
    ] {
        let got = profile.value_where("off_cpu", |s| s.contains(function) && s.label_str("state") == Some("blocked"));
        within(got, want, EXACT_TOLERANCE, &format!("off-CPU ns (blocked) under {function}"), profile);
    }
}

/// `DIR/<comm>-<pid>/offcpu.pb.gz` exists; returns it.
fn written(out: &Path, fixture: &Fixture) -> PathBuf {
    let path = process_dir(out, fixture.comm(), fixture.pid()).join("offcpu.pb.gz");
    assert!(path.is_file(), "no offcpu profile at {}; output holds:\n{}", path.display(), listing(out));
    path
}

/// switches/count and off_cpu/nanoseconds, period 1 (values are estimates already), labels
/// on every sample, and comments stating the sampling (`sampling`, a part of that line) and
/// the drops.
fn offcpu_format(profile: &Profile, sampling: &str) {
    let types: Vec<(&str, &str)> = profile.sample_types.iter().map(|(t, u)| (t.as_str(), u.as_str())).collect();
    assert_eq!(types, OFFCPU_TYPES, "sample_type");
    assert_eq!(profile.period, 1, "period");
    for sample in &profile.samples {
        assert!(sample.values[0] > 0, "values {:?}", sample.values);
        assert!(matches!(sample.label_str("state"), Some("blocked" | "runnable")), "labels {:?}", sample.labels);
        assert!(sample.label_num("tid").is_some() && sample.label_str("thread").is_some(), "{:?}", sample.labels);
    }
    let comments = profile.comments.join("\n");
    assert!(comments.contains(sampling), "comments should state the sampling ({sampling}): {comments}");
    assert!(comments.contains("dropped"), "comments should report drops: {comments}");
}

fn within(got: i64, truth: i64, tolerance: f64, what: &str, profile: &Profile) {
    // The margin, for the log of a run that passes.
    println!(
        "{what}: {got} against {truth} ({:+.2}%, tolerance {:.0}%)",
        (got - truth) as f64 * 100.0 / truth.max(1) as f64,
        tolerance * 100.0
    );
    if let Err(message) = profiler_tests::expect::check_within(got, truth, tolerance, what) {
        panic!("{message} (against the program's own count and clock); stacks (off-CPU ns):\n{}", stacks(profile));
    }
}

fn stacks(profile: &Profile) -> String {
    let off = profile.value_index("off_cpu");
    let mut samples: Vec<&Sample> = profile.samples.iter().collect();
    samples.sort_by_key(|s| -s.values[off]);
    samples
        .iter()
        .take(40)
        .map(|s| format!("{:>12} {:?} {:?}", s.values[off], s.label_str("state"), s.names()))
        .collect::<Vec<_>>()
        .join("\n")
}
