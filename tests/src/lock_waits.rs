//! `lock_contention`'s ground truth (`lock_wait_ns N R S`) and the bounds a block or mutex
//! profile's lock delay must fall in against it: how much of the lock calls' time the kernel
//! could not see as a wait, and how far a sampled estimate may stray on its own.

use crate::Fixture;

/// Standard deviations a sampled estimate may stray before a test calls it wrong.
const SIGMAS: f64 = 3.5;

/// What the lockers of `lock_contention` measured themselves.
#[derive(Debug, Clone, Copy)]
pub struct LockWaits {
    /// Time in `pthread_mutex_lock`, summed over every call (CLOCK_MONOTONIC).
    pub total_ns: i64,
    /// The lockers' run-queue delay inside their lock calls (schedstat, read around each):
    /// a bound on the part of `total_ns` spent runnable outside any futex wait, which only
    /// a loaded machine makes large.
    pub run_delay_ns: i64,
    /// The sum of the squares of the lock calls' times, in µs².
    pub squares_us2: u64,
}

impl LockWaits {
    /// Reads the fixture's `lock_wait_ns N R S` line (waits for it).
    pub fn read(fixture: &mut Fixture) -> Self {
        let values = fixture.read_values("lock_wait_ns");
        assert_eq!(values.len(), 3, "lock_contention printed `lock_wait_ns` with {values:?}, not N R S");
        Self { total_ns: values[0] as i64, run_delay_ns: values[1] as i64, squares_us2: values[2] }
    }

    /// The relative tolerance for an estimate that keeps each wait with probability
    /// 1/`fraction` and scales what it keeps by `fraction`: `floor`, or 3.5σ of that
    /// estimate where that is wider. Its variance is Σ dᵢ²·(F−1) over the waits dᵢ, at most
    /// (F−1)·S: equal waits make it small, a few long ones (a holder preempted on a loaded
    /// machine) make the estimate rest on the few that are kept, and the bound says so.
    pub fn tolerance(&self, floor: f64, fraction: u32) -> f64 {
        let variance_ns2 = f64::from(fraction.saturating_sub(1)) * self.squares_us2 as f64 * 1e6;
        let sampled = SIGMAS * variance_ns2.sqrt() / (self.total_ns.max(1) as f64);
        floor.max(sampled)
    }

    /// The relative tolerance for a block profile at `rate_ns` (Go's block rate: a wait of
    /// d < rate kept with probability d/rate and scaled by rate/d): `floor`, or 3.5σ where
    /// wider. A kept wait's variance is d·(rate−d) < rate·d, so the estimate's is below
    /// rate·N: it shrinks, relative to N, as the waits grow.
    pub fn block_tolerance(&self, floor: f64, rate_ns: u64) -> f64 {
        let total = self.total_ns.max(1) as f64;
        floor.max(SIGMAS * (rate_ns as f64 * total).sqrt() / total)
    }

    /// The relative tolerance for a mutex profile at block rate `rate_ns` and mutex fraction
    /// `fraction`: `floor`, or 3.5σ where wider. A wake is kept with probability p/F, where
    /// p = min(1, s/rate) for what its waiters had waited by then (s, the time since the
    /// word's previous wake), and each wait d it ends is charged d·F/p: variance d²(F/p − 1).
    /// Where each wait began after its word's previous wake (both fixtures: turns, or holds
    /// longer than the rate), s ≥ d, so p ≥ min(1, d/rate) and the variance is at most
    /// F·max(d², rate·d) − d²: in all, (F−1)·S + F·rate·N.
    pub fn mutex_tolerance(&self, floor: f64, rate_ns: u64, fraction: u32) -> f64 {
        let f = f64::from(fraction.max(1));
        let total = self.total_ns.max(1) as f64;
        let variance_ns2 = (f - 1.0) * self.squares_us2 as f64 * 1e6 + f * rate_ns as f64 * total;
        floor.max(SIGMAS * variance_ns2.sqrt() / total)
    }

    /// The least delay a profile may hold: `total_ns` less `tolerance`, less the time the
    /// lockers spent runnable (a thread preempted inside `pthread_mutex_lock`, outside its
    /// futex wait, counts in the truth but is blocked in no wait).
    pub fn least(&self, tolerance: f64) -> f64 {
        self.total_ns as f64 * (1.0 - tolerance) - self.run_delay_ns as f64
    }

