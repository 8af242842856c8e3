//! Process events from the kernel as they happen: every executable mapping, `exec`, fork and
//! exit on the machine, from one side-band perf event per CPU ([`ring`]), the way `perf
//! record` learns them. A process that lives 20 ms is known, with its mappings, before it
//! exits, and a `dlopen` is known when it happens, without polling `/proc`.
//!
//! [`Sideband::read`] drains every CPU's ring and returns the events in time order (records
//! of one process can land on several CPUs). A watcher thread waits on the rings and calls
//! the owner's waker when records arrive and the owner has read the previous ones, so the
//! owner (the capture's thread) is woken at most once per batch it reads.

pub mod latency;
mod record;
mod ring;

use std::{
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    thread::JoinHandle,
    time::Duration,
};

pub use latency::FollowLatency;
pub use record::ProcessEvent;
use ring::Ring;

/// How long the watcher sleeps on the rings at most (it also wakes on records).
const WATCH_TIMEOUT: Duration = Duration::from_millis(500);
/// How often the watcher looks again while the owner is still reading the previous batch.
const REARM_POLL: Duration = Duration::from_millis(1);

/// Why the side-band events could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum SidebandError {
    #[error("failed to open the side-band perf event of cpu {cpu} (needs CAP_PERFMON or root)")]
    Open {
        cpu: u32,
        #[source]
        source: std::io::Error,
    },
    #[error("failed to enable the side-band perf event of cpu {cpu}")]
    Enable {
        cpu: u32,
        #[source]
        source: std::io::Error,
    },
    #[error("failed to find the online CPUs")]
    Cpus(#[source] std::io::Error),
    #[error("failed to start the side-band watcher thread")]
    Thread(#[source] std::io::Error),
}

/// What the side band delivered since start.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SidebandStats {
    /// Events read (of the kinds kept).
    pub events: u64,
    /// Records the kernel dropped because a ring was full.
    pub lost: u64,
}

/// Every CPU's side-band ring, and the thread that watches them.
pub struct Sideband {
    rings: Vec<Ring>,
    watcher: Option<Watcher>,
    stats: SidebandStats,
}

struct Watcher {
    stop: Arc<AtomicBool>,
    /// Set by [`Sideband::read`]: the owner has read, wake it again at the next records.
    armed: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Sideband {
    /// Opens and enables one side-band event per online CPU.
    pub fn open() -> Result<Self, SidebandError> {
        let cpus = online_cpus().map_err(SidebandError::Cpus)?;
        let mut rings = Vec::with_capacity(cpus.len());
        for cpu in cpus {
            rings.push(Ring::open(cpu).map_err(|source| SidebandError::Open { cpu, source })?);
        }
        for (cpu, ring) in rings.iter().enumerate() {
            ring.enable().map_err(|source| SidebandError::Enable { cpu: cpu as u32, source })?;
        }
        Ok(Self { rings, watcher: None, stats: SidebandStats::default() })
    }

    /// Starts a thread that calls `wake` when records arrive, once per [`Sideband::read`].
    pub fn watch(&mut self, wake: impl Fn() + Send + 'static) -> Result<(), SidebandError> {
        let stop = Arc::new(AtomicBool::new(false));
        let armed = Arc::new(AtomicBool::new(true));
        let fds: Vec<i32> = self.rings.iter().map(Ring::raw_fd).collect();
        let pending = self.rings.iter().map(|r| r.pending_probe()).collect::<Vec<_>>();
        let (thread_stop, thread_armed) = (Arc::clone(&stop), Arc::clone(&armed));
        let thread = std::thread::Builder::new()
            .name("sideband".into())
            .spawn(move || watch(&fds, &pending, &thread_stop, &thread_armed, wake))
            .map_err(SidebandError::Thread)?;
        self.watcher = Some(Watcher { stop, armed, thread: Some(thread) });
        Ok(())
    }

    /// Every event recorded since the last read, in time order; re-arms the watcher.
    pub fn read(&mut self) -> Vec<ProcessEvent> {
        if let Some(watcher) = &self.watcher {
            // Before reading: a record written meanwhile wakes the owner again.
            watcher.armed.store(true, Ordering::Release);
        }
        let mut events = Vec::new();
        for ring in &mut self.rings {
            ring.drain(|kind, misc, body| events.extend(record::parse(kind, misc, body)));
        }
        events.sort_by_key(ProcessEvent::time);
        for event in &events {
            match event {
                ProcessEvent::Lost { count } => self.stats.lost += count,
                _ => self.stats.events += 1,
            }
        }
        events
    }

    pub fn stats(&self) -> SidebandStats {
        self.stats
    }
}

impl Drop for Sideband {
    fn drop(&mut self) {
        // The watcher reads the rings' metadata pages: it ends before they are unmapped.
        if let Some(mut watcher) = self.watcher.take() {
            watcher.stop.store(true, Ordering::Release);
            if let Some(thread) = watcher.thread.take() {
                let _ = thread.join();
            }
        }
    }
}

/// The watcher's loop: sleep on the rings; when one holds records and the owner has read
/// the last batch, wake it.
fn watch(fds: &[i32], pending: &[ring::PendingProbe], stop: &AtomicBool, armed: &AtomicBool, wake: impl Fn()) {
    let mut polls: Vec<libc::pollfd> =
        fds.iter().map(|&fd| libc::pollfd { fd, events: libc::POLLIN, revents: 0 }).collect();
    while !stop.load(Ordering::Acquire) {
        // SAFETY: `polls` is a valid array of pollfds for the duration of the call.
        unsafe { libc::poll(polls.as_mut_ptr(), polls.len() as libc::nfds_t, WATCH_TIMEOUT.as_millis() as i32) };
        // The owner is woken at once, without letting records gather: a program's mappings
        // must reach the unwinder before its `main` runs (a 2 ms gather cost the first 10% of
        // a 20 ms process's samples their chain). Records that arrive while it reads wait
        // for the next wake, so a burst still costs one pass.
        while pending.iter().any(ring::PendingProbe::has_records) && !stop.load(Ordering::Acquire) {
            if armed.swap(false, Ordering::AcqRel) {
                wake();
                break;
            }
            std::thread::sleep(REARM_POLL);
        }
    }
}

/// Now on the clock the records carry (`CLOCK_MONOTONIC`, ns): how long an event waited.
pub fn now_ns() -> u64 {
    let mut now = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes one timespec, which `now` is.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut now) };
    now.tv_sec as u64 * 1_000_000_000 + now.tv_nsec as u64
}

