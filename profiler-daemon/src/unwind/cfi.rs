//! Evaluates the CFI programs of one section (`.eh_frame` or `.debug_frame`) with gimli and
//! classifies each row of each FDE into a [`Rule`]. This is the only module that knows DWARF;
//! it knows nothing of the row encoding, merging or gaps.

use gimli::constants::{DW_OP_breg7, DW_OP_deref};
use gimli::{
    BaseAddresses, CfaRule, CieOrFde, EndianSlice, FrameDescriptionEntry, LittleEndian, Reader, RegisterRule,
    UnwindContext, UnwindExpression, UnwindSection, UnwindTableRow, X86_64,
};
use profiler_common::unwind::{sigframe, RA_CFA_OFFSET};

use super::rule::{cfa_offset, CfaRegister, RbpRule, Rule, Unsupported};

/// The reader every section is parsed with.
pub(crate) type Slice<'a> = EndianSlice<'a, LittleEndian>;

/// The classified rows of one FDE, in address order; each row runs to the next, the last to
/// `end`.
#[derive(Clone, Debug)]
pub(crate) struct FdeRows {
    pub start: u64,
    pub end: u64,
    pub rows: Vec<(u64, Rule)>,
}

/// Where one FDE of a section is: its first address, and its entry's offset in the section,
/// where [`read_fde`] evaluates it. The FDEs are indexed first and evaluated in address order
/// after, one at a time, so a file's rows are never all held at once before they are merged
/// (libLLVM's were 56 MiB of the snapshot's 74 MiB heap peak).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct FdeAt {
    pub start: u64,
    pub offset: usize,
}

/// The FDEs of one section, in the section's order.
#[derive(Debug, Default)]
pub(crate) struct SectionIndex {
    pub fdes: Vec<FdeAt>,
    /// FDEs that could not be parsed, so their address range is unknown.
    pub unparsed_fdes: u64,
}

/// What reading one file's CFI may cost, checked before the work and memory it bounds:
/// a file is the process's to write, and a few hundred KiB of zlib can hold a `.debug_frame`
/// whose rows would fill the machine's memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Limits {
    /// CFI rows in all the file's sections ([`super::table::MAX_ROWS`]).
    pub rows: usize,
    /// CFI program bytes evaluated for one FDE: its entry plus its CIE's (gimli runs the
    /// CIE's initial instructions again for each FDE). An FDE yields at most one row per
    /// byte, so this bounds what one FDE holds in memory before the row budget sees it.
    pub fde_program_bytes: usize,
    /// CFI program bytes evaluated for the whole file, each FDE's counted as above: bounds
    /// the CPU time, which rows alone do not (most instructions make no row, and a CIE is
    /// evaluated once per FDE).
    pub program_bytes: usize,
}

impl Limits {
    /// The limits every file is built under. Measured on this machine's largest files
    /// (`readelf --debug-dump=frames`): the largest FDE entry is 33,676 bytes (nightly
    /// `librustc_driver`; 11,596 on stable, 10,892 in `libclang-cpp`, 2,880 in `libLLVM`,
    /// 192 in glibc's `libc.so.6`) and CIE entries are at most 32 bytes, so 1 MiB per FDE
    /// is 30 times what a compiler emits. The largest file's program in all is about
    /// 9.4 MiB (`librustc_driver`: 5.8 MiB of FDEs plus 106 k × 32 bytes of CIE), so 256 MiB
    /// (the most a compressed section may inflate to) is 27 times that. A release build
    /// refuses a file at either cap in about 0.3 s (a CIE of 1 MiB of `DW_CFA_nop` run for
    /// each of its FDEs: 0.34 s), while librustc_driver and libLLVM build in under 0.2 s.
    pub const FILE: Limits =
        Limits { rows: super::table::MAX_ROWS, fde_program_bytes: 1 << 20, program_bytes: 256 << 20 };
}

