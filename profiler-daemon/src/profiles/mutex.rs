//! Go's mutex profile: woken futex waits and their delay, charged to the stack of the thread
//! whose wake, unlock or requeue on the same futex word ended them (as Go charges the
//! unlocker), labelled like the block profile.

use std::collections::HashSet;

use super::{waits::drop_comments, Context, Counts, ProcessCounts};
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
    super::waits::sightings(&batch.mutex, out);
}

pub(super) fn stacks(counts: &ProcessCounts, out: &mut HashSet<StackId>) {
    counts.mutex.stacks(out);
}

pub(super) fn comments(context: Context, counters: &Counters) -> Vec<String> {
    let [drops, unwind] = drop_comments(counters);
    vec![
        format!(
            "profiler {} mutex profile: delay of woken futex waits charged to the stack of the thread whose wake, \
             unlock or requeue on the same futex word ended them (as Go charges the unlocker); condvar and other \
             non-lock waits appear too: filter with -tagfocus primitive=...; {}",
            env!("CARGO_PKG_VERSION"),
            context.describe()
        ),
        format!(
            "woken waits without a recorded waker (whole machine; not in this profile): {}",
            counters.futex.no_waker
        ),
        drops,
        unwind,
    ]
}