/// The online CPUs, from `/sys/devices/system/cpu/online` (`0-3,5`).
fn online_cpus() -> std::io::Result<Vec<u32>> {
    let text = std::fs::read_to_string("/sys/devices/system/cpu/online")?;
    let mut cpus = Vec::new();
    for part in text.trim().split(',').filter(|p| !p.is_empty()) {
        let bad = || std::io::Error::new(std::io::ErrorKind::InvalidData, format!("bad CPU list {text:?}"));
        let (first, last) = part.split_once('-').unwrap_or((part, part));
        let (first, last): (u32, u32) = (first.parse().map_err(|_| bad())?, last.parse().map_err(|_| bad())?);
        cpus.extend(first..=last);
    }
    Ok(cpus)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_cpu_list() {
        let cpus = online_cpus().unwrap();
        assert!(!cpus.is_empty());
        assert_eq!(cpus[0], 0);
    }

    /// Ground truth: this test forks a child that execs `true`; the side band reports the
    /// fork, the exec (named `true`), its executable mappings (the program and the C library
    /// among them) and its exit, in that order.
    #[test]
    fn sees_a_short_process_fork_exec_map_and_exit() {
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("skipped: opening system-wide perf events needs root");
            return;
        }
        let mut sideband = Sideband::open().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        sideband
            .watch(move || {
                let _ = tx.send(());
            })
            .unwrap();
        let child = std::process::Command::new("true").spawn().unwrap();
        let pid = crate::ids::Pid(child.id());
        let _ = child.wait_with_output();
        rx.recv_timeout(Duration::from_secs(5)).expect("the watcher wakes the owner");
        let mut events = Vec::new();
        // Records of one process may still be on their way from another CPU.
        for _ in 0..20 {
            events.extend(sideband.read().into_iter().filter(|e| !matches!(e, ProcessEvent::Lost { .. })));
            if events.iter().any(|e| matches!(e, ProcessEvent::Exited { pid: p, .. } if *p == pid)) {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let ours: Vec<&ProcessEvent> = events.iter().filter(|e| e.pid() == Some(pid)).collect();
        let position = |want: &dyn Fn(&ProcessEvent) -> bool| ours.iter().position(|e| want(e));
        let forked = position(&|e| matches!(e, ProcessEvent::Forked { .. })).expect("fork");
        let exec = position(&|e| matches!(e, ProcessEvent::Exec { name, .. } if name == "true")).expect("exec");
        let libc = position(&|e| matches!(e, ProcessEvent::Mapped { map, .. } if map.path.contains("libc.so")));
        let exited = position(&|e| matches!(e, ProcessEvent::Exited { .. })).expect("exit");
        assert!(forked < exec && exec < libc.expect("libc mapped") && libc.unwrap() < exited, "{ours:#?}");
    }
}
