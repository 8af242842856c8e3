//! Go's legacy text profiles, what `?debug=1` returns, written as Go 1.19's `runtime/pprof`
//! writes them (`writeHeapInternal`, the contention writer, `printCountProfile`):
//!
//! ```text
//! heap profile: 4: 2048 [9: 4096] @ heap/1048576   --- contention:             threadcreate profile: total 3
//! 4: 2048 [9: 4096] @ 0x1101 0x1201                cycles/second=1000000000    3 @ 0x1101 0x1201
//! #\t0x1100\thot+0x10\ta.c:10                       5000 2 @ 0x1101 0x1201      #\t0x1100\thot+0x10\ta.c:10
//! ```
//!
//! A record's frame lines are `#\t0xADDR\tfunction+0xOFFSET\tfile:line`, one per frame
//! (inlined frames each on their own line, innermost first), their columns aligned with tabs
//! as Go's `text/tabwriter` aligns them; an unsymbolized address is `#\t0xADDR`. The `@` list
//! holds each location's address + 1 (return addresses, as Go prints them), so that
//! `go tool pprof`, which subtracts 1 when it reads them, finds our locations' addresses.
//! Values are as sampled: the heap's are unscaled (pprof scales them by `heap/2·rate`), and
//! delays are in nanoseconds, stated as `cycles/second=1000000000`.

use std::fmt::Write;

use crate::resolve::{LocationInfo, ResolvedProfile, ResolvedSample};

/// Which of Go's text layouts a profile kind uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TextFormat {
    /// `heap profile: …`, values `[alloc_objects, alloc_space, inuse_objects, inuse_space]`
    /// sampled one per `rate` bytes on average.
    Heap { rate: u64 },
    /// `--- contention:` (block) or `--- mutex:`, values `[count, delay_ns]`; the mutex
    /// layout states its sampling period.
    Contention { mutex_period: Option<i64> },
    /// `<name> profile: total N`, one count value; samples with the same stack are one
    /// record (Go groups goroutines so).
    Count { name: &'static str },
    /// Go's `goroutine?debug=2` adapted to threads: each thread's header, then its frames
    /// (see [`super::thread_text`]).
    Threads,
    /// `--- <type>: <sample types>` then the values and stack of each sample: for profiles
    /// Go has no text form of (CPU).
    Generic { name: &'static str, sample_types: &'static [(&'static str, &'static str)] },
}

/// The values Go's text shows: as sampled when they were scaled.
fn sampled(sample: &ResolvedSample) -> &[i64] {
    if sample.unscaled.is_empty() {
        &sample.values
    } else {
        &sample.unscaled
    }
}

fn value(sample: &ResolvedSample, index: usize) -> i64 {
    sampled(sample).get(index).copied().unwrap_or(0)
}

/// `heap profile: in_objs: in_bytes [alloc_objs: alloc_bytes] @ heap/2·rate`, records by in-use
/// bytes, largest first. Go writes twice the rate here and its parser halves it again.
pub(super) fn heap(resolved: &ResolvedProfile, rate: u64, out: &mut String) {
    let values = |s: &ResolvedSample| [value(s, 2), value(s, 3), value(s, 0), value(s, 1)];
    let mut total = [0i64; 4];
    for sample in &resolved.samples {
        total.iter_mut().zip(values(sample)).for_each(|(t, v)| *t = t.saturating_add(v));
    }
    let [io, ib, ao, ab] = total;
    let _ = writeln!(out, "heap profile: {io}: {ib} [{ao}: {ab}] @ heap/{}", rate.max(1).saturating_mul(2));
    let mut samples: Vec<&ResolvedSample> = resolved.samples.iter().collect();
    samples.sort_by_key(|s| std::cmp::Reverse(value(s, 3)));
    for sample in samples {
        let [io, ib, ao, ab] = values(sample);
        let _ = write!(out, "{io}: {ib} [{ao}: {ab}]");
        record_stack(resolved, sample, out);
    }
}

