//! Go's `debug=1` text profiles as the reference: Go's own output (from
//! `tests/fixtures/go_text.go`, run with Debian's Go), a line-by-line grammar of each layout
//! (header lines, the count/value lines, the frame lines, the blank line that ends a record),
//! and `go tool pprof -raw` output read back as samples, to compare a text profile with the
//! protobuf one it came from.

use std::{collections::BTreeMap, path::Path, process::Command};

use regex::Regex;

/// The text layouts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    Heap,
    /// Block (`--- contention:`) or mutex (`--- mutex:`).
    Contention {
        mutex: bool,
    },
    /// `<name> profile: total N`.
    Count,
}

/// What a text holds, as its grammar reads it.
#[derive(Debug, Default)]
pub struct Parsed {
    /// Each record's numbers, in the order written.
    pub records: Vec<Vec<i64>>,
    /// Frame lines with a function (`#\t0x..\tf+0x..\tfile:line`).
    pub symbolized_frames: usize,
    pub unsymbolized_frames: usize,
}

/// Runs Go's reference program; returns its texts by profile name (heap, block, mutex,
/// threadcreate).
pub fn reference(dir: &Path) -> BTreeMap<&'static str, String> {
    let source = crate::workspace_root().join("tests/fixtures/go_text.go");
    std::fs::create_dir_all(dir).expect("a directory for Go's texts");
    let output = Command::new("go")
        .arg("run")
        .arg(&source)
        .arg(dir)
        // No module proxy is reachable, and the program needs none.
        .env("GOFLAGS", "-mod=mod")
        .env("GOPROXY", "off")
        .output()
        .unwrap_or_else(|e| panic!("failed to run `go` ({e}): {}", crate::go_pprof::INSTALL_GO));
    assert!(output.status.success(), "go run {}: {}", source.display(), String::from_utf8_lossy(&output.stderr));
    ["heap", "block", "mutex", "threadcreate"]
        .into_iter()
        .map(|name| {
            let path = dir.join(format!("{name}.txt"));
            (name, std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display())))
        })
        .collect()
}

struct Grammar {
    header: Vec<Regex>,
    record: Regex,
    frame: Regex,
    frame_unsymbolized: Regex,
}

fn grammar(layout: Layout) -> Grammar {
    let re = |s: &str| Regex::new(s).expect("a valid regex");
    let stack = r"@((?: 0x[0-9a-f]+)*)$";
    let (header, record) = match layout {
        Layout::Heap => (
            vec![re(r"^heap profile: (-?\d+): (-?\d+) \[(\d+): (\d+)\] @ heap/(\d+)$")],
            format!(r"^(-?\d+): (-?\d+) \[(\d+): (\d+)\] {stack}"),
        ),
        Layout::Contention { mutex } => {
            let mut header = vec![re(r"^--- (contention|mutex):$"), re(r"^cycles/second=(\d+)$")];
            if mutex {
                header.push(re(r"^sampling period=(-?\d+)$"));
            }
            (header, format!(r"^(\d+) (\d+) {stack}"))
        }
        Layout::Count => (vec![re(r"^(\S+) profile: total (\d+)$")], format!(r"^(\d+) {stack}")),
    };
    Grammar {
        header,
        record: re(&record),
        frame: re(r"^#\t(0x[0-9a-f]+)\t+([^\t]+)\+(0x[0-9a-f]+)\t+([^\t]*):(\d+)$"),
        frame_unsymbolized: re(r"^#\t(0x[0-9a-f]+)$"),
    }
}