/// A limit of [`Limits`] that reading a file would have exceeded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Exceeded {
    pub what: &'static str,
    pub cap: u64,
}

/// What reading one file's CFI has cost so far, against its [`Limits`]. Shared by the
/// file's sections.
#[derive(Debug)]
pub(crate) struct Budget {
    limits: Limits,
    rows: usize,
    program_bytes: usize,
    fdes: usize,
}

impl Budget {
    pub fn new(limits: Limits) -> Self {
        Self { limits, rows: 0, program_bytes: 0, fdes: 0 }
    }

    /// Charges one FDE's program before it is evaluated.
    fn charge_program(&mut self, bytes: usize) -> Result<(), Exceeded> {
        if bytes > self.limits.fde_program_bytes {
            let cap = self.limits.fde_program_bytes as u64;
            return Err(Exceeded { what: "the CFI program (bytes) of one FDE", cap });
        }
        self.program_bytes = self.program_bytes.saturating_add(bytes);
        if self.program_bytes > self.limits.program_bytes {
            return Err(Exceeded {
                what: "the CFI program (bytes) of the file",
                cap: self.limits.program_bytes as u64,
            });
        }
        Ok(())
    }

    /// Charges one FDE before it is indexed: an FDE costs at least the row it would make, so
    /// the index is bounded by the row cap.
    fn charge_fde(&mut self) -> Result<(), Exceeded> {
        if self.fdes >= self.limits.rows {
            return Err(Exceeded { what: "the FDE count", cap: self.limits.rows as u64 });
        }
        self.fdes += 1;
        Ok(())
    }

    /// Charges one row before it is stored.
    fn charge_row(&mut self) -> Result<(), Exceeded> {
        if self.rows >= self.limits.rows {
            return Err(Exceeded { what: "the CFI row count", cap: self.limits.rows as u64 });
        }
        self.rows += 1;
        Ok(())
    }
}

/// Why a section could not be read.
#[derive(Debug)]
pub(crate) enum SectionError {
    /// The section itself cannot be walked.
    Parse(gimli::Error),
    /// Reading it would exceed the file's [`Limits`]; nothing more is read.
    OverBudget(Exceeded),
}

/// Why one FDE's program was not turned into rows.
enum FdeError {
    Parse,
    OverBudget(Exceeded),
}

/// Indexes every FDE of `section` (its start and offset), charging `budget` for each. Fails
/// when the section itself cannot be walked or the budget runs out.
pub(crate) fn index_section<'a, S>(
    section: &S,
    bases: &BaseAddresses,
    budget: &mut Budget,
) -> Result<SectionIndex, SectionError>
where
    S: UnwindSection<Slice<'a>>,
{
    let mut out = SectionIndex::default();
    let mut entries = section.entries(bases);
    while let Some(entry) = entries.next().map_err(SectionError::Parse)? {
        let CieOrFde::Fde(partial) = entry else { continue };
        let offset = partial.offset();
        let Ok(fde) = partial.parse(S::cie_from_offset) else {
            out.unparsed_fdes += 1;
            continue;
        };
        if fde.len() == 0 {
            continue;
        }
        budget.charge_fde().map_err(SectionError::OverBudget)?;
        out.fdes.push(FdeAt { start: fde.initial_address(), offset });
    }
    Ok(out)
}

