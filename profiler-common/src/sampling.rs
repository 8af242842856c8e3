//! Sampling by length, shared by the kernel programs that keep the rare long events: the
//! block profile (a futex wait), the off-CPU profile (a switched-out interval) and the mutex
//! profile (the wake that ends a wait). Pure functions of a length, a rate and a uniform
//! 32-bit draw, so that one implementation runs in the kernel and is proven unbiased here.
//!
//! The rule is Go's (CL 299991): an event at least `rate` long is always kept, as itself; a
//! shorter one of length d with probability d/rate, and then weighted rate/d. Weighted
//! counts are fixed point, in 1/[`WEIGHT_ONE`].

/// One event in a weighted count (fixed point, so that rate/d keeps its fraction).
pub const WEIGHT_ONE: u64 = 1 << 16;

/// A kept event's weight: it stands for `count`/[`WEIGHT_ONE`] events of `total_ns` in all.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Weighted {
    pub count: u64,
    pub total_ns: u64,
}

/// Uniform in [0, `rate_ns`) from a 32-bit draw, without a division: draw · rate / 2^32,
/// split so that a rate past 2^32 ns (4.3 s) does not overflow.
#[inline(always)]
fn scaled(draw: u32, rate_ns: u64) -> u64 {
    let r = u64::from(draw);
    r * (rate_ns >> 32) + ((r * (rate_ns & 0xffff_ffff)) >> 32)
}

/// Whether an event of `length_ns` is kept at `rate_ns`, and as what: itself when at least
/// the rate long (or the rate is 0 or 1: keep all), else with probability length/rate as
/// rate/length events of `rate_ns` in all, so that the sums estimate every event's. `draw`
/// (uniform 32 bits) is called only for a short event: a kept long one costs no draw.
#[inline(always)]
pub fn by_length(length_ns: u64, rate_ns: u64, draw: impl FnOnce() -> u32) -> Option<Weighted> {
    if rate_ns <= 1 || length_ns >= rate_ns {
        return Some(Weighted { count: WEIGHT_ONE, total_ns: length_ns });
    }
    if scaled(draw(), rate_ns) >= length_ns {
        return None;
    }
    // length_ns > draw >= 0 here.
    Some(Weighted { count: (rate_ns * WEIGHT_ONE) / length_ns, total_ns: rate_ns })
}

/// The mutex profile's decision at a wake, before the waits it ends are over: kept with
/// probability min(1, `so_far_ns`/rate) / `fraction`, where `so_far_ns` is what the waits it
/// ends have waited by the wake's entry (see the futex program for how that is bounded).
/// Returns the weight in 1/[`WEIGHT_ONE`] that each of those waits is charged with
/// (see [`charge`]): the inverse of the probability the rate part kept it with. The fraction
/// part is scaled back by userspace, as Go scales its mutex profile.
///
/// Unbiased whatever `so_far_ns` is, as long as it is fixed before the draw: a wait of any
/// length d that the wake ends is charged d · weight with probability p and 0 otherwise,
/// and weight = 1/p, so its expected charge is d. A poor `so_far_ns` (far below d) costs
/// variance, not bias; one above d costs walks.
#[inline(always)]
pub fn wake_weight(so_far_ns: u64, rate_ns: u64, fraction: u64, draw: impl FnOnce() -> u32) -> Option<u64> {
    let always = rate_ns <= 1 || so_far_ns >= rate_ns;
    if always && fraction <= 1 {
        return Some(WEIGHT_ONE);
    }
    let draw = draw();
    // 1 in `fraction` first, on the draw's top part: a 32-bit draw r is below 2^32 / fraction
    // with probability 1/fraction (to within 2^-32), tested with a multiply.
    if fraction > 1 && (u64::from(draw) * fraction) >> 32 != 0 {
        return None;
    }
    if always {
        return Some(WEIGHT_ONE);
    }
    // A floor of rate/2^16 keeps the weight at most 2^16 waits (so [`charge`] cannot
    // overflow) and never makes the probability 0 (a wake seen with nothing behind it may
    // still end a wait); the same floored value gives probability and weight, so the
    // estimate stays unbiased.
    let so_far_ns = so_far_ns.max(rate_ns >> 16).max(1);
    // The second decision needs a draw independent of the first: a fresh one from the
    // caller would cost a wake a second generator step, so the bits the first test left
    // uniform are used (given r · fraction < 2^32, r is uniform below 2^32 / fraction).
    let rest = if fraction > 1 { draw.wrapping_mul(fraction as u32) } else { draw };
    if scaled(rest, rate_ns) >= so_far_ns {
        return None;
    }
    Some((rate_ns * WEIGHT_ONE) / so_far_ns)
}

