//! Go's threadcreate profile: threads created (clones with `CLONE_THREAD`), by creating
//! stack, `threadcreate/count`.

use std::collections::{HashMap, HashSet};

use super::{unwind_comment, Context, Counts};
use crate::{
    catalog::Sighting,
    ebpf::{Batch, Counters},
    ids::StackId,
    pprof::Shape,
    resolve::StackSample,
};

/// Taken in the creating thread's `clone`: the leaf is the syscall's return point.
const USER_LEAF_IS_RETURN: bool = true;

/// One process's thread creations in a window.
#[derive(Clone, Debug, Default)]
pub struct ThreadCounts {
    /// Threads created, by creating stack.
    pub created: HashMap<StackId, u64>,
}

impl ThreadCounts {
    /// Threads created in the window.
    pub fn total(&self) -> u64 {
        self.created.values().sum()
    }
}

pub(super) fn count(batch: &Batch, counts: &mut Counts) {
    for raw in &batch.threadcreate {
        *counts.process_mut(raw.pid).threadcreate.created.entry(raw.stack).or_default() += raw.count;
    }
}

pub(super) fn sightings<'a>(batch: &'a Batch, out: &mut Vec<Sighting<'a>>) {
    out.extend(batch.threadcreate.iter().map(|t| Sighting {
        pid: t.pid,
        user_stack: t.stack,
        kernel_stack: StackId::NONE,
        user_leaf_is_return: USER_LEAF_IS_RETURN,
        main_thread_name: None,
    }));
}

pub(super) fn stacks(counts: &ThreadCounts, out: &mut HashSet<StackId>) {
    out.extend(counts.created.keys().copied());
}

pub(super) const SHAPE: Shape = Shape {
    sample_types: &[("threadcreate", "count")],
    period_type: ("threadcreate", "count"),
    period: 1,
    default_sample_type: "threadcreate",
};

pub(super) fn samples(counts: &ThreadCounts) -> Vec<StackSample> {
    let mut stacks: Vec<(StackId, u64)> = counts.created.iter().map(|(&s, &n)| (s, n)).collect();
    stacks.sort_unstable();
    stacks
        .into_iter()
        .map(|(stack, count)| StackSample {
            user_stack: stack,
            kernel_stack: StackId::NONE,
            user_leaf_is_return: USER_LEAF_IS_RETURN,
            values: vec![count as i64],
            unscaled: Vec::new(),
            labels: Vec::new(),
        })
        .collect()
}

pub(super) fn comments(context: Context, counters: &Counters) -> Vec<String> {
    let t = counters.threadcreate;
    vec![
        format!(
            "profiler {} threadcreate profile: clones with CLONE_THREAD by creating stack (forks are not counted); {}",
            env!("CARGO_PKG_VERSION"),
            context.describe()
        ),
        format!("dropped (whole machine): threadcreate map full {}; stacks lost {}", t.map_full, t.stack_lost),
        unwind_comment(counters),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ebpf::RawThreadCount, ids::Pid};

    #[test]
    fn counts_threads_per_creating_stack() {
        let batch = Batch {
            threadcreate: vec![RawThreadCount { pid: Pid(3), stack: StackId(9), count: 4 }],
            ..Batch::default()
        };
        let mut counts = Counts::default();
        count(&batch, &mut counts);
        count(&batch, &mut counts);
        let threads = &counts.process(Pid(3)).unwrap().threadcreate;
        assert_eq!(threads.total(), 8);
        assert_eq!(samples(threads)[0].values, [8]);
    }
}
