//! What the two contention profiles, block and mutex, share: futex waits counted by (op,
//! outcome, stack), Go's contention shape (`contentions/count`, `delay/nanoseconds`), and the
//! `futex_op`, `outcome` and `primitive` labels. Each profile says which stack a wait is
//! counted under (the waiter's in block, the waker's in mutex).

use std::collections::{HashMap, HashSet};

use profiler_common::{WaitOp, WaitOutcome, WAIT_COUNT_ONE};

use super::{primitive, unwind_comment};
use crate::{
    catalog::Sighting,
    ebpf::{Counters, FutexCounters, RawWaitTotals},
    ids::StackId,
    pprof::Shape,
    resolve::{LabelValue, ResolvedProfile, StackSample},
};

/// Taken in the syscall: the leaf is the return point of the syscall instruction.
const USER_LEAF_IS_RETURN: bool = true;

/// What futex waits are counted under inside one process: the waiting operation, how it
/// ended, and the stack (the waiter's in the block profile, the waker's in the mutex profile).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct WaitSite {
    /// A `profiler_common::WaitOp` as its `u16`.
    pub op: u16,
    /// A `profiler_common::WaitOutcome` as its `u16`.
    pub outcome: u16,
    pub stack: StackId,
}

/// Completed waits: how many and their summed delay.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WaitCount {
    /// In 1/`WAIT_COUNT_ONE` (the kernel's fixed point: sampled short waits count rate/d).
    pub count: u64,
    pub delay_ns: u64,
}

/// One process's waits in a window (block or mutex).
#[derive(Clone, Debug, Default)]
pub struct WaitCounts {
    pub sites: HashMap<WaitSite, WaitCount>,
}

impl WaitCounts {
    pub(super) fn add(&mut self, raw: &RawWaitTotals) {
        let site = WaitSite { op: raw.op, outcome: raw.outcome, stack: raw.stack };
        let total = self.sites.entry(site).or_default();
        total.count += raw.count;
        total.delay_ns = total.delay_ns.saturating_add(raw.delay_ns);
    }

    /// Waits in the window.
    pub fn waits(&self) -> u64 {
        whole(self.sites.values().map(|w| w.count).sum())
    }

    pub(super) fn stacks(&self, out: &mut HashSet<StackId>) {
        out.extend(self.sites.keys().map(|site| site.stack));
    }

    /// The samples, values multiplied by `scale` (the mutex fraction; 1 for block, whose
    /// kernel counts are already unbiased). Scaled values keep the sampled ones for Go's
    /// text form, which states the period instead.
    pub(super) fn samples(&self, scale: u32) -> Vec<StackSample> {
        let scale = i64::from(scale.max(1));
        let mut sites: Vec<(&WaitSite, &WaitCount)> = self.sites.iter().collect();
        sites.sort_unstable_by_key(|(site, _)| **site);
        sites
            .into_iter()
            .map(|(site, wait)| {
                let op = WaitOp::from_u16(site.op).map_or("unknown", WaitOp::name);
                let outcome = WaitOutcome::from_u16(site.outcome).map_or("unknown", WaitOutcome::name);
                let sampled = [whole(wait.count) as i64, wait.delay_ns.min(i64::MAX as u64) as i64];
                StackSample {
                    user_stack: site.stack,
                    kernel_stack: StackId::NONE,
                    user_leaf_is_return: USER_LEAF_IS_RETURN,
                    values: if scale == 1 {
                        sampled.to_vec()
                    } else {
                        vec![whole(wait.count.saturating_mul(scale as u64)) as i64, sampled[1].saturating_mul(scale)]
                    },
                    unscaled: if scale == 1 { Vec::new() } else { sampled.to_vec() },
                    labels: vec![
                        ("futex_op", LabelValue::Str(op.into())),
                        ("outcome", LabelValue::Str(outcome.into())),
                    ],
                }
            })
            .collect()
    }
}

/// Waits from the kernel's fixed point, rounded.
fn whole(count: u64) -> u64 {
    count.saturating_add(WAIT_COUNT_ONE / 2) / WAIT_COUNT_ONE
}

pub(super) fn sightings<'a>(waits: &'a [RawWaitTotals], out: &mut Vec<Sighting<'a>>) {
    out.extend(waits.iter().map(|w| Sighting {
        pid: w.pid,
        user_stack: w.stack,
        kernel_stack: StackId::NONE,
        user_leaf_is_return: USER_LEAF_IS_RETURN,
        main_thread_name: None,
    }));
}

/// The shape of Go's block and mutex profiles.
pub(super) const SHAPE: Shape = Shape {
    sample_types: &[("contentions", "count"), ("delay", "nanoseconds")],
    period_type: ("contentions", "count"),
    period: 1,
    default_sample_type: "delay",
};

