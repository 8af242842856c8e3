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
#[derive(Debug)]
pub(crate) struct FdeRows {
    pub start: u64,
    pub end: u64,
    pub rows: Vec<(u64, Rule)>,
}

/// Everything read from one section.
#[derive(Debug, Default)]
pub(crate) struct SectionCfi {
    pub fdes: Vec<FdeRows>,
    /// FDEs that could not be parsed, so their address range is unknown.
    pub unparsed_fdes: u64,
}

/// Reads every FDE of `section`. Fails only when the section itself cannot be walked. An FDE
/// whose program fails to evaluate becomes one [`Unsupported::BadCfi`] row over its range.
pub(crate) fn read_section<'a, S>(section: &S, bases: &BaseAddresses) -> gimli::Result<SectionCfi>
where
    S: UnwindSection<Slice<'a>>,
{
    let mut out = SectionCfi::default();
    let mut ctx = UnwindContext::new();
    let mut entries = section.entries(bases);
    while let Some(entry) = entries.next()? {
        let CieOrFde::Fde(partial) = entry else { continue };
        let Ok(fde) = partial.parse(S::cie_from_offset) else {
            out.unparsed_fdes += 1;
            continue;
        };
        if fde.len() == 0 {
            continue;
        }
        let rows = evaluate(section, bases, &mut ctx, &fde)
            .unwrap_or_else(|_| vec![(fde.initial_address(), Rule::Unsupported(Unsupported::BadCfi))]);
        out.fdes.push(FdeRows { start: fde.initial_address(), end: fde.end_address(), rows });
    }
    Ok(out)
}

/// Runs one FDE's CFI program and classifies each non-empty row.
fn evaluate<'a, S>(
    section: &S,
    bases: &BaseAddresses,
    ctx: &mut UnwindContext<usize>,
    fde: &FrameDescriptionEntry<Slice<'a>>,
) -> gimli::Result<Vec<(u64, Rule)>>
where
    S: UnwindSection<Slice<'a>>,
{
    let mut table = fde.rows(section, bases, ctx)?;
    let mut rows = Vec::new();
    while let Some(row) = table.next_row()? {
        if row.start_address() < row.end_address() {
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
