//! A Go process's goroutines as Go's own `goroutine` texts (Go 1.19's `runtime/pprof`):
//!
//! `debug=1` (`printCountProfile`): goroutines with the same stack and labels are one
//! record, by count then key, each `N @ 0x.. 0x..`, then `# labels: {"k":"v"}` when it has
//! labels, then its frame lines as every `debug=1` record has them.
//!
//! `debug=2` (`runtime.Stack(buf, true)`): each goroutine by id, `goroutine 7 [chan receive,
//! 2 minutes]:`, then its frames as `function(...)` and `\tfile:line +0xoff` (Go prints the
//! arguments' words where `(...)` stands; the runtime's unexported functions are hidden, as
//! Go's traceback hides them), then `created by F` (Go 1.21 on: `in goroutine N`) and its
//! place, then a blank line.
//!
//! The goroutine's facts come from the samples' labels ([`crate::runtimes::go::profile`]);
//! labels that are not facts are its pprof labels.

use std::fmt::Write;

use super::text::{addresses, aligned, frame_lines, printable};
use crate::resolve::LocationInfo;
use crate::{
    resolve::{LabelValue, ResolvedProfile, ResolvedSample},
    runtimes::go::{labels::go_string, profile as go},
};

/// Whether the samples are goroutines (not OS threads).
pub(super) fn is_goroutines(resolved: &ResolvedProfile) -> bool {
    resolved.samples.iter().any(|s| s.labels.iter().any(|(k, _)| *k == go::GOID))
}

/// `debug=1`.
pub(super) fn grouped(resolved: &ResolvedProfile, out: &mut String) {
    let _ = writeln!(out, "goroutine profile: total {}", resolved.samples.len());
    let mut records: Vec<(String, i64, &ResolvedSample)> = Vec::new();
    for sample in &resolved.samples {
        let mut key = addresses(resolved, sample);
        if let Some(labels) = pprof_labels(sample) {
            let _ = write!(key, "\n# labels: {}", printable(&go_string(&labels)));
        }
        match records.iter_mut().find(|(k, _, _)| *k == key) {
            Some((_, n, _)) => *n += 1,
            None => records.push((key, 1, sample)),
        }
    }
    records.sort_by(|(ka, a, _), (kb, b, _)| b.cmp(a).then_with(|| ka.cmp(kb)));
    for (key, n, sample) in records {
        let _ = writeln!(out, "{n}{key}");
        let locations: Vec<&LocationInfo> = sample.locations.iter().map(|&l| &resolved.locations[l]).collect();
        for line in aligned(&record_lines(&locations)) {
            out.push_str(&line);
            out.push('\n');
        }
        out.push('\n');
    }
}

/// A record's frame lines as Go's `printStackRecord` picks them: the runtime's frames before
/// the first other one hidden, `runtime.goexit` always; all of them when that leaves none.
fn record_lines(locations: &[&LocationInfo]) -> Vec<Vec<String>> {
    let mut lines = Vec::new();
    let mut show = false;
    for location in locations {
        let mut all = Vec::new();
        frame_lines(location, &mut all);
        for (line, frame) in all.into_iter().zip(location.frames.iter().map(Some).chain(std::iter::repeat(None))) {
            let name = frame.map_or("", |f| f.function.as_str());
            if name != "runtime.goexit" && (show || !name.starts_with("runtime.")) {
                show = true;
                lines.push(line);
            }
        }
    }
    if !show {
        locations.iter().for_each(|location| frame_lines(location, &mut lines));
    }
    lines
}

/// `debug=2`.
pub(super) fn each(resolved: &ResolvedProfile, out: &mut String) {
    let mut samples: Vec<&ResolvedSample> = resolved.samples.iter().collect();
    samples.sort_by_key(|s| number(s, go::GOID));
    for sample in samples {
        let state = text(sample, go::STATE).unwrap_or_default();
        let _ = writeln!(out, "goroutine {} [{}]:", number(sample, go::GOID).unwrap_or(0), state);
        let exact_leaf = text(sample, go::STACK).is_some_and(|how| how.contains("exact pc"));
        for (i, &location) in sample.locations.iter().enumerate() {
            let info = &resolved.locations[location];
            // Return addresses are symbolized one byte back; Go prints their own offset.
            let back = u64::from(i > 0 || !exact_leaf);
            if info.frames.is_empty() {
                let _ = writeln!(out, "{:#x}(...)\n\t?:0", info.address + back);
            }
            for frame in info.frames.iter().filter(|f| shown(&f.function)) {
                let file = printable(frame.file.as_deref().unwrap_or("?"));
                let name = printable(&frame.function);
                let _ = writeln!(out, "{name}(...)\n\t{file}:{} +{:#x}", frame.line, frame.offset + back);
            }
        }
        // Go's `printcreatedby`: not for the main goroutine, nor for a creator it hides.
        let goid = number(sample, go::GOID).unwrap_or(0);
        if let Some(creator) = text(sample, go::CREATOR).filter(|c| goid != 1 && shown(c)) {
            let parent = number(sample, go::PARENT).map(|p| format!(" in goroutine {p}")).unwrap_or_default();
            let at = text(sample, go::CREATOR_AT).unwrap_or_default();
            let _ = writeln!(out, "created by {creator}{parent}\n\t{at}");
        }
        out.push('\n');
    }
}

