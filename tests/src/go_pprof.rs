//! Go's own pprof tool as a second, independent decoder of the profiler's files: if
//! `go tool pprof` cannot read a profile, no user's tooling can.

use std::io::ErrorKind;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

/// `go tool pprof` loads in well under a second; the rest is slack for a cold disk cache.
const GO_PPROF_TIMEOUT: Duration = Duration::from_secs(60);

/// Runs `go tool pprof -raw FILE`; panics unless it exits 0. Returns stdout.
pub fn raw(profile: &Path) -> String {
    go_tool_pprof(&["-raw"], profile)
}

/// Runs `go tool pprof -traces FILE` (each sample's stack and labels); panics unless it
/// exits 0. Returns stdout.
pub fn traces(profile: &Path) -> String {
    go_tool_pprof(&["-traces"], profile)
}

/// Runs `go tool pprof -top FILE`; panics unless it exits 0. Returns stdout.
pub fn top(profile: &Path) -> String {
    go_tool_pprof(&["-top"], profile)
}

/// Runs `go tool pprof -sample_index=INDEX -raw FILE` (e.g. INDEX `alloc_space` of a heap
/// profile); panics unless it exits 0. Returns stdout.
pub fn raw_of(profile: &Path, sample_index: &str) -> String {
    go_tool_pprof(&[&format!("-sample_index={sample_index}"), "-raw"], profile)
}

/// Runs `go tool pprof -sample_index=INDEX -nodefraction=0 -top FILE`: every function with a
/// value, however small its share (pprof otherwise hides those under 0.5%). Panics unless it
/// exits 0.
pub fn top_of(profile: &Path, sample_index: &str) -> String {
    go_tool_pprof(&[&format!("-sample_index={sample_index}"), "-nodefraction=0", "-top"], profile)
}

/// Runs `go tool pprof -tagfocus=FOCUS -raw FILE` (e.g. FOCUS `primitive=pthread_mutex_lock`:
/// only samples with that label); panics unless it exits 0. Returns stdout.
pub fn raw_tagfocus(profile: &Path, focus: &str) -> String {
    go_tool_pprof(&[&format!("-tagfocus={focus}"), "-raw"], profile)
}

fn go_tool_pprof(flags: &[&str], profile: &Path) -> String {
    require_go();
    let mut cmd = Command::new("go");
    // -symbolize=none: the profile carries its own function names; never let pprof go looking
    // for binaries or symbol servers.
    cmd.args(["tool", "pprof"]).args(flags).arg("-symbolize=none").arg(profile);
    let output = crate::run::run_with_timeout(&mut cmd, GO_PPROF_TIMEOUT);
    assert!(
        output.status.success(),
        "{cmd:?} exited with {}\nstderr:\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).expect("go tool pprof prints UTF-8")
}

/// What to do when Go is missing.
pub(crate) const INSTALL_GO: &str =
    "install golang-go (`cargo xtask setup --for-test` does, as `cargo xtask test` does)";

fn require_go() {
    match Command::new("go").arg("version").output() {
        Ok(out) if out.status.success() => {}
        Ok(out) => panic!("`go version` failed ({}): {INSTALL_GO}", out.status),
        Err(e) if e.kind() == ErrorKind::NotFound => panic!("`go` is not on PATH: {INSTALL_GO}"),
        Err(e) => panic!("failed to run `go version`: {e}: {INSTALL_GO}"),
    }
}

/// The flat% column of the `-top` row for `function` (matched as in
/// [`crate::name_matches`]), or `None` if no row names it.
///
/// Rows look like `     3.73s 75.05% 75.05%      3.73s 75.05%  hot_a`; the name is
/// everything after the fifth column (Rust names may contain spaces).
pub fn flat_percent(top: &str, function: &str) -> Option<f64> {
    top.lines().find_map(|line| {
        let mut columns = line.split_whitespace();
        let flat_pct = columns.nth(1)?.strip_suffix('%')?.parse().ok()?;
        let name = columns.skip(3).collect::<Vec<_>>().join(" ");
        crate::name_matches(&name, function).then_some(flat_pct)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOP: &str = "\
File: cpu_split_rs
Type: cpu
Showing nodes accounting for 4.97s, 100% of 4.97s total
      flat  flat%   sum%        cum   cum%
     3.73s 75.05% 75.05%      3.73s 75.05%  cpu_split_rs::hot_a
     1.24s 24.95%   100%      1.24s 24.95%  <T as core::ops::Fn>::call
         0     0%   100%      4.97s   100%  main
";

    #[test]
    fn finds_flat_percent_by_function_name() {
        assert_eq!(flat_percent(TOP, "hot_a"), Some(75.05));
        assert_eq!(flat_percent(TOP, "<T as core::ops::Fn>::call"), Some(24.95));
        assert_eq!(flat_percent(TOP, "main"), Some(0.0));
        assert_eq!(flat_percent(TOP, "hot_b"), None);
    }
}
