//! Per-uid gates in front of the costly requests, decided before the collector is asked.
//!
//! A thread dump costs collector time in proportion to the target's threads (every thread's
//! stack is read and walked), and the connection limits bound requests in flight, not that
//! time: a few clients looping dumps of a process with thousands of threads held up every
//! other answer for seconds. So each uid other than root may have one dump in flight and a
//! budget of dumps over time (a token bucket: [`DUMP_BURST`] at once, one more every
//! [`DUMP_REFILL`]); past either it gets a 429 that says when to retry. Root is exempt: it
//! can stop the daemon anyway, and its tools must not be refused by other users' use.
//!
//! Flame graphs are drawn off the async front, but each one holds a blocking thread and up to
//! a hundred MB while it draws: one uid draws one at a time, later ones wait their turn, and
//! at most [`FLAMES_AT_ONCE`] are drawn at once in all.
//!
//! The decision is [`admit_dump`], a pure function of a uid's ledger and the time, so it is
//! unit-tested; [`Gates`] holds the ledgers and applies it.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex, PoisonError},
    time::{Duration, Instant},
};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::control::Viewer;

/// Thread dumps a uid other than root may take at once after a quiet spell.
pub const DUMP_BURST: u32 = 5;
/// How often a uid other than root earns one more dump (10 a minute, sustained).
pub const DUMP_REFILL: Duration = Duration::from_secs(6);

/// Flame graphs drawn at once, all uids together (a CPU each, on a small machine).
pub const FLAMES_AT_ONCE: usize = 2;

/// One uid's dump budget.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DumpLedger {
    /// Dumps it may start now.
    pub tokens: u32,
    /// When `tokens` was last brought up to date (a partial refill is kept by not moving it
    /// past the last whole token earned).
    pub refilled: Instant,
    /// A dump of it is being taken.
    pub in_flight: bool,
}

impl DumpLedger {
    /// A uid not seen before: a full burst.
    pub fn new(now: Instant) -> Self {
        Self { tokens: DUMP_BURST, refilled: now, in_flight: false }
    }
}

/// Why a dump was refused, and when to retry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DumpRefusal {
    /// The uid's previous dump is still being taken.
    InFlight,
    /// The uid used its budget; one more dump is earned after `retry_after`.
    Budget { retry_after: Duration },
}

impl DumpRefusal {
    /// Seconds to put in `Retry-After` (at least 1).
    pub fn retry_after_secs(self) -> u64 {
        match self {
            Self::InFlight => 1,
            Self::Budget { retry_after } => retry_after.as_secs() + u64::from(retry_after.subsec_nanos() > 0),
        }
    }

    /// The 429's body.
    pub fn message(self, uid: u32) -> String {
        match self {
            Self::InFlight => format!(
                "a thread dump for uid {uid} is already being taken; one at a time per user: retry when it is done"
            ),
            Self::Budget { .. } => format!(
                "uid {uid} took its {DUMP_BURST} thread dumps allowed at once (one more every {}s); retry in {}s",
                DUMP_REFILL.as_secs(),
                self.retry_after_secs()
            ),
        }
    }
}

/// Whether a uid with `ledger` may start a dump at `now`: the ledger after the dump starts,
/// or why not. Tokens earned since `ledger.refilled` are added first (up to the burst).
pub fn admit_dump(ledger: DumpLedger, now: Instant) -> Result<DumpLedger, DumpRefusal> {
    let ledger = refill(ledger, now);
    if ledger.in_flight {
        return Err(DumpRefusal::InFlight);
    }
    if ledger.tokens == 0 {
        let due = ledger.refilled + DUMP_REFILL;
        return Err(DumpRefusal::Budget { retry_after: due.saturating_duration_since(now) });
    }
    Ok(DumpLedger { tokens: ledger.tokens - 1, in_flight: true, ..ledger })
}

