//! `perf record --call-graph dwarf` as an independent unwinder to compare against: it copies
//! 8 KiB of user stack per sample and unwinds it in userspace with libdw, the reference for
//! completeness on binaries without frame pointers.

use std::collections::HashMap;
use std::path::Path;
use std::process::{Child, Command, Stdio};

use crate::Profile;

/// Starts `perf record -F HZ --call-graph dwarf -p PID` for `seconds`, writing `output`.
/// Returns the running perf; wait for it before reading the file.
pub fn record_dwarf(pid: u32, hz: u32, seconds: u32, output: &Path) -> Child {
    Command::new("perf")
        .args(["record", "-q", "-F", &hz.to_string(), "--call-graph", "dwarf", "-p", &pid.to_string(), "-o"])
        .arg(output)
        .args(["--", "sleep", &seconds.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("failed to run perf (cargo xtask setup installs linux-perf): {e}"))
}

/// The user-space functions of every sample in a perf.data file, leaf first, from
/// `perf script`.
pub fn user_stacks(perf_data: &Path) -> Vec<Vec<String>> {
    let output = Command::new("perf")
        .args(["script", "-F", "ip,sym", "-i"])
        .arg(perf_data)
        .output()
        .unwrap_or_else(|e| panic!("failed to run perf script: {e}"));
    assert!(output.status.success(), "perf script failed: {}", String::from_utf8_lossy(&output.stderr));
    let text = String::from_utf8_lossy(&output.stdout);
    let mut stacks = Vec::new();
    let mut current = Vec::new();
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() {
            if !current.is_empty() {
                stacks.push(std::mem::take(&mut current));
            }
            continue;
        }
        let Some((addr, sym)) = line.split_once(' ') else { continue };
        let Ok(addr) = u64::from_str_radix(addr, 16) else { continue };
        // Kernel frames are not the unwinders' business.
        if addr >= 0xffff_8000_0000_0000 {
            continue;
        }
        current.push(normalize(sym));
    }
    if !current.is_empty() {
        stacks.push(current);
    }
    stacks
}

/// The user functions of every sample of one of our profiles, one entry per sample count.
pub fn profile_user_stacks(profile: &Profile) -> Vec<(Vec<String>, i64)> {
    let samples = profile.value_index("samples");
    profile
        .samples
        .iter()
        .map(|s| (s.user_frames().iter().map(|f| normalize(&f.function)).collect(), s.values[samples]))
        .collect()
}

/// Functions by the share of samples whose stack holds them (Go's and perf's "cumulative"),
/// largest first, ties by name.
pub fn cumulative<'a>(stacks: impl IntoIterator<Item = (&'a [String], i64)>) -> Vec<(String, f64)> {
    let mut cum: HashMap<&str, i64> = HashMap::new();
    let mut total = 0;
    for (stack, weight) in stacks {
        total += weight;
        let mut seen: Vec<&str> = stack.iter().map(String::as_str).collect();
        seen.sort_unstable();
        seen.dedup();
        for f in seen {
            *cum.entry(f).or_default() += weight;
        }
    }
    let mut out: Vec<(String, f64)> =
        cum.into_iter().map(|(f, n)| (f.to_string(), n as f64 / total.max(1) as f64)).collect();
    out.sort_by(|a, b| b.1.total_cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    out
}

/// One spelling per function across symbolizers: perf names glibc's internal aliases
/// (`__qsort_r`) and marks inlined frames; blazesym may name another alias
/// (`__GI___qsort_r`). Strips `(inlined)`, `+0x…` offsets, `__GI_` and leading underscores.
pub fn normalize(name: &str) -> String {
    let name = name.trim().trim_end_matches("(inlined)").trim();
    let name = name.split("+0x").next().unwrap_or(name);
    let name = name.strip_prefix("__GI_").unwrap_or(name);
    name.trim_start_matches('_').to_string()
}