    /// Whether `got` ns of lock delay is within [`least`](Self::least) and `total_ns`
    /// plus `tolerance`; the error names `what` and every bound.
    pub fn check(&self, got: i64, tolerance: f64, what: &str) -> Result<(), String> {
        let (low, high) = (self.least(tolerance), self.total_ns as f64 * (1.0 + tolerance));
        eprintln!(
            "{what}: {got} ns against {} ns in the lock calls ({} ns runnable at most), tolerance {:.1}%",
            self.total_ns,
            self.run_delay_ns,
            tolerance * 100.0
        );
        if (low..=high).contains(&(got as f64)) {
            return Ok(());
        }
        Err(format!(
            "{what}: got {got}, expected {} -{} (run-queue delay) ±{:.1}% (the larger of the test's \
             floor and 3.5σ of the sampled estimate; Σ lock time² = {} µs²)",
            self.total_ns,
            self.run_delay_ns,
            tolerance * 100.0,
            self.squares_us2
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn waits(total_ns: i64, squares_us2: u64) -> LockWaits {
        LockWaits { total_ns, run_delay_ns: 0, squares_us2 }
    }

    #[test]
    fn equal_waits_keep_the_floor() {
        // 12,000 waits of 50 µs at 1 in 50: σ = √(49·12,000·2,500 µs²) = 38 ms of 600 ms, 6.4%.
        let w = waits(12_000 * 50_000, 12_000 * 2_500);
        assert!((w.tolerance(0.0, 50) - 3.5 * 0.0639).abs() < 0.001, "{}", w.tolerance(0.0, 50));
        assert_eq!(w.tolerance(0.25, 50), 0.25);
    }

    #[test]
    fn a_few_long_waits_widen_it_and_every_event_needs_none() {
        // 100 waits of 10 ms among 12,000 of 50 µs: the long ones hold 1 s of 1.6 s.
        let w = waits(12_000 * 50_000 + 100 * 10_000_000, 12_000 * 2_500 + 100 * 100_000_000);
        assert!(w.tolerance(0.25, 50) > 1.0, "{}", w.tolerance(0.25, 50));
        assert_eq!(w.tolerance(0.25, 1), 0.25);
    }

    #[test]
    fn block_sampling_matters_less_as_waits_grow() {
        // 0.6 s of waits at 1 ms: σ ≤ √(1 ms·0.6 s) = 24.5 ms, 4.1%; at 2.4 s, 2%.
        assert!((waits(600_000_000, 0).block_tolerance(0.0, 1_000_000) - 3.5 * 0.0408).abs() < 0.001);
        assert!(waits(2_400_000_000, 0).block_tolerance(0.0, 1_000_000) < 3.5 * 0.021);
        assert_eq!(waits(600_000_000, 0).block_tolerance(0.15, 1), 0.15);
    }

    #[test]
    fn mutex_sampling_adds_the_fraction_to_the_rate() {
        // 12,000 waits of 50 µs at rate 1 ms, no fraction: as the block bound, 4.1%.
        let w = waits(12_000 * 50_000, 12_000 * 2_500);
        assert!((w.mutex_tolerance(0.0, 1_000_000, 1) - w.block_tolerance(0.0, 1_000_000)).abs() < 1e-9);
        // Every wake (rate 1 ns, fraction 1): the floor.
        assert_eq!(w.mutex_tolerance(0.25, 1, 1), 0.25);
        // A fraction on top widens it past either part alone.
        assert!(w.mutex_tolerance(0.0, 1_000_000, 10) > w.tolerance(0.0, 10).max(w.block_tolerance(0.0, 1_000_000)));
    }

    #[test]
    fn runnable_time_lowers_only_the_lower_bound() {
        let w = LockWaits { total_ns: 1_000, run_delay_ns: 300, squares_us2: 0 };
        assert!(w.check(600, 0.15, "x").is_ok());
        assert!(w.check(540, 0.15, "x").is_err());
        assert!(w.check(1_150, 0.15, "x").is_ok());
        assert!(w.check(1_151, 0.15, "x").is_err());
    }
}