/// Reads the FDE indexed at `at`, charging `budget` before its program is evaluated and each
/// row stored. Fails when the budget runs out, or the FDE no longer parses (the file changed
/// under its mapping). An FDE whose program fails to evaluate becomes one
/// [`Unsupported::BadCfi`] row over its range.
pub(crate) fn read_fde<'a, S>(
    section: &S,
    bases: &BaseAddresses,
    ctx: &mut UnwindContext<usize>,
    at: FdeAt,
    budget: &mut Budget,
) -> Result<FdeRows, SectionError>
where
    S: UnwindSection<Slice<'a>>,
{
    let fde =
        section.fde_from_offset(bases, S::Offset::from(at.offset), S::cie_from_offset).map_err(SectionError::Parse)?;
    budget.charge_program(fde.entry_len() + fde.cie().entry_len()).map_err(SectionError::OverBudget)?;
    let rows = match evaluate(section, bases, ctx, &fde, budget) {
        Ok(rows) => rows,
        Err(FdeError::OverBudget(exceeded)) => return Err(SectionError::OverBudget(exceeded)),
        Err(FdeError::Parse) => {
            budget.charge_row().map_err(SectionError::OverBudget)?;
            vec![(fde.initial_address(), Rule::Unsupported(Unsupported::BadCfi))]
        }
    };
    Ok(FdeRows { start: fde.initial_address(), end: fde.end_address(), rows })
}

/// Runs one FDE's CFI program and classifies each non-empty row, charging each to `budget`
/// before it is stored.
fn evaluate<'a, S>(
    section: &S,
    bases: &BaseAddresses,
    ctx: &mut UnwindContext<usize>,
    fde: &FrameDescriptionEntry<Slice<'a>>,
    budget: &mut Budget,
) -> Result<Vec<(u64, Rule)>, FdeError>
where
    S: UnwindSection<Slice<'a>>,
{
    let mut table = fde.rows(section, bases, ctx).map_err(|_| FdeError::Parse)?;
    let mut rows = Vec::new();
    while let Some(row) = table.next_row().map_err(|_| FdeError::Parse)? {
        if row.start_address() < row.end_address() {
            budget.charge_row().map_err(FdeError::OverBudget)?;
            rows.push((row.start_address(), classify(row, section)));
        }
    }
    Ok(rows)
}

/// The rule for one row of a CFI table.
fn classify<'a, S: UnwindSection<Slice<'a>>>(row: &UnwindTableRow<usize>, section: &S) -> Rule {
    if row.register(X86_64::RA) == Some(RegisterRule::Undefined) {
        return Rule::EndOfStack;
    }
    match row.cfa() {
        CfaRule::RegisterAndOffset { register, offset } => classify_frame(row, *register, *offset),
        CfaRule::Expression(cfa) => {
            let cfa = expression_bytes(cfa, section);
            if let Some(rip_threshold) = plt_threshold(cfa) {
                if row.register(X86_64::RA) == Some(RegisterRule::Offset(RA_CFA_OFFSET)) {
                    return Rule::Plt { rip_threshold };
                }
            }
            if is_signal_frame(row, cfa, section) {
                return Rule::SignalFrame;
            }
            Rule::Unsupported(Unsupported::CfaExpression)
        }
    }
}

/// A frame whose CFA is a register plus an offset.
fn classify_frame(row: &UnwindTableRow<usize>, register: gimli::Register, offset: i64) -> Rule {
    let register = match register {
        X86_64::RSP => CfaRegister::Rsp,
        X86_64::RBP => CfaRegister::Rbp,
        _ => return Rule::Unsupported(Unsupported::CfaRegister),
    };
    let Some(offset_bytes) = cfa_offset(offset) else {
        return Rule::Unsupported(Unsupported::CfaOffset);
    };
    if row.register(X86_64::RA) != Some(RegisterRule::Offset(RA_CFA_OFFSET)) {
        return Rule::Unsupported(Unsupported::ReturnAddress);
    }
    let rbp = match row.register(X86_64::RBP) {
        None | Some(RegisterRule::SameValue | RegisterRule::Undefined) => RbpRule::Unchanged,
        Some(RegisterRule::Register(X86_64::RBP)) => RbpRule::Unchanged,
        Some(RegisterRule::Offset(offset)) => match RbpRule::at_cfa(offset) {
            Some(rbp) => rbp,
            None => return Rule::Unsupported(Unsupported::RbpOffset),
        },
        Some(_) => return Rule::Unsupported(Unsupported::RbpRule),
    };
    Rule::Frame { register, offset_bytes, rbp }
}