/// The (count, delay) a wait of `delay_ns` adds when a wake kept with `weight` ended it:
/// `weight`/[`WEIGHT_ONE`] waits of `delay_ns` each. No 128-bit multiply in the kernel (nor
/// an overflow check, which compiles to one), so the operands are bounded instead: the
/// weight at 2^32 (what [`wake_weight`] returns at most) and the delay at 2^47 ns (39 hours),
/// and the product split in two that cannot overflow.
#[inline(always)]
pub fn charge(delay_ns: u64, weight: u64) -> Weighted {
    let weight = weight.min(MAX_WEIGHT);
    let delay_ns = delay_ns.min(MAX_CHARGED_NS);
    // < 2^31 · 2^32 and < 2^16 · 2^32.
    let high = (delay_ns >> 16) * weight;
    let low = ((delay_ns & 0xffff) * weight) >> 16;
    Weighted { count: weight, total_ns: high + low }
}

/// The largest weight [`charge`] takes (2^16 waits).
const MAX_WEIGHT: u64 = 1 << 32;
/// The longest delay [`charge`] charges as itself.
pub const MAX_CHARGED_NS: u64 = (1 << 47) - 1;

#[cfg(test)]
mod tests {
    extern crate std;
    use std::vec::Vec;

    use super::*;

    /// xorshift64*, the same generator the futex programs use, seeded per test.
    struct Draws(u64);
    impl Draws {
        fn next(&mut self) -> u32 {
            let mut x = self.0;
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
            self.0 = x;
            (x.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 32) as u32
        }
    }

    /// Mean and its standard error of `n` draws of `f`.
    fn mean_and_error(n: usize, mut f: impl FnMut() -> f64) -> (f64, f64) {
        let xs: Vec<f64> = (0..n).map(|_| f()).collect();
        let mean = xs.iter().sum::<f64>() / n as f64;
        let var = xs.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / (n - 1) as f64;
        (mean, (var / n as f64).sqrt())
    }

    /// The estimate is within 4 standard errors of the truth (a 1-in-15,000 false alarm per
    /// check), and the standard error is small enough that a biased estimator would fail:
    /// each case's bias, were the weight dropped, would be many standard errors.
    fn assert_unbiased(what: &str, truth: f64, (mean, error): (f64, f64)) {
        assert!(error < truth * 0.02, "{what}: standard error {error} too large to tell bias from noise");
        assert!((mean - truth).abs() <= 4.0 * error, "{what}: mean {mean} vs truth {truth} (se {error})");
    }

    #[test]
    fn by_length_keeps_long_events_as_themselves() {
        assert_eq!(by_length(5_000, 1_000, || 0), Some(Weighted { count: WEIGHT_ONE, total_ns: 5_000 }));
        assert_eq!(by_length(5_000, 1_000, || u32::MAX), Some(Weighted { count: WEIGHT_ONE, total_ns: 5_000 }));
        assert_eq!(by_length(3, 1, || u32::MAX), Some(Weighted { count: WEIGHT_ONE, total_ns: 3 }));
    }

