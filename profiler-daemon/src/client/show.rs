//! The daemon's JSON as text for people: `profiler status` (a summary) and `profiler ps` (a
//! table). `None` when the JSON lacks what the summary needs (a daemon of another version).

use std::fmt::Write;

use serde_json::Value;

use crate::units::{format_bytes, format_duration};

/// A few lines: uptime and what is profiled, samples and drops per type, the unwinder, the
/// output, and anything that needs attention.
pub fn status(s: &Value) -> Option<String> {
    let mut out = String::new();
    summary(&mut out, s)?;
    counts(&mut out, s)?;
    unwind_and_output(&mut out, s);
    let mut warnings = exports(&mut out, s);
    warnings.extend(warnings_of(s));
    if !warnings.is_empty() {
        let _ = writeln!(out, "warnings:  {}", warnings.join("\n           "));
    }
    Some(out)
}

/// A number of the JSON, 0 when it is missing.
fn u(v: &Value) -> u64 {
    v.as_u64().unwrap_or(0)
}

/// The first line: version, uptime, what is profiled and how many processes.
fn summary(out: &mut String, s: &Value) -> Option<()> {
    let programs = &s["programs"];
    let mut kinds: Vec<&str> =
        ["cpu", "block", "mutex", "threadcreate"].into_iter().filter(|k| programs[k].as_bool() == Some(true)).collect();
    let heap_processes = programs["heap_processes"].as_array().map_or(0, Vec::len);
    if heap_processes > 0 {
        kinds.push("heap");
    }
    let uptime = std::time::Duration::from_secs(s["uptime_seconds"].as_u64()?);
    let _ = writeln!(
        out,
        "profiler {}, up {}: {} at {} Hz; {} processes tracked{}",
        s["version"].as_str()?,
        format_duration(uptime),
        if kinds.is_empty() { "nothing".into() } else { kinds.join(", ") },
        u(&programs["cpu_frequency_hz"]),
        u(&s["processes_tracked"]),
        if heap_processes > 0 { format!(", {heap_processes} heap-profiled") } else { String::new() }
    );
    Some(())
}

/// The samples and the drops per type.
fn counts(out: &mut String, s: &Value) -> Option<()> {
    let samples = &s["samples"];
    let _ = writeln!(
        out,
        "samples:   cpu {}, heap {}, futex waits {} ({} charged to a waker), threads created {}",
        u(&samples["cpu"]),
        u(&samples["heap"]),
        u(&samples["futex_waits"]),
        u(&samples["futex_waits_charged_to_waker"]),
        u(&samples["threads_created"])
    );
    let drops: Vec<String> = s["drops"]
        .as_object()?
        .iter()
        .filter(|(_, n)| u(n) > 0)
        .map(|(what, n)| format!("{} {}", what.replace('_', " "), u(n)))
        .collect();
    let _ = writeln!(out, "dropped:   {}", if drops.is_empty() { "nothing".into() } else { drops.join(", ") });
    Some(())
}

/// The unwinder's and the output's lines.
fn unwind_and_output(out: &mut String, s: &Value) {
    let unwind = &s["unwind"];
    let _ = writeln!(
        out,
        "unwinding: {} frames by table, {} by frame pointer; {} tables, {} of {}",
        u(&unwind["frames"]["by_table"]),
        u(&unwind["frames"]["by_frame_pointer"]),
        u(&unwind["tables_loaded"]),
        format_bytes(u(&unwind["table_bytes"])),
        format_bytes(u(&unwind["table_budget_bytes"]))
    );
    let o = &s["output"];
    let _ = writeln!(
        out,
        "output:    {}: {} files ({}) in {} dumps, every {}; last dump {} ms; retention deleted {}",
        o["dir"].as_str().unwrap_or("?"),
        u(&o["files_written"]),
        format_bytes(u(&o["bytes_written"])),
        u(&o["dumps"]),
        format_duration(std::time::Duration::from_secs(u(&o["interval_seconds"]))),
        u(&o["last_dump_ms"]),
        u(&o["files_deleted_by_retention"])
    );
}

/// One line per export; returns the warnings of those with a last error.
fn exports(out: &mut String, s: &Value) -> Vec<String> {
    let mut warnings = Vec::new();
    for (name, e) in s["export"].as_object().into_iter().flatten() {
        let _ = writeln!(
            out,
            "export:    {name} ({} {}): {} sent ({}), {} queued, {} retried, {} failed, {} dropped",
            e["protocol"].as_str().unwrap_or("?"),
            e["url"].as_str().unwrap_or("?"),
            u(&e["sent"]),
            format_bytes(u(&e["bytes_sent"])),
            u(&e["queue_depth"]),
            u(&e["retried"]),
            u(&e["failed"]),
            u(&e["dropped"])
        );
        if let Some(err) = e["last_error"].as_str() {
            warnings.push(format!("export {name}: last error: {err}"));
        }
    }
    warnings
}

