//! The protocol between the async front (socket server, timers, signals) and the collector
//! thread, which owns the BPF session, the aggregates and the symbolizer. The front never
//! touches that state: it sends a [`Command`] and awaits the reply.

use std::time::Duration;

use tokio::sync::{mpsc, oneshot};

use crate::config::{Config, ProfileKind};

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

/// Which profile a query asks for. `Allocs` is the heap profile with `alloc_space` as the
/// default sample type, as in Go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QueryKind {
    Cpu,
    Heap,
    Allocs,
    Block,
    Mutex,
    ThreadCreate,
}

impl QueryKind {
    /// The profile type that holds the data.
    pub fn profile_kind(self) -> ProfileKind {
        match self {
            QueryKind::Cpu => ProfileKind::Cpu,
            QueryKind::Heap | QueryKind::Allocs => ProfileKind::Heap,
            QueryKind::Block => ProfileKind::Block,
            QueryKind::Mutex => ProfileKind::Mutex,
            QueryKind::ThreadCreate => ProfileKind::ThreadCreate,
        }
    }
}

/// A profile query.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProfileQuery {
    pub viewer: Viewer,
    pub pid: u32,
    pub kind: QueryKind,
    /// Capture a delta over the next `seconds` (always set for CPU); `None` = since start
    /// (heap: the live state now).
    pub window: Option<Duration>,
    /// Go's legacy text form (`debug=1`) instead of gzipped protobuf.
    pub text: bool,
}

/// Why a query has no profile. The server maps these to HTTP status codes.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum QueryError {
    /// 404: no such process known to the daemon (never seen, or dropped after exit).
    #[error("no data for pid {0}: the process is unknown or has exited")]
    UnknownPid(u32),
    /// 403: the process belongs to another user.
    #[error("pid {0} belongs to another user")]
    Forbidden(u32),
    /// 404: the profile type is not enabled in the configuration (or not for this process,
    /// e.g. heap for a process that is not opted in).
    #[error("the {0} profile is not enabled for this process")]
    NotEnabled(ProfileKind),
    /// 503: the daemon is shutting down or overloaded.
    #[error("the daemon is unavailable: {0}")]
    Unavailable(String),
    /// 500.
    #[error("internal error: {0}")]
    Internal(String),
}

/// A finished profile.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProfileBody {
    /// gzipped profile.proto, or the legacy text form.
    pub bytes: Vec<u8>,
    pub text: bool,
}

/// One line of the index: a process and its profiles with sample counts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IndexEntry {
    pub pid: u32,
    pub name: String,
    pub uid: u32,
    /// (profile type, number of samples since the daemon started), enabled types only.
    pub profiles: Vec<(ProfileKind, u64)>,
}

/// Requests to the collector.
#[derive(Debug)]
pub enum Command {
    Index {
        viewer: Viewer,
        reply: oneshot::Sender<Vec<IndexEntry>>,
    },
    Profile {
        query: ProfileQuery,
        reply: oneshot::Sender<Result<ProfileBody, QueryError>>,
    },
    /// `/status` as a JSON document.
    Status {
        reply: oneshot::Sender<String>,
    },
    /// Write one interval's dump now (the timer sends this).
    Dump {
        reply: oneshot::Sender<()>,
    },
    /// Apply a new, already validated configuration.
    Reload {
        config: Box<Config>,
        reply: oneshot::Sender<Result<(), String>>,
    },
    /// Write a final dump and stop.
    Shutdown {
        reply: oneshot::Sender<()>,
    },
}

/// The front's handle on the collector; cheap to clone.
#[derive(Clone, Debug)]
pub struct CollectorHandle {
    tx: mpsc::Sender<Command>,
}

impl CollectorHandle {
    pub fn new(tx: mpsc::Sender<Command>) -> Self {
        Self { tx }
    }

    async fn ask<T>(&self, make: impl FnOnce(oneshot::Sender<T>) -> Command) -> Option<T> {
        let (reply, rx) = oneshot::channel();
        self.tx.send(make(reply)).await.ok()?;
        rx.await.ok()
    }

    pub async fn index(&self, viewer: Viewer) -> Result<Vec<IndexEntry>, QueryError> {
        self.ask(|reply| Command::Index { viewer, reply }).await.ok_or_else(gone)
    }

    pub async fn profile(&self, query: ProfileQuery) -> Result<ProfileBody, QueryError> {
        self.ask(|reply| Command::Profile { query, reply }).await.ok_or_else(gone)?
    }

    pub async fn status(&self) -> Result<String, QueryError> {
        self.ask(|reply| Command::Status { reply }).await.ok_or_else(gone)
    }

    pub async fn dump(&self) -> Result<(), QueryError> {
        self.ask(|reply| Command::Dump { reply }).await.ok_or_else(gone)
    }

    pub async fn reload(&self, config: Config) -> Result<Result<(), String>, QueryError> {
        self.ask(|reply| Command::Reload { config: Box::new(config), reply }).await.ok_or_else(gone)
    }

    pub async fn shutdown(&self) -> Result<(), QueryError> {
        self.ask(|reply| Command::Shutdown { reply }).await.ok_or_else(gone)
    }
}

fn gone() -> QueryError {
    QueryError::Unavailable("the collector has stopped".into())
}
