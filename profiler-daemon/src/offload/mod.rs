//! Work on the files of profiled processes, off the calling thread and time-boxed.
//!
//! The daemon opens, stats, maps and reads the executables and libraries of every process it
//! profiles, to symbolize them and to build their unwind tables. Any of those calls can sleep
//! for ever when the file lives on a file system whose server does not answer: a FUSE server
//! a local user runs and stops answering, a hard-mounted NFS server that went away. On the
//! collector's thread that would stop the drains, the dumps and the socket's answers until the
//! watchdog restarted the daemon, which would then hang again on the same file.
//!
//! So each such call runs as a job on a worker thread ([`Offload::call`]). The caller waits
//! for it and keeps the daemon's [`Heartbeat`] going meanwhile. A job asleep without using
//! any CPU for [`STALL_AFTER`] is given up: its thread is left where it sleeps (a thread
//! blocked in a FUSE request its server has read cannot be interrupted, not even killed), its
//! device is marked stalled, and later jobs on that device are refused at once, until the
//! thread left behind comes back (the server answered or died). A job that keeps working (a
//! large file's debug info being parsed) is waited for up to [`BUSY_LIMIT`]; one that takes
//! longer is given up as that file's failure, not its device's. At most [`MAX_ABANDONED`]
//! threads are left behind on files, and [`MAX_ABANDONED_PERF_MAPS`] more on perf maps (a
//! lane of their own: any user writes a perf map); past that every job of the lane is
//! refused until one returns. No one user can use the whole budget: a job for a process
//! whose owner already has [`MAX_ABANDONED_PER_OWNER`] threads left behind is refused, and
//! only that owner's jobs are. Everything given up or refused is counted ([`OffloadStats`])
//! and the callers name it where it costs something (the profile's comment).
//!
//! A stall is charged where the stuck call is: a job says, as it goes, which device it is
//! working on ([`Charger::charge_to`]). A job that is still walking a path (which any
//! user can lead into a mount that never answers) is charged to no device, so a symlink
//! planted by one user cannot make every process's files on `/` be skipped.
//!
//! Handles made with [`Offload::sibling`] share the stalled devices and the counts but each
//! has its own worker, so a stall seen by the unwinder spares the symbolizer the wait.//!
//! The handle is here; [`charge`] owns what a stall is charged to, [`stuck`] the threads
//! given up on and the refusals they cause, [`worker`] the worker threads and how their
//! progress is read, and [`heartbeat`] the daemon's liveness beaten while a caller waits.

mod charge;
mod stuck;
#[cfg(test)]
mod tests;
mod worker;

use std::{
    sync::{
        atomic::Ordering,
        mpsc::{self, RecvTimeoutError},
        Arc, Mutex, MutexGuard,
    },
    time::{Duration, Instant},
};

use self::{
    charge::{decode, encode, Owner},
    stuck::{Abandoned, Shared},
    worker::{Progress, Worker},
};
pub use self::{
    charge::{Charge, Charger, Lane},
    worker::WorkerState,
};
use crate::{heartbeat::Heartbeat, procs::Device};

/// A job that has used no CPU for this long is taken to be stuck in the kernel.
pub const STALL_AFTER: Duration = Duration::from_secs(5);
/// The longest a job is waited for, even while it works.
pub const BUSY_LIMIT: Duration = Duration::from_secs(120);
/// Threads left blocked on files at most; past it every file job is refused until one
/// returns.
pub const MAX_ABANDONED: usize = 8;
/// Threads left blocked on perf maps at most, apart from the files' budget.
pub const MAX_ABANDONED_PERF_MAPS: usize = 4;
/// Threads left blocked for the processes of one owner (uid) at most: past it only that
/// owner's jobs are refused.
pub const MAX_ABANDONED_PER_OWNER: usize = 2;
/// How often a waiting caller looks at the worker (and beats the heartbeat).
const POLL: Duration = Duration::from_millis(100);

/// Why a job gave no answer.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Stall {
    #[error("{what} did not answer for {}s (device {device}); left waiting, and the device is skipped until it answers", STALL_AFTER.as_secs())]
    Stalled { what: String, device: DeviceName },
    #[error("{what} was still working after {}s; given up", BUSY_LIMIT.as_secs())]
    TooLong { what: String },
    #[error("device {device} is stalled (an earlier read never returned): {what} was skipped")]
    DeviceStalled { what: String, device: DeviceName },
    #[error("{stuck} reads are already stuck on unresponsive file systems: {what} was skipped")]
    TooManyStuck { what: String, stuck: usize },
    #[error("{MAX_ABANDONED_PER_OWNER} reads for {whose} are already stuck: {what} was skipped")]
    OwnerStuck { what: String, whose: String },
    #[error("the worker thread for {what} failed")]
    WorkerFailed { what: String },
}

/// A device, or the lack of one, for messages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceName(pub Option<Device>);

impl std::fmt::Display for DeviceName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            Some(device) => device.fmt(f),
            None => f.write_str("unknown"),
        }
    }
}

/// What the offload workers did since start, for `/status`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OffloadStats {
    /// Jobs run to their end.
    pub jobs: u64,
    /// Jobs given up (their threads left behind).
    pub stalls: u64,
    /// Jobs refused because their device was stalled, or too many threads were stuck.
    pub refused: u64,
    /// Threads left behind that came back later.
    pub recovered: u64,
    /// Threads left behind that are still stuck now.
    pub stuck_threads: usize,
    /// Of those, threads stuck on perf maps.
    pub stuck_perf_map_threads: usize,
    /// The devices skipped now.
    pub stalled_devices: Vec<Device>,
}

