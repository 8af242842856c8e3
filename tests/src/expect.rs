//! Assertions more than one test makes about a profile: the format the profiler promises for
//! every CPU and every heap profile, where it writes them, what a single-threaded fixture's
//! samples must be labelled with, and a measured value within a tolerance of the truth.

use std::path::{Path, PathBuf};

use crate::pprof::Profile;
use crate::run::{heap_profile_path, listing, profile_path};

/// The sample value types, in order, of every CPU profile.
pub const SAMPLE_TYPES: [(&str, &str); 2] = [("samples", "count"), ("cpu", "nanoseconds")];

/// Sample types, period type, period = 1e9 / `frequency_hz`, cpu value = samples × period in
/// every sample, and comments that report dropped samples and unsymbolized frames.
pub fn cpu_profile_format(profile: &Profile, frequency_hz: i64) {
    let types: Vec<(&str, &str)> = profile.sample_types.iter().map(|(t, u)| (t.as_str(), u.as_str())).collect();
    assert_eq!(types, SAMPLE_TYPES, "sample_type");
    let period_type = profile.period_type.as_ref().map(|(t, u)| (t.as_str(), u.as_str()));
    assert_eq!(period_type, Some(("cpu", "nanoseconds")), "period_type");
    let period = 1_000_000_000 / frequency_hz;
    assert_eq!(profile.period, period, "period for {frequency_hz} Hz");
    let (count, cpu) = (profile.value_index("samples"), profile.value_index("cpu"));
    for sample in &profile.samples {
        assert_eq!(sample.values.len(), 2, "values of sample {:?}", sample.names());
        assert!(sample.values[count] > 0, "sample with count {} at {:?}", sample.values[count], sample.names());
        assert_eq!(sample.values[cpu], sample.values[count] * period, "cpu ns of sample {:?}", sample.names());
    }
    let comments = profile.comments.join("\n").to_lowercase();
    let reports_unresolved = comments.contains("unresolved") || comments.contains("without symbol");
    assert!(
        comments.contains("dropped") && reports_unresolved,
        "comments should report dropped samples and unresolved frames: {:?}",
        profile.comments
    );
}

/// Every sample of a single-threaded process carries `tid` = its pid and `thread` = its comm.
pub fn single_thread_labels(profile: &Profile, pid: u32, comm: &str) {
    for sample in &profile.samples {
        assert_eq!(sample.label_num("tid"), Some(i64::from(pid)), "tid label of {:?}", sample.labels);
        assert_eq!(sample.label_str("thread"), Some(comm), "thread label of {:?}", sample.labels);
    }
}

/// The number of samples is what `cpu_ns` of one busy thread's CPU time (measured over the
/// capture: on a loaded machine a busy thread gets less than the wall time) gives at
/// `frequency_hz`: not fewer than 60% (samples lost) nor more than 110% (samples counted
/// twice).
pub fn busy_thread_sample_count(profile: &Profile, cpu_ns: u64, frequency_hz: i64) {
    let expected = cpu_ns as f64 / 1e9 * frequency_hz as f64;
    let got = profile.total("samples") as f64;
    assert!(
        (0.6 * expected..=1.1 * expected).contains(&got),
        "{got} samples for {:.2} s of one busy thread's CPU time at {frequency_hz} Hz (expected ~{expected:.0})",
        cpu_ns as f64 / 1e9
    );
}

/// The profile of `comm`/`pid` exists where the profiler promises (`DIR/<comm>-<pid>/cpu.pb.gz`);
/// returns its path.
pub fn profile_written(out_dir: &Path, comm: &str, pid: u32) -> PathBuf {
    let path = profile_path(out_dir, comm, pid);
    assert!(path.is_file(), "no profile at {}; output holds:\n{}", path.display(), listing(out_dir));
    path
}

/// The sample value types, in order, of every heap profile (Go's heap profile).
pub const HEAP_SAMPLE_TYPES: [(&str, &str); 4] =
    [("alloc_objects", "count"), ("alloc_space", "bytes"), ("inuse_objects", "count"), ("inuse_space", "bytes")];

