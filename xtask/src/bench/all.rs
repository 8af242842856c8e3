//! `cargo xtask bench all --quick`: each bench's headline figures from one short round of its
//! smallest configuration, in one table (#51): bench, figure, value, target, verdict, and the
//! command that runs the bench in full. A few minutes in all, so a change's cost shows before
//! the full benches (an hour and more together) are run.
//!
//! Each bench module's `quick` measures with its own functions and returns its rows; a bench
//! that fails (a missing tool, say) gives one n/a row with the reason, and the rest still run.
//! The figures are the ratios against the peers and floors each bench runs beside the
//! profiler, and the MiB budgets the issues state; no absolute time that the machine decides.
//! One round is noisy: a MISS here says to run the full bench, which judges medians.

use std::time::{Duration, Instant};

use anyhow::{bail, Result};

use super::{bail_if_interrupted, workload};
use crate::workspace;

#[derive(clap::Args, Debug)]
pub struct AllArgs {
    /// One short round of each bench's smallest configuration (required for now).
    #[arg(long)]
    quick: bool,
}

/// How a figure is held to its target.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Bar {
    Below(f64),
    AtMost(f64),
}

impl Bar {
    fn holds(self, value: f64) -> bool {
        match self {
            Bar::Below(bar) => value < bar,
            Bar::AtMost(bar) => value <= bar,
        }
    }
}

/// What a figure counts, for how it is shown.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Unit {
    /// A ratio against a peer or floor run beside it.
    Ratio,
    Mib,
    /// Percent of one core.
    CoreShare,
    Count,
}

impl Unit {
    fn show(self, value: f64) -> String {
        match self {
            Unit::Ratio => format!("{value:.2}x"),
            Unit::Mib => format!("{value:.1} MiB"),
            Unit::CoreShare => format!("{value:.2}% of a core"),
            Unit::Count => format!("{value:.0}"),
        }
    }
}

/// One row of the table: a bench's headline figure and its verdict.
#[derive(Debug)]
pub struct Headline {
    pub bench: &'static str,
    pub figure: String,
    pub value: Option<f64>,
    pub shown: String,
    pub target: String,
    /// `None`: not measured (n/a).
    pub pass: Option<bool>,
    pub full_command: String,
    /// Why there is no value, shown as a note under the table (a path or a tool's message
    /// would widen a column past reading).
    pub why: Option<String>,
}

impl Headline {
    /// `value` of `figure` held to `bar`; n/a when there is no value.
    pub fn new(bench: &'static str, figure: &str, value: Option<f64>, bar: Bar, unit: Unit) -> Headline {
        let target = match bar {
            Bar::Below(bar) => format!("< {}", unit.show(bar)),
            Bar::AtMost(bar) => format!("<= {}", unit.show(bar)),
        };
        Headline {
            bench,
            figure: figure.to_string(),
            value,
            shown: value.map_or_else(|| "n/a".to_string(), |v| unit.show(v)),
            target,
            pass: value.map(|v| bar.holds(v)),
            full_command: format!("cargo xtask bench {bench}"),
            why: None,
        }
    }

    /// Says why, if there is no value (a missing peer, say).
    pub fn missing_because(mut self, why: &str) -> Headline {
        if self.value.is_none() {
            self.why = Some(why.to_string());
        }
        self
    }

    /// The one row of a bench that did not run, or failed, and why.
    pub fn not_run(bench: &'static str, why: &str) -> Headline {
        Headline {
            bench,
            figure: "(not run)".to_string(),
            value: None,
            shown: "n/a".to_string(),
            target: String::new(),
            pass: None,
            full_command: format!("cargo xtask bench {bench}"),
            why: Some(why.to_string()),
        }
    }
}

type Quick = fn() -> Result<Vec<Headline>>;

/// The benches in the order they run: the short, single-process ones first.
const BENCHES: [(&str, Quick); 11] = [
    ("cpu", super::cpu::quick),
    ("unwind", super::unwind::quick),
    ("python", super::python::quick),
    ("heap", super::heap::quick),
    ("futex", super::futex::quick),
    ("offcpu", super::offcpu::quick),
    ("memory", super::memory::quick),
    ("threads", super::threads::quick),
    ("exec", super::exec::quick),
    ("daemon", super::daemon::quick),
    ("export", super::export::quick),
];

/// The longest reason shown under the table; the bench's own output above it has the rest.
const MAX_REASON_CHARS: usize = 200;

pub fn run(args: &AllArgs) -> Result<()> {
    if !args.quick {
        bail!(
            "`bench all` runs only with --quick for now: the full benches take an hour and more together. \
             Run `cargo xtask bench all --quick`, or a full bench by name (`cargo xtask bench cpu`, …)"
        );
    }
    crate::setup::prepare_bench()?;
    workload::catch_interrupt();
    let started = Instant::now();
    let mut rows = Vec::new();
    let mut took = Vec::new();
    for (bench, quick) in BENCHES {
        workspace::stage(&format!("bench {bench}, quick: one short round"));
        let began = Instant::now();
        let result = quick();
        // A Ctrl-C ends the whole run, not just the bench it fell in.
        bail_if_interrupted()?;
        match result {
            Ok(headlines) => rows.extend(headlines),
            Err(err) => rows.push(Headline::not_run(bench, &reason(&err))),
        }
        took.push((bench, began.elapsed()));
    }
    rows.push(Headline::not_run("soak", "left out: it runs 10 min and more (a million stacks at 999 Hz)"));
    println!();
    print!("{}", table(&rows));
    println!("wall time {} in all: {}", minutes(started.elapsed()), timings(&took));
    Ok(())
}

