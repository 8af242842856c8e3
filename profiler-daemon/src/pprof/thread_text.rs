//! A thread dump as text (`goroutine?debug=2`): Go's per-goroutine layout adapted to
//! threads. One block per thread, by thread id: a header naming the thread, where it waits
//! and its state, then its frames, kernel first, one per line as in `debug=1` records, then
//! a blank line:
//!
//! ```text
//! thread 4242 "worker-3" [futex, S, wchan futex_do_wait]:
//! #→0xffffffff81441416→futex_do_wait+0x46→→→?:0
//! #→0x7f6c34fc0f15→→__futex_abstimed_wait_common+0xc5→./nptl/futex-internal.c:87
//! ```
//!
//! (→ stands for a tab.)
//!
//! The header's fields come from the samples' labels (`tid`, `thread`, `syscall`, `state`,
//! `wchan`, and `stack` when the user stack was not walked now).

use std::fmt::Write;

use super::text::{frames, printable};
use crate::resolve::{LabelValue, ResolvedProfile, ResolvedSample};

/// Every sample (one per thread) as a header and its frames, by thread id.
pub(super) fn per_thread(resolved: &ResolvedProfile, out: &mut String) {
    let mut samples: Vec<&ResolvedSample> = resolved.samples.iter().collect();
    samples.sort_by_key(|s| number(s, "tid"));
    for sample in samples {
        let _ = writeln!(out, "{}", header(sample));
        frames(resolved, sample, out);
        out.push('\n');
    }
}

/// `thread TID "NAME" [SYSCALL, STATE, wchan W, stack: HOW]:` with the parts that apply.
fn header(sample: &ResolvedSample) -> String {
    let name = text(sample, "thread").unwrap_or_default();
    let mut parts = Vec::new();
    match text(sample, "syscall") {
        Some(call) => parts.push(call),
        None if text(sample, "state").as_deref() == Some("R") => parts.push("running".into()),
        None => {}
    }
    parts.extend(text(sample, "state"));
    parts.extend(text(sample, "wchan").map(|w| format!("wchan {w}")));
    if let Some(how) = text(sample, "stack").filter(|how| how != "walked") {
        parts.push(format!("stack: {how}"));
    }
    format!("thread {} \"{}\" [{}]:", number(sample, "tid"), name, parts.join(", "))
}

fn text(sample: &ResolvedSample, key: &str) -> Option<String> {
    sample.labels.iter().find_map(|(k, v)| match v {
        LabelValue::Str(s) if *k == key => Some(printable(s).replace('"', "'")),
        _ => None,
    })
}

fn number(sample: &ResolvedSample, key: &str) -> i64 {
    sample
        .labels
        .iter()
        .find_map(|(k, v)| match v {
            LabelValue::Num(n, _) if *k == key => Some(*n),
            _ => None,
        })
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        ids::Pid,
        pprof::{go_text, TextFormat},
        resolve::{FrameStats, LocationInfo},
        symbolize::Frame,
    };

    fn sample(tid: i64, name: &str, labels: &[(&'static str, &str)], locations: Vec<usize>) -> ResolvedSample {
        let mut all = vec![("tid", LabelValue::Num(tid, None)), ("thread", LabelValue::Str(name.into()))];
        all.extend(labels.iter().map(|&(k, v)| (k, LabelValue::Str(v.into()))));
        ResolvedSample { locations, values: vec![1], unscaled: vec![], labels: all }
    }

    #[test]
    fn each_thread_is_a_header_and_its_frames_by_tid() {
        let frame =
            |function: &str, line| Frame { function: function.into(), file: Some("a.c".into()), line, offset: 4 };
        let resolved = ResolvedProfile {
            pid: Pid(1),
            name: "app".into(),
            mappings: vec![],
            locations: vec![
                LocationInfo { address: 0x10, mapping: None, frames: vec![frame("wait", 3)] },
                LocationInfo { address: 0x20, mapping: None, frames: vec![frame("main", 9)] },
            ],
            samples: vec![
                sample(9, "busy", &[("state", "R"), ("stack", "cpu sample 0.2s before")], vec![1]),
                sample(
                    4,
                    "wa\"it\ner",
                    &[("syscall", "futex"), ("state", "S"), ("wchan", "futex_wait_queue"), ("stack", "walked")],
                    vec![0, 1],
                ),
            ],
            frames: FrameStats::default(),
            refused: vec![],
            notes: vec![],
        };
        let text = go_text(&resolved, TextFormat::Threads);
        let expected = "\
thread 4 \"wa'it?er\" [futex, S, wchan futex_wait_queue]:
#\t0x10\twait+0x4\ta.c:3
#\t0x20\tmain+0x4\ta.c:9

thread 9 \"busy\" [running, R, stack: cpu sample 0.2s before]:
#\t0x20\tmain+0x4\ta.c:9

";
        assert_eq!(text, expected);
    }

    #[test]
    fn threads_with_one_stack_are_one_debug1_record() {
        let resolved = ResolvedProfile {
            locations: vec![LocationInfo { address: 0x10, mapping: None, frames: vec![] }],
            samples: vec![sample(1, "a", &[], vec![0]), sample(2, "b", &[], vec![0])],
            ..ResolvedProfile::default()
        };
        let text = go_text(&resolved, TextFormat::Count { name: "threads" });
        assert_eq!(text, "threads profile: total 2\n2 @ 0x11\n#\t0x10\n\n");
    }
}