/// `ledger` with the whole tokens earned by `now`.
fn refill(ledger: DumpLedger, now: Instant) -> DumpLedger {
    let elapsed = now.saturating_duration_since(ledger.refilled);
    let earned = (elapsed.as_nanos() / DUMP_REFILL.as_nanos()).min(u128::from(DUMP_BURST)) as u32;
    if ledger.tokens + earned >= DUMP_BURST {
        return DumpLedger { tokens: DUMP_BURST, refilled: now, ..ledger };
    }
    DumpLedger { tokens: ledger.tokens + earned, refilled: ledger.refilled + DUMP_REFILL * earned, ..ledger }
}

/// The ledgers of every uid, shared by the connections; cheap to clone.
#[derive(Clone, Debug)]
pub struct Gates {
    dumps: Arc<Mutex<HashMap<u32, DumpLedger>>>,
    /// Each uid's turn to draw.
    flames: Arc<Mutex<HashMap<u32, Arc<Semaphore>>>>,
    /// [`FLAMES_AT_ONCE`] permits.
    drawing: Arc<Semaphore>,
}

impl Default for Gates {
    fn default() -> Self {
        Self { dumps: Arc::default(), flames: Arc::default(), drawing: Arc::new(Semaphore::new(FLAMES_AT_ONCE)) }
    }
}

/// A uid's turn to draw a flame graph, and one of the [`FLAMES_AT_ONCE`] places.
#[derive(Debug)]
pub struct FlameTurn {
    _uid: OwnedSemaphorePermit,
    _drawing: OwnedSemaphorePermit,
}

/// A dump admitted: its uid's dump is in flight until this is dropped.
#[derive(Debug)]
pub struct DumpPermit {
    gates: Option<(Gates, u32)>,
}

impl Drop for DumpPermit {
    fn drop(&mut self) {
        if let Some((gates, uid)) = self.gates.take() {
            let mut dumps = gates.dumps.lock().unwrap_or_else(PoisonError::into_inner);
            if let Some(ledger) = dumps.get_mut(&uid) {
                ledger.in_flight = false;
            }
        }
    }
}

impl Gates {
    /// Admits a thread dump for `viewer` now, or says why not (see [`admit_dump`]).
    pub fn dump(&self, viewer: Viewer) -> Result<DumpPermit, DumpRefusal> {
        if viewer == Viewer::ROOT {
            return Ok(DumpPermit { gates: None });
        }
        let now = Instant::now();
        let mut dumps = self.dumps.lock().unwrap_or_else(PoisonError::into_inner);
        // A ledger back at a full burst says nothing a new one would not: forget it, so the
        // map holds only uids that dumped in the last half minute.
        dumps.retain(|_, ledger| ledger.in_flight || refill(*ledger, now).tokens < DUMP_BURST);
        let ledger = dumps.get(&viewer.uid).copied().unwrap_or_else(|| DumpLedger::new(now));
        dumps.insert(viewer.uid, admit_dump(ledger, now)?);
        Ok(DumpPermit { gates: Some((self.clone(), viewer.uid)) })
    }

