//! The decoded form of an unwind row ([`Rule`]) and its encoding into the kernel's 8-byte
//! [`UnwindRow`]. Each `Rule` value has exactly one encoding, so identical rules merge.

pub use profiler_common::unwind::Unsupported;
use profiler_common::{UnwindKind, UnwindRow};

/// The largest CFA offset a row holds: `u16::MAX` 8-byte words, a 512 KiB frame.
pub const MAX_CFA_OFFSET: u32 = u16::MAX as u32 * 8;

/// The register the CFA is computed from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CfaRegister {
    Rsp,
    Rbp,
}

/// Where the caller's rbp is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RbpRule {
    /// This frame has not changed rbp (or has no use for it).
    Unchanged,
    /// Saved at CFA + this many bytes: negative, a multiple of 8, at least −1024.
    AtCfa(i16),
}

/// How to step from a frame at some address to its caller (x86_64: the return address is
/// always at CFA − 8).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Rule {
    /// CFA = `register` + `offset_bytes` (a multiple of 8, at most [`MAX_CFA_OFFSET`]); the
    /// caller's rbp per `rbp`.
    Frame { register: CfaRegister, offset_bytes: u32, rbp: RbpRule },
    /// A lazy PLT entry: CFA = rsp + 8 + 8 · ((rip & 15) ≥ `rip_threshold`).
    Plt { rip_threshold: u8 },
    /// The Linux signal trampoline (see [`profiler_common::unwind::sigframe`]).
    SignalFrame,
    /// The outermost frame: the return address is undefined.
    EndOfStack,
    /// CFI that no row can express.
    Unsupported(Unsupported),
    /// A cgo call's `CALL` in Go's `runtime.asmcgocall`: the goroutine's stack is found from
    /// the depth saved at rsp + `depth_bytes` and the `g` after it (see
    /// [`UnwindKind::GoCgoReturn`]).
    GoCgoReturn { depth_bytes: u16 },
}

/// `offset` as a [`Rule::Frame`] CFA offset, or `None` if no row can hold it.
pub fn cfa_offset(offset: i64) -> Option<u32> {
    let bytes = u32::try_from(offset).ok()?;
    (bytes % 8 == 0 && bytes <= MAX_CFA_OFFSET).then_some(bytes)
}

impl RbpRule {
    /// The rule for rbp saved at CFA + `offset`, or `None` if no row can hold it.
    pub fn at_cfa(offset: i64) -> Option<RbpRule> {
        let in_range = (-1024..0).contains(&offset) && offset % 8 == 0;
        in_range.then_some(RbpRule::AtCfa(offset as i16))
    }
}

impl Rule {
    /// The row for this rule, starting at `pc_offset` from the table's base.
    pub fn encode(self, pc_offset: u32) -> UnwindRow {
        let (kind, operand, rbp_cfa_words) = match self {
            Rule::Frame { register, offset_bytes, rbp } => {
                let kind = match register {
                    CfaRegister::Rsp => UnwindKind::CfaRsp,
                    CfaRegister::Rbp => UnwindKind::CfaRbp,
                };
                let words = match rbp {
                    RbpRule::Unchanged => 0,
                    RbpRule::AtCfa(bytes) => (bytes / 8) as i8,
                };
                debug_assert_eq!(cfa_offset(i64::from(offset_bytes)), Some(offset_bytes));
                (kind, (offset_bytes / 8) as u16, words)
            }
            Rule::Plt { rip_threshold } => (UnwindKind::Plt, u16::from(rip_threshold), 0),
            Rule::SignalFrame => (UnwindKind::SignalFrame, 0, 0),
            Rule::EndOfStack => (UnwindKind::EndOfStack, 0, 0),
            Rule::Unsupported(reason) => (UnwindKind::Unsupported, reason as u16, 0),
            Rule::GoCgoReturn { depth_bytes } => (UnwindKind::GoCgoReturn, depth_bytes / 8, 0),
        };
        UnwindRow { pc_offset, operand, rbp_cfa_words, kind: kind as u8 }
    }

    /// The rule `row` encodes; `None` for a gap (or a row no builder writes).
    pub fn decode(row: &UnwindRow) -> Option<Rule> {
        let rbp = match row.rbp_cfa_words {
            0 => RbpRule::Unchanged,
            words => RbpRule::AtCfa(i16::from(words) * 8),
        };
        let offset_bytes = u32::from(row.operand) * 8;
        let frame = |register| Rule::Frame { register, offset_bytes, rbp };
        Some(match UnwindKind::from_u8(row.kind)? {
            UnwindKind::Gap => return None,
            UnwindKind::CfaRsp => frame(CfaRegister::Rsp),
            UnwindKind::CfaRbp => frame(CfaRegister::Rbp),
            UnwindKind::Plt => Rule::Plt { rip_threshold: row.operand as u8 },
            UnwindKind::SignalFrame => Rule::SignalFrame,
            UnwindKind::EndOfStack => Rule::EndOfStack,
            UnwindKind::Unsupported => Rule::Unsupported(Unsupported::from_index(row.operand)?),
            UnwindKind::GoCgoReturn => Rule::GoCgoReturn { depth_bytes: row.operand * 8 },
        })
    }
}

/// The row that marks addresses without CFI.
pub(crate) fn gap_row(pc_offset: u32) -> UnwindRow {
    UnwindRow { pc_offset, operand: 0, rbp_cfa_words: 0, kind: UnwindKind::Gap as u8 }
}

/// A count per [`Unsupported`] reason.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReasonCounts([u64; Unsupported::COUNT]);

impl ReasonCounts {
    /// Counts one more `reason`.
    pub fn add(&mut self, reason: Unsupported) {
        self.0[reason as usize] += 1;
    }

    /// Adds every count of `other`.
    pub fn merge(&mut self, other: &ReasonCounts) {
        for (count, more) in self.0.iter_mut().zip(other.0) {
            *count += more;
        }
    }

    /// The count for `reason`.
    pub fn get(&self, reason: Unsupported) -> u64 {
        self.0[reason as usize]
    }

    /// All reasons with their counts, in index order.
    pub fn iter(&self) -> impl Iterator<Item = (Unsupported, u64)> + '_ {
        Unsupported::ALL.into_iter().map(|reason| (reason, self.get(reason)))
    }

    /// The sum over all reasons.
    pub fn total(&self) -> u64 {
        self.0.iter().sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_a_row_can_hold() {
        assert_eq!(cfa_offset(8), Some(8));
        assert_eq!(cfa_offset(i64::from(MAX_CFA_OFFSET)), Some(MAX_CFA_OFFSET));
        assert_eq!(cfa_offset(i64::from(MAX_CFA_OFFSET) + 8), None);
        assert_eq!(cfa_offset(12), None, "not a whole word");
        assert_eq!(cfa_offset(-8), None);
        assert_eq!(RbpRule::at_cfa(-16), Some(RbpRule::AtCfa(-16)));
        assert_eq!(RbpRule::at_cfa(-1024), Some(RbpRule::AtCfa(-1024)));
        assert_eq!(RbpRule::at_cfa(-1032), None);
        assert_eq!(RbpRule::at_cfa(-12), None);
        assert_eq!(RbpRule::at_cfa(0), None, "0 encodes 'unchanged'");
    }
}