    #[test]
    fn by_length_is_unbiased_for_short_events() {
        let rate = 1_000_000;
        for (seed, length) in [(1, 10_000u64), (2, 100_000), (3, 999_999)] {
            let mut draws = Draws(seed * 0x9e37_79b9);
            let n = 1_000_000;
            let total =
                mean_and_error(n, || by_length(length, rate, || draws.next()).map_or(0.0, |w| w.total_ns as f64));
            assert_unbiased("total", length as f64, total);
            let mut draws = Draws(seed * 0x9e37_79b9);
            let count = mean_and_error(n, || {
                by_length(length, rate, || draws.next()).map_or(0.0, |w| w.count as f64 / WEIGHT_ONE as f64)
            });
            assert_unbiased("count", 1.0, count);
        }
    }

    /// The mutex estimator: a wake decided by what its waits had waited at its entry
    /// (`so_far`), charging each wait it ends by that wait's own final delay. Unbiased for
    /// waits that end longer than the wake saw (the wake-up latency), for waits a wake saw
    /// as far older than they are (another waiter's age), for a wake that ends several waits
    /// of different lengths, and with the fraction on top, scaled back as userspace does.
    #[test]
    fn wake_weight_charges_every_wait_it_ends_without_bias() {
        let rate = 1_000_000;
        // (so_far at the wake, the final delays of the waits it ends, fraction)
        let cases: [(u64, &[u64], u64); 6] = [
            (200_000, &[250_000], 1),
            (10_000, &[3_000_000], 1),
            (900_000, &[100_000, 400_000, 950_000], 1),
            (2_000_000, &[2_100_000], 1),
            (300_000, &[320_000, 10_000], 5),
            (50_000, &[60_000], 3),
        ];
        for (i, (so_far, delays, fraction)) in cases.into_iter().enumerate() {
            let truth: u64 = delays.iter().sum();
            let mut draws = Draws(0x1234_5678 + i as u64);
            let n = 1_000_000;
            let (mut sum, mut sum2, mut waits) = (0.0f64, 0.0f64, 0.0f64);
            for _ in 0..n {
                let Some(weight) = wake_weight(so_far, rate, fraction, || draws.next()) else { continue };
                let charged: u64 = delays.iter().map(|&d| charge(d, weight).total_ns).sum();
                let x = charged as f64 * fraction as f64;
                sum += x;
                sum2 += x * x;
                waits += (weight * delays.len() as u64) as f64 / WEIGHT_ONE as f64 * fraction as f64;
            }
            let mean = sum / n as f64;
            let error = ((sum2 / n as f64 - mean * mean) / n as f64).sqrt();
            assert_unbiased("delay", truth as f64, (mean, error));
            let per_wake = waits / n as f64;
            assert!((per_wake / delays.len() as f64 - 1.0).abs() < 0.03, "count: {per_wake} per wake");
        }
    }

    #[test]
    fn wake_weight_always_keeps_a_wake_behind_a_long_wait() {
        for draw in [0, 1, u32::MAX / 2, u32::MAX] {
            assert_eq!(wake_weight(1_000_000, 1_000_000, 1, || draw), Some(WEIGHT_ONE));
            assert_eq!(wake_weight(7, 0, 1, || draw), Some(WEIGHT_ONE));
        }
        assert_eq!(wake_weight(0, 1_000_000, 1, || u32::MAX), None);
        // Seen with nothing behind it, a wake is still kept now and then, at a bounded weight.
        assert_eq!(wake_weight(0, 1_000_000, 1, || 0), Some((1_000_000 * WEIGHT_ONE) / (1_000_000 >> 16)));
    }

    #[test]
    fn charge_does_not_overflow_a_long_wait_at_a_large_weight() {
        let day_ns = 86_400 * 1_000_000_000u64;
        let w = charge(day_ns, 1_000 * WEIGHT_ONE);
        assert_eq!(w.total_ns, day_ns * 1_000);
        let most = charge(u64::MAX, u64::MAX);
        assert_eq!((most.count, most.total_ns), (MAX_WEIGHT, MAX_CHARGED_NS * (MAX_WEIGHT / WEIGHT_ONE)));
        assert_eq!(charge(123_456_789, WEIGHT_ONE).total_ns, 123_456_789);
    }
}
