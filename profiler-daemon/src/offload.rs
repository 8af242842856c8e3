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
//! large file's debug info being parsed) is waited for up to [`BUSY_LIMIT`]. At most
//! [`MAX_ABANDONED`] threads are left behind; past that every job is refused until one
//! returns. Everything given up or refused is counted ([`OffloadStats`]) and the callers name
//! it where it costs something (the profile's comment).
//!
//! Handles made with [`Offload::sibling`] share the stalled devices and the counts but each
//! has its own worker, so a stall seen by the unwinder spares the symbolizer the wait.

use std::{
    any::{Any, TypeId},
    collections::HashMap,
    sync::{
        atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering},
        mpsc::{self, RecvTimeoutError},
        Arc, Mutex, MutexGuard,
    },
    time::{Duration, Instant},
};

use crate::procs::Device;

/// A job that has used no CPU for this long is taken to be stuck in the kernel.
pub const STALL_AFTER: Duration = Duration::from_secs(5);
/// The longest a job is waited for, even while it works.
pub const BUSY_LIMIT: Duration = Duration::from_secs(120);
/// Threads left blocked at most; past it every job is refused until one returns.
pub const MAX_ABANDONED: usize = 8;
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
    #[error("{MAX_ABANDONED} reads are already stuck on unresponsive file systems: {what} was skipped")]
    TooManyStuck { what: String },
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
    /// The devices skipped now.
    pub stalled_devices: Vec<Device>,
}

/// When the daemon last showed it was alive. The collector beats it once per loop and a
/// waiting caller every [`POLL`]; the front pings systemd's watchdog only while it is
/// recent, so a collector stuck for real (not one waiting on a stuck file) is restarted.
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

/// What a worker keeps between its jobs, by type: each user stores its own (the
/// symbolizer its parsed files). Lost with the worker when a job is given up.
#[derive(Default)]
pub struct WorkerState {
    values: HashMap<TypeId, Box<dyn Any>>,
}

impl WorkerState {
    /// The worker's value of type `T`, created on first use.
    pub fn get<T: Default + 'static>(&mut self) -> &mut T {
        self.values
            .entry(TypeId::of::<T>())
            .or_insert_with(|| Box::new(T::default()))
            .downcast_mut()
            .expect("stored under its own type id")
    }
}

type Job = Box<dyn FnOnce(&mut WorkerState) + Send>;

/// One worker thread.
struct Worker {
    jobs: mpsc::Sender<Job>,
    /// Its thread id, for `/proc/self/task/TID/stat` (0 until it has started).
    tid: Arc<AtomicI32>,
    /// Cleared when the thread ends.
    alive: Arc<AtomicBool>,
}

impl Worker {
    fn spawn(name: &str) -> std::io::Result<Self> {
        let (jobs, queue) = mpsc::channel::<Job>();
        let tid = Arc::new(AtomicI32::new(0));
        let alive = Arc::new(AtomicBool::new(true));
        let (thread_tid, thread_alive) = (Arc::clone(&tid), Arc::clone(&alive));
        std::thread::Builder::new().name(name.to_string()).spawn(move || {
            // SAFETY: gettid has no preconditions.
            thread_tid.store(unsafe { libc::gettid() }, Ordering::Release);
            let mut state = WorkerState::default();
            while let Ok(job) = queue.recv() {
                job(&mut state);
            }
            thread_alive.store(false, Ordering::Release);
        })?;
        Ok(Self { jobs, tid, alive })
    }
}

/// A thread given up on, still blocked.
struct Abandoned {
    device: Option<Device>,
    alive: Arc<AtomicBool>,
}

/// What the siblings share.
#[derive(Default)]
struct Shared {
    abandoned: Vec<Abandoned>,
    stats: OffloadStats,
}

impl Shared {
    /// Forgets threads that came back, which frees their devices.
    fn reap(&mut self) {
        let before = self.abandoned.len();
        self.abandoned.retain(|a| a.alive.load(Ordering::Acquire));
        self.stats.recovered += (before - self.abandoned.len()) as u64;
    }