/// The threshold `T` if `cfa` is the expression binutils emits for lazy PLT entries,
/// `rsp + 8 + (((rip & 15) >= T) << 3)`: T = 11 for the classic PLT, 10 with IBT, 5 with MPX.
fn plt_threshold(cfa: &[u8]) -> Option<u8> {
    // DW_OP_breg7 8; DW_OP_breg16 0; DW_OP_lit15; DW_OP_and; DW_OP_lit<T>; DW_OP_ge;
    // DW_OP_lit3; DW_OP_shl; DW_OP_plus
    const LIT0: u8 = 0x30;
    match *cfa {
        [0x77, 0x08, 0x80, 0x00, 0x3f, 0x1a, lit, 0x2a, 0x33, 0x24, 0x22] if (LIT0..LIT0 + 16).contains(&lit) => {
            Some(lit - LIT0)
        }
        _ => None,
    }
}

/// Whether the row is glibc's `__restore_rt`: CFA = *(rsp + 160), rip and rbp saved in the
/// kernel's signal frame at the fixed `sigcontext` offsets.
fn is_signal_frame<'a, S: UnwindSection<Slice<'a>>>(row: &UnwindTableRow<usize>, cfa: &[u8], section: &S) -> bool {
    let saved_at = |register| match row.register(register) {
        Some(RegisterRule::Expression(expr)) => rsp_relative(expression_bytes(&expr, section)),
        _ => None,
    };
    rsp_relative(cfa) == Some((sigframe::RSP_OFFSET as i64, true))
        && saved_at(X86_64::RA) == Some((sigframe::RIP_OFFSET as i64, false))
        && saved_at(X86_64::RBP) == Some((sigframe::RBP_OFFSET as i64, false))
}

/// Decodes `DW_OP_breg7 <offset>` optionally followed by `DW_OP_deref`.
fn rsp_relative(expression: &[u8]) -> Option<(i64, bool)> {
    let mut reader = Slice::new(expression, LittleEndian);
    if reader.read_u8().ok()? != DW_OP_breg7.0 {
        return None;
    }
    let offset = reader.read_sleb128().ok()?;
    let deref = match reader.read_u8() {
        Err(_) => false,
        Ok(op) if op == DW_OP_deref.0 && reader.is_empty() => true,
        Ok(_) => return None,
    };
    Some((offset, deref))
}

fn expression_bytes<'a, S: UnwindSection<Slice<'a>>>(expression: &UnwindExpression<usize>, section: &S) -> &'a [u8] {
    expression.get(section).map_or(&[], |expression| expression.0.slice())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plt_expressions_of_each_plt_flavour() {
        let classic = [0x77, 0x08, 0x80, 0x00, 0x3f, 0x1a, 0x3b, 0x2a, 0x33, 0x24, 0x22];
        let ibt = [0x77, 0x08, 0x80, 0x00, 0x3f, 0x1a, 0x3a, 0x2a, 0x33, 0x24, 0x22];
        assert_eq!(plt_threshold(&classic), Some(11));
        assert_eq!(plt_threshold(&ibt), Some(10));
        assert_eq!(plt_threshold(&classic[..10]), None);
    }

    #[test]
    fn rsp_relative_expressions() {
        // DW_OP_breg7 160 (sleb128 a0 01); DW_OP_deref
        assert_eq!(rsp_relative(&[0x77, 0xa0, 0x01, 0x06]), Some((160, true)));
        // DW_OP_breg7 120 (sleb128 f8 00: bit 6 set, so two bytes)
        assert_eq!(rsp_relative(&[0x77, 0xf8, 0x00]), Some((120, false)));
        assert_eq!(rsp_relative(&[0x76, 0x08]), None);
        assert_eq!(rsp_relative(&[0x77, 0x08, 0x06, 0x06]), None);
    }
}
