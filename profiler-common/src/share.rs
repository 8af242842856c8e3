//! Fair shares of the kernel's stack table: no single process, and no single uid, may insert
//! more than its share of a map set's [`crate::maps::STACKS_MAX_ENTRIES`] entries. The maps
//! are shared by every process and filled first come, first served, so without a cap one
//! process making distinct stacks as fast as it can (a futex storm from generated code, a
//! crafted attack) fills them within a fraction of each set's second and every other
//! process's new stacks are refused until the next flip. The caps bind only once the set's
//! table is [`ShareCaps::binding_from`] full (half): below that, first come, first served,
//! so one busy process on a quiet host keeps every stack it makes; above it, only owners
//! under their caps insert, so the rest of the table stays for them. A stack refused is
//! recorded as [`crate::stack::OVER_SHARE_STACK`]: the sample still counts, without frames,
//! and the refusal is counted against the process.

/// [`ShareKey`] bit: the key names a uid (low 32 bits), not a process.
pub const SHARE_UID: u64 = 1 << 32;

/// [`ShareKey`] of the set's total: every entry inserted while caps are on.
pub const SHARE_ALL: u64 = u64::MAX;

/// Key of the `STACK_SHARES_*` maps: a process's tgid (as the profiler sees it), or
/// [`SHARE_UID`]` | uid`.
pub type ShareKey = u64;

/// What one process or uid did to one map set's stack table since the set was last drained.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ShareUse {
    /// Stack-table entries inserted (a deep stack's pieces each count).
    pub entries: u64,
    /// Samples refused a new stack because this owner (or, for a process, its uid) held its
    /// share: one per sample, not per distinct stack. Charged to the process only; a uid's
    /// entry keeps 0.
    pub refused: u64,
}

/// The caps the kernel applies, in entries per map set (0: no cap), set at load.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ShareCaps {
    pub per_process: u32,
    pub per_uid: u32,
    /// Entries in the set's table from which the caps bind.
    pub binding_from: u32,
}

impl ShareCaps {
    /// Caps of `process_percent` and `uid_percent` of a table of `table` entries (100: no
    /// cap), binding from half the table.
    pub fn of_table(table: u32, process_percent: u32, uid_percent: u32) -> Self {
        Self {
            per_process: cap(table.into(), process_percent) as u32,
            per_uid: cap(table.into(), uid_percent) as u32,
            binding_from: table / 2,
        }
    }
}

/// Owners whose use one set can record (processes and uids together); past it, inserts go
/// uncapped rather than refused, and are not counted.
pub const STACK_SHARES_MAX_ENTRIES: u32 = 4_096;

/// Entries of a table of `table` entries that `percent` of it allows, at least 1; 0 (no
/// cap) for 100 or more. The kernel's caps and the daemon's catalogue use the same rule.
pub fn cap(table: u64, percent: u32) -> u64 {
    if percent >= 100 {
        0
    } else {
        (table.saturating_mul(percent.into()) / 100).max(1)
    }
}

#[cfg(feature = "user")]
mod pod {
    // SAFETY: repr(C), only integers, no padding.
    unsafe impl aya::Pod for super::ShareUse {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::ShareCaps {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn caps_are_fractions_of_the_table_and_never_zero_below_a_hundred_percent() {
        assert_eq!(cap(16_384, 25), 4_096);
        assert_eq!(cap(16_384, 100), 0);
        assert_eq!(cap(3, 1), 1);
        assert_eq!(
            ShareCaps::of_table(16_384, 25, 100),
            ShareCaps { per_process: 4_096, per_uid: 0, binding_from: 8_192 }
        );
    }
}
