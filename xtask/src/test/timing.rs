//! Runs the workspace's test binaries one after another, as `cargo test` would (each in its
//! package's directory), timing each binary and each test, so a slow or stuck test shows
//! up by name at the end of the run rather than as one long `cargo test`.
//!
//! A test's time is from the end of the test before it (or the binary's start) to its own
//! result line: with one test thread, that is the test plus the harness's few microseconds.

use std::{
    io::{BufRead, BufReader},
    path::PathBuf,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};

use crate::workspace;

/// One test executable cargo built.
#[derive(Debug, Clone)]
pub struct TestBinary {
    /// `package/target` (`profiler-tests/futex`, `profiler-daemon/lib`).
    pub name: String,
    pub executable: PathBuf,
    /// The package's directory: cargo runs a test binary there.
    pub dir: PathBuf,
}

/// What one binary did.
#[derive(Debug, Default)]
struct BinaryRun {
    name: String,
    wall: Duration,
    passed: u64,
    failed: u64,
    ignored: u64,
    /// The harness's own summary line was not seen (it crashed or was killed).
    crashed: bool,
    tests: Vec<(String, Duration)>,
}

/// Every binary's run.
#[derive(Debug, Default)]
pub struct Report {
    runs: Vec<BinaryRun>,
}

/// Builds the workspace's test binaries ([`crate::builds::test_binaries`]), or only the test
/// targets named in `only`, and lists them.
pub fn test_binaries(only: &[String]) -> Result<Vec<TestBinary>> {
    let mut cmd = crate::builds::test_binaries(only);
    workspace::stage(&workspace::shell_line(&cmd));
    let output = cmd.stderr(Stdio::inherit()).output().context("failed to run cargo test --no-run")?;
    if !output.status.success() {
        bail!("building the tests failed ({}); fix the errors above", output.status);
    }
    let text = String::from_utf8_lossy(&output.stdout);
    let binaries: Vec<TestBinary> = text.lines().filter_map(test_binary).collect();
    if binaries.is_empty() {
        bail!("cargo built no test binary");
    }
    Ok(binaries)
}

/// A test executable from one line of cargo's JSON messages, if the line names one.
fn test_binary(line: &str) -> Option<TestBinary> {
    let message: serde_json::Value = serde_json::from_str(line).ok()?;
    if message["reason"] != "compiler-artifact" || message["profile"]["test"] != true {
        return None;
    }
    let executable = PathBuf::from(message["executable"].as_str()?);
    let manifest = PathBuf::from(message["manifest_path"].as_str()?);
    let package = message["package_id"].as_str().and_then(package_name).unwrap_or("?").to_string();
    let target = message["target"]["name"].as_str().unwrap_or("?");
    let kind = message["target"]["kind"][0].as_str().unwrap_or("");
    let target = if kind == "lib" { "lib" } else { target };
    Some(TestBinary { name: format!("{package}/{target}"), executable, dir: manifest.parent()?.to_path_buf() })
}

/// `profiler-tests` from a package id (`path+file:///w/tests#profiler-tests@0.1.0`), or
/// the directory's name when the id leaves the name out because it is the same
/// (`path+file:///w/profiler-daemon#0.1.0`).
fn package_name(id: &str) -> Option<&str> {
    let (url, tail) = id.rsplit_once('#')?;
    match tail.split_once('@') {
        Some((name, _)) => Some(name),
        None => url.rsplit('/').next(),
    }
}

/// Runs every binary with `harness` arguments and `envs`, echoing its output, then the doc
/// tests if `doc`.
pub fn run_all(binaries: &[TestBinary], harness: &[String], envs: &[(&str, PathBuf)], doc: bool) -> Result<Report> {
    let mut report = Report::default();
    for binary in binaries {
        workspace::stage(&format!("{} ({})", binary.name, binary.executable.display()));
        let mut cmd = Command::new(&binary.executable);
        cmd.args(harness).current_dir(&binary.dir).env("CARGO_MANIFEST_DIR", &binary.dir);
        for (key, value) in envs {
            cmd.env(key, value);
        }
        report.runs.push(run_one(&binary.name, cmd)?);
    }
    if doc {
        // The examples in the crates' docs, as plain `cargo test` runs them.
        let mut doc = crate::builds::doc_tests();
        doc.arg("--").args(harness);
        workspace::stage(&workspace::shell_line(&doc));
        report.runs.push(run_one("doctests", doc)?);
    }
    Ok(report)
}

