//! Process events from the kernel as they happen: every executable mapping, `exec`, fork and
//! exit on the machine, from one side-band perf event per CPU ([`ring`]), the way `perf
//! record` learns them. A process that lives 20 ms is known, with its mappings, before it
//! exits, and a `dlopen` is known when it happens, without polling `/proc`.
//!
//! [`Sideband::read`] drains every CPU's ring and returns the events in time order (records
//! of one process can land on several CPUs). The owner waits on the rings itself
//! ([`Sideband::wait`], beside its own descriptor such as a command bell) and reads a batch
//! as soon as it wakes: no relay thread between the rings and their reader. Under a storm
//! of records the rings are read at most every [`pace::STORM_GAP`], and at once when a
//! walker asks for the registration of a process it met unregistered ([`pace`]).

pub mod latency;
pub mod pace;
mod record;
mod ring;

use std::{
    os::fd::{AsRawFd, BorrowedFd},
    time::{Duration, Instant},
};

pub use latency::FollowLatency;
use pace::Pace;
pub use record::ProcessEvent;
use ring::Ring;

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
}

/// What the side band delivered since start.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SidebandStats {
    /// Events read (of the kinds kept).
    pub events: u64,
    /// Records the kernel dropped because a ring was full.
    pub lost: u64,
    /// Whether records came faster than [`pace::STORM_EVENTS_PER_S`] lately (the rings are
    /// then read at most every [`pace::STORM_GAP`]).
    pub storm: bool,
    /// How long, since start, records came that fast (and were read at that pace).
    pub storm_time: Duration,
    /// Walkers' asks to register a process they met unregistered, each of which had the
    /// rings read at once (filled in by the owner of the asks).
    pub asks: u64,
}

/// Every CPU's side-band ring.
pub struct Sideband {
    rings: Vec<Ring>,
    stats: SidebandStats,
    pace: Pace,
}

/// What ended a [`Sideband::wait`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Woken {
    /// Records are waiting in a ring: [`Sideband::read`] them.
    pub records: bool,
    /// The caller's other descriptor is readable.
    pub other: bool,
    /// The caller's urgent descriptor is readable.
    pub urgent: bool,
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
        Ok(Self { rings, stats: SidebandStats::default(), pace: Pace::default() })
    }

    /// Waits until a ring holds records, `other` or `urgent` is readable, or `timeout`
    /// passes. Returns at once when records are already waiting (the kernel wakes a poller
    /// once per write, so records left from an earlier wake-up would not wake it again). A
    /// wake-up for records read meanwhile returns with nothing ready; the caller just waits
    /// again. Under a storm ([`pace`]), records are not waited for until the gap since the
    /// last read is over: only `other`, `urgent` and the timeout end the wait before then,
    /// and `urgent` (a walker asking for a process's registration) has the records read at
    /// once. The caller empties `urgent` when it is readable.
    pub fn wait(&self, other: Option<BorrowedFd<'_>>, urgent: Option<BorrowedFd<'_>>, timeout: Duration) -> Woken {
        let callers = Callers::new(other, urgent);
        if let Some(hold) = self.pace.hold(Instant::now()) {
            let ready = callers.woken(&poll(callers.fds(), timeout.min(hold)), false);
            // Records are read once the gap is over, or at once for an ask, not before.
            let records = (ready.urgent || (timeout >= hold && !ready.other)) && self.has_records();
            return Woken { records, ..ready };
        }
        if self.has_records() {
            let ready = if callers.fds().is_empty() { Vec::new() } else { poll(callers.fds(), Duration::ZERO) };
            return callers.woken(&ready, true);
        }
        let fds: Vec<BorrowedFd<'_>> = callers.fds().iter().copied().chain(self.rings.iter().map(Ring::fd)).collect();
        let ready = poll(&fds, timeout);
        callers.woken(&ready, self.has_records())
    }

    /// Whether records wait to be read (no system call).
    pub fn has_records(&self) -> bool {
        self.rings.iter().any(Ring::has_records)
    }

    /// Every event recorded since the last read, in time order.
    pub fn read(&mut self) -> Vec<ProcessEvent> {
        let mut events = Vec::new();
        for ring in &mut self.rings {
            ring.drain(|kind, misc, body| events.extend(record::parse(kind, misc, body)));
        }
        events.sort_by_key(ProcessEvent::time);
        self.pace.read(Instant::now(), events.len());
        for event in &events {
            match event {
                ProcessEvent::Lost { count } => self.stats.lost += count,
                _ => self.stats.events += 1,
            }
        }
        events
    }

    pub fn stats(&self) -> SidebandStats {
        SidebandStats { storm: self.pace.storm(), storm_time: self.pace.storm_time(), ..self.stats }
    }
}