/// `--- contention:` / `--- mutex:`, `cycles/second=` (our delays are nanoseconds, so one
/// "cycle" is one), the mutex's `sampling period=`, then `delay count` records, largest delay
/// first.
pub(super) fn contention(resolved: &ResolvedProfile, mutex_period: Option<i64>, out: &mut String) {
    out.push_str(if mutex_period.is_some() { "--- mutex:\n" } else { "--- contention:\n" });
    out.push_str("cycles/second=1000000000\n");
    if let Some(period) = mutex_period {
        let _ = writeln!(out, "sampling period={period}");
    }
    let mut samples: Vec<&ResolvedSample> = resolved.samples.iter().collect();
    samples.sort_by_key(|s| std::cmp::Reverse(value(s, 1)));
    for sample in samples {
        let _ = write!(out, "{} {}", value(sample, 1), value(sample, 0));
        record_stack(resolved, sample, out);
    }
}

/// `<name> profile: total N`, then the stacks with their counts: largest count first, ties
/// by the text of the address list, as Go orders them. Samples with the same locations are
/// one record.
pub(super) fn count(resolved: &ResolvedProfile, name: &str, out: &mut String) {
    let total: i64 = resolved.samples.iter().map(|s| value(s, 0)).sum();
    let _ = writeln!(out, "{name} profile: total {total}");
    let mut grouped: Vec<(&ResolvedSample, i64, String)> = Vec::new();
    for sample in &resolved.samples {
        match grouped.iter_mut().find(|(s, _, _)| s.locations == sample.locations) {
            Some((_, n, _)) => *n += value(sample, 0),
            None => grouped.push((sample, value(sample, 0), addresses(resolved, sample))),
        }
    }
    grouped.sort_by(|(_, a, ka), (_, b, kb)| b.cmp(a).then_with(|| ka.cmp(kb)));
    for (sample, n, _) in grouped {
        let _ = write!(out, "{n}");
        record_stack(resolved, sample, out);
    }
}

/// `--- cpu: samples/count cpu/nanoseconds`, then `3 30000000 @ 0x..` per sample.
pub(super) fn generic(resolved: &ResolvedProfile, name: &str, sample_types: &[(&str, &str)], out: &mut String) {
    let types: Vec<String> = sample_types.iter().map(|(t, u)| format!("{t}/{u}")).collect();
    let _ = writeln!(out, "--- {name}: {}", types.join(" "));
    for sample in &resolved.samples {
        let values: Vec<String> = sample.values.iter().map(i64::to_string).collect();
        out.push_str(&values.join(" "));
        record_stack(resolved, sample, out);
    }
}

/// ` @ 0x.. 0x..` (leaf first, each address + 1, see the module doc).
pub(super) fn addresses(resolved: &ResolvedProfile, sample: &ResolvedSample) -> String {
    let mut text = String::from(" @");
    for &location in &sample.locations {
        let _ = write!(text, " {:#x}", resolved.locations[location].address.wrapping_add(1));
    }
    text
}

/// The rest of a record after its values: the address list, the frame lines (aligned), and
/// the blank line that ends it. A stack without frames is `#\t0x0`, as Go prints it.
fn record_stack(resolved: &ResolvedProfile, sample: &ResolvedSample, out: &mut String) {
    out.push_str(&addresses(resolved, sample));
    out.push('\n');
    frames(resolved, sample, out);
    out.push('\n');
}

/// A sample's frame lines, aligned (`#\t0x0` for a stack without frames).
pub(super) fn frames(resolved: &ResolvedProfile, sample: &ResolvedSample, out: &mut String) {
    let mut lines: Vec<Vec<String>> = Vec::new();
    for &location in &sample.locations {
        frame_lines(&resolved.locations[location], &mut lines);
    }
    if sample.locations.is_empty() {
        lines.push(vec!["#".into(), "0x0".into()]);
    }
    for line in aligned(&lines) {
        out.push_str(&line);
        out.push('\n');
    }
}

