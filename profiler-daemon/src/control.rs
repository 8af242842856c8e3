//! The protocol between the async front (socket server, signals, systemd notifications) and
//! the collector thread, which owns the capture, the counts and the symbolizer. The front
//! never touches that state: it sends a [`Command`] and awaits the reply. Neutral ground:
//! both `api` and `daemon` depend on this module, neither on the other's internals.
//!
//! The command channel is a bounded std channel, so the collector keeps its own clock (a
//! `recv_timeout`, not an async runtime it would depend on); replies are tokio oneshots,
//! which a sync thread can send on.

use std::{
    sync::mpsc::{self, SyncSender, TrySendError},
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
    /// Go's legacy text form (`debug=1`) instead of gzipped protobuf.
    pub text: bool,
}

/// Why a query has no profile. The server maps these to HTTP status codes.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum QueryError {
    /// 404: no such process known to the daemon (never seen, or dropped after exit).
    #[error("no data for pid {0}: the process is unknown or has exited")]
    UnknownPid(Pid),
    /// 403: the process belongs to another user.
    #[error("pid {0} belongs to another user")]
    Forbidden(Pid),
    /// 404: the profile type is not enabled in the configuration (or not for this process,
    /// e.g. heap for a process that is not opted in).
    #[error("the {0} profile is not enabled for this process")]
    NotEnabled(ProfileKind),
    /// 503: the daemon is shutting down or overloaded.
    #[error("the daemon is unavailable: {0}")]
    Unavailable(String),
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
    pub pid: Pid,
    pub name: String,
    pub uid: u32,
    /// (profile type, number of samples since the daemon started), enabled types only.
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

/// The front's handle on the collector; cheap to clone.
#[derive(Clone, Debug)]
pub struct CollectorHandle {
    tx: SyncSender<Command>,
}

/// The collector's end of the channel.
pub type Commands = mpsc::Receiver<Command>;

/// A handle and the collector's end of its channel.
pub fn channel() -> (CollectorHandle, Commands) {
    let (tx, rx) = mpsc::sync_channel(QUEUE);
    (CollectorHandle { tx }, rx)
}

impl CollectorHandle {
    /// Sends without blocking the async front: a full queue is "busy", not a stall.
    async fn ask<T>(&self, make: impl FnOnce(oneshot::Sender<T>) -> Command) -> Result<T, QueryError> {
        let (reply, rx) = oneshot::channel();
        match self.tx.try_send(make(reply)) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) => {
                return Err(QueryError::Unavailable(format!("the collector has {QUEUE} requests waiting; retry later")))
            }
            Err(TrySendError::Disconnected(_)) => return Err(gone()),
        }
        rx.await.map_err(|_| gone())
    }

    pub async fn index(&self, viewer: Viewer) -> Result<Vec<IndexEntry>, QueryError> {
        self.ask(|reply| Command::Index { viewer, reply }).await
    }

    pub async fn profile(&self, query: ProfileQuery) -> Result<ProfileBody, QueryError> {
        self.ask(|reply| Command::Profile { query, reply }).await?
    }

    pub async fn status(&self) -> Result<String, QueryError> {
        self.ask(|reply| Command::Status { reply }).await
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
