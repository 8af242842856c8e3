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

use crate::{ids::Pid, procs::Device};

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

/// Which budget of stuck threads a job draws on.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Lane {
    /// Mapped files (executables, libraries) and the daemon's own work.
    #[default]
    Files,
    /// Perf maps (`/tmp/perf-PID.map`), which any user writes.
    PerfMaps,
}

/// What a job's stall is charged to: the device it starts on (it may say another as it
/// goes: [`Charger::charge_to`]), the process it works for (whose owner's share it
/// uses), and its lane.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Charge {
    pub device: Option<Device>,
    pub pid: Option<Pid>,
    pub lane: Lane,
}

impl Charge {
    /// Work on a file of `device` for process `pid`.
    pub fn file(device: Device, pid: Pid) -> Self {
        Self { device: Some(device), pid: Some(pid), lane: Lane::Files }
    }

    /// Work for process `pid` on no known device yet (a path still to be walked).
    pub fn path(pid: Pid) -> Self {
        Self { device: None, pid: Some(pid), lane: Lane::Files }
    }

    /// A perf map of process `pid`.
    pub fn perf_map(pid: Pid) -> Self {
        Self { device: None, pid: Some(pid), lane: Lane::PerfMaps }
    }

    /// The daemon's own work (closing files): no device, no process.
    pub fn internal() -> Self {
        Self::default()
    }
}

impl From<Option<Device>> for Charge {
    fn from(device: Option<Device>) -> Self {
        Self { device, ..Self::default() }
    }
}

/// A job's way to say where it works.
#[derive(Clone, Debug, Default)]
pub struct Charger(CurrentDevice);

impl Charger {
    /// Says which device the job works on from now on (`None`: a path walk, which may lead
    /// anywhere): a stall from here on is charged to it.
    pub fn charge_to(&self, device: Option<Device>) {
        self.0.store(encode(device), Ordering::Release);
    }
}

/// The device a worker's current job says it is working on, shared with its caller: a
/// device's `major << 32 | minor`, or [`NO_DEVICE`].
type CurrentDevice = Arc<AtomicU64>;
const NO_DEVICE: u64 = u64::MAX;

fn encode(device: Option<Device>) -> u64 {
    device.map_or(NO_DEVICE, |d| (u64::from(d.major) << 32) | u64::from(d.minor))
}

fn decode(word: u64) -> Option<Device> {
    (word != NO_DEVICE).then_some(Device { major: (word >> 32) as u32, minor: word as u32 })
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
    current: CurrentDevice,
}

impl WorkerState {
    /// What the job uses to say which device it works on (see [`Charger::charge_to`]).
    pub fn charger(&self) -> Charger {
        Charger(Arc::clone(&self.current))
    }

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
    /// The device its job works on now.
    current: CurrentDevice,
}

impl Worker {
    fn spawn(name: &str) -> std::io::Result<Self> {
        let (jobs, queue) = mpsc::channel::<Job>();
        let tid = Arc::new(AtomicI32::new(0));
        let alive = Arc::new(AtomicBool::new(true));
        let current: CurrentDevice = Arc::new(AtomicU64::new(NO_DEVICE));
        let (thread_tid, thread_alive) = (Arc::clone(&tid), Arc::clone(&alive));
        let thread_current = Arc::clone(&current);
        std::thread::Builder::new().name(name.to_string()).spawn(move || {
            // SAFETY: gettid has no preconditions.
            thread_tid.store(unsafe { libc::gettid() }, Ordering::Release);
            let mut state = WorkerState { current: thread_current, ..WorkerState::default() };
            while let Ok(job) = queue.recv() {
                job(&mut state);
            }
            thread_alive.store(false, Ordering::Release);
        })?;
        Ok(Self { jobs, tid, alive, current })
    }
}

/// A thread given up on, still blocked.
struct Abandoned {
    /// The device it is stuck on; `None` for a path walk, or a job that was only slow.
    device: Option<Device>,
    /// Whose share it uses.
    owner: Owner,
    lane: Lane,
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