/// Checks `text` against the layout's grammar, line by line: the header lines; then records,
/// each a value line, zero or more frame lines and one blank line; for the heap, an optional
/// `# runtime.MemStats` block after one more blank line (Go writes one, readers skip it).
/// For count layouts the counts must add up to the header's total. Returns what it read, or
/// the first line that breaks the grammar.
pub fn check(layout: Layout, text: &str) -> Result<Parsed, String> {
    let g = grammar(layout);
    let lines: Vec<&str> = text.strip_suffix('\n').ok_or("the text does not end with a newline")?.split('\n').collect();
    let at = |i: usize, what: &str| format!("line {}: {what}: {:?}", i + 1, lines.get(i).copied().unwrap_or("<end>"));
    let mut parsed = Parsed::default();
    let mut i = 0;
    let mut total = None;
    for header in &g.header {
        let caps = header.captures(lines.get(i).copied().unwrap_or("")).ok_or_else(|| at(i, "not the header"))?;
        if layout == Layout::Count {
            total = Some(caps[2].parse::<i64>().map_err(|e| e.to_string())?);
        }
        i += 1;
    }
    while i < lines.len() {
        if layout == Layout::Heap && lines[i].is_empty() {
            // The MemStats trailer: a blank line, then `#` lines only.
            let trailer = &lines[i + 1..];
            if trailer.first() == Some(&"# runtime.MemStats") && trailer.iter().all(|l| l.starts_with("# ")) {
                break;
            }
            return Err(at(i, "a blank line that starts no MemStats block"));
        }
        let caps = g.record.captures(lines[i]).ok_or_else(|| at(i, "not a record line"))?;
        let numbers = (1..caps.len() - 1).map(|k| caps[k].parse::<i64>().map_err(|e| e.to_string()));
        parsed.records.push(numbers.collect::<Result<_, _>>()?);
        i += 1;
        while i < lines.len() && lines[i].starts_with('#') {
            if g.frame.is_match(lines[i]) {
                parsed.symbolized_frames += 1;
            } else if g.frame_unsymbolized.is_match(lines[i]) {
                parsed.unsymbolized_frames += 1;
            } else {
                return Err(at(i, "not a frame line"));
            }
            i += 1;
        }
        if lines.get(i) != Some(&"") {
            return Err(at(i, "a record not ended by a blank line"));
        }
        i += 1;
    }
    if let Some(total) = total {
        let sum: i64 = parsed.records.iter().map(|r| r[0]).sum();
        if sum != total {
            return Err(format!("the counts add up to {sum}, the header says total {total}"));
        }
    }
    Ok(parsed)
}

/// The samples of `go tool pprof -raw` output: each stack (as addresses, leaf first) with its
/// values, samples of the same stack summed (pprof's text readers merge them, labels being
/// absent from text), sorted, so two profiles of the same data compare equal whatever their
/// order and labels.
pub fn raw_samples(raw: &str) -> Vec<(Vec<i64>, Vec<u64>)> {
    let location = Regex::new(r"^\s*(\d+): (0x[0-9a-f]+) ").expect("regex");
    let sample = Regex::new(r"^\s*((?:-?\d+\s+)*-?\d+): ((?:\d+ ?)*)$").expect("regex");
    let mut addresses = BTreeMap::new();
    let mut in_locations = false;
    for line in raw.lines() {
        if line.starts_with("Locations") {
            in_locations = true;
        } else if line.starts_with("Mappings") {
            in_locations = false;
        } else if in_locations {
            if let Some(caps) = location.captures(line) {
                let address = u64::from_str_radix(caps[2].trim_start_matches("0x"), 16).expect("hex");
                addresses.insert(caps[1].to_string(), address);
            }
        }
    }
    let mut by_stack: BTreeMap<Vec<u64>, Vec<i64>> = BTreeMap::new();
    for caps in raw
        .lines()
        .skip_while(|l| !l.starts_with("Samples:"))
        .take_while(|l| !l.starts_with("Locations"))
        .filter_map(|line| sample.captures(line))
    {
        let values: Vec<i64> = caps[1].split_whitespace().map(|v| v.parse().expect("a value")).collect();
        let stack = caps[2].split_whitespace().map(|id| addresses.get(id).copied().unwrap_or(0)).collect();
        let sum = by_stack.entry(stack).or_insert_with(|| vec![0; values.len()]);
        sum.iter_mut().zip(values).for_each(|(s, v)| *s += v);
    }
    let mut samples: Vec<(Vec<i64>, Vec<u64>)> = by_stack.into_iter().map(|(stack, values)| (values, stack)).collect();
    samples.sort();
    samples
}
