//! Pushing interval profiles to backends (`[[export]]`): Grafana Pyroscope's push API and OTLP
//! profiles over HTTP. The dump directory is the spool ([`super::spool`]): the collector
//! writes a dump's files and its manifest, then wakes the [`Exporter`]; each export sends the
//! files in order from its cursor and moves the cursor only past what its backend
//! acknowledged. The network never touches the collector thread: the exporter is a thread of
//! its own with a current-thread tokio runtime, one task per export ([`worker`]).
//!
//! Owns: the exports' threads, connections, retries and counts. Does not own: what is written
//! (the dump), what is deleted (retention), the wire formats (`crate::pprof::push`,
//! `crate::pprof::otlp`).

mod client;
mod request;
mod worker;

use std::{
    path::Path,
    sync::{
        atomic::{AtomicI64, AtomicU64, Ordering},
        Arc, Mutex,
    },
    time::Duration,
};

use tokio::sync::{watch, Notify};

use super::spool::{self, Cursor};
use crate::config::{ExportConfig, Protocol};

pub use request::{pyroscope_name, MAX_REQUEST_PROFILES, PYROSCOPE_MAX_PROFILE_BYTES};

/// How long the exporter may keep sending once asked to stop (the final dump, a backlog):
/// what is left stays in the spool for the next start.
pub const STOP_GRACE: Duration = Duration::from_secs(3);

/// An export's counts, shared between its task (which counts) and `/status` (which reads).
#[derive(Debug, Default)]
pub struct Counters {
    /// Profiles acknowledged by the backend.
    pub sent: AtomicU64,
    /// Tries that failed and will be tried again.
    pub retried: AtomicU64,
    /// Profiles refused for good (by the backend, or before sending for being over its limits).
    pub failed: AtomicU64,
    /// Profiles retention deleted before they were sent.
    pub dropped: AtomicU64,
    /// Profiles in the spool not yet acknowledged (nor dropped or failed).
    pub queued: AtomicI64,
    pub bytes_sent: AtomicU64,
    /// The manifest the export's cursor is in: manifests below every export's are deleted.
    pub cursor_seq: AtomicU64,
}

/// One export's state that outlives its task.
#[derive(Debug)]
pub struct Shared {
    pub name: String,
    pub protocol: Protocol,
    pub url: String,
    pub counters: Counters,
    last_error: Mutex<Option<String>>,
    /// Wakes the export when a manifest was written.
    wake: Notify,
}

impl Shared {
    fn record_error(&self, error: String) {
        *self.last_error.lock().expect("last_error lock") = Some(error);
    }
}

/// An export as `/status` shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExportStatus {
    pub name: String,
    pub protocol: Protocol,
    pub url: String,
    pub sent: u64,
    pub retried: u64,
    pub failed: u64,
    pub dropped: u64,
    pub queue_depth: u64,
    pub bytes_sent: u64,
    pub last_error: Option<String>,
}

