//! Property tests of the parsers of files a profiled process controls: JIT perf maps and
//! the ELF files unwind tables are built from. Each gets arbitrary (and arbitrarily
//! corrupted) input and must answer with a value or an error, never a panic or an unbounded
//! result. The socket's request parser and the configuration loader have theirs next to
//! their unit tests (`api/tests/request.rs`, `config/tests.rs`). `cargo xtask test` runs
//! them all with the unit tests; the case counts bound their time.

use proptest::prelude::*;

use crate::{symbolize, unwind};

fn config(cases: u32) -> ProptestConfig {
    ProptestConfig { cases, failure_persistence: None, ..ProptestConfig::default() }
}

/// Text biased toward what the parsers split on, so that cases get past the first check.
fn text_with(alphabet: &'static str, max: usize) -> impl Strategy<Value = String> {
    proptest::collection::vec(
        prop_oneof![proptest::sample::select(alphabet.chars().collect::<Vec<_>>()), any::<char>()],
        0..max,
    )
    .prop_map(|chars| chars.into_iter().collect())
}

proptest! {
    #![proptest_config(config(2000))]

    /// Any perf map line parses to a non-empty range with a name, or to nothing.
    #[test]
    fn perf_map_lines_parse_to_ranges(text in text_with("0123456789abcdefx \n_jit", 400)) {
        for line in text.lines() {
            if let Some((start, end, name)) = symbolize::perf_map_line(line) {
                prop_assert!(start < end && !name.is_empty(), "{line:?}");
            }
        }
    }
}

/// A small real ELF file with CFI: the one most corruptions are tried on.
fn sample_elf() -> Vec<u8> {
    std::fs::read("/usr/bin/true").or_else(|_| std::fs::read("/bin/true")).expect("/usr/bin/true, a small ELF file")
}

proptest! {
    #![proptest_config(config(1000))]

    /// An ELF file corrupted anywhere (bytes overwritten, or cut short) builds a table or
    /// gets an error: the headers, section table and CFI are all read with bounds.
    #[test]
    fn corrupted_elf_files_build_or_fail(
        edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..32),
        cut in proptest::option::of(any::<prop::sample::Index>()),
    ) {
        let mut bytes = sample_elf();
        let len = bytes.len();
        for (n, (at, byte)) in edits.into_iter().enumerate() {
            // Most bytes are code; aim a third of the edits at the ELF and program headers
            // and a third at the section headers (at the end), where the parser looks.
            let i = match n % 3 {
                0 => at.index(512.min(len)),
                1 => len - 1 - at.index(4096.min(len)),
                _ => at.index(len),
            };
            bytes[i] = byte;
        }
        if let Some(cut) = cut {
            bytes.truncate(cut.index(bytes.len()));
        }
        let _ = unwind::build(&bytes);
    }

    /// Arbitrary bytes behind a valid ELF magic.
    #[test]
    fn arbitrary_elf_bytes_build_or_fail(tail in proptest::collection::vec(any::<u8>(), 0..4096)) {
        let mut bytes = b"\x7fELF\x02\x01\x01\x00".to_vec();
        bytes.extend(tail);
        let _ = unwind::build(&bytes);
    }
}