/// What else needs attention: the last error, exec tracking off, a pid namespace of its own.
fn warnings_of(s: &Value) -> Vec<String> {
    let mut warnings = Vec::new();
    if let Some(err) = s["last_error"].as_str() {
        warnings.push(format!("last error: {err}"));
    }
    if let Some(err) = s["unwind"]["exec_tracking_error"].as_str() {
        warnings.push(format!("exec tracking is off: {err}"));
    }
    if s["pid_namespace"]["initial"].as_bool() == Some(false) {
        warnings.push("in a pid namespace of its own: only that namespace's processes are profiled".into());
    }
    warnings
}

/// One row per process: pid, name, uid, unit or container, and per type the events since
/// the daemon started.
pub fn processes(list: &Value) -> Option<String> {
    let list = list.as_array()?;
    let mut kinds: Vec<String> = Vec::new();
    for process in list {
        for kind in process["profiles"].as_object()?.keys() {
            if !kinds.contains(kind) {
                kinds.push(kind.clone());
            }
        }
    }
    let mut out = format!("{:>8} {:<16} {:>6} {:<28}", "PID", "NAME", "UID", "UNIT/CONTAINER");
    for kind in &kinds {
        let _ = write!(out, " {:>12}", kind.to_uppercase());
    }
    out.push('\n');
    for p in list {
        let unit = p["container"].as_str().map(|id| &id[..id.len().min(12)]).or(p["unit"].as_str()).unwrap_or("-");
        let name: String = p["name"].as_str()?.chars().map(|c| if c.is_control() { '?' } else { c }).collect();
        let _ = write!(out, "{:>8} {:<16} {:>6} {:<28}", p["pid"].as_u64()?, name, p["uid"].as_u64()?, unit);
        for kind in &kinds {
            match p["profiles"][kind].as_u64() {
                Some(n) => write!(out, " {n:>12}"),
                None => write!(out, " {:>12}", "-"),
            }
            .ok()?;
        }
        out.push('\n');
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_is_a_summary_with_the_warnings_last() {
        let s: Value = serde_json::from_str(
            r#"{"version":"0.1.0","uptime_seconds":3720,"processes_tracked":70,
            "programs":{"cpu":true,"cpu_frequency_hz":19,"heap_processes":[4],"block":true,"mutex":false,"threadcreate":false},
            "samples":{"cpu":1709,"heap":3,"futex_waits":89,"futex_waits_charged_to_waker":3,"threads_created":66},
            "drops":{"cpu_stacks_map_full":1,"heap_live_map_full":0},
            "unwind":{"frames":{"by_table":6955,"by_frame_pointer":860},"tables_loaded":62,"table_bytes":7471104,
                      "table_budget_bytes":33554432,"exec_tracking_error":null},
            "output":{"dir":"/var/lib/profiler","files_written":4,"bytes_written":7249,"dumps":2,"interval_seconds":60,
                      "last_dump_ms":4,"files_deleted_by_retention":0},
            "export":{"eu":{"protocol":"otlp","url":"http://c:4318","sent":9,"bytes_sent":2048,"queue_depth":2,
                      "retried":1,"failed":0,"dropped":3,"last_error":"c:4318 answered 503: busy"}},
            "last_error":"failed to write","pid_namespace":{"initial":true}}"#,
        )
        .unwrap();
        let text = status(&s).unwrap();
        assert!(
            text.starts_with(
                "profiler 0.1.0, up 62m: cpu, block, heap at 19 Hz; 70 processes tracked, 1 heap-profiled\n"
            ),
            "{text}"
        );
        assert!(text.contains("dropped:   cpu stacks map full 1\n"), "{text}");
        assert!(
            text.contains(
                "export:    eu (otlp http://c:4318): 9 sent (2KiB), 2 queued, 1 retried, 0 failed, 3 dropped\n"
            ),
            "{text}"
        );
        assert!(text.contains("warnings:  export eu: last error: c:4318 answered 503: busy\n"), "{text}");
        assert!(text.ends_with("           last error: failed to write\n"), "{text}");
        assert!(status(&Value::Null).is_none());
    }

    #[test]
    fn ps_shows_one_row_per_process_with_its_counts() {
        let list: Value = serde_json::from_str(
            r#"[{"pid":4242,"name":"nginx","uid":33,"unit":"nginx.service","container":null,"profiles":{"cpu":12,"heap":3}},
               {"pid":7,"name":"x","uid":0,"unit":null,"container":"0123456789abcdef","profiles":{"cpu":1}}]"#,
        )
        .unwrap();
        let text = processes(&list).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[0].contains("UNIT/CONTAINER") && lines[0].ends_with("CPU         HEAP"), "{text}");
        assert!(
            lines[1].contains("nginx") && lines[1].contains("nginx.service") && lines[1].ends_with("12            3"),
            "{text}"
        );
        assert!(lines[2].contains("0123456789ab ") && lines[2].ends_with("-"), "{text}");
    }
}
