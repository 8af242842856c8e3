//! How often the owner reads the rings under a storm of process events. Each record wakes a
//! waiting reader, and a program that forks, execs, maps its libraries and exits writes five
//! or six of them within a millisecond: a machine running hundreds of short programs a second
//! would wake the daemon thousands of times a second, and register with the unwinder
//! processes that exit before the next record arrives. So once the records come faster than
//! [`STORM_EVENTS_PER_S`], the rings are read at most every [`STORM_GAP`]: the owner then
//! waits on its other descriptors only, for the rest of the gap, and the records meanwhile
//! gather. Below the rate, every record is read as it comes (a quiet machine's short-lived
//! process is registered within a fraction of a millisecond).
//!
//! The gap can be long because a process that matters does not wait for it: the first walk
//! that meets a process unregistered asks for it (`REGISTER_ASKS`, a ring the owner also
//! waits on), and the rings are then read at once. Only processes something samples, or
//! whose waits or allocations are walked, cost a read; the storm's programs that nothing
//! walks are followed in batches. At 500 programs a second (`cargo xtask bench exec`), a
//! 2 ms gap woke the daemon about 480 times a second and cost it 1.7-1.85% of a core; 10 and
//! 25 ms cost 0.85-0.90%. A process first walked during the gap loses that walk's tables
//! (frame pointers only), as it would before its first read anyway.

use std::time::{Duration, Instant};

/// Records per second past which the rings are read at most every [`STORM_GAP`]: some 200
/// programs started a second (one every 5 ms, each with its fork, exec, mappings and exit).
pub const STORM_EVENTS_PER_S: u64 = 1_000;
/// The longest a record waits under a storm, unless a walker asks for its process.
pub const STORM_GAP: Duration = Duration::from_millis(20);
/// How long the rate is measured over.
const WINDOW: Duration = Duration::from_millis(100);

/// The rate of the records read lately, and when they were last read.
#[derive(Debug)]
pub struct Pace {
    window_start: Instant,
    window_events: u64,
    storm: bool,
    /// Windows that ended at a storm's rate, since start.
    storm_windows: u64,
    last_read: Option<Instant>,
}

impl Default for Pace {
    fn default() -> Self {
        Self { window_start: Instant::now(), window_events: 0, storm: false, storm_windows: 0, last_read: None }
    }
}

impl Pace {
    /// Notes a read of `events` records at `now`.
    pub fn read(&mut self, now: Instant, events: usize) {
        let elapsed = now.saturating_duration_since(self.window_start);
        if elapsed >= WINDOW {
            // The window's rate decides the next one's pace (a window that ended long ago
            // counted few records for its length: no storm).
            let rate = self.window_events as u128 * 1_000_000_000 / elapsed.as_nanos().max(1);
            self.storm = rate >= u128::from(STORM_EVENTS_PER_S);
            self.storm_windows += u64::from(self.storm);
            self.window_start = now;
            self.window_events = 0;
        }
        self.window_events += events as u64;
        self.last_read = Some(now);
    }

    /// How much longer the rings are left unread, if they are: under a storm, until
    /// [`STORM_GAP`] after the last read.
    pub fn hold(&self, now: Instant) -> Option<Duration> {
        if !self.storm {
            return None;
        }
        let due = self.last_read? + STORM_GAP;
        due.checked_duration_since(now).filter(|left| !left.is_zero())
    }

    /// Whether the records came faster than [`STORM_EVENTS_PER_S`] in the last window.
    pub fn storm(&self) -> bool {
        self.storm
    }

    /// How long the records came at a storm's rate since start (whole windows).
    pub fn storm_time(&self) -> Duration {
        WINDOW * self.storm_windows.min(u64::from(u32::MAX)) as u32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_quiet_machine_is_read_as_records_come() {
        let start = Instant::now();
        let mut pace = Pace { window_start: start, ..Pace::default() };
        // 250 records a second, in bursts of five.
        for i in 0..100 {
            let now = start + Duration::from_millis(20 * i);
            pace.read(now, 5);
            assert_eq!(pace.hold(now), None, "read {i}");
        }
        assert!(!pace.storm());
        assert_eq!(pace.storm_time(), Duration::ZERO);
    }

    #[test]
    fn a_storm_is_read_every_gap_and_ends_with_it() {
        let start = Instant::now();
        let mut pace = Pace { window_start: start, ..Pace::default() };
        // 2,500 records a second: a burst of five every 2 ms.
        let mut now = start;
        for _ in 0..60 {
            now += Duration::from_millis(2);
            pace.read(now, 5);
        }
        assert!(pace.storm());
        // 120 ms of records: one whole window ended at a storm's rate.
        assert_eq!(pace.storm_time(), WINDOW);
        assert_eq!(pace.hold(now), Some(STORM_GAP));
        assert_eq!(pace.hold(now + Duration::from_millis(1)), Some(STORM_GAP - Duration::from_millis(1)));
        assert_eq!(pace.hold(now + STORM_GAP), None, "the gap over, the rings are watched again");
        // Then a quiet spell: the next read starts a window that ends the storm.
        now += Duration::from_secs(1);
        pace.read(now, 1);
        assert!(!pace.storm());
        assert_eq!(pace.hold(now), None);
        assert_eq!(pace.storm_time(), WINDOW, "the quiet window is not counted");
    }
}
