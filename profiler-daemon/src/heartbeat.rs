//! [`Heartbeat`]: when the daemon last showed it was alive, which the front reads before it
//! pings systemd's watchdog. Its own module at the bottom floor, since both the collector and
//! the offload workers (below it) beat it.

use std::{
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

/// When the daemon last showed it was alive. The collector beats it once per loop and a
/// caller waiting on an offload worker at every poll (`offload::POLL`); the front pings
/// systemd's watchdog only while it is recent, so a collector stuck for real (not one
/// waiting on a stuck file) is restarted.
#[derive(Clone, Debug)]
pub struct Heartbeat {
    started: Instant,
    /// Milliseconds since `started` at the last beat.
    last_ms: Arc<AtomicU64>,
}

impl Default for Heartbeat {
    fn default() -> Self {
        Self::new()
    }
}

impl Heartbeat {
    pub fn new() -> Self {
        Self { started: Instant::now(), last_ms: Arc::new(AtomicU64::new(0)) }
    }

    pub fn beat(&self) {
        self.last_ms.store(self.started.elapsed().as_millis() as u64, Ordering::Relaxed);
    }

    /// Time since the last beat.
    pub fn age(&self) -> Duration {
        let last = Duration::from_millis(self.last_ms.load(Ordering::Relaxed));
        self.started.elapsed().saturating_sub(last)
    }
}
