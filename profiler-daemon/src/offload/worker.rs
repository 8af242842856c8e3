//! The worker threads jobs run on, what each keeps between its jobs ([`WorkerState`]), and
//! whether one moves (its CPU time and scheduler state), which tells a stalled job from a
//! busy one.

use std::{
    any::{Any, TypeId},
    collections::HashMap,
    sync::{
        atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering},
        mpsc, Arc,
    },
    time::{Duration, Instant},
};

use super::charge::{Charger, CurrentDevice, NO_DEVICE};

/// What a worker keeps between its jobs, by type: each user stores its own (the
/// symbolizer its parsed files). Lost with the worker when a job is given up.
#[derive(Default)]
pub struct WorkerState {
    values: HashMap<TypeId, Box<dyn Any>>,
    pub(super) current: CurrentDevice,
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

pub(super) type Job = Box<dyn FnOnce(&mut WorkerState) + Send>;

/// One worker thread.
pub(super) struct Worker {
    pub(super) jobs: mpsc::Sender<Job>,
    /// Its thread id, for `/proc/self/task/TID/stat` (0 until it has started).
    pub(super) tid: Arc<AtomicI32>,
    /// Cleared when the thread ends.
    pub(super) alive: Arc<AtomicBool>,
    /// The device its job works on now.
    pub(super) current: CurrentDevice,
}

impl Worker {
    pub(super) fn spawn(name: &str) -> std::io::Result<Self> {
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

/// Whether a worker thread moves: its CPU time and scheduler state, from
/// `/proc/self/task/TID/stat`, read only once a job has taken longer than a poll (most take
/// microseconds, and the read would cost more than the job).
pub(super) struct Progress {
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
    pub(super) fn idle_for(&mut self, tid: i32) -> Duration {
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
pub(super) fn thread_cpu(tid: i32) -> Option<(u64, char)> {
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