/// A location's frame lines as tab-separated cells: `#`, the address, `function+0xoff`,
/// `file:line`; just `#` and the address when unsymbolized.
pub(super) fn frame_lines(location: &LocationInfo, lines: &mut Vec<Vec<String>>) {
    let address = format!("{:#x}", location.address);
    if location.frames.is_empty() {
        lines.push(vec!["#".into(), address]);
        return;
    }
    for frame in &location.frames {
        let file = frame.file.as_deref().unwrap_or("?");
        lines.push(vec![
            "#".into(),
            address.clone(),
            format!("{}+{:#x}", printable(&frame.function), frame.offset),
            format!("{}:{}", printable(file), frame.line),
        ]);
    }
}

/// Symbol and file names come from files any user controls: no control characters in a
/// line of text (a newline would forge a record, an escape would reach a terminal), and
/// no format characters (a bidi override would reorder what a terminal shows, as in
/// "Trojan Source", CVE-2021-42574; a zero-width one would hide a difference).
pub(super) fn printable(text: &str) -> String {
    text.chars().map(|c| if c.is_control() || is_format(c) { '?' } else { c }).collect()
}

/// Unicode's General_Category=Cf ("Other, format"), from `DerivedGeneralCategory.txt` of
/// Unicode 15.1, plus the line and paragraph separators U+2028 and U+2029 (Zl, Zp), which
/// some viewers break lines at. Sorted, inclusive ranges.
const FORMAT_CHARACTERS: &[(u32, u32)] = &[
    (0x00AD, 0x00AD),   // soft hyphen
    (0x0600, 0x0605),   // Arabic number signs
    (0x061C, 0x061C),   // Arabic letter mark
    (0x06DD, 0x06DD),   // Arabic end of ayah
    (0x070F, 0x070F),   // Syriac abbreviation mark
    (0x0890, 0x0891),   // Arabic pound and piastre marks above
    (0x08E2, 0x08E2),   // Arabic disputed end of ayah
    (0x180E, 0x180E),   // Mongolian vowel separator
    (0x200B, 0x200F),   // zero-width space, joiners, LRM, RLM
    (0x2028, 0x202E),   // line/paragraph separators (Zl, Zp); bidi embeddings and overrides
    (0x2060, 0x2064),   // word joiner, invisible operators
    (0x2066, 0x206F),   // bidi isolates, deprecated format characters
    (0xFEFF, 0xFEFF),   // zero-width no-break space (byte order mark)
    (0xFFF9, 0xFFFB),   // interlinear annotation
    (0x110BD, 0x110BD), // Kaithi number sign
    (0x110CD, 0x110CD), // Kaithi number sign above
    (0x13430, 0x1343F), // Egyptian hieroglyph format controls
    (0x1BCA0, 0x1BCA3), // shorthand format controls
    (0x1D173, 0x1D17A), // musical symbol format controls
    (0xE0001, 0xE0001), // language tag
    (0xE0020, 0xE007F), // tag characters
];

/// Whether `c` is in [`FORMAT_CHARACTERS`].
fn is_format(c: char) -> bool {
    let c = u32::from(c);
    let at = FORMAT_CHARACTERS.partition_point(|&(_, last)| last < c);
    FORMAT_CHARACTERS.get(at).is_some_and(|&(first, _)| first <= c)
}

/// Joins each line's cells with tabs the way Go's `tabwriter.NewWriter(w, 1, 8, 1, '\t', 0)`
/// does: every cell but a line's last is a column; a column's width is the widest cell in
/// a block of consecutive lines that have it, plus one, rounded up to a multiple of 8; a
/// cell is followed by as many tabs as reach that width.
pub(super) fn aligned(lines: &[Vec<String>]) -> Vec<String> {
    let mut out: Vec<String> = vec![String::new(); lines.len()];
    let mut widths = Vec::new();
    format_columns(lines, 0, lines.len(), &mut widths, &mut out);
    out
}

