//! A resident-memory budget on the symbolizer's open files, checked after each file it reads
//! from: past it, every parsed file is closed (the symbols found are kept) and freed heap is
//! given back, so a run that names the files of many processes at once holds about one file
//! parsed beyond the budget, not all of them. `profiler snapshot` uses it (it names every
//! process at its end); the daemon bounds its caches per dump instead (`daemon::collector`).

/// Growth past the resident size left after the last close before files are closed again:
/// when what cannot be closed (the symbols found, the capture's own memory) is already over
/// the budget, files are closed once per this much growth, not after every file (which would
/// parse libc again for every process).
pub const REGROWTH_BYTES: u64 = 16 << 20;

/// The budget and what the last close left.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FilesBudget {
    /// Resident bytes past which the open files are closed.
    pub limit: u64,
    /// Resident bytes just after the last close (0 before any).
    floor: u64,
    /// Closes so far.
    pub closes: u64,
}

impl FilesBudget {
    pub fn new(limit: u64) -> Self {
        Self { limit, floor: 0, closes: 0 }
    }

    /// Whether the files must be closed at `resident` bytes.
    pub fn due(&self, resident: u64) -> bool {
        resident > self.limit.max(self.floor.saturating_add(REGROWTH_BYTES))
    }

    /// Notes a close that left `resident` bytes.
    pub fn closed(&mut self, resident: u64) {
        self.floor = resident;
        self.closes += 1;
    }
}

/// This process's resident set size, from `/proc/self/statm`.
pub fn resident_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    Some(pages * u64::try_from(page).unwrap_or(4096))
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn files_close_past_the_limit_then_once_per_regrowth_when_the_floor_is_over_it() {
        let mut budget = FilesBudget::new(32 * MIB);
        assert!(!budget.due(32 * MIB), "at the limit, not past it");
        assert!(budget.due(32 * MIB + 1));
        // A close that got back well under the limit: the limit rules again.
        budget.closed(8 * MIB);
        assert!(!budget.due(32 * MIB));
        assert!(budget.due(33 * MIB));
        // One that got just under it: the next waits for REGROWTH_BYTES, not a few pages.
        budget.closed(30 * MIB);
        assert!(!budget.due(33 * MIB));
        assert!(budget.due(30 * MIB + REGROWTH_BYTES + 1));
        // A close that could not get under it: the next waits for REGROWTH_BYTES more.
        budget.closed(40 * MIB);
        assert!(!budget.due(40 * MIB + REGROWTH_BYTES));
        assert!(budget.due(40 * MIB + REGROWTH_BYTES + 1));
        assert_eq!(budget.closes, 3);
    }

    #[test]
    fn resident_bytes_sees_memory_touched() {
        let before = resident_bytes().expect("statm readable");
        let touched = vec![1u8; 64 * MIB as usize];
        let after = resident_bytes().expect("statm readable");
        assert!(after >= before + 60 * MIB, "{before} -> {after}");
        drop(std::hint::black_box(touched));
    }
}
