//! Rows laid over a built table for addresses whose CFI is wrong or missing on purpose: Go's
//! cgo `CALL`s in `runtime.asmcgocall` ([`super::go_cgo`]), which run on another stack.

use std::ops::Range;

use profiler_common::UnwindRow;

use super::{gap_row, BuildError, Rule, UnwindTable, MAX_TABLE_ROWS};

impl UnwindTable {
    /// Makes `rule` the rule for `range` (addresses the CFI got wrong, such as Go's stack
    /// switches), keeping the rules around it: the one in force at `range.end` resumes
    /// there.
    pub(crate) fn overlay(&mut self, range: Range<u64>, rule: Rule) -> Result<(), BuildError> {
        if self.rows.is_empty() {
            self.base_address = range.start;
        }
        if range.start < self.base_address {
            // Rebase: every offset moves up by the distance to the new base.
            let span = self.base_address - range.start;
            let delta = u32::try_from(span).map_err(|_| BuildError::SpanTooLarge { span })?;
            for row in &mut self.rows {
                row.pc_offset = row.pc_offset.checked_add(delta).ok_or(BuildError::SpanTooLarge { span })?;
            }
            self.base_address = range.start;
        }
        let offset = |address: u64| {
            let span = address - self.base_address;
            u32::try_from(span).map_err(|_| BuildError::SpanTooLarge { span })
        };
        let (start, end) = (offset(range.start)?, offset(range.end)?);
        let lo = self.rows.partition_point(|row| row.pc_offset < start);
        let hi = self.rows.partition_point(|row| row.pc_offset < end);
        let resumes = match self.rows.get(hi) {
            Some(row) if row.pc_offset == end => None,
            _ => Some(match hi.checked_sub(1).map(|at| self.rows[at]) {
                Some(row) => UnwindRow { pc_offset: end, ..row },
                None => gap_row(end),
            }),
        };
        self.rows.splice(lo..hi, std::iter::once(rule.encode(start)).chain(resumes));
        if self.rows.len() > MAX_TABLE_ROWS {
            return Err(BuildError::TooLarge { cap: MAX_TABLE_ROWS as u64 });
        }
        self.stats.rows = self.rows.len() as u64;
        self.stats.bytes = (self.rows.len() * std::mem::size_of::<UnwindRow>()) as u64;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{fde, rsp, table};
    use super::*;

    #[test]
    fn an_overlay_replaces_its_range_and_the_rule_around_it_resumes() {
        let cgo = Rule::GoCgoReturn { depth_bytes: 40 };
        let mut t = table(vec![fde(0x1000, 0x1010, &[(0x1000, rsp(8)), (0x1004, rsp(16))])]);
        t.overlay(0x1006..0x1008, cgo).expect("overlays");
        assert_eq!(t.lookup(0x1005), Some(rsp(16)));
        assert_eq!(t.lookup(0x1006), Some(cgo));
        assert_eq!(t.lookup(0x1007), Some(cgo));
        assert_eq!(t.lookup(0x1008), Some(rsp(16)), "the rule in force resumes");
        assert_eq!(t.lookup(0x1010), None);
        // Below the table's first row: the table is rebased, and a gap follows the overlay.
        t.overlay(0x0f00..0x0f02, cgo).expect("overlays");
        assert_eq!(t.base_address(), 0x0f00);
        assert_eq!((t.lookup(0x0f01), t.lookup(0x0f02)), (Some(cgo), None));
        assert_eq!((t.lookup(0x1000), t.lookup(0x1007)), (Some(rsp(8)), Some(cgo)));
        // Ending where a row starts: that row stays.
        t.overlay(0x1002..0x1004, cgo).expect("overlays");
        assert_eq!((t.lookup(0x1001), t.lookup(0x1003), t.lookup(0x1004)), (Some(rsp(8)), Some(cgo), Some(rsp(16))));
        assert_eq!(t.stats().rows, t.rows().len() as u64);
    }
}