    fn is_stalled(&self, device: Device) -> bool {
        self.abandoned.iter().any(|a| a.device == Some(device))
    }
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
    /// `device` the file system it touches, for refusals and messages. See the module docs
    /// for when it gives up.
    pub fn call<T: Send + 'static>(
        &mut self,
        what: &str,
        device: Option<Device>,
        job: impl FnOnce(&mut WorkerState) -> T + Send + 'static,
    ) -> Result<T, Stall> {
        {
            let mut shared = self.shared();
            shared.reap();
            let refusal = if device.is_some_and(|d| shared.is_stalled(d)) {
                Some(Stall::DeviceStalled { what: what.to_string(), device: DeviceName(device) })
            } else if shared.abandoned.len() >= MAX_ABANDONED {
                Some(Stall::TooManyStuck { what: what.to_string() })
            } else {
                None
            };
            if let Some(refusal) = refusal {
                shared.stats.refused += 1;
                return Err(refusal);
            }
        }
        let failed = || Stall::WorkerFailed { what: what.to_string() };
        if self.worker.is_none() {
            self.worker = Some(Worker::spawn(&self.name).map_err(|_| failed())?);
        }
        let worker = self.worker.as_ref().expect("spawned above");
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
                let mut shared = self.shared();
                shared.abandoned.push(Abandoned { device, alive: worker.alive });
                shared.stats.stalls += 1;
                let what = what.to_string();
                let err =
                    if stuck { Stall::Stalled { what, device: DeviceName(device) } } else { Stall::TooLong { what } };
                tracing::warn!("{err}");
                return Err(err);
            }
        }
    }

    /// Like [`Offload::call`], for work that keeps no state between jobs: run on the calling
    /// thread when the file lives on a block device (a major number other than 0: a disk's
    /// file system, which no user can make stop answering), on the worker otherwise (FUSE,
    /// NFS, overlay and other anonymous devices). Saves a thread hand-off per job for the
    /// common case.
    pub fn run<T: Send + 'static>(
        &mut self,
        what: &str,
        device: Option<Device>,
        job: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T, Stall> {
        match device {
            Some(device) if device.major != 0 => {
                self.shared().stats.jobs += 1;
                Ok(job())
            }
            _ => self.call(what, device, move |_| job()),
        }
    }

    /// What the workers of this handle and its siblings did.
    pub fn stats(&self) -> OffloadStats {
        let mut shared = self.shared();
        shared.reap();
        let mut stats = shared.stats.clone();
        stats.stuck_threads = shared.abandoned.len();
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

/// Whether a worker thread moves: its CPU time and scheduler state, from
/// `/proc/self/task/TID/stat`, read only once a job has taken longer than a poll (most take
/// microseconds, and the read would cost more than the job).
struct Progress {
    cpu_ticks: Option<u64>,
    since: Instant,
}

impl Default for Progress {
    fn default() -> Self {
        Self { cpu_ticks: None, since: Instant::now() }
    }
}

impl Progress {
    /// How long the thread has used no CPU and not been runnable.
    fn idle_for(&mut self, tid: i32) -> Duration {
        match thread_cpu(tid) {
            // Running or waiting for a core is progress, and so is CPU time used since.
            Some((ticks, state)) if state == 'R' || Some(ticks) != self.cpu_ticks => {
                self.cpu_ticks = Some(ticks);
                self.since = Instant::now();
            }
            _ => {}
        }
        self.since.elapsed()
    }
}

/// A thread's user + system CPU time (clock ticks) and state letter.
fn thread_cpu(tid: i32) -> Option<(u64, char)> {
    if tid == 0 {
        return None;
    }
    let stat = std::fs::read_to_string(format!("/proc/self/task/{tid}/stat")).ok()?;
    // After "tid (comm) ": state is field 3, utime and stime fields 14 and 15.
    let mut fields = stat.rsplit_once(')')?.1.split_whitespace();
    let state = fields.next()?.chars().next()?;
    let mut rest = fields.skip(10);
    let utime: u64 = rest.next()?.parse().ok()?;
    let stime: u64 = rest.next()?.parse().ok()?;
    Some((utime + stime, state))
}

#[cfg(test)]
mod tests {
    use super::*;

    const DEVICE: Device = Device { major: 0, minor: 99 };

    #[test]
    fn jobs_run_on_the_worker_and_keep_their_state() {
        let mut offload = Offload::new("offload-test", None);
        let tid = offload.call("a tid", None, |_| unsafe { libc::gettid() }).unwrap();
        // SAFETY: gettid has no preconditions.
        assert_ne!(tid, unsafe { libc::gettid() }, "not the caller's thread");
        offload.call("count", None, |s| *s.get::<u32>() += 1).unwrap();
        assert_eq!(offload.call("count", None, |s| *s.get::<u32>()).unwrap(), 1);
        assert_eq!(offload.stats().jobs, 3);
    }

    #[test]
    fn a_panicking_job_fails_and_the_next_one_gets_a_new_worker() {
        let mut offload = Offload::new("offload-test", None);
        let err = offload.call("boom", None, |_| -> u32 { panic!("job panics") }).unwrap_err();
        assert_eq!(err, Stall::WorkerFailed { what: "boom".into() });
        assert_eq!(offload.call("after", None, |_| 7).unwrap(), 7);
    }

    /// A job that sleeps without CPU is given up after `STALL_AFTER`, its device is then
    /// skipped by every sibling, and freed once the thread comes back.
    #[test]
    fn a_sleeping_job_is_given_up_and_its_device_skipped_until_it_returns() {
        let heartbeat = Heartbeat::new();
        let mut offload = Offload::new("offload-test", Some(heartbeat.clone()));
        let mut sibling = offload.sibling("offload-test2");
        let (release, released) = mpsc::channel::<()>();
        let started = Instant::now();
        let err = offload
            .call("a hung read", Some(DEVICE), move |_| {
                let _ = released.recv();
            })
            .unwrap_err();
        assert!(matches!(err, Stall::Stalled { .. }), "{err}");
        assert!(started.elapsed() >= STALL_AFTER && started.elapsed() < STALL_AFTER * 2);
        assert!(heartbeat.age() < Duration::from_secs(1), "beaten while waiting");
        let refused = sibling.call("another read", Some(DEVICE), |_| ()).unwrap_err();
        assert!(matches!(refused, Stall::DeviceStalled { .. }), "{refused}");
        assert_eq!(sibling.call("elsewhere", None, |_| 5).unwrap(), 5, "other devices still work");
        let stats = offload.stats();
        assert_eq!((stats.stalls, stats.refused, stats.stuck_threads), (1, 1, 1));
        assert_eq!(stats.stalled_devices, vec![DEVICE]);
        // The stuck thread returns (the server answered): its device is usable again.
        release.send(()).unwrap();
        let freed = (0..50).any(|_| {
            std::thread::sleep(Duration::from_millis(20));
            offload.stats().stuck_threads == 0
        });
        assert!(freed);
        assert_eq!(offload.call("read again", Some(DEVICE), |_| 1).unwrap(), 1);
        assert_eq!(offload.stats().recovered, 1);
    }

    #[test]
    fn a_busy_job_is_not_a_stall() {
        let mut offload = Offload::new("offload-test", None);
        let spin = Duration::from_secs(6);
        let done = offload.call("a long parse", None, move |_| {
            let start = Instant::now();
            let mut x = 0u64;
            while start.elapsed() < spin {
                x = std::hint::black_box(x.wrapping_add(1));
            }
            x > 0
        });
        assert_eq!(done, Ok(true));
    }

    #[test]
    fn reads_a_threads_cpu_and_state() {
        // SAFETY: gettid has no preconditions.
        let (ticks, state) = thread_cpu(unsafe { libc::gettid() }).unwrap();
        assert_eq!(state, 'R', "this thread is running");
        assert!(ticks < u64::MAX);
        assert_eq!(thread_cpu(0), None);
    }
}
