//! Builds one file's [`UnwindTable`]: reads `.eh_frame` and `.debug_frame`, lays the FDEs'
//! rules out by address with gap rows between functions, merges identical neighbours and
//! encodes the rows for the kernel. Also the userspace lookup the tests (and any userspace
//! walker) use, which binary-searches exactly as the kernel does.

use std::ops::Range;
use std::time::{Duration, Instant};

use gimli::{BaseAddresses, DebugFrame, EhFrame, LittleEndian, UnwindContext};
use profiler_common::{
    unwind::{MAX_TABLE_SHARDS, SHARD_ROWS},
    UnwindRow,
};

use super::cfi::{self, Budget, FdeAt, FdeRows, Limits, SectionError, SectionIndex};
use super::go_cgo;
use super::rule::{gap_row, ReasonCounts, Rule};
use crate::elf::{Elf, ElfError, Section};

mod overlay;

/// Why no table could be built for a file.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    /// The file's ELF headers or sections (its own cap on inflating included).
    #[error(transparent)]
    Elf(#[from] ElfError),
    #[error("no .eh_frame or .debug_frame section")]
    NoCfi,
    #[error("failed to parse {section}")]
    Cfi { section: &'static str, source: gimli::Error },
    #[error("CFI spans {span:#x} bytes, more than a row's 32-bit offset can address")]
    SpanTooLarge { span: u64 },
    /// More rows, once merged, than the kernel's walker can search in one table: refused
    /// while building, before more memory is spent on rows that would not be loaded.
    #[error("the table has over {cap} rows, more than one table may hold")]
    TooLarge { cap: u64 },
    /// A cap that bounds what one (possibly hostile) file can cost to build.
    #[error("{what} is {size}, over the cap of {cap}")]
    OverCap { what: &'static str, size: u64, cap: u64 },
    /// A cap that bounds what reading one (possibly hostile) file's CFI can cost, reached
    /// while reading it: the rest is not read, nor is the file built again.
    #[error("{what} would pass the cap of {cap}: refused, as a file built to exhaust the profiler's memory or time")]
    OverBudget { what: &'static str, cap: u64 },
}

impl BuildError {
    /// Whether the file was refused for what building it would cost (not for what it is):
    /// such a refusal is remembered across restarts, so a hostile file is paid for once.
    pub fn is_over_budget(&self) -> bool {
        matches!(
            self,
            BuildError::OverCap { .. } | BuildError::OverBudget { .. } | BuildError::Elf(ElfError::OverCap { .. })
        )
    }
}

/// The most CFI rows one file may produce before merging: libLLVM, among the largest
/// libraries, has about 1.3 M; each costs ~24 bytes while the table is built.
pub const MAX_ROWS: usize = 8 << 20;

/// The most rows (merged) one table may have: what the kernel's table can address.
pub const MAX_TABLE_ROWS: usize = MAX_TABLE_SHARDS * SHARD_ROWS as usize;

/// What building one table found and cost, for `/status` and the bench.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BuildStats {
    /// FDEs whose rules are in the table.
    pub fdes: u64,
    /// FDEs left out: overlapping an earlier one, or starting outside every executable
    /// section (a linker's tombstone for a discarded function), or unparseable.
    pub skipped_fdes: u64,
    /// Rows before identical neighbours were merged, gap rows included.
    pub rows_before_merge: u64,
    /// Rows in the table, gap rows included.
    pub rows: u64,
    /// CFI rows (before merging) that became an `Unsupported` row, per reason.
    pub unsupported: ReasonCounts,
    /// Size of the rows: what a BPF array holding them needs, before map overhead.
    pub bytes: u64,
    /// Wall time of [`build`].
    pub build_duration: Duration,
}

/// One file's unwind rules, sorted by address.
#[derive(Clone, Debug)]
pub struct UnwindTable {
    base_address: u64,
    rows: Vec<UnwindRow>,
    stats: BuildStats,
}

impl UnwindTable {
    /// The file-relative virtual address that row offsets count from.
    pub fn base_address(&self) -> u64 {
        self.base_address
    }

    /// The rows as the kernel will read them, sorted by `pc_offset`, ending with a gap row.
    pub fn rows(&self) -> &[UnwindRow] {
        &self.rows
    }

    /// What the build found and cost.
    pub fn stats(&self) -> &BuildStats {
        &self.stats
    }

    /// The rule at `address` (a file-relative virtual address), or `None` if no CFI covers
    /// it. The kernel's binary search does the same: the last row starting at or before
    /// `offset`.
    pub fn lookup(&self, address: u64) -> Option<Rule> {
        let offset = u32::try_from(address.checked_sub(self.base_address)?).ok()?;
        let index = self.rows.partition_point(|row| row.pc_offset <= offset);
        Rule::decode(self.rows.get(index.checked_sub(1)?)?)
    }
}

/// Builds the unwind table of the ELF file `elf_bytes`.
pub fn build(elf_bytes: &[u8]) -> Result<UnwindTable, BuildError> {
    build_with(elf_bytes, Limits::FILE)
}

/// [`build`] under `limits` (the tests' small ones). Its memory, besides the section bytes
/// read from the file: an index entry per FDE, one FDE's rows, and the merged rows (at most
/// [`MAX_TABLE_ROWS`] of 8 bytes).
pub(crate) fn build_with(elf_bytes: &[u8], limits: Limits) -> Result<UnwindTable, BuildError> {
    let started = Instant::now();
    let elf = Elf::parse(elf_bytes)?;
    let mut budget = Budget::new(limits);
    let eh_data = elf.section(".eh_frame").map(|header| elf.data(&header).map(|data| (header, data))).transpose()?;
    let debug_data = elf.section(".debug_frame").map(|header| elf.data(&header)).transpose()?;
    // .eh_frame first: at equal starts the earlier section wins (see `assemble`).
    let mut sections = Vec::new();
    if let Some((header, data)) = &eh_data {
        sections.push(Cfi::eh_frame(&elf, header, data));
    }
    if let Some(data) = &debug_data {
        sections.push(Cfi::debug_frame(data));
    }
    if sections.is_empty() {
        return Err(BuildError::NoCfi);
    }
    let indexes = sections.iter().map(|cfi| cfi.index(&mut budget)).collect::<Result<Vec<_>, _>>()?;
    let mut ctx = UnwindContext::new();
    let read = |order: usize, at| sections[order].read(at, &mut ctx, &mut budget);
    let mut table = assemble(indexes, &elf.executable_ranges(), read)?;
    for (range, rule) in go_cgo::cgo_call_rows(&elf, elf_bytes) {
        table.overlay(range, rule)?;
    }
    table.stats.build_duration = started.elapsed();
    Ok(table)
}

/// One section of CFI and the bases its pointers are read with.
enum Cfi<'d> {
    Eh(EhFrame<cfi::Slice<'d>>, BaseAddresses),
    Debug(DebugFrame<cfi::Slice<'d>>),
}

impl<'d> Cfi<'d> {
    fn eh_frame(elf: &Elf<'_>, header: &Section, data: &'d [u8]) -> Self {
        let mut section = EhFrame::new(data, LittleEndian);
        section.set_address_size(8);
        // .eh_frame pointers are usually pc-relative; text- and data-relative ones need these.
        let mut bases = BaseAddresses::default().set_eh_frame(header.addr);
        if let Some(text) = elf.section(".text") {
            bases = bases.set_text(text.addr);
        }
        if let Some(got) = elf.section(".got") {
            bases = bases.set_got(got.addr);
        }
        Cfi::Eh(section, bases)
    }

    fn debug_frame(data: &'d [u8]) -> Self {
        let mut section = DebugFrame::new(data, LittleEndian);
        section.set_address_size(8);
        Cfi::Debug(section)
    }

    fn name(&self) -> &'static str {
        match self {
            Cfi::Eh(..) => ".eh_frame",
            Cfi::Debug(_) => ".debug_frame",
        }
    }

    fn index(&self, budget: &mut Budget) -> Result<SectionIndex, BuildError> {
        match self {
            Cfi::Eh(section, bases) => cfi::index_section(section, bases, budget),
            Cfi::Debug(section) => cfi::index_section(section, &BaseAddresses::default(), budget),
        }
        .map_err(|err| section_error(self.name(), err))
    }

    fn read(&self, at: FdeAt, ctx: &mut UnwindContext<usize>, budget: &mut Budget) -> Result<FdeRows, BuildError> {
        match self {
            Cfi::Eh(section, bases) => cfi::read_fde(section, bases, ctx, at, budget),
            Cfi::Debug(section) => cfi::read_fde(section, &BaseAddresses::default(), ctx, at, budget),
        }
        .map_err(|err| section_error(self.name(), err))
    }
}

fn section_error(section: &'static str, err: SectionError) -> BuildError {
    match err {
        SectionError::Parse(source) => BuildError::Cfi { section, source },
        SectionError::OverBudget(exceeded) => BuildError::OverBudget { what: exceeded.what, cap: exceeded.cap },
    }
}

/// Lays the FDEs of all sections out by address, reading each with `read(section, fde)` in
/// that order, and encodes their rows as they come. An FDE that starts inside an earlier one
/// is dropped unread; the earlier one wins (at equal starts, the earlier section).
pub(crate) fn assemble(
    indexes: Vec<SectionIndex>,
    executable: &[Range<u64>],
    mut read: impl FnMut(usize, FdeAt) -> Result<FdeRows, BuildError>,
) -> Result<UnwindTable, BuildError> {
    let mut rows = Encoder::default();
    let mut fdes: Vec<(FdeAt, usize)> = Vec::with_capacity(indexes.iter().map(|index| index.fdes.len()).sum());
    for (order, index) in indexes.into_iter().enumerate() {
        rows.stats.skipped_fdes += index.unparsed_fdes;
        fdes.extend(index.fdes.into_iter().map(|at| (at, order)));
    }
    fdes.sort_by_key(|(at, order)| (at.start, *order));

    let in_code = |address| executable.is_empty() || executable.iter().any(|r| r.contains(&address));
    let mut covered_to = 0;
    for (at, order) in fdes {
        if !in_code(at.start) || (rows.started() && at.start < covered_to) {
            rows.stats.skipped_fdes += 1;
            continue;
        }
        let fde = read(order, at)?;
        if rows.started() && fde.start > covered_to {
            rows.push(covered_to, None)?;
        }
        for (address, rule) in fde.rows {
            rows.push(address, Some(rule))?;
        }
        covered_to = fde.end;
        rows.stats.fdes += 1;
    }
    if rows.started() {
        rows.push(covered_to, None)?;
    }
    Ok(rows.finish())
}

/// The table's rows as they are laid out: each merged with its identical neighbour (the
/// first of a run starts the run's range) and encoded as it comes, so no row is held twice.
#[derive(Default)]
struct Encoder {
    base_address: Option<u64>,
    /// The rule of the last row pushed (`None` for a gap), once one was.
    last: Option<Option<Rule>>,
    rows: Vec<UnwindRow>,
    stats: BuildStats,
}

impl Encoder {
    fn started(&self) -> bool {
        self.last.is_some()
    }

    /// Adds the row at `address` (`None`: a gap between functions).
    fn push(&mut self, address: u64, rule: Option<Rule>) -> Result<(), BuildError> {
        self.stats.rows_before_merge += 1;
        if self.stats.rows_before_merge > MAX_ROWS as u64 {
            let size = self.stats.rows_before_merge;
            return Err(BuildError::OverCap { what: "the CFI row count", size, cap: MAX_ROWS as u64 });
        }
        if let Some(Rule::Unsupported(reason)) = rule {
            self.stats.unsupported.add(reason);
        }
        if self.last == Some(rule) {
            return Ok(());
        }
        let base = *self.base_address.get_or_insert(address);
        let span = address.wrapping_sub(base);
        let offset = u32::try_from(span).map_err(|_| BuildError::SpanTooLarge { span })?;
        if self.rows.len() >= MAX_TABLE_ROWS {
            return Err(BuildError::TooLarge { cap: MAX_TABLE_ROWS as u64 });
        }
        self.rows.push(rule.map_or_else(|| gap_row(offset), |rule| rule.encode(offset)));
        self.last = Some(rule);
        Ok(())
    }

    fn finish(mut self) -> UnwindTable {
        self.stats.rows = self.rows.len() as u64;
        self.stats.bytes = (self.rows.len() * std::mem::size_of::<UnwindRow>()) as u64;
        UnwindTable { base_address: self.base_address.unwrap_or(0), rows: self.rows, stats: self.stats }
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::unwind::rule::{CfaRegister, RbpRule, Unsupported, MAX_CFA_OFFSET};

    pub(super) fn rsp(offset_bytes: u32) -> Rule {
        Rule::Frame { register: CfaRegister::Rsp, offset_bytes, rbp: RbpRule::Unchanged }
    }

    pub(super) fn fde(start: u64, end: u64, rows: &[(u64, Rule)]) -> FdeRows {
        FdeRows { start, end, rows: rows.to_vec() }
    }

    pub(super) fn table(fdes: Vec<FdeRows>) -> UnwindTable {
        let index = fdes.iter().enumerate().map(|(offset, fde)| FdeAt { start: fde.start, offset }).collect();
        let section = SectionIndex { fdes: index, unparsed_fdes: 0 };
        let read = |_, at: FdeAt| Ok(fdes[at.offset].clone());
        assemble(vec![section], &[0x1000..0x5000, 0x5000..0x9000], read).expect("table builds")
    }

    #[test]
    fn lookup_finds_rows_and_gaps() {
        let t = table(vec![
            fde(0x1000, 0x1010, &[(0x1000, rsp(8)), (0x1001, rsp(16))]),
            fde(0x1020, 0x1030, &[(0x1020, Rule::EndOfStack)]),
        ]);
        assert_eq!(t.base_address(), 0x1000);
        assert_eq!(t.lookup(0xfff), None);
        assert_eq!(t.lookup(0x1000), Some(rsp(8)));
        assert_eq!(t.lookup(0x1001), Some(rsp(16)));
        assert_eq!(t.lookup(0x100f), Some(rsp(16)));
        assert_eq!(t.lookup(0x1010), None, "gap between FDEs");
        assert_eq!(t.lookup(0x1020), Some(Rule::EndOfStack));
        assert_eq!(t.lookup(0x1030), None, "past the last FDE");
        assert_eq!(t.lookup(u64::MAX), None);
    }

    #[test]
    fn merges_identical_neighbours_across_fdes() {
        let t = table(vec![
            fde(0x1000, 0x1010, &[(0x1000, rsp(8)), (0x1004, rsp(8))]),
            fde(0x1010, 0x1020, &[(0x1010, rsp(8)), (0x1011, rsp(16))]),
        ]);
        assert_eq!(t.stats().rows_before_merge, 5);
        assert_eq!(t.stats().rows, 3, "rsp+8 from 0x1000, rsp+16 from 0x1011, gap at 0x1020");
        assert_eq!(t.stats().bytes, 24);
        assert_eq!(t.lookup(0x1010), Some(rsp(8)));
    }

    #[test]
    fn drops_overlapping_and_tombstoned_fdes() {
        let t = table(vec![
            fde(0, 0x10, &[(0, rsp(24))]),
            fde(0x1000, 0x1010, &[(0x1000, rsp(8))]),
            fde(0x1008, 0x1018, &[(0x1008, rsp(16))]),
        ]);
        assert_eq!(t.stats().fdes, 1);
        assert_eq!(t.stats().skipped_fdes, 2);
        assert_eq!(t.lookup(0x100c), Some(rsp(8)));
        assert_eq!(t.lookup(0x1010), None);
    }

    #[test]
    fn counts_unsupported_rows_per_reason() {
        let bad = Rule::Unsupported(Unsupported::CfaRegister);
        let t = table(vec![fde(0x1000, 0x1010, &[(0x1000, rsp(8)), (0x1002, bad), (0x1004, bad)])]);
        assert_eq!(t.stats().unsupported.get(Unsupported::CfaRegister), 2);
        assert_eq!(t.stats().unsupported.total(), 2);
        assert_eq!(t.lookup(0x1005), Some(bad));
    }

    #[test]
    fn every_rule_round_trips_through_its_row() {
        let rules = [
            rsp(8),
            Rule::Frame { register: CfaRegister::Rbp, offset_bytes: 16, rbp: RbpRule::AtCfa(-16) },
            Rule::Frame { register: CfaRegister::Rsp, offset_bytes: MAX_CFA_OFFSET, rbp: RbpRule::AtCfa(-1024) },
            Rule::Plt { rip_threshold: 11 },
            Rule::SignalFrame,
            Rule::EndOfStack,
        ];
        let reasons = Unsupported::ALL.map(Rule::Unsupported);
        for rule in rules.into_iter().chain(reasons) {
            assert_eq!(Rule::decode(&rule.encode(7)), Some(rule));
        }
        assert_eq!(Rule::decode(&gap_row(7)), None);
    }

    #[test]
    fn rejects_non_elf_and_foreign_elf() {
        assert!(matches!(build(b"not an elf"), Err(BuildError::Elf(ElfError::NotElf))));
        let mut header = [0u8; 64];
        header[..4].copy_from_slice(b"\x7fELF");
        header[4] = 1; // ELFCLASS32
        header[5] = 1;
        assert!(matches!(build(&header), Err(BuildError::Elf(ElfError::UnsupportedElf { class: 1, .. }))));
    }

    /// A `.debug_frame` (32-bit DWARF, version 1) of one CIE (CFA = rsp + 8, return address
    /// at CFA − 8) and one FDE from 0x1000 whose program is `advances` one-byte
    /// `DW_CFA_advance_loc 1`: `advances + 1` rows of one byte each. Also the length of
    /// each entry, as the budget counts them.
    fn debug_frame(advances: usize) -> (Vec<u8>, usize) {
        debug_frame_of(1, advances)
    }

    /// [`debug_frame`] with `fdes` such FDEs, each starting where the one before ends.
    fn debug_frame_of(fdes: usize, advances: usize) -> (Vec<u8>, usize) {
        let mut cie = u32::MAX.to_le_bytes().to_vec(); // the CIE id
        cie.extend([1, 0, 1, 0x78, 16]); // version, no augmentation, code ×1, data ×−8, RA = r16
        cie.extend([0x0c, 7, 8, 0x90, 1]); // DW_CFA_def_cfa rsp 8; DW_CFA_offset r16 cfa−8
        let mut entries = vec![cie];
        for i in 0..fdes as u64 {
            let mut fde = 0u32.to_le_bytes().to_vec(); // its CIE, at offset 0
            fde.extend((0x1000 + i * (advances as u64 + 1)).to_le_bytes());
            fde.extend((advances as u64 + 1).to_le_bytes());
            fde.resize(fde.len() + advances, 0x41);
            entries.push(fde);
        }
        let program = entries[0].len() + entries[1].len();
        let mut section = Vec::new();
        for entry in entries {
            section.extend((entry.len() as u32).to_le_bytes());
            section.extend(entry);
        }
        (section, program)
    }

    fn elf_with_debug_frame(advances: usize) -> (Vec<u8>, usize) {
        let (section, program) = debug_frame(advances);
        (crate::elf::tests::elf_with_section(".debug_frame", 0, &section), program)
    }

    fn elf_with_debug_frame_of(fdes: usize, advances: usize) -> (Vec<u8>, usize) {
        let (section, program) = debug_frame_of(fdes, advances);
        (crate::elf::tests::elf_with_section(".debug_frame", 0, &section), program)
    }

    fn status_kib(field: &str) -> u64 {
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        let line = status.lines().find(|l| l.starts_with(field)).unwrap();
        line.split_whitespace().nth(1).unwrap().parse().unwrap()
    }

    /// N2 of security review 3: one FDE of 10 M `DW_CFA_advance_loc` bytes (a 10 MB
    /// section; zlib makes it 10 KB) is refused, and refusing it costs little memory. Run in
    /// a process of its own ([`one_huge_fde_in_its_own_process`]), whose peak RSS no other
    /// test moves.
    #[test]
    fn one_huge_fde_is_refused_before_its_rows_are_built() {
        in_own_process("one_huge_fde_in_its_own_process", "PROFILER_TEST_HUGE_FDE");
    }

    /// Runs the ignored test `name` of this module alone in a new process of this test
    /// binary, with `env` set (the child returns at once without it), and fails with its
    /// output unless it ran and passed.
    fn in_own_process(name: &str, env: &str) {
        let exe = std::env::current_exe().unwrap();
        let child = format!("unwind::table::tests::{name}");
        let out = std::process::Command::new(exe)
            .args(["--exact", &child, "--ignored", "--nocapture", "--test-threads=1"])
            .env(env, "1")
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{text}");
        assert!(text.contains("1 passed"), "the child ran no test: {text}");
    }

    #[test]
    #[ignore = "run by one_huge_fde_is_refused_before_its_rows_are_built in a process of its own"]
    fn one_huge_fde_in_its_own_process() {
        if std::env::var_os("PROFILER_TEST_HUGE_FDE").is_none() {
            return;
        }
        const MIB: u64 = 1024;
        let (elf, _) = elf_with_debug_frame(10_000_000);
        let before = status_kib("VmHWM:");
        let started = Instant::now();
        let built = build(&elf);
        let grown = status_kib("VmHWM:").saturating_sub(before);
        eprintln!("peak RSS grew by {grown} KiB in {:?}", started.elapsed());
        assert!(matches!(built, Err(BuildError::OverBudget { .. })), "{built:?}");
        assert!(grown < 64 * MIB, "peak RSS grew by {grown} KiB building a refused table");
    }

    /// Building a table holds one FDE's rows at a time, never the file's: 8 FDEs of 500,001
    /// rows each, all merged into one (24 bytes a row before merging: 96 MiB if all were held
    /// at once, as they were when a snapshot peaked at 105 MiB building libLLVM's table). Run
    /// in a process of its own, whose peak RSS no other test moves.
    #[test]
    fn building_holds_one_fde_of_rows_at_a_time() {
        in_own_process("many_fdes_in_their_own_process", "PROFILER_TEST_MANY_FDES");
    }

    #[test]
    #[ignore = "run by building_holds_one_fde_of_rows_at_a_time in a process of its own"]
    fn many_fdes_in_their_own_process() {
        if std::env::var_os("PROFILER_TEST_MANY_FDES").is_none() {
            return;
        }
        let (fdes, advances) = (8, 500_000);
        let (elf, _) = elf_with_debug_frame_of(fdes, advances);
        let before = status_kib("VmHWM:");
        let table = build(&elf).expect("builds");
        let grown = status_kib("VmHWM:").saturating_sub(before);
        eprintln!("peak RSS grew by {grown} KiB for {} rows", table.stats().rows_before_merge);
        assert_eq!(table.stats().rows_before_merge, (fdes * (advances + 1) + 1) as u64, "every row and the end gap");
        assert_eq!(table.stats().rows, 2, "one rule from 0x1000, and the gap after the last FDE");
        let row_bytes = (std::mem::size_of::<(u64, Rule)>() * fdes * advances) as u64 / 1024;
        assert!(
            grown < row_bytes / 3,
            "peak RSS grew by {grown} KiB: the rows of every FDE ({row_bytes} KiB) were held"
        );
    }

    #[test]
    fn a_file_just_under_the_row_budget_builds_and_one_row_more_is_refused() {
        let (elf, _) = elf_with_debug_frame(999);
        let limits = |rows| Limits { rows, ..Limits::FILE };
        let table = build_with(&elf, limits(1000)).expect("1000 rows fit a budget of 1000");
        assert_eq!(table.stats().rows_before_merge, 1001, "1000 CFI rows and the gap after them");
        assert_eq!(table.lookup(0x1000 + 999), Some(rsp(8)));
        match build_with(&elf, limits(999)) {
            Err(err @ BuildError::OverBudget { cap: 999, .. }) => {
                assert!(err.to_string().contains("row count"), "{err}");
                assert!(err.is_over_budget());
            }
            other => panic!("1000 rows built under a budget of 999: {other:?}"),
        }
        // The same file under the limits every file is built under.
        assert_eq!(build(&elf).expect("builds").stats().rows_before_merge, 1001);
    }

    #[test]
    fn the_program_bytes_of_one_fde_and_of_the_file_are_bounded() {
        let (elf, program) = elf_with_debug_frame(999);
        let fde = |fde_program_bytes| Limits { fde_program_bytes, ..Limits::FILE };
        let file = |program_bytes| Limits { program_bytes, ..Limits::FILE };
        assert!(build_with(&elf, fde(program)).is_ok());
        assert!(build_with(&elf, file(program)).is_ok());
        let refused = |limits, what: &str| match build_with(&elf, limits) {
            Err(err @ BuildError::OverBudget { .. }) => assert!(err.to_string().contains(what), "{err}"),
            other => panic!("a program of {program} bytes built under {limits:?}: {other:?}"),
        };
        refused(fde(program - 1), "of one FDE");
        refused(file(program - 1), "of the file");
    }
}