    /// Waits for `viewer`'s turn to draw a flame graph, then for a place among those drawn
    /// at once; both last until the turn is dropped.
    pub async fn flame_turn(&self, viewer: Viewer) -> FlameTurn {
        let turn = {
            let mut flames = self.flames.lock().unwrap_or_else(PoisonError::into_inner);
            // Nobody holds or waits for these (only the map has them): forget them.
            flames.retain(|_, turn| Arc::strong_count(turn) > 1);
            Arc::clone(flames.entry(viewer.uid).or_insert_with(|| Arc::new(Semaphore::new(1))))
        };
        let uid = turn.acquire_owned().await.expect("a flame graph turn is never closed");
        let drawing = Arc::clone(&self.drawing).acquire_owned().await.expect("flame graph places are never closed");
        FlameTurn { _uid: uid, _drawing: drawing }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ledger(tokens: u32, at: Instant) -> DumpLedger {
        DumpLedger { tokens, refilled: at, in_flight: false }
    }

    #[test]
    fn a_new_uid_has_a_burst_then_waits_for_the_refill() {
        let t0 = Instant::now();
        let mut l = DumpLedger::new(t0);
        for _ in 0..DUMP_BURST {
            l = admit_dump(l, t0).expect("within the burst");
            l.in_flight = false;
        }
        assert_eq!(admit_dump(l, t0), Err(DumpRefusal::Budget { retry_after: DUMP_REFILL }));
        let later = t0 + DUMP_REFILL / 2;
        assert_eq!(admit_dump(l, later), Err(DumpRefusal::Budget { retry_after: DUMP_REFILL / 2 }));
        let l = admit_dump(l, t0 + DUMP_REFILL).expect("one earned");
        assert_eq!(l.tokens, 0);
        assert_eq!(l.refilled, t0 + DUMP_REFILL, "the refill clock moves by whole tokens");
    }

    #[test]
    fn one_dump_in_flight_per_uid_whatever_its_budget() {
        let t0 = Instant::now();
        let l = admit_dump(DumpLedger::new(t0), t0).unwrap();
        assert!(l.in_flight);
        assert_eq!(admit_dump(l, t0 + DUMP_REFILL * 10), Err(DumpRefusal::InFlight));
    }

    #[test]
    fn partial_refills_are_kept_and_the_burst_caps_the_savings() {
        let t0 = Instant::now();
        // 2.5 periods: 2 tokens earned, the half period still counts toward the next one.
        let l = refill(ledger(0, t0), t0 + DUMP_REFILL * 5 / 2);
        assert_eq!((l.tokens, l.refilled), (2, t0 + DUMP_REFILL * 2));
        let l = refill(l, t0 + DUMP_REFILL * 3);
        assert_eq!(l.tokens, 3);
        let idle = refill(ledger(1, t0), t0 + DUMP_REFILL * 1000);
        assert_eq!(idle.tokens, DUMP_BURST, "an idle uid saves at most a burst");
        // A clock that appears to go back earns nothing.
        assert_eq!(refill(ledger(1, t0 + DUMP_REFILL), t0).tokens, 1);
    }

    #[test]
    fn refusals_say_when_to_retry_in_whole_seconds() {
        let r = DumpRefusal::Budget { retry_after: Duration::from_millis(4_200) };
        assert_eq!(r.retry_after_secs(), 5);
        assert!(r.message(65534).contains("retry in 5s"), "{}", r.message(65534));
        assert!(DumpRefusal::InFlight.message(7).contains("already being taken"));
    }

    #[test]
    fn root_is_exempt_and_others_are_counted_apart() {
        let gates = Gates::default();
        let roots: Vec<_> = (0..2 * DUMP_BURST).map(|_| gates.dump(Viewer::ROOT)).collect();
        assert!(roots.iter().all(Result::is_ok), "root is never refused");
        let first = gates.dump(Viewer { uid: 1000 }).expect("a first dump");
        assert_eq!(gates.dump(Viewer { uid: 1000 }).unwrap_err(), DumpRefusal::InFlight);
        let other = gates.dump(Viewer { uid: 1001 }).expect("another uid's own budget");
        drop((first, other));
        for _ in 1..DUMP_BURST {
            drop(gates.dump(Viewer { uid: 1000 }).expect("the rest of the burst"));
        }
        assert!(matches!(gates.dump(Viewer { uid: 1000 }), Err(DumpRefusal::Budget { .. })));
    }

    #[tokio::test(flavor = "current_thread")]
    async fn flame_graphs_of_one_uid_take_turns() {
        let gates = Gates::default();
        let turn = gates.flame_turn(Viewer { uid: 5 }).await;
        let other = tokio::time::timeout(Duration::from_secs(5), gates.flame_turn(Viewer { uid: 6 })).await;
        assert!(other.is_ok(), "another uid does not wait");
        let same = tokio::time::timeout(Duration::from_millis(50), gates.flame_turn(Viewer { uid: 5 })).await;
        assert!(same.is_err(), "the same uid waits while its turn is held");
        drop(turn);
        let next = tokio::time::timeout(Duration::from_secs(5), gates.flame_turn(Viewer { uid: 5 })).await;
        assert!(next.is_ok(), "and gets its turn when the first is done");
    }
}