/// Sample types, period type `space/bytes`, period = `sample_bytes`, default sample type
/// `inuse_space`, a `bytes` label (unit "bytes") on every sample, no negative value, and
/// comments that say what inuse means, the sampling rate and the drop counts.
pub fn heap_profile_format(profile: &Profile, sample_bytes: i64) {
    let types: Vec<(&str, &str)> = profile.sample_types.iter().map(|(t, u)| (t.as_str(), u.as_str())).collect();
    assert_eq!(types, HEAP_SAMPLE_TYPES, "sample_type");
    let period_type = profile.period_type.as_ref().map(|(t, u)| (t.as_str(), u.as_str()));
    assert_eq!(period_type, Some(("space", "bytes")), "period_type");
    assert_eq!(profile.period, sample_bytes, "period");
    assert_eq!(profile.default_sample_type, "inuse_space", "default_sample_type");
    for sample in &profile.samples {
        assert!(
            sample.values.len() == 4 && sample.values.iter().all(|&v| v >= 0),
            "values {:?} of sample {:?}",
            sample.values,
            sample.names()
        );
        assert!(
            matches!(sample.label_num_unit("bytes"), Some((n, Some("bytes"))) if n > 0),
            "sample {:?} lacks a positive `bytes` label with unit bytes: {:?}",
            sample.names(),
            sample.labels
        );
    }
    let comments = profile.comments.join("\n");
    for phrase in ["since the probes attached", "live map full"] {
        assert!(comments.contains(phrase), "comments should contain {phrase:?}: {:?}", profile.comments);
    }
    assert!(
        comments.contains(&sample_bytes.to_string()),
        "comments should state the sampling rate {sample_bytes}: {:?}",
        profile.comments
    );
}

/// The heap profile of `comm`/`pid` exists at `DIR/<comm>-<pid>/heap.pb.gz`; returns its path.
pub fn heap_profile_written(out_dir: &Path, comm: &str, pid: u32) -> PathBuf {
    let path = heap_profile_path(out_dir, comm, pid);
    assert!(path.is_file(), "no heap profile at {}; output holds:\n{}", path.display(), listing(out_dir));
    path
}

/// Asserts |got − truth| ≤ tolerance × truth (so got = 0 when truth is 0).
pub fn within(got: i64, truth: i64, tolerance: f64, what: &str) {
    if let Err(message) = check_within(got, truth, tolerance, what) {
        panic!("{message}");
    }
}

/// [`within`] as a result, for tests that report every miss at once.
pub fn check_within(got: i64, truth: i64, tolerance: f64, what: &str) -> Result<(), String> {
    let off = (got - truth).abs() as f64;
    if off <= tolerance * truth as f64 {
        return Ok(());
    }
    Err(format!(
        "{what}: got {got}, expected {truth} ± {:.0}% (off by {:.2}%)",
        tolerance * 100.0,
        100.0 * off / (truth as f64).max(1.0)
    ))
}

/// The fewest samples with which a share of `min` is 3.5σ below an expected share of
/// `expected` (binomial: σ = √(p(1−p)/n) at p = `min`).
pub fn min_samples_for_share(expected: f64, min: f64) -> i64 {
    (3.5f64.powi(2) * min * (1.0 - min) / (expected - min).powi(2)).ceil() as i64
}

/// The machine's CPU time stolen by its hypervisor so far (`/proc/stat`'s steal column, in
/// 10 ms ticks), if the kernel reports it.
pub fn steal_ms() -> Option<u64> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let ticks: u64 = stat.lines().next()?.split_whitespace().nth(8)?.parse().ok()?;
    Some(ticks * 10)
}

/// The CPU time the hypervisor stole since [`steal_ms`] gave `before`, for a message:
/// "N ms", or "unknown" where the kernel does not report it.
pub fn stolen_since(before: Option<u64>) -> String {
    match (before, steal_ms()) {
        (Some(before), Some(after)) => format!("{} ms", after.saturating_sub(before)),
        _ => "unknown".to_string(),
    }
}