/// After symbolization: the `primitive` label, named from the frames.
pub(super) fn label(resolved: &mut ResolvedProfile) {
    primitive::label(resolved);
}

/// Wakes that release no lock: a wait they end is a condition, a semaphore or a one-time
/// event, which Go's mutex profile leaves to the block profile.
const NOT_LOCK_RELEASES: &[&str] = &[
    "pthread_cond_signal",
    "pthread_cond_broadcast",
    "sem_post",
    "pthread_barrier_wait",
    "pthread_once",
    "std::sync::Condvar::notify_one",
    "std::sync::Condvar::notify_all",
    "std::thread::Thread::unpark",
    "std::sync::Once",
];

/// The mutex profile's labels, then only lock releases kept: a sample whose waking stack
/// signals a condition variable or posts a semaphore is dropped (those waits stay in the
/// block profile, under the waiter). Returns the comment line that counts what was dropped,
/// so the kernel's count of charged waits still adds up.
pub(super) fn label_locks_only(resolved: &mut ResolvedProfile) -> String {
    primitive::label(resolved);
    // The values are SHAPE's: contentions, delay.
    let (mut samples, mut contentions, mut delay_ns) = (0usize, 0i64, 0i64);
    resolved.samples.retain(|sample| {
        let released_no_lock = sample.labels.iter().any(|(key, value)| {
            *key == primitive::LABEL
                && matches!(value, LabelValue::Str(name) if NOT_LOCK_RELEASES.contains(&name.as_str()))
        });
        if released_no_lock {
            samples += 1;
            contentions = contentions.saturating_add(sample.values[0]);
            delay_ns = delay_ns.saturating_add(sample.values[1]);
        }
        !released_no_lock
    });
    format!(
        "locks only: left out {samples} stacks that woke waiters without releasing a lock (condvar signal or \
         broadcast, semaphore post, barrier, once, unpark), {contentions} contentions and {delay_ns} ns in all \
         (scaled as the samples are); those waits are in the block profile under the waiter"
    )
}

/// The comment lines both profiles end with: drops and the unwinder's counts.
pub(super) fn drop_comments(counters: &Counters) -> [String; 2] {
    [futex_drops(&counters.futex), unwind_comment(counters)]
}

fn futex_drops(f: &FutexCounters) -> String {
    format!(
        "dropped waits (whole machine): in-flight map full {}, block map full {}, mutex map full {}, waker map \
         update failed {}; stacks lost (counted without frames) {}",
        f.pending_map_full, f.block_map_full, f.mutex_map_full, f.waker_map_full, f.stack_lost
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::Pid;

    #[test]
    fn samples_carry_op_and_outcome_and_outcomes_stay_apart() {
        let mut waits = WaitCounts::default();
        let raw = RawWaitTotals {
            pid: Pid(1),
            op: WaitOp::WaitBitset as u16,
            outcome: WaitOutcome::TimedOut as u16,
            stack: StackId(7),
            count: 2 * WAIT_COUNT_ONE,
            delay_ns: 5_000,
        };
        waits.add(&raw);
        waits.add(&raw);
        waits.add(&RawWaitTotals { outcome: WaitOutcome::Woken as u16, ..raw });
        assert_eq!((waits.sites.len(), waits.waits()), (2, 6));
        let samples = waits.samples(1);
        let timed_out = samples.iter().find(|s| s.labels[1].1 == LabelValue::Str("timed_out".into())).unwrap();
        assert_eq!(timed_out.values, [4, 10_000]);
        assert_eq!(timed_out.labels[0], ("futex_op", LabelValue::Str("FUTEX_WAIT_BITSET".into())));
        assert!(timed_out.user_leaf_is_return);
        let scaled = waits.samples(5);
        assert_eq!(scaled[0].values.len(), 2);
        let timed_out = scaled.iter().find(|s| s.labels[1].1 == LabelValue::Str("timed_out".into())).unwrap();
        assert_eq!((timed_out.values.clone(), timed_out.unscaled.clone()), (vec![20, 50_000], vec![4, 10_000]));
    }

    #[test]
    fn fractional_counts_add_up_before_rounding() {
        let mut waits = WaitCounts::default();
        let raw = RawWaitTotals {
            pid: Pid(1),
            op: 0,
            outcome: 0,
            stack: StackId(7),
            count: WAIT_COUNT_ONE * 3 / 2,
            delay_ns: 100,
        };
        waits.add(&raw);
        waits.add(&raw);
        assert_eq!(waits.waits(), 3);
    }
}
