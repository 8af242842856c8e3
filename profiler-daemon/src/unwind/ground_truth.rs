//! Checks built tables against an independent reading of the same CFI: binutils'
//! `readelf --debug-dump=frames-interp`, whose table gives per address range the CFA rule
//! and the rule of each saved register. Every readelf row must agree with `lookup` at its
//! first and last byte, and every gap after an FDE must look up as `None`. Also prints each
//! table's size and build time (the numbers in docs/unwinding.md).
//!
//! Needs `readelf` and `gcc` (both in the build environment); the C fixture is compiled at
//! test time, never committed.

use std::ops::Range;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

// The workspace's one C compile helper (its header says why it is included by path).
#[allow(dead_code)] // the file also serves xtask's benches: this test uses one function of it
#[path = "../../../tests/src/cc.rs"]
mod cc;

use super::readelf::{readelf_fdes, Columns, ReadelfFde};
use super::rule::{cfa_offset, CfaRegister, RbpRule, Rule, Unsupported};
use super::table::{build, UnwindTable};
use crate::elf::Elf;

const LIBC: &str = "/usr/lib/x86_64-linux-gnu/libc.so.6";

/// A C program with frames of every common shape: leaf, callee-saved registers, alloca (CFA
/// on rbp), a stack realigned through r10 (DRAP: CFA register r10, then a CFA expression),
/// recursion and PLT calls.
const FIXTURE_C: &str = r#"
#include <alloca.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

__attribute__((noinline)) long leaf(long x) { return x * 3 + 1; }

__attribute__((noinline)) long with_saves(long n) {
    long a = 0, b = 1;
    for (long i = 0; i < n; i++) { long t = a + b + leaf(i); a = b; b = t; }
    return a ^ b;
}

__attribute__((noinline)) long with_alloca(long n) {
    char *buf = alloca(n + 16);
    memset(buf, (int)n, n + 16);
    return buf[n] + with_saves(n);
}

__attribute__((noinline)) long realigned(long n) {
    char buf[64] __attribute__((aligned(64)));
    char *extra = alloca(n + 8);
    memset(extra, 1, n + 8);
    snprintf(buf, sizeof buf, "%ld", n);
    return strlen(buf) + extra[n] + with_alloca(n);
}

__attribute__((noinline)) long recurse(long depth) {
    if (depth == 0) return realigned(7);
    return recurse(depth - 1) + 1;
}

int main(int argc, char **argv) {
    long n = argc > 1 ? strtol(argv[1], 0, 10) : 5;
    printf("%ld\n", recurse(n));
    return 0;
}
"#;

/// What the table must say for a readelf row, applying the same encoding limits and the same
/// precedence as the builder (undefined RA, then the CFA, then the RA, then rbp).
fn expected(columns: &Columns, in_plt: bool, signal: bool) -> Rule {
    let column = |name: &str| columns.get(name).map(String::as_str);
    if column("ra") == Some("u") {
        return Rule::EndOfStack;
    }
    let cfa = column("CFA").expect("every row has a CFA");
    if cfa == "exp" {
        return match (in_plt && column("ra") == Some("c-8"), signal) {
            // readelf does not print the expression; the builder's threshold is checked by
            // kind only.
            (true, _) => Rule::Plt { rip_threshold: 0 },
            (false, true) => Rule::SignalFrame,
            (false, false) => Rule::Unsupported(Unsupported::CfaExpression),
        };
    }
    let split = cfa.find(['+', '-']).expect("register and offset");
    let register = match &cfa[..split] {
        "rsp" => CfaRegister::Rsp,
        "rbp" => CfaRegister::Rbp,
        _ => return Rule::Unsupported(Unsupported::CfaRegister),
    };
    let Some(offset_bytes) = cfa_offset(cfa[split..].parse::<i64>().expect("cfa offset")) else {
        return Rule::Unsupported(Unsupported::CfaOffset);
    };
    if column("ra") != Some("c-8") {
        return Rule::Unsupported(Unsupported::ReturnAddress);
    }
    let rbp = match column("rbp") {
        None | Some("u" | "s" | "rbp") => RbpRule::Unchanged,
        Some(saved) if saved.starts_with('c') => {
            let offset = saved[1..].parse::<i64>().expect("rbp offset");
            match RbpRule::at_cfa(offset) {
                Some(rbp) => rbp,
                None => return Rule::Unsupported(Unsupported::RbpOffset),
            }
        }
        Some(_) => return Rule::Unsupported(Unsupported::RbpRule),
    };
    Rule::Frame { register, offset_bytes, rbp }
}

