//! How long after its `exec` a followed process's new image is registered with the unwinder:
//! until then the kernel walks its stacks with frame pointers only, so at 999 Hz each
//! millisecond is about one sample of a new program unwound without its tables (a 60 ms
//! process loses ~2% of its chains per millisecond past the ~1 ms its loader takes). Counted
//! by the capture (`Capture::follow`), shown in `/status`.

/// Upper bounds of the buckets, in microseconds; the last bucket is everything above.
pub const BOUNDS_US: [u64; 6] = [500, 1_000, 2_000, 5_000, 20_000, 100_000];

/// A histogram of exec-to-registration latencies.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FollowLatency {
    /// Counts per bucket of [`BOUNDS_US`], then the count above its last bound.
    pub buckets: [u64; BOUNDS_US.len() + 1],
    pub max_us: u64,
    /// Exec'd processes whose exit was read before they were registered (in the same batch
    /// of events, or while they waited): every sample they had was walked without tables.
    pub exited_unregistered: u64,
}

impl FollowLatency {
    pub fn record(&mut self, latency_us: u64) {
        let bucket = BOUNDS_US.iter().position(|&bound| latency_us <= bound).unwrap_or(BOUNDS_US.len());
        self.buckets[bucket] += 1;
        self.max_us = self.max_us.max(latency_us);
    }

    pub fn count(&self) -> u64 {
        self.buckets.iter().sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn latencies_fall_in_the_bucket_of_their_upper_bound() {
        let mut latency = FollowLatency::default();
        for us in [0, 500, 501, 2_000, 100_000, 100_001, 3_000_000] {
            latency.record(us);
        }
        assert_eq!(latency.buckets, [2, 1, 1, 0, 0, 1, 2]);
        assert_eq!((latency.count(), latency.max_us), (7, 3_000_000));
    }
}