/// Go's `showframe` at the default traceback level: a function with a package, not one of
/// the runtime's unexported ones.
fn shown(function: &str) -> bool {
    match function.strip_prefix("runtime.") {
        Some(rest) => rest.starts_with(|c: char| c.is_ascii_uppercase()),
        None => function.contains('.'),
    }
}

/// The sample's pprof labels (not facts), `None` when it has none.
fn pprof_labels(sample: &ResolvedSample) -> Option<Vec<(String, String)>> {
    let labels: Vec<(String, String)> = sample
        .labels
        .iter()
        .filter(|(k, _)| !go::is_fact(k))
        .filter_map(|(k, v)| match v {
            LabelValue::Str(s) => Some((k.to_string(), s.clone())),
            LabelValue::Num(..) => None,
        })
        .collect();
    (!labels.is_empty()).then_some(labels)
}

fn text(sample: &ResolvedSample, key: &str) -> Option<String> {
    sample.labels.iter().find_map(|(k, v)| match v {
        LabelValue::Str(s) if *k == key => Some(printable(s)),
        _ => None,
    })
}

fn number(sample: &ResolvedSample, key: &str) -> Option<i64> {
    sample.labels.iter().find_map(|(k, v)| match v {
        LabelValue::Num(n, _) if *k == key => Some(*n),
        _ => None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        pprof::{go_text, TextFormat},
        resolve::{FrameStats, LocationInfo},
        symbolize::Frame,
    };

    fn location(address: u64, function: &str, line: u32) -> LocationInfo {
        let frame = Frame { function: function.into(), file: Some("/src/main.go".into()), line, offset: 0x23 };
        LocationInfo { address, mapping: None, frames: vec![frame] }
    }

    fn goroutine(goid: i64, labels: &[(&'static str, &str)], locations: Vec<usize>) -> ResolvedSample {
        let mut all = vec![
            (go::GOID, LabelValue::Num(goid, None)),
            (go::STATE, LabelValue::Str("chan receive".into())),
            (go::STACK, LabelValue::Str("saved sched".into())),
            (go::CREATOR, LabelValue::Str("main.main".into())),
            (go::CREATOR_AT, LabelValue::Str("/src/main.go:40 +0x65".into())),
        ];
        all.extend(labels.iter().map(|&(k, v)| (k, LabelValue::Str(v.into()))));
        ResolvedSample { locations, values: vec![1], unscaled: vec![], labels: all }
    }

    fn profile() -> ResolvedProfile {
        ResolvedProfile {
            locations: vec![
                location(0x100, "runtime.gopark", 10),
                location(0x200, "main.waitA", 20),
                location(0x300, "runtime.goexit", 30),
            ],
            samples: vec![
                goroutine(9, &[("worker", "a")], vec![0, 1, 2]),
                goroutine(7, &[("worker", "a")], vec![0, 1, 2]),
                goroutine(8, &[], vec![0, 1, 2]),
            ],
            frames: FrameStats::default(),
            ..ResolvedProfile::default()
        }
    }

    #[test]
    fn debug1_groups_by_stack_and_labels_as_go_does() {
        let text = go_text(&profile(), TextFormat::Count { name: "threads" });
        let expected = "goroutine profile: total 3
2 @ 0x101 0x201 0x301
# labels: {\"worker\":\"a\"}
#\t0x200\tmain.waitA+0x23\t/src/main.go:20

1 @ 0x101 0x201 0x301
#\t0x200\tmain.waitA+0x23\t/src/main.go:20

";
        assert_eq!(text, expected);
    }

    #[test]
    fn debug2_is_each_goroutine_by_id_with_its_creator() {
        let text = go_text(&profile(), TextFormat::Threads);
        let one = |id| {
            format!(
                "goroutine {id} [chan receive]:\nmain.waitA(...)\n\t/src/main.go:20 +0x24\ncreated by main.main\n\t/src/main.go:40 +0x65\n\n"
            )
        };
        assert_eq!(text, format!("{}{}{}", one(7), one(8), one(9)));
    }

    #[test]
    fn the_main_goroutine_and_runtime_creators_print_no_created_by() {
        let mut resolved = profile();
        resolved.samples = vec![goroutine(1, &[], vec![1]), goroutine(2, &[], vec![1])];
        resolved.samples[1].labels[3] = (go::CREATOR, LabelValue::Str("runtime.newproc".into()));
        let text = go_text(&resolved, TextFormat::Threads);
        assert!(!text.contains("created by"), "{text}");
    }

    #[test]
    fn the_runtimes_unexported_frames_are_hidden() {
        assert!(!shown("runtime.gopark"));
        assert!(shown("runtime.Gosched"));
        assert!(shown("sync.(*Mutex).Lock"));
        assert!(!shown("goexit"));
    }
}
