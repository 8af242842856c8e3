//! When the symbolizer's open files are closed for the files budget. Closing them frees
//! their parsed debug info, which the next symbolization of those files parses again
//! (inflating compressed sections: tens of milliseconds and tens of MiB for a large Rust or
//! C++ binary). When the files in use need more than the budget, resident memory is over it
//! again one dump after every close: closing at every dump then buys no lower peak, only a
//! parse per interval and a resident size that saws between the two. So a close that did
//! not bring memory under the budget for one whole interval doubles the wait before the
//! next (up to [`MAX_WAIT`] dumps); a dump under the budget resets it. The caches' hard
//! budget (dropping every symbol found) is not paced: it guards the unit's memory limit.

/// Dumps the longest wait between two closes spans.
const MAX_WAIT: u32 = 32;

/// Whether to close the files at each dump, given whether memory is over the files budget.
#[derive(Debug, Default)]
pub struct FileCloses {
    /// Dumps to let pass before the next close.
    wait: u32,
    /// The wait set at the last close.
    last_wait: u32,
    /// Whether the previous dump found memory over the budget.
    was_over: bool,
}

impl FileCloses {
    /// Called once per dump: whether to close the files now.
    pub fn at_dump(&mut self, over: bool) -> bool {
        let was_over = std::mem::replace(&mut self.was_over, over);
        if !over {
            (self.wait, self.last_wait) = (0, 0);
            return false;
        }
        if self.wait > 0 {
            self.wait -= 1;
            return false;
        }
        // Over at the previous dump too: the last close (or the wait after it) did not
        // bring memory down for an interval.
        self.last_wait = if was_over { (self.last_wait * 2).clamp(1, MAX_WAIT) } else { 0 };
        self.wait = self.last_wait;
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_close_that_helps_is_repeated_when_needed() {
        let mut closes = FileCloses::default();
        // Over, closed, under for a while, over again: closed at once each time.
        let pattern = [true, false, false, true, false, true];
        let closed: Vec<bool> = pattern.iter().map(|&over| closes.at_dump(over)).collect();
        assert_eq!(closed, pattern);
    }

    #[test]
    fn closes_that_do_not_help_back_off_to_every_32_dumps() {
        let mut closes = FileCloses::default();
        let closed: Vec<usize> = (0..200).filter(|_| closes.at_dump(true)).collect();
        assert_eq!(&closed[..6], &[0, 1, 3, 6, 11, 20]);
        let gaps: Vec<usize> = closed.windows(2).map(|w| w[1] - w[0]).collect();
        assert!(gaps.iter().all(|&g| g <= MAX_WAIT as usize + 1), "{gaps:?}");
        assert_eq!(*gaps.last().unwrap(), MAX_WAIT as usize + 1);
        // Under the budget once: the next time over closes at once.
        assert!(!closes.at_dump(false));
        assert!(closes.at_dump(true));
    }
}
