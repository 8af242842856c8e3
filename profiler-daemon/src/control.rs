//! The protocol between the async front (socket server, signals, systemd notifications) and
//! the collector thread, which owns the capture, the counts and the symbolizer. The front
//! never touches that state: it sends a [`Command`] and awaits the reply. Neutral ground:
//! both `api` and `daemon` depend on this module, neither on the other's internals.
//!
//! The command channel is a bounded std channel with a [`Bell`] (an eventfd rung after each
//! send), so the collector keeps its own clock and waits on the bell and the kernel's
//! process-event rings in one `ppoll` (not an async runtime it would depend on); replies are
//! tokio oneshots, which a sync thread can send on. `/status` is not a command: the collector publishes it
//! on a [`StatusBoard`] after every command and dump, and between them every 250 ms while
//! it is being read (every 2 s while it is not), and the front answers from there, so it
//! answers at once even while the collector is busy (a long dump, a table build, a file
//! read waited out on a stalled file system).

use std::{
    os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd},
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering::Relaxed},
        mpsc::{self, RecvError, SyncSender, TryRecvError, TrySendError},
        Arc, Mutex,
    },
    time::Duration,
};

use tokio::sync::oneshot;

use crate::{
    config::Config,
    ids::Pid,
    profiles::{ProfileKind, View},
};

/// Commands waiting for the collector at most; past it the front answers "busy".
pub const QUEUE: usize = 64;

/// Who is asking: the peer's credentials from `SO_PEERCRED`. Root sees every process; any
/// other uid sees only processes running as that uid.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Viewer {
    pub uid: u32,
}

impl Viewer {
    pub const ROOT: Viewer = Viewer { uid: 0 };

    /// Whether this viewer may see a process owned by `owner_uid`.
    pub fn may_see(self, owner_uid: u32) -> bool {
        self.uid == 0 || self.uid == owner_uid
    }
}

/// A profile query.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProfileQuery {
    pub viewer: Viewer,
    pub pid: Pid,
    pub view: View,
    /// Capture a delta over the next `window` (always set for CPU); `None` = since start
    /// (heap: the live state now).
    pub window: Option<Duration>,
    /// Go's `debug` parameter: 0 gzipped protobuf, 1 Go's legacy text form, 2 the thread
    /// dump's per-thread text (goroutine only).
    pub debug: u8,
    /// A thread dump of a Go process shows its OS threads, not its goroutines (`threads=os`).
    pub os_threads: bool,
}

/// Why a query has no profile, each with its real cause and, where there is one, the fix.
/// The server maps these to HTTP status codes (all 404 but `Unavailable`, 503, and
/// `Limited`, 429).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum QueryError {
    /// For root: no process with this pid runs, and the daemon has no data of one.
    #[error("no such process: pid {0} is not running and the daemon has no data of it")]
    UnknownPid(Pid),
    /// For root: the process exited, and the daemon has forgotten it since.
    #[error(
        "pid {pid} ({name}) exited at about {when}; the daemon no longer holds its data (its interval \
         profiles, if any, are in the output directory)"
    )]
    Exited { pid: Pid, name: String, when: String },
    /// For any other uid: the one answer to "no such process", "exited" and "not yours",
    /// so the socket tells no one which pids run.
    #[error("no data for pid {0}: no such process of yours is profiled")]
    NotVisible(Pid),
    /// The kind is not enabled (or not yet: a reload enabled it), and how to enable it.
    #[error("the {kind} profile is not enabled: {fix}")]
    NotEnabled { kind: ProfileKind, fix: String },
    /// The process is not selected for the kind, and why.
    #[error("pid {pid} has no {kind} profile: {why}")]
    NotSelected { pid: Pid, kind: ProfileKind, why: String },
    /// 503: the daemon is shutting down or overloaded.
    #[error("the daemon is unavailable: {0}")]
    Unavailable(String),
    /// 429: this uid already uses its share (of captures running at once).
    #[error("too many requests: {0}")]
    Limited(String),
}

/// A finished profile.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProfileBody {
    /// gzipped profile.proto, or the legacy text form.
    pub bytes: Vec<u8>,
    pub text: bool,
}

/// One process of the index: who it is and its profiles with event counts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IndexEntry {
    pub pid: Pid,
    pub name: String,
    pub uid: u32,
    /// The systemd unit its cgroup names, if any.
    pub unit: Option<String>,
    /// The container id its cgroup names, if any.
    pub container: Option<String>,
    /// (profile type, events since the daemon started: samples, allocations, waits,
    /// threads), enabled types only.
    pub profiles: Vec<(ProfileKind, u64)>,
}