/// The first line of `err`'s chain, cut to [`MAX_REASON_CHARS`].
fn reason(err: &anyhow::Error) -> String {
    let text = format!("{err:#}");
    let line = text.lines().next().unwrap_or("failed");
    match line.char_indices().nth(MAX_REASON_CHARS) {
        Some((cut, _)) => format!("failed: {}…", &line[..cut]),
        None => format!("failed: {line}"),
    }
}

fn minutes(d: Duration) -> String {
    format!("{}m{:02}s", d.as_secs() / 60, d.as_secs() % 60)
}

fn timings(took: &[(&str, Duration)]) -> String {
    took.iter().map(|(bench, d)| format!("{bench} {}s", d.as_secs())).collect::<Vec<_>>().join(", ")
}

/// The table, columns as wide as their widest cell, and under it the notes that say why a
/// value is missing (`n/a [N]`).
fn table(rows: &[Headline]) -> String {
    let verdict = |pass: Option<bool>| match pass {
        Some(true) => "PASS",
        Some(false) => "MISS",
        None => "n/a",
    };
    let mut notes = Vec::new();
    let shown: Vec<String> = rows
        .iter()
        .map(|r| match &r.why {
            Some(why) => {
                notes.push(format!("[{}] {}: {why}\n", notes.len() + 1, r.bench));
                format!("{} [{}]", r.shown, notes.len())
            }
            None => r.shown.clone(),
        })
        .collect();
    let header = ["bench", "figure", "value", "target", "verdict", "in full"];
    let cells: Vec<[&str; 6]> = rows
        .iter()
        .zip(&shown)
        .map(|(r, shown)| [r.bench, &r.figure, shown, &r.target, verdict(r.pass), &r.full_command])
        .collect();
    let width = |i: usize| cells.iter().map(|c| c[i].chars().count()).chain([header[i].len()]).max().unwrap_or(0);
    let widths: Vec<usize> = (0..header.len()).map(width).collect();
    let line = |cells: [&str; 6]| {
        let padded: Vec<String> = cells.iter().zip(&widths).map(|(c, &w)| format!("{c:<w$}")).collect();
        format!("{}\n", padded.join("  ").trim_end())
    };
    let dashes: Vec<String> = widths.iter().map(|&w| "-".repeat(w)).collect();
    let mut text = line(header);
    text += &line(std::array::from_fn(|i| dashes[i].as_str()));
    for c in cells {
        text += &line(c);
    }
    text + &notes.concat()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verdicts_follow_the_bar_and_missing_values_are_na() {
        let below = Headline::new("cpu", "x", Some(1.0), Bar::Below(1.0), Unit::Ratio);
        assert_eq!((below.pass, below.shown.as_str(), below.target.as_str()), (Some(false), "1.00x", "< 1.00x"));
        let at_most = Headline::new("cpu", "x", Some(48.0), Bar::AtMost(48.0), Unit::Mib);
        assert_eq!((at_most.pass, at_most.target.as_str()), (Some(true), "<= 48.0 MiB"));
        let missing = Headline::new("python", "x", None, Bar::Below(1.0), Unit::Ratio).missing_because("no py-spy");
        assert_eq!((missing.pass, missing.shown.as_str(), missing.why.as_deref()), (None, "n/a", Some("no py-spy")));
        let measured =
            Headline::new("python", "x", Some(0.5), Bar::Below(1.0), Unit::Ratio).missing_because("no py-spy");
        assert_eq!(measured.why, None);
        assert_eq!(missing.full_command, "cargo xtask bench python");
    }

    #[test]
    fn table_aligns_every_row_under_its_header() {
        let rows = [
            Headline::new("cpu", "CPU time / perf record's", Some(0.5), Bar::Below(1.0), Unit::Ratio),
            Headline::not_run("threads", "failed: eu-stack is missing"),
        ];
        let text = table(&rows);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 5, "{text}");
        let column = |line: &str, cell: &str| line.find(cell).unwrap_or_else(|| panic!("{cell} in {line}"));
        assert_eq!(column(lines[0], "value"), column(lines[2], "0.50x"));
        assert_eq!(column(lines[0], "verdict"), column(lines[2], "PASS"));
        assert_eq!(column(lines[0], "in full"), column(lines[3], "cargo xtask bench threads"));
        assert_eq!(column(lines[0], "value"), column(lines[3], "n/a [1]"));
        assert_eq!(lines[4], "[1] threads: failed: eu-stack is missing");
    }

    #[test]
    fn a_reason_is_one_line_and_short() {
        let err = anyhow::anyhow!("perf failed; its stderr:\n{}", "x".repeat(500)).context("bench cpu");
        let why = reason(&err);
        assert!(why.starts_with("failed: bench cpu: perf failed"), "{why}");
        assert!(!why.contains('\n') && why.chars().count() <= MAX_REASON_CHARS + 9, "{why}");
        let long = anyhow::anyhow!("{}", "y".repeat(500));
        assert!(reason(&long).ends_with('…'));
    }
}