/// A handle on a worker thread for jobs on files, and on the stall state its siblings share.
pub struct Offload {
    name: String,
    worker: Option<Worker>,
    shared: Arc<Mutex<Shared>>,
    heartbeat: Option<Heartbeat>,
}

impl Offload {
    /// A handle whose worker thread is named `name` (at most 15 bytes show in `ps`), beating
    /// `heartbeat` while it waits.
    pub fn new(name: &str, heartbeat: Option<Heartbeat>) -> Self {
        Self { name: name.to_string(), worker: None, shared: Arc::default(), heartbeat }
    }

    /// A handle with a worker of its own, sharing the stalled devices and counts.
    pub fn sibling(&self, name: &str) -> Self {
        Self {
            name: name.to_string(),
            worker: None,
            shared: Arc::clone(&self.shared),
            heartbeat: self.heartbeat.clone(),
        }
    }

    /// Runs `job` on the worker and returns its result; `what` names the work (a file) and
    /// `charge` what a stall is charged to (the file system it touches, the process it works
    /// for), for refusals and messages. See the module docs for when it gives up.
    pub fn call<T: Send + 'static>(
        &mut self,
        what: &str,
        charge: impl Into<Charge>,
        job: impl FnOnce(&mut WorkerState) -> T + Send + 'static,
    ) -> Result<T, Stall> {
        let charge = charge.into();
        let owner = Owner::of(charge);
        {
            let mut shared = self.shared();
            shared.reap();
            if let Some(refusal) = shared.refusal(what, charge, owner) {
                shared.stats.refused += 1;
                return Err(refusal);
            }
        }
        let failed = || Stall::WorkerFailed { what: what.to_string() };
        if self.worker.is_none() {
            self.worker = Some(Worker::spawn(&self.name).map_err(|_| failed())?);
        }
        let worker = self.worker.as_ref().expect("spawned above");
        worker.current.store(encode(charge.device), Ordering::Release);
        let (tx, rx) = mpsc::channel();
        let sent = worker.jobs.send(Box::new(move |state: &mut WorkerState| {
            // The caller may have given up and gone: then nobody wants the answer.
            let _ = tx.send(job(state));
        }));
        if sent.is_err() {
            self.worker = None;
            return Err(failed());
        }
        let started = Instant::now();
        let mut progress = Progress::default();
        loop {
            match rx.recv_timeout(POLL) {
                Ok(value) => {
                    self.shared().stats.jobs += 1;
                    return Ok(value);
                }
                Err(RecvTimeoutError::Disconnected) => {
                    // The job panicked and took the thread with it.
                    self.worker = None;
                    return Err(failed());
                }
                Err(RecvTimeoutError::Timeout) => {}
            }
            if let Some(heartbeat) = &self.heartbeat {
                heartbeat.beat();
            }
            let tid = worker.tid.load(Ordering::Acquire);
            let stuck = progress.idle_for(tid) >= STALL_AFTER;
            if stuck || started.elapsed() >= BUSY_LIMIT {
                let worker = self.worker.take().expect("waited on it");
                // Only a job asleep in the kernel says its device does not answer; a slow one
                // is its file's failure.
                let device = if stuck { decode(worker.current.load(Ordering::Acquire)) } else { None };
                let mut shared = self.shared();
                shared.abandoned.push(Abandoned { device, owner, lane: charge.lane, alive: worker.alive });
                shared.stats.stalls += 1;
                let what = what.to_string();
                let err =
                    if stuck { Stall::Stalled { what, device: DeviceName(device) } } else { Stall::TooLong { what } };
                tracing::warn!("{err}");
                return Err(err);
            }
        }
    }

    /// Like [`Offload::call`], for work on a file already opened and checked (see
    /// [`crate::opened`]): run on the calling thread when it lives on a block device (a
    /// major number other than 0: a disk's file system, which no user can make stop
    /// answering, and the descriptor leaves no path to redirect), on the worker otherwise
    /// (FUSE, NFS, overlay and other anonymous devices). Saves a thread hand-off per job for
    /// the common case. A job that would open a path must use [`Offload::call`].
    pub fn run_on_opened<T: Send + 'static>(
        &mut self,
        what: &str,
        charge: Charge,
        job: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T, Stall> {
        match charge.device {
            Some(device) if device.major != 0 => {
                self.shared().stats.jobs += 1;
                Ok(job())
            }
            _ => self.call(what, charge, move |_| job()),
        }
    }

    /// What the workers of this handle and its siblings did.
    pub fn stats(&self) -> OffloadStats {
        let mut shared = self.shared();
        shared.reap();
        let mut stats = shared.stats.clone();
        stats.stuck_threads = shared.abandoned.len();
        stats.stuck_perf_map_threads = shared.abandoned.iter().filter(|a| a.lane == Lane::PerfMaps).count();
        stats.stalled_devices = shared.abandoned.iter().filter_map(|a| a.device).collect();
        stats.stalled_devices.sort_unstable();
        stats.stalled_devices.dedup();
        stats
    }

    fn shared(&self) -> MutexGuard<'_, Shared> {
        // Nothing panics while holding it; a poisoned lock still holds consistent counts.
        self.shared.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}