/// What a reload did: the keys that take effect only after a restart.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Reloaded {
    pub restart_needed: Vec<&'static str>,
}

/// Why a reload was not applied (the old configuration stays).
#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    #[error("the new output directory cannot be used")]
    OutputDir(#[source] crate::Error),
}

/// Requests to the collector.
#[derive(Debug)]
pub enum Command {
    /// The processes `viewer` may see; `pid`: that one only.
    Index {
        viewer: Viewer,
        pid: Option<Pid>,
        reply: oneshot::Sender<Vec<IndexEntry>>,
    },
    Profile {
        query: ProfileQuery,
        reply: oneshot::Sender<Result<ProfileBody, QueryError>>,
    },
    /// Apply a new, already validated configuration.
    Reload {
        config: Box<Config>,
        reply: oneshot::Sender<Result<Reloaded, ReloadError>>,
    },
    /// Write a final dump and stop.
    Shutdown {
        reply: oneshot::Sender<()>,
    },
}

/// What the front refused, by reason: the socket server counts, `/status` shows.
#[derive(Debug, Default)]
pub struct Refusals {
    /// Connections answered 503 because every slot was taken.
    pub busy: AtomicU64,
    /// Connections answered 429 because their uid had its share of slots.
    pub uid_connections: AtomicU64,
    /// Connections closed because a response could not be written in time (a client that
    /// does not read).
    pub write_timeouts: AtomicU64,
    /// Requests answered 503 because the collector's queue was full.
    pub collector_queue_full: AtomicU64,
}

impl Refusals {
    pub fn count(counter: &AtomicU64) {
        counter.fetch_add(1, Relaxed);
    }

    /// (name, count) for `/status`.
    pub fn read(&self) -> [(&'static str, u64); 4] {
        [
            ("connections_busy", self.busy.load(Relaxed)),
            ("connections_over_uid_share", self.uid_connections.load(Relaxed)),
            ("write_timeouts", self.write_timeouts.load(Relaxed)),
            ("collector_queue_full", self.collector_queue_full.load(Relaxed)),
        ]
    }
}

/// `/status` as the collector last published it: the JSON document for root, and the one
/// with only its counters for anyone else. The front's own counters ([`Refusals`]) are put
/// in when it is read, so they are never stale.
#[derive(Clone, Debug, Default)]
pub struct StatusBoard(Arc<Mutex<Option<PublishedStatus>>>, Arc<AtomicBool>);

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PublishedStatus {
    pub full: serde_json::Value,
    pub counters_only: serde_json::Value,
}

impl StatusBoard {
    pub fn publish(&self, status: PublishedStatus) {
        *self.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(status);
        self.1.store(false, Relaxed);
    }

    /// Whether the last publication was read: someone is watching, and the next one is
    /// worth rendering soon.
    pub fn was_read(&self) -> bool {
        self.1.load(Relaxed)
    }

    /// The document `viewer` may see, with the front's `refusals` as they are now; `None`
    /// before the first publication.
    pub fn read(&self, viewer: Viewer, refusals: &Refusals) -> Option<String> {
        self.1.store(true, Relaxed);
        let board = self.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let published = board.as_ref()?;
        let mut doc = if viewer == Viewer::ROOT { published.full.clone() } else { published.counters_only.clone() };
        drop(board);
        let socket: serde_json::Map<String, serde_json::Value> =
            refusals.read().into_iter().map(|(name, n)| (name.to_string(), n.into())).collect();
        if let Some(refused) = doc.get_mut("refused").and_then(serde_json::Value::as_object_mut) {
            refused.insert("socket".into(), socket.into());
        }
        Some(serde_json::to_string_pretty(&doc).unwrap_or_else(|_| "{}".into()) + "\n")
    }
}

/// The front's handle on the collector; cheap to clone.
#[derive(Clone, Debug)]
pub struct CollectorHandle {
    tx: SyncSender<Command>,
    bell: Arc<Bell>,
    /// Shared with the collector, which shows them.
    pub refusals: Arc<Refusals>,
    status: StatusBoard,
}

/// The collector's end of the channel, the front's refusals it reports, and where it
/// publishes `/status`.
#[derive(Debug)]
pub struct Commands {
    rx: mpsc::Receiver<Command>,
    bell: Arc<Bell>,
    pub refusals: Arc<Refusals>,
    pub status: StatusBoard,
}

/// What [`Commands::next`] found.
#[derive(Debug)]
pub enum Next {
    Command(Command),
    /// Every handle is gone: the front has stopped.
    Disconnected,
    /// Nothing queued.
    Empty,
}

impl Commands {
    /// The next queued command, without waiting.
    pub fn next(&self) -> Next {
        match self.rx.try_recv() {
            Ok(command) => Next::Command(command),
            Err(TryRecvError::Disconnected) => Next::Disconnected,
            Err(TryRecvError::Empty) => Next::Empty,
        }
    }