    /// Why a job with `charge` for `owner` must not run now, if it must not.
    fn refusal(&self, what: &str, charge: Charge, owner: Owner) -> Option<Stall> {
        let what = what.to_string();
        if charge.lane == Lane::Files {
            if let Some(device) = charge.device.filter(|&d| self.is_stalled(d)) {
                return Some(Stall::DeviceStalled { what, device: DeviceName(Some(device)) });
            }
        }
        let cap = match charge.lane {
            Lane::Files => MAX_ABANDONED,
            Lane::PerfMaps => MAX_ABANDONED_PERF_MAPS,
        };
        let stuck = self.abandoned.iter().filter(|a| a.lane == charge.lane).count();
        if stuck >= cap {
            return Some(Stall::TooManyStuck { what, stuck });
        }
        let owned = self.abandoned.iter().filter(|a| a.owner == owner).count();
        match owner {
            Owner::Daemon => None,
            Owner::Uid(uid) if owned >= MAX_ABANDONED_PER_OWNER => {
                Some(Stall::OwnerStuck { what, whose: format!("uid {uid}'s processes") })
            }
            // Processes gone before their owner was read share one owner's share: exiting
            // must not free a user from theirs.
            Owner::Gone if owned >= MAX_ABANDONED_PER_OWNER => {
                Some(Stall::OwnerStuck { what, whose: "processes gone before their owner was read".into() })
            }
            _ => None,
        }
    }
}

/// Whose share of stuck threads a job uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Owner {
    /// The daemon's own work (no process).
    Daemon,
    /// The real uid of the process it works for.
    Uid(u32),
    /// A process already gone when the job was asked for.
    Gone,
}

impl Owner {
    /// Read when the job is asked for (by the time it stalls, its process may be gone):
    /// the real uid from `/proc/PID/status` (the directory's owner would be root for a
    /// process that made itself undumpable).
    fn of(charge: Charge) -> Self {
        match charge.pid {
            None => Owner::Daemon,
            Some(pid) => crate::procs::read_credentials(pid.0).map_or(Owner::Gone, |c| Owner::Uid(c.uids[0])),
        }
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

    /// A job stuck while walking a path (it said so) leaves its device usable; a perf map's
    /// stall is counted in its own lane; an owner with two threads stuck gets no third
    /// while others still get theirs.
    #[test]
    fn stalls_are_charged_where_they_are_and_to_whom() {
        let own = Pid(std::process::id());
        let offload = Offload::new("offload-test", None);
        let (release, released) = mpsc::channel::<()>();
        let released = Arc::new(Mutex::new(released));
        // Both stalls at once, on two siblings: one STALL_AFTER in all.
        let stalls: Vec<_> = [Charge::file(DEVICE, own), Charge::perf_map(own)]
            .into_iter()
            .map(|charge| {
                let mut sibling = offload.sibling("offload-test");
                let released = Arc::clone(&released);
                std::thread::spawn(move || {
                    sibling.call("a hung walk", charge, move |state| {
                        state.charger().charge_to(None);
                        let _ = released.lock().unwrap().recv();
                    })
                })
            })
            .collect();
        for stall in stalls {
            let err = stall.join().unwrap().unwrap_err();
            assert!(matches!(err, Stall::Stalled { device: DeviceName(None), .. }), "{err}");
        }
        let mut other = offload.sibling("offload-test");
        let stats = other.stats();
        assert_eq!((stats.stuck_threads, stats.stuck_perf_map_threads), (2, 1));
        assert!(stats.stalled_devices.is_empty(), "a path walk names no device");
        let refused = other.call("a third read", Charge::file(DEVICE, own), |_| ()).unwrap_err();
        assert!(matches!(refused, Stall::OwnerStuck { .. }), "{refused}");
        assert_eq!(other.call("the daemon's own work", None, |_| 3).unwrap(), 3, "others still run");
        release.send(()).unwrap();
        release.send(()).unwrap();
        let freed = (0..50).any(|_| {
            std::thread::sleep(Duration::from_millis(20));
            other.stats().stuck_threads == 0
        });
        assert!(freed);
        assert_eq!(other.call("after", Charge::file(DEVICE, own), |_| 4).unwrap(), 4);
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