fn run_one(name: &str, mut cmd: Command) -> Result<BinaryRun> {
    let started = Instant::now();
    let mut child = cmd.stdout(Stdio::piped()).spawn().with_context(|| format!("failed to run {name}"))?;
    let stdout = child.stdout.take().expect("piped");
    let mut run = BinaryRun { name: name.to_string(), crashed: true, ..BinaryRun::default() };
    let mut last = Instant::now();
    for line in BufReader::new(stdout).lines() {
        let line = line.with_context(|| format!("failed to read the output of {name}"))?;
        println!("{line}");
        if let Some((test, _)) = result_line(&line) {
            run.tests.push((test.to_string(), last.elapsed()));
            last = Instant::now();
        } else if let Some(counts) = summary_line(&line) {
            (run.passed, run.failed, run.ignored) = counts;
            run.crashed = false;
        }
    }
    let status = child.wait().with_context(|| format!("failed to wait for {name}"))?;
    run.wall = started.elapsed();
    if !status.success() && run.failed == 0 {
        // Killed, or it failed outside any test: count the binary as one failure.
        run.crashed = true;
    }
    Ok(run)
}

/// `test NAME ... ok` (or `FAILED`, `ignored`): the test's name and result.
fn result_line(line: &str) -> Option<(&str, &str)> {
    let rest = line.strip_prefix("test ")?;
    let (name, result) = rest.rsplit_once(" ... ")?;
    Some((name, result))
}

/// `test result: ok. 3 passed; 0 failed; 1 ignored; …`: (passed, failed, ignored).
fn summary_line(line: &str) -> Option<(u64, u64, u64)> {
    let rest = line.strip_prefix("test result: ")?;
    let count = |word: &str| -> Option<u64> {
        let before = rest.split(';').find(|part| part.trim_end().ends_with(word))?;
        before.split_whitespace().rev().nth(1)?.parse().ok()
    };
    Some((count("passed")?, count("failed")?, count("ignored").unwrap_or(0)))
}

impl Report {
    /// Binaries that failed a test or did not finish.
    pub fn failed_binaries(&self) -> usize {
        self.runs.iter().filter(|run| run.failed > 0 || run.crashed).count()
    }

    /// Each binary's wall time (slowest first), the ten slowest tests, and the totals.
    pub fn print(&self) {
        let mut runs: Vec<&BinaryRun> = self.runs.iter().collect();
        runs.sort_by_key(|run| std::cmp::Reverse(run.wall));
        println!("\n==> wall time per test binary");
        for run in &runs {
            let state = if run.crashed { " (did not finish)" } else { "" };
            println!(
                "{:>8.1} s  {:<40} {} passed, {} failed, {} ignored{state}",
                run.wall.as_secs_f64(),
                run.name,
                run.passed,
                run.failed,
                run.ignored
            );
        }
        let total: Duration = self.runs.iter().map(|run| run.wall).sum();
        println!("{:>8.1} s  in all", total.as_secs_f64());
        let mut tests: Vec<(&str, &str, Duration)> = self
            .runs
            .iter()
            .flat_map(|run| run.tests.iter().map(move |(test, took)| (run.name.as_str(), test.as_str(), *took)))
            .collect();
        tests.sort_by_key(|&(_, _, took)| std::cmp::Reverse(took));
        println!("\n==> the ten slowest tests");
        for (binary, test, took) in tests.iter().take(10) {
            println!("{:>8.1} s  {binary} {test}", took.as_secs_f64());
        }
        let passed: u64 = self.runs.iter().map(|run| run.passed).sum();
        let failed: u64 = self.runs.iter().map(|run| run.failed + u64::from(run.crashed && run.failed == 0)).sum();
        println!("\n{passed} passed, {failed} failed");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_result_and_summary_lines() {
        assert_eq!(result_line("test a::b ... ok"), Some(("a::b", "ok")));
        assert_eq!(result_line("test a ... FAILED"), Some(("a", "FAILED")));
        assert_eq!(result_line("running 3 tests"), None);
        let summary =
            "test result: FAILED. 3 passed; 1 failed; 2 ignored; 0 measured; 0 filtered out; finished in 1.0s";
        assert_eq!(summary_line(summary), Some((3, 1, 2)));
        assert_eq!(summary_line("test result: ok. 0 passed; 0 failed; 0 ignored"), Some((0, 0, 0)));
    }

    #[test]
    fn reads_a_test_binary_from_cargos_messages() {
        let line = r#"{"reason":"compiler-artifact","package_id":"path+file:///w/tests#profiler-tests@0.1.0","manifest_path":"/w/tests/Cargo.toml","target":{"kind":["test"],"name":"futex"},"profile":{"test":true},"executable":"/w/target/release/deps/futex-1"}"#;
        let binary = test_binary(line).unwrap();
        assert_eq!(binary.name, "profiler-tests/futex");
        assert_eq!(binary.dir, PathBuf::from("/w/tests"));
        assert_eq!(package_name("path+file:///w/profiler-daemon#0.1.0"), Some("profiler-daemon"));
        let not_test = line.replace(r#""test":true"#, r#""test":false"#);
        assert!(test_binary(&not_test).is_none());
    }
}