/// Go's `tabwriter.(*Writer).format`, over lines `[start, end)` with the widths of the
/// columns to the left already known.
fn format_columns(lines: &[Vec<String>], start: usize, end: usize, widths: &mut Vec<usize>, out: &mut [String]) {
    let column = widths.len();
    let mut line0 = start;
    let mut this = start;
    while this < end {
        if column + 1 >= lines[this].len() {
            this += 1;
            continue;
        }
        write_lines(lines, line0, this, widths, out);
        line0 = this;
        let mut width = 1;
        while this < end && column + 1 < lines[this].len() {
            width = width.max(lines[this][column].chars().count() + 1);
            this += 1;
        }
        widths.push(width);
        format_columns(lines, line0, this, widths, out);
        widths.pop();
        line0 = this;
    }
    write_lines(lines, line0, end, widths, out);
}

/// Go's `writeLines`: each line's cells, those with a known column width padded with tabs.
fn write_lines(lines: &[Vec<String>], start: usize, end: usize, widths: &[usize], out: &mut [String]) {
    const TAB_WIDTH: usize = 8;
    for (line, text) in lines[start..end].iter().zip(&mut out[start..end]) {
        for (j, cell) in line.iter().enumerate() {
            text.push_str(cell);
            if let Some(&width) = widths.get(j) {
                if j + 1 < line.len() {
                    let cell_width = width.div_ceil(TAB_WIDTH) * TAB_WIDTH;
                    let tabs = (cell_width - cell.chars().count()).div_ceil(TAB_WIDTH);
                    text.push_str(&"\t".repeat(tabs));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pprof::go_text;
    use crate::{
        ids::Pid,
        resolve::{FrameStats, MappingInfo},
        symbolize::Frame,
    };

    fn frame(function: &str, offset: u64, file: &str, line: u32) -> Frame {
        Frame { function: function.into(), file: Some(file.into()), line, offset }
    }

    /// Two stacks sharing `main`; the leaf of the first has an inlined frame; the second's
    /// leaf is unsymbolized.
    fn profile(values: [(Vec<i64>, Vec<i64>); 2]) -> ResolvedProfile {
        let mapping = MappingInfo {
            start: 0x1000,
            limit: 0x9000,
            offset: 0,
            path: "/bin/app".into(),
            build_id: None,
            has_functions: true,
            has_lines: true,
            has_inline_frames: true,
        };
        let loc = |address, frames| LocationInfo { address, mapping: Some(0), frames };
        let [(v0, u0), (v1, u1)] = values;
        ResolvedProfile {
            pid: Pid(7),
            name: "app".into(),
            mappings: vec![mapping],
            locations: vec![
                loc(0x1100, vec![frame("inlined", 0x10, "a.c", 3), frame("hot", 0x10, "a.c", 10)]),
                loc(0x1200, vec![frame("main", 0x2a, "main.c", 20)]),
                LocationInfo { address: 0xdead, mapping: None, frames: vec![] },
            ],
            samples: vec![
                ResolvedSample { locations: vec![0, 1], values: v0, unscaled: u0, labels: vec![] },
                ResolvedSample { locations: vec![2, 1], values: v1, unscaled: u1, labels: vec![] },
            ],
            frames: FrameStats::default(),
            refused: Vec::new(),
            notes: Vec::new(),
        }
    }

    #[test]
    fn heap_prints_the_unscaled_values_by_inuse_bytes_with_gos_header() {
        let p = profile([(vec![14, 6000, 6, 2600], vec![9, 4096, 4, 2048]), (vec![2, 150, 0, 0], vec![1, 100, 0, 0])]);
        let expected = "\
heap profile: 4: 2048 [10: 4196] @ heap/1048576
4: 2048 [9: 4096] @ 0x1101 0x1201
#\t0x1100\tinlined+0x10\ta.c:3
#\t0x1100\thot+0x10\ta.c:10
#\t0x1200\tmain+0x2a\tmain.c:20

0: 0 [1: 100] @ 0xdeae 0x1201
#\t0xdead
#\t0x1200\tmain+0x2a\tmain.c:20

";
        assert_eq!(go_text(&p, TextFormat::Heap { rate: 524288 }), expected);
    }

    #[test]
    fn contention_prints_delay_then_count_and_mutex_states_its_period() {
        let p = profile([(vec![3, 30], vec![]), (vec![1, 90], vec![])]);
        let text = go_text(&p, TextFormat::Contention { mutex_period: Some(1) });
        assert!(
            text.starts_with("--- mutex:\ncycles/second=1000000000\nsampling period=1\n90 1 @ 0xdeae 0x1201\n"),
            "{text}"
        );
        let block = go_text(&p, TextFormat::Contention { mutex_period: None });
        assert!(block.starts_with("--- contention:\ncycles/second=1000000000\n90 1 @"), "{block}");
    }

    #[test]
    fn counts_sum_into_the_total_and_sort_by_count() {
        let p = profile([(vec![1], vec![]), (vec![2], vec![])]);
        let text = go_text(&p, TextFormat::Count { name: "threadcreate" });
        assert!(text.starts_with("threadcreate profile: total 3\n2 @ 0xdeae 0x1201\n#\t0xdead\n"), "{text}");
    }

    #[test]
    fn columns_align_like_gos_tabwriter() {
        // Go's own output: widths round up to tab stops, per block of lines with the column.
        let cells = |c: &[&str]| c.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let lines = [
            cells(&["#", "0x6a8fdc", "main.newBuf+0x5c", "/tmp/main.go:57"]),
            cells(&["#", "0x6a8fdd", "main.allocViaInline+0x5d", "/tmp/main.go:63"]),
            cells(&["#", "0x6aa8f3", "main.main+0xf3", "/tmp/main.go:264"]),
        ];
        assert_eq!(
            aligned(&lines),
            [
                "#\t0x6a8fdc\tmain.newBuf+0x5c\t\t/tmp/main.go:57",
                "#\t0x6a8fdd\tmain.allocViaInline+0x5d\t/tmp/main.go:63",
                "#\t0x6aa8f3\tmain.main+0xf3\t\t\t/tmp/main.go:264",
            ]
        );
        // An unsymbolized line ends the address column's block.
        let split = [
            cells(&["#", "0x1", "a_long_function_name+0x1", "f:1"]),
            cells(&["#", "0x2"]),
            cells(&["#", "0x3", "b+0x1", "f:2"]),
        ];
        assert_eq!(aligned(&split), ["#\t0x1\ta_long_function_name+0x1\tf:1", "#\t0x2", "#\t0x3\tb+0x1\tf:2"]);
    }

    #[test]
    fn names_cannot_forge_lines() {
        let mut p = profile([(vec![1], vec![]), (vec![1], vec![])]);
        p.locations[1].frames[0].function = "evil\n1 @ 0x1".into();
        let text = go_text(&p, TextFormat::Count { name: "threadcreate" });
        assert!(text.contains("evil?1 @ 0x1+0x2a"), "{text}");
        assert_eq!(text.lines().filter(|l| l.ends_with(" @ 0x1")).count(), 0);
    }

    #[test]
    fn format_characters_are_replaced() {
        // A name that a terminal shows as "main_sdrawkcab" reversed: U+202E reorders it.
        assert_eq!(printable("evil\u{202E}kcab"), "evil?kcab");
        for c in [
            '\u{00AD}',
            '\u{200B}',
            '\u{200F}',
            '\u{2028}',
            '\u{202A}',
            '\u{2066}',
            '\u{2069}',
            '\u{FEFF}',
            '\u{E007F}',
        ] {
            assert_eq!(printable(&format!("a{c}b")), "a?b", "U+{:04X}", u32::from(c));
        }
        // Neighbours of the ranges, and ordinary non-ASCII names, pass.
        for text in ["\u{00AC}\u{00AE}", "\u{200A}\u{2010}\u{2065}\u{2070}", "std::vec::Vec<größe>", "関数"] {
            assert_eq!(printable(text), text);
        }
        assert!(FORMAT_CHARACTERS.windows(2).all(|w| w[0].1 < w[1].0), "sorted, disjoint");
    }
}
