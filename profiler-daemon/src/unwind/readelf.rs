//! A reader for binutils' `readelf --debug-dump=frames-interp`: per FDE, its address range,
//! whether its CIE marks a signal trampoline, and the interpreted table (per address, the CFA
//! rule and each saved register's rule as readelf prints them). The ground truth the tests
//! compare built tables with; it shares no code with the builder.

use std::collections::HashMap;
use std::ops::Range;
use std::path::Path;
use std::process::Command;

/// One row of readelf's interpreted table: column name → rule text (`rsp+16`, `c-8`, `u`).
pub(super) type Columns = HashMap<String, String>;

/// One FDE as readelf interprets it.
#[derive(Debug)]
pub(super) struct ReadelfFde {
    pub pc: Range<u64>,
    /// The CIE's augmentation has `S`: a signal trampoline.
    pub signal: bool,
    /// Rows in address order; empty when the FDE has no instructions (the CIE's row holds).
    pub rows: Vec<(u64, Columns)>,
    /// The CIE's initial row, for FDEs without rows.
    pub cie_row: Option<Columns>,
}

/// Parses `readelf --debug-dump=frames-interp` for `path`, both CFI sections.
pub(super) fn readelf_fdes(path: &Path) -> Vec<ReadelfFde> {
    let output = Command::new("readelf")
        .arg("--debug-dump=frames-interp")
        .arg(path)
        .output()
        .expect("failed to run readelf (binutils is part of the build environment)");
    // readelf exits 1 on libc.so.6 (it cannot follow the .gnu_debuglink) but prints the
    // tables anyway, so check the output rather than the status.
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        stdout.contains("Contents of the .eh_frame section") || stdout.contains("Contents of the .debug_frame section"),
        "readelf printed no CFI for {} ({}): {}",
        path.display(),
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    parse_readelf(&stdout)
}

fn parse_readelf(text: &str) -> Vec<ReadelfFde> {
    let mut cies: HashMap<(usize, String), (bool, Option<Columns>)> = HashMap::new();
    let mut fdes = Vec::new();
    let mut section = 0;
    let mut columns: Vec<String> = Vec::new();
    // Where rows go: the CIE being read, or the last FDE.
    let mut current_cie: Option<(usize, String)> = None;
    for line in text.lines() {
        let tokens = tokens(line);
        match tokens.as_slice() {
            ["Contents", "of", ..] => section += 1,
            [offset, _, _, "CIE", augmentation, ..] => {
                let key = (section, offset.to_string());
                cies.insert(key.clone(), (augmentation.contains('S'), None));
                current_cie = Some(key);
            }
            [_, _, _, "FDE", cie, pc, ..] => {
                let cie_key = (section, cie.trim_start_matches("cie=").to_string());
                let (signal, cie_row) = cies.get(&cie_key).cloned().unwrap_or((false, None));
                let (start, end) = pc.trim_start_matches("pc=").split_once("..").expect("pc range");
                let pc = hex(start)..hex(end);
                fdes.push(ReadelfFde { pc, signal, rows: Vec::new(), cie_row });
                current_cie = None;
            }
            ["LOC", rest @ ..] => columns = rest.iter().map(|c| c.to_string()).collect(),
            [loc, values @ ..] if loc.len() == 16 && loc.bytes().all(|b| b.is_ascii_hexdigit()) => {
                assert_eq!(values.len(), columns.len(), "readelf row {line:?} under {columns:?}");
                let row: Columns = columns.iter().cloned().zip(values.iter().map(|v| v.to_string())).collect();
                match &current_cie {
                    Some(key) => cies.get_mut(key).expect("cie seen").1 = Some(row),
                    None => fdes.last_mut().expect("row after an FDE").rows.push((hex(loc), row)),
                }
            }
            _ => {}
        }
    }
    fdes
}

/// Splits a readelf line into words, joining a register rule printed as `r5 (rdi)` into `rdi`.
fn tokens(line: &str) -> Vec<&str> {
    let mut tokens: Vec<&str> = Vec::new();
    for word in line.split_whitespace() {
        match word.strip_prefix('(').and_then(|w| w.strip_suffix(')')) {
            Some(name) if !tokens.is_empty() => *tokens.last_mut().expect("not empty") = name,
            _ => tokens.push(word),
        }
    }
    tokens
}

fn hex(text: &str) -> u64 {
    u64::from_str_radix(text, 16).unwrap_or_else(|_| panic!("not hex: {text}"))
}