    /// Readable when a command may be queued: wait on it (beside other descriptors), then
    /// [`Commands::silence`] it and take commands with [`Commands::next`] until empty.
    pub fn bell(&self) -> BorrowedFd<'_> {
        self.bell.0.as_fd()
    }

    /// Resets the bell before the queue is read, so a command sent meanwhile rings it again.
    pub fn silence(&self) {
        let mut count = 0u64;
        // SAFETY: reads 8 bytes into a u64 from our own non-blocking eventfd; EAGAIN (not
        // rung) is fine.
        unsafe { libc::read(self.bell.0.as_raw_fd(), (&mut count as *mut u64).cast(), 8) };
    }

    /// Blocks until a command comes (the bell unused): for a driver that waits on nothing else.
    pub fn recv(&self) -> Result<Command, RecvError> {
        self.rx.recv()
    }
}

/// An eventfd the front rings after each command it queues.
#[derive(Debug)]
struct Bell(OwnedFd);

impl Bell {
    fn new() -> Self {
        // SAFETY: eventfd(2) with valid flags; the result is checked.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        // Out of descriptors at start-up is not something a daemon can run without.
        assert!(fd >= 0, "failed to create the collector's eventfd: {}", std::io::Error::last_os_error());
        // SAFETY: a new descriptor, which we now own.
        Self(unsafe { OwnedFd::from_raw_fd(fd) })
    }

    fn ring(&self) {
        let one = 1u64;
        // SAFETY: writes 8 bytes from a u64 to our own eventfd; a full counter (EAGAIN) is
        // still readable, which is all a ring means.
        unsafe { libc::write(self.0.as_raw_fd(), (&one as *const u64).cast(), 8) };
    }
}

/// A handle and the collector's end of its channel.
pub fn channel() -> (CollectorHandle, Commands) {
    let (tx, rx) = mpsc::sync_channel(QUEUE);
    let refusals = Arc::new(Refusals::default());
    let status = StatusBoard::default();
    let bell = Arc::new(Bell::new());
    let commands = Commands { rx, bell: Arc::clone(&bell), refusals: Arc::clone(&refusals), status: status.clone() };
    (CollectorHandle { tx, bell, refusals, status }, commands)
}

impl CollectorHandle {
    /// Sends without blocking the async front: a full queue is "busy", not a stall.
    async fn ask<T>(&self, make: impl FnOnce(oneshot::Sender<T>) -> Command) -> Result<T, QueryError> {
        let (reply, rx) = oneshot::channel();
        match self.tx.try_send(make(reply)) {
            Ok(()) => self.bell.ring(),
            Err(TrySendError::Full(_)) => {
                Refusals::count(&self.refusals.collector_queue_full);
                return Err(QueryError::Unavailable(format!(
                    "the collector has {QUEUE} requests waiting; retry later"
                )));
            }
            Err(TrySendError::Disconnected(_)) => return Err(gone()),
        }
        rx.await.map_err(|_| gone())
    }

    pub async fn index(&self, viewer: Viewer, pid: Option<Pid>) -> Result<Vec<IndexEntry>, QueryError> {
        self.ask(|reply| Command::Index { viewer, pid, reply }).await
    }

    pub async fn profile(&self, query: ProfileQuery) -> Result<ProfileBody, QueryError> {
        self.ask(|reply| Command::Profile { query, reply }).await?
    }

    /// `/status` for `viewer`, from the board: never waits for the collector.
    pub fn status(&self, viewer: Viewer) -> Result<String, QueryError> {
        self.status
            .read(viewer, &self.refusals)
            .ok_or_else(|| QueryError::Unavailable("the collector is starting".into()))
    }

    pub async fn reload(&self, config: Config) -> Result<Result<Reloaded, ReloadError>, QueryError> {
        self.ask(|reply| Command::Reload { config: Box::new(config), reply }).await
    }

    pub async fn shutdown(&self) -> Result<(), QueryError> {
        self.ask(|reply| Command::Shutdown { reply }).await
    }
}

fn gone() -> QueryError {
    QueryError::Unavailable("the collector has stopped".into())
}