/// The caller's descriptors of a wait (`other`, then `urgent`, those given), polled first,
/// so a poll's results start with theirs.
pub struct Callers<'a> {
    fds: Vec<BorrowedFd<'a>>,
    other: bool,
    urgent: bool,
}

impl<'a> Callers<'a> {
    pub fn new(other: Option<BorrowedFd<'a>>, urgent: Option<BorrowedFd<'a>>) -> Self {
        Self { fds: other.into_iter().chain(urgent).collect(), other: other.is_some(), urgent: urgent.is_some() }
    }

    /// The descriptors to poll, in order.
    pub fn fds(&self) -> &[BorrowedFd<'a>] {
        &self.fds
    }

    /// What woke the wait, from `ready` (a poll's results of [`Self::fds`] first; empty
    /// when nothing was polled) and whether records wait.
    pub fn woken(&self, ready: &[bool], records: bool) -> Woken {
        let at = |i: usize| ready.get(i).copied().unwrap_or(false);
        Woken { records, other: self.other && at(0), urgent: self.urgent && at(usize::from(self.other)) }
    }
}

/// Waits until one of `fds` is readable or `timeout` passes (to the microsecond: `ppoll`,
/// so a deadline is not rounded up to the next millisecond). Returns which are readable;
/// all false on timeout or error (an interrupted wait is just a short one).
pub fn poll(fds: &[BorrowedFd<'_>], timeout: Duration) -> Vec<bool> {
    let mut polls: Vec<libc::pollfd> =
        fds.iter().map(|fd| libc::pollfd { fd: fd.as_raw_fd(), events: libc::POLLIN, revents: 0 }).collect();
    let timeout = libc::timespec {
        tv_sec: timeout.as_secs().min(i32::MAX as u64) as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: `polls` is a valid array of pollfds and `timeout` a valid timespec for the
    // duration of the call; no signal mask is passed.
    let n = unsafe { libc::ppoll(polls.as_mut_ptr(), polls.len() as libc::nfds_t, &timeout, std::ptr::null()) };
    polls.iter().map(|p| n > 0 && p.revents & libc::POLLIN != 0).collect()
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

    /// Each of the caller's descriptors is found where it was polled, whichever are given,
    /// and a poll of nothing (records already waiting) wakes neither.
    #[test]
    fn callers_find_their_descriptors_in_the_poll_results() {
        let (a, b) = (std::io::stdin(), std::io::stdout());
        let (a, b) = (std::os::fd::AsFd::as_fd(&a), std::os::fd::AsFd::as_fd(&b));
        let both = Callers::new(Some(a), Some(b));
        assert_eq!(both.fds().len(), 2);
        assert_eq!(both.woken(&[false, true], false), Woken { records: false, other: false, urgent: true });
        assert_eq!(both.woken(&[true, false, true], true), Woken { records: true, other: true, urgent: false });
        let urgent_only = Callers::new(None, Some(b));
        assert_eq!(urgent_only.woken(&[true], false), Woken { records: false, other: false, urgent: true });
        let other_only = Callers::new(Some(a), None);
        assert_eq!(other_only.woken(&[true, true], false), Woken { records: false, other: true, urgent: false });
        assert_eq!(both.woken(&[], true), Woken { records: true, other: false, urgent: false });
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
        // Whatever other processes did before the child: read, so the wait below is woken
        // by the child's records.
        sideband.read();
        let child = std::process::Command::new("true").spawn().unwrap();
        let pid = crate::ids::Pid(child.id());
        let _ = child.wait_with_output();
        assert!(sideband.wait(None, None, Duration::from_secs(5)).records, "records wake the waiter");
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