/// Equal, except that PLT thresholds are not compared (readelf does not show them).
fn agrees(actual: Option<Rule>, expected: Rule) -> bool {
    match (actual, expected) {
        (Some(Rule::Plt { rip_threshold }), Rule::Plt { .. }) => (5..=11).contains(&rip_threshold),
        (actual, expected) => actual == Some(expected),
    }
}

/// Compares `table` with readelf's reading of `path`; returns the number of rows checked.
fn check_against_readelf(path: &Path, table: &UnwindTable) -> usize {
    let bytes = std::fs::read(path).expect("read the ELF file");
    let elf = Elf::parse(&bytes).expect("parse the ELF file");
    let code = elf.executable_ranges();
    let plt: Vec<Range<u64>> =
        [".plt", ".plt.sec"].iter().filter_map(|name| elf.section(name)).map(|s| s.address_range()).collect();
    let in_any = |ranges: &[Range<u64>], address| ranges.iter().any(|r: &Range<u64>| r.contains(&address));

    let fdes: Vec<ReadelfFde> =
        readelf_fdes(path).into_iter().filter(|fde| !fde.pc.is_empty() && in_any(&code, fde.pc.start)).collect();
    let mut mismatches = Vec::new();
    let mut checked = 0;
    for fde in &fdes {
        let rows = if fde.rows.is_empty() {
            vec![(fde.pc.start, fde.cie_row.clone().expect("the CIE has a row"))]
        } else {
            fde.rows.clone()
        };
        for (index, (start, columns)) in rows.iter().enumerate() {
            let end = rows.get(index + 1).map_or(fde.pc.end, |(next, _)| *next);
            if start >= &end {
                continue;
            }
            let want = expected(columns, in_any(&plt, *start), fde.signal);
            for address in [*start, start + (end - start) / 2, end - 1] {
                if !agrees(table.lookup(address), want) {
                    mismatches
                        .push(format!("{address:#x}: table {:?}, readelf {want:?} {columns:?}", table.lookup(address)));
                }
            }
            checked += 1;
        }
    }
    let mut ranges: Vec<Range<u64>> = fdes.iter().map(|fde| fde.pc.clone()).collect();
    ranges.sort_by_key(|range| range.start);
    let covered = |address| {
        let index = ranges.partition_point(|range| range.start <= address);
        index > 0 && ranges[index - 1].contains(&address)
    };
    for fde in &fdes {
        if !covered(fde.pc.end) {
            if let Some(rule) = table.lookup(fde.pc.end) {
                mismatches.push(format!("{:#x}: gap after an FDE, table {rule:?}", fde.pc.end));
            }
        }
    }
    assert!(
        mismatches.is_empty(),
        "{}: {} of {checked} readelf rows disagree, first: {:#?}",
        path.display(),
        mismatches.len(),
        &mismatches[..mismatches.len().min(10)]
    );
    checked
}

/// A scratch directory removed on drop.
struct ScratchDir(PathBuf);

