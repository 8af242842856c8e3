//! Go's block profile: completed futex waits and their total delay, by the waiting stack,
//! labelled with the futex operation, how the wait ended and the waiting primitive.

use std::collections::HashSet;

use super::{contention::drop_comments, Context, Counts, ProcessCounts, Settings};
use crate::{
    catalog::Sighting,
    ebpf::{Batch, Counters},
    ids::StackId,
};

pub(super) fn count(batch: &Batch, counts: &mut Counts) {
    for raw in &batch.block {
        counts.process_mut(raw.pid).block.add(raw);
    }
}

pub(super) fn sightings<'a>(batch: &'a Batch, out: &mut Vec<Sighting<'a>>) {
    super::contention::sightings(&batch.block, out);
}

pub(super) fn stacks(counts: &ProcessCounts, out: &mut HashSet<StackId>) {
    counts.block.stacks(out);
}

pub(super) fn comments(context: Context, counters: &Counters, settings: &Settings) -> Vec<String> {
    let [drops, unwind] = drop_comments(counters);
    vec![
        format!(
            "profiler {} block profile: futex waits (FUTEX_WAIT, WAIT_BITSET, LOCK_PI, LOCK_PI2, WAIT_REQUEUE_PI, \
             futex2 futex_wait/futex_waitv) by waiting stack, delay = syscall exit - entry; labels: primitive \
             (the locking function on the stack), futex_op, outcome (timed out and interrupted waits count too); {}",
            env!("CARGO_PKG_VERSION"),
            context.describe()
        ),
        format!(
            "sampling: block rate {} ns: waits at least that long are all recorded, a shorter one of length d \
             with probability d/rate and then counted as rate/d waits of rate ns in all (Go's unbiasing); \
             shorter waits left out (whole machine): {}",
            settings.block_rate_ns.max(1),
            counters.futex.block_unsampled
        ),
        drops,
        unwind,
    ]
}
