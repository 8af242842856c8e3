//! Go's mutex profile: woken futex waits and their delay, charged to the stack of the thread
//! whose wake, unlock or requeue on the same futex word ended them (as Go charges the
//! unlocker), labelled like the block profile.

use std::collections::HashSet;

use super::{contention::drop_comments, Context, Counts, ProcessCounts, Settings};
use crate::{
    catalog::Sighting,
    ebpf::{Batch, Counters},
    ids::StackId,
};

pub(super) fn count(batch: &Batch, counts: &mut Counts) {
    for raw in &batch.mutex {
        counts.process_mut(raw.pid).mutex.add(raw);
    }
}

pub(super) fn sightings<'a>(batch: &'a Batch, out: &mut Vec<Sighting<'a>>) {
    super::contention::sightings(&batch.mutex, out);
}

pub(super) fn stacks(counts: &ProcessCounts, out: &mut HashSet<StackId>) {
    counts.mutex.stacks(out);
}

pub(super) fn comments(context: Context, counters: &Counters, settings: &Settings) -> Vec<String> {
    let [drops, unwind] = drop_comments(counters);
    vec![
        format!(
            "profiler {} mutex profile: delay of woken futex waits charged to the stack of the thread whose wake or \
             unlock on the same futex word ended them (as Go charges the unlocker; a waiter a requeue moved to \
             another word: to that word's next wake, the unlock that woke it); locks only: waits \
             ended by a condvar signal or broadcast, a semaphore post, a barrier or a once are in the block \
             profile, not here; {}",
            env!("CARGO_PKG_VERSION"),
            context.describe()
        ),
        format!(
            "woken waits without a recorded waker (whole machine; not in this profile): {}; charged through a \
             requeue to the unlock that woke them (whole machine): {}",
            counters.futex.no_waker, counters.futex.requeued
        ),
        format!(
            "sampling: decided at the wake by what its waiters have waited so far (s, bounded by the time since \
             the word's previous wake): a wake with s at least the block rate ({} ns) records its stack, one \
             with a shorter s with probability s/rate, and each wait it ends is charged its own delay times \
             rate/s (unbiased); mutex fraction {}: 1 in {} of those, values scaled by {}; woken waits whose wake \
             was not sampled (whole machine): {}",
            settings.block_rate_ns.max(1),
            settings.mutex_fraction.max(1),
            settings.mutex_fraction.max(1),
            settings.mutex_fraction.max(1),
            counters.futex.mutex_unsampled
        ),
        drops,
        unwind,
    ]
}