impl ScratchDir {
    fn new(name: &str) -> ScratchDir {
        let dir = std::env::temp_dir().join(format!("profiler-unwind-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("create a scratch directory");
        ScratchDir(dir)
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Compiles the C fixture with `flags` into `dir`.
fn compile_fixture(dir: &Path, name: &str, flags: &[&str]) -> PathBuf {
    cc::compile_text(dir, name, FIXTURE_C, flags).unwrap_or_else(|e| panic!("{e}"))
}

fn build_file(path: &Path) -> UnwindTable {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("failed to read {}: {e}", path.display()));
    build(&bytes).unwrap_or_else(|e| panic!("failed to build the table of {}: {e}", path.display()))
}

fn count_rules(table: &UnwindTable, wanted: fn(&Rule) -> bool) -> usize {
    table.rows().iter().filter_map(Rule::decode).filter(wanted).count()
}

#[test]
fn libc_agrees_with_readelf() {
    let table = build_file(Path::new(LIBC));
    let checked = check_against_readelf(Path::new(LIBC), &table);
    assert!(checked > 10_000, "only {checked} rows checked");
    assert!(count_rules(&table, |r| matches!(r, Rule::Plt { rip_threshold: 11 })) > 0, "libc's .plt");
    assert_eq!(count_rules(&table, |r| *r == Rule::SignalFrame), 1, "__restore_rt");
    assert!(count_rules(&table, |r| *r == Rule::EndOfStack) > 0, "clone's thread start");
}

#[test]
fn gcc_omit_frame_pointer_agrees_with_readelf() {
    let dir = ScratchDir::new("eh-frame");
    let binary = compile_fixture(&dir.0, "fixture", &["-O2", "-fomit-frame-pointer"]);
    let table = build_file(&binary);
    check_against_readelf(&binary, &table);
    let unsupported = &table.stats().unsupported;
    assert!(unsupported.get(Unsupported::CfaRegister) > 0, "DRAP's r10 CFA: {unsupported:?}");
    assert!(unsupported.get(Unsupported::CfaExpression) > 0, "DRAP's CFA expression");
    assert!(count_rules(&table, |r| matches!(r, Rule::Frame { register: CfaRegister::Rbp, .. })) > 0);
    assert!(count_rules(&table, |r| matches!(r, Rule::Plt { .. })) > 0);
    assert!(count_rules(&table, |r| *r == Rule::EndOfStack) > 0, "_start");
}

#[test]
fn gcc_debug_frame_agrees_with_readelf() {
    let dir = ScratchDir::new("debug-frame");
    let flags = ["-O2", "-fomit-frame-pointer", "-g", "-fno-asynchronous-unwind-tables", "-fno-unwind-tables"];
    let binary = compile_fixture(&dir.0, "fixture", &flags);
    let table = build_file(&binary);
    // The fixture's own functions are only in .debug_frame; crt's are in .eh_frame.
    assert!(table.stats().fdes >= 8, "{:?}", table.stats());
    check_against_readelf(&binary, &table);
}

#[test]
fn rust_binary_agrees_with_readelf() {
    // This test binary is itself a large optimized Rust binary.
    let exe = std::env::current_exe().expect("the test binary's path");
    let table = build_file(&exe);
    let checked = check_against_readelf(&exe, &table);
    assert!(checked > 1_000, "only {checked} rows checked");
}

/// Not a timed test: it asserts nothing about time, it prints what `docs/unwinding.md`
/// quotes. `cargo test --release -p profiler-daemon unwind -- --nocapture` shows it.
#[test]
fn report_table_sizes_and_build_times() {
    let release_profiler = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/release/profiler");
    let rust_binary = if release_profiler.exists() {
        release_profiler
    } else {
        std::env::current_exe().expect("the test binary's path")
    };
    println!(
        "{:<44} {:>9} {:>7} {:>10} {:>8} {:>10} {:>9}  unsupported",
        "file", "file KiB", "FDEs", "rows (raw)", "rows", "table KiB", "build ms"
    );
    for path in [Path::new(LIBC), rust_binary.as_path()] {
        let bytes = std::fs::read(path).expect("read the file");
        let (table, best) = best_of(5, || build(&bytes).expect("table builds"));
        let stats = table.stats();
        let unsupported: Vec<String> =
            stats.unsupported.iter().filter(|(_, n)| *n > 0).map(|(r, n)| format!("{}={n}", r.name())).collect();
        println!(
            "{:<44} {:>9} {:>7} {:>10} {:>8} {:>10.1} {:>9.2}  {}",
            path.file_name().unwrap_or_default().to_string_lossy(),
            bytes.len() / 1024,
            stats.fdes,
            stats.rows_before_merge,
            stats.rows,
            stats.bytes as f64 / 1024.0,
            best.as_secs_f64() * 1e3,
            unsupported.join(" "),
        );
        assert_eq!(stats.bytes, stats.rows * 8);
    }
}

fn best_of<T>(runs: usize, mut f: impl FnMut() -> T) -> (T, Duration) {
    let mut best = Duration::MAX;
    let mut last = None;
    for _ in 0..runs {
        let started = Instant::now();
        last = Some(f());
        best = best.min(started.elapsed());
    }
    (last.expect("at least one run"), best)
}
