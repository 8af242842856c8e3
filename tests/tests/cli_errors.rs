//! The CLI's error contract: every invalid invocation exits non-zero with one clean message
//! on stderr that starts with `error:` and names what was wrong, and never a panic or a
//! backtrace.

use std::os::unix::fs::PermissionsExt;
use std::process::Output;

use profiler_tests::{preflight, run_profiler, run_profiler_as_nobody, Fixture, FixtureKind, TempDir};

/// Asserts `output` is a clean CLI error whose stderr mentions each of `words` (any case).
fn assert_cli_error(output: &Output, case: &str, words: &[&str]) {
    let stderr = String::from_utf8_lossy(&output.stderr);
    let context = format!("{case}: exit {}, stderr:\n{stderr}", output.status);
    assert!(matches!(output.status.code(), Some(code) if code != 0), "expected a non-zero exit; {context}");
    assert!(stderr.starts_with("error:"), "stderr should start with `error:`; {context}");
    let lower = stderr.to_lowercase();
    assert!(!lower.contains("panicked") && !lower.contains("backtrace"), "a panic is not an error message; {context}");
    for word in words {
        assert!(lower.contains(&word.to_lowercase()), "stderr should mention {word:?}; {context}");
    }
}

/// `--duration abc` and `--duration 0s` are rejected and name the flag.
#[test]
fn bad_duration_is_rejected() {
    if !preflight() {
        return;
    }
    let out = TempDir::new("duration");
    for value in ["abc", "0s"] {
        let output = run_profiler(&["snapshot", "--duration", value, "--output", &out.path_arg()]);
        assert_cli_error(&output, &format!("--duration {value}"), &["duration"]);
    }
}

/// `--frequency 0` and `--frequency 100000` are rejected and name the flag.
#[test]
fn bad_frequency_is_rejected() {
    if !preflight() {
        return;
    }
    let out = TempDir::new("frequency");
    for value in ["0", "100000"] {
        let output = run_profiler(&["snapshot", "--duration", "1s", "--frequency", value, "--output", &out.path_arg()]);
        assert_cli_error(&output, &format!("--frequency {value}"), &["frequency"]);
    }
}

/// A pid that no process has is named in the error along with "no such process".
#[test]
fn missing_pid_is_rejected() {
    if !preflight() {
        return;
    }
    let out = TempDir::new("pid");
    // Above the default pid_max (32768, or 4194304 on large machines it is rarely reached).
    let pid = (4_000_000u32..).find(|p| !std::path::Path::new(&format!("/proc/{p}")).exists()).expect("a free pid");
    let pid = pid.to_string();
    let output = run_profiler(&["snapshot", "--pid", &pid, "--duration", "1s", "--output", &out.path_arg()]);
    assert_cli_error(&output, &format!("--pid {pid}"), &[&pid, "no such process"]);
}

/// An output directory that cannot be created (its parent is a regular file) is named.
#[test]
fn unwritable_output_is_rejected() {
    if !preflight() {
        return;
    }
    let scratch = TempDir::new("output");
    let file = scratch.path().join("regular-file");
    std::fs::write(&file, b"not a directory").expect("failed to write scratch file");
    let output_dir = scratch.arg("regular-file/out");
    // A busy process to sample, so a profiler that creates the directory only when it writes
    // still reaches that point.
    let fixture = Fixture::spawn(FixtureKind::CpuSplitC, 10);
    let pid = fixture.pid().to_string();
    let output = run_profiler(&["snapshot", "--pid", &pid, "--duration", "1s", "--output", &output_dir]);
    assert_cli_error(&output, &format!("--output {output_dir}"), &[&output_dir]);
}

/// Without privileges the error says which capabilities are needed.
#[test]
fn missing_privileges_are_explained() {
    if !preflight() {
        return;
    }
    let scratch = TempDir::new("nobody");
    // Writable for nobody, so the only thing the run can lack is privileges.
    let out = scratch.path().join("out");
    std::fs::create_dir(&out).expect("failed to create output dir");
    std::fs::set_permissions(&out, std::fs::Permissions::from_mode(0o777)).expect("failed to chmod output dir");
    let output = run_profiler_as_nobody(&scratch, &["snapshot", "--duration", "1s", "--output", &scratch.arg("out")]);
    assert_cli_error(&output, "snapshot as uid 65534", &["CAP_BPF", "CAP_PERFMON"]);
}

/// `--profiles heap` without `--pid` is refused: heap probes slow every allocation of a
/// probed process, so they are attached only to chosen processes.
#[test]
fn heap_without_pid_is_rejected() {
    if !preflight() {
        return;
    }
    let out = TempDir::new("heap-no-pid");
    for profiles in ["heap", "cpu,heap"] {
        let output =
            run_profiler(&["snapshot", "--profiles", profiles, "--duration", "1s", "--output", &out.path_arg()]);
        assert_cli_error(&output, &format!("--profiles {profiles} without --pid"), &["heap", "--pid"]);
    }
}