/// The running exports: a thread that owns their tasks, and the handles to wake, read and
/// stop them.
pub struct Exporter {
    running: Arc<[Arc<Shared>]>,
    stop: watch::Sender<bool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Exporter {
    /// Starts one task per export, each from its cursor in `dir`'s spool. An export without a
    /// cursor (new in the config) starts after the manifests already there.
    pub fn start(exports: &[ExportConfig], dir: &Path) -> std::io::Result<Self> {
        let next_seq = next_seq(dir);
        let host = request::Host { hostname: hostname() };
        let mut starts = Vec::with_capacity(exports.len());
        for export in exports {
            let cursor = match spool::read_cursor(dir, &export.name) {
                Ok(Some(cursor)) => cursor,
                Ok(None) | Err(_) => {
                    let cursor = Cursor { seq: next_seq, index: 0 };
                    // Kept now, so that a restart before the first push skips nothing.
                    if let Err(err) = spool::write_cursor(dir, &export.name, cursor) {
                        tracing::error!("{}", crate::error::chain(&err));
                    }
                    cursor
                }
            };
            starts.push((export.clone(), cursor, queued(dir, cursor)));
        }
        let running: Arc<[Arc<Shared>]> = starts
            .iter()
            .map(|(export, cursor, queued)| {
                let counters = Counters {
                    queued: AtomicI64::new(*queued),
                    cursor_seq: AtomicU64::new(cursor.seq),
                    ..Counters::default()
                };
                Arc::new(Shared {
                    name: export.name.clone(),
                    protocol: export.protocol,
                    url: export.url.text.clone(),
                    counters,
                    last_error: Mutex::new(None),
                    wake: Notify::new(),
                })
            })
            .collect();
        let (stop, stopped) = watch::channel(false);
        let workers: Vec<worker::Worker> = starts
            .into_iter()
            .zip(running.iter())
            .map(|((export, cursor, _), shared)| {
                worker::Worker::new(
                    export,
                    dir.to_path_buf(),
                    host.clone(),
                    Arc::clone(shared),
                    Arc::clone(&running),
                    cursor,
                    stopped.clone(),
                )
            })
            .collect();
        let thread = std::thread::Builder::new().name("exporter".into()).spawn(move || run(workers, stopped))?;
        Ok(Self { running, stop, thread: Some(thread) })
    }

    /// A manifest of `files` profiles was written: count them as queued and wake the exports.
    pub fn spooled(&self, files: usize) {
        for export in self.running.iter() {
            export.counters.queued.fetch_add(files as i64, Ordering::Relaxed);
            export.wake.notify_one();
        }
    }

    pub fn status(&self) -> Vec<ExportStatus> {
        self.running
            .iter()
            .map(|s| {
                let c = &s.counters;
                ExportStatus {
                    name: s.name.clone(),
                    protocol: s.protocol,
                    url: s.url.clone(),
                    sent: c.sent.load(Ordering::Relaxed),
                    retried: c.retried.load(Ordering::Relaxed),
                    failed: c.failed.load(Ordering::Relaxed),
                    dropped: c.dropped.load(Ordering::Relaxed),
                    queue_depth: c.queued.load(Ordering::Relaxed).max(0) as u64,
                    bytes_sent: c.bytes_sent.load(Ordering::Relaxed),
                    last_error: s.last_error.lock().expect("last_error lock").clone(),
                }
            })
            .collect()
    }

    /// Stops the exports: each sends what is queued until it is idle, a send fails, or
    /// [`STOP_GRACE`] is over; what is not acknowledged by then stays in the spool.
    pub fn stop(mut self) {
        self.halt();
    }

    fn halt(&mut self) {
        let _ = self.stop.send(true);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for Exporter {
    fn drop(&mut self) {
        self.halt();
    }
}

/// The exporter thread: the exports' tasks until asked to stop, then [`STOP_GRACE`] for them
/// to finish.
fn run(workers: Vec<worker::Worker>, mut stopped: watch::Receiver<bool>) {
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(err) => return tracing::error!("cannot start the exporter's runtime, nothing will be exported: {err}"),
    };
    runtime.block_on(async move {
        let tasks: Vec<_> = workers.into_iter().map(|w| tokio::spawn(w.run())).collect();
        while !*stopped.borrow() {
            if stopped.changed().await.is_err() {
                break;
            }
        }
        let _ = tokio::time::timeout(STOP_GRACE, async {
            for task in tasks {
                let _ = task.await;
            }
        })
        .await;
    });
    // Dropping the runtime cancels what is still in flight: not acknowledged, sent again later.
}

/// The number the next manifest gets: one past the highest in the spool.
pub fn next_seq(dir: &Path) -> u64 {
    spool::seqs(dir).ok().and_then(|seqs| seqs.last().copied()).map_or(0, |last| last + 1)
}

/// Profiles in the spool from `cursor` on.
fn queued(dir: &Path, cursor: Cursor) -> i64 {
    let manifests = spool::list(dir).unwrap_or_default();
    let files: usize = manifests.range(cursor.seq..).map(|(_, &files)| files).sum();
    let done = if manifests.contains_key(&cursor.seq) { cursor.index } else { 0 };
    files.saturating_sub(done) as i64
}

/// The machine's name, as `hostname` prints it.
fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .unwrap_or_else(|_| "unknown".into())
}
