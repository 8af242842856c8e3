//! Thread dumps off the collector thread. The collector begins a dump (registers the process,
//! holds its tables, takes what the walk needs: `Capture::start_thread_dump`) and ends it
//! (learns its stacks, answers: `Capture::finish_thread_dump`); the walk between, every
//! thread's iterator records, stack reads, `/proc` reads and interpreted frames, runs on a thread
//! of its own, and rings the collector's bell when done. Meanwhile the collector drains,
//! follows process events and answers everything else.
//!
//! One dump at a time (the interpreters' code caches go with the walk); later queries wait in
//! order. This module owns the queue and the walk in flight, not the capture.

use std::{
    collections::VecDeque,
    os::fd::{AsRawFd, BorrowedFd, OwnedFd},
    panic::AssertUnwindSafe,
    sync::mpsc,
    thread::JoinHandle,
};

use tokio::sync::oneshot;

use crate::{
    capture::{DumpStarted, DumpTicket},
    control::{ProfileBody, ProfileQuery, QueryError},
    thread_dump::DumpOutcome,
};

/// A thread-dump query waiting for its dump.
pub struct DumpQuery {
    pub query: ProfileQuery,
    pub reply: oneshot::Sender<Result<ProfileBody, QueryError>>,
}

/// A walk that ended: its ticket, the query it answers (none for an interval's dump), and
/// what it gave (`Err` when the walk's thread panicked).
pub struct Walked {
    pub ticket: DumpTicket,
    pub waiter: Option<DumpQuery>,
    pub outcome: std::thread::Result<DumpOutcome<'static>>,
}

/// A walk whose thread could not be started, given back with its query.
pub type Unlaunched = (DumpStarted, Option<DumpQuery>, std::io::Error);

/// The walk in flight.
struct InFlight {
    ticket: DumpTicket,
    waiter: Option<DumpQuery>,
    thread: JoinHandle<()>,
}

/// The queue of dump queries and the walk in flight.
pub struct ThreadDumps {
    waiting: VecDeque<DumpQuery>,
    in_flight: Option<InFlight>,
    results: mpsc::Receiver<std::thread::Result<DumpOutcome<'static>>>,
    sender: mpsc::Sender<std::thread::Result<DumpOutcome<'static>>>,
    /// A duplicate of the collector's bell, rung when a walk ends; `None` when it could not
    /// be duplicated (the collector then sees the end at its next turn, within a second).
    bell: Option<std::sync::Arc<OwnedFd>>,
}

impl ThreadDumps {
    /// Rings `bell` (the collector's wake-up eventfd) when a walk ends.
    pub fn new(bell: BorrowedFd<'_>) -> Self {
        let (sender, results) = mpsc::channel();
        let bell = bell
            .try_clone_to_owned()
            .inspect_err(|err| tracing::warn!("thread dumps wake the collector late: cannot duplicate its bell: {err}"))
            .ok()
            .map(std::sync::Arc::new);
        Self { waiting: VecDeque::new(), in_flight: None, results, sender, bell }
    }

    /// Queues a dump query.
    pub fn push(&mut self, query: DumpQuery) {
        self.waiting.push_back(query);
    }

    /// The next query to begin, when no walk is in flight; queries whose client hung up are
    /// dropped (a dump nobody waits for would cost for nothing).
    pub fn next_query(&mut self) -> Option<DumpQuery> {
        if self.in_flight.is_some() {
            return None;
        }
        while let Some(query) = self.waiting.pop_front() {
            if !query.reply.is_closed() {
                return Some(query);
            }
        }
        None
    }

    /// Whether a walk is in flight.
    pub fn busy(&self) -> bool {
        self.in_flight.is_some()
    }

    /// Runs `started`'s walk on a thread of its own (no walk may be in flight).
    pub fn launch(&mut self, started: DumpStarted, waiter: Option<DumpQuery>) -> Result<(), Box<Unlaunched>> {
        debug_assert!(self.in_flight.is_none(), "one walk at a time");
        let DumpStarted { job, ticket } = started;
        let (sender, bell) = (self.sender.clone(), self.bell.clone());
        let (job_slot, job_back) = mpsc::sync_channel(1);
        let spawned = std::thread::Builder::new().name("thread-dump".into()).spawn(move || {
            let Ok(job) = job_back.recv() else { return };
            let outcome = std::panic::catch_unwind(AssertUnwindSafe(|| crate::thread_dump::DumpJob::run(job)));
            let _ = sender.send(outcome);
            if let Some(bell) = bell {
                ring(&bell);
            }
        });
        match spawned {
            Ok(thread) => {
                let _ = job_slot.send(job);
                self.in_flight = Some(InFlight { ticket, waiter, thread });
                Ok(())
            }
            Err(err) => Err(Box::new((DumpStarted { job, ticket }, waiter, err))),
        }
    }

    /// The walk in flight, if it ended.
    pub fn ended(&mut self) -> Option<Walked> {
        let in_flight = self.in_flight.as_ref()?;
        let outcome = match self.results.try_recv() {
            Ok(outcome) => outcome,
            // A thread that ended without sending panicked outside the walk: nothing comes.
            Err(_) if in_flight.thread.is_finished() => {
                self.results.try_recv().unwrap_or_else(|_| Err(Box::new("the thread-dump thread ended early")))
            }
            Err(_) => return None,
        };
        let InFlight { ticket, waiter, thread } = self.in_flight.take()?;
        let _ = thread.join();
        Some(Walked { ticket, waiter, outcome })
    }
}

/// Writes one to an eventfd; a full counter (EAGAIN) is still readable, all a ring means.
fn ring(bell: &OwnedFd) {
    let one = 1u64;
    // SAFETY: writes 8 bytes from a u64 to an eventfd this process owns.
    unsafe { libc::write(bell.as_raw_fd(), (&one as *const u64).cast(), 8) };
}
