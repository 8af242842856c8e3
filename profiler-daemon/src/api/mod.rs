//! The control socket: HTTP/1.1 over a unix socket, like Docker's API, serving Go's
//! `net/http/pprof` paths (`/debug/pprof/...`) and `/status`.
//!
//! It owns the socket file (creation, mode, group), connection limits and timeouts, the
//! request grammar and the rendering of answers. It owns no profiling state: every answer
//! comes from the collector through [`CollectorHandle`], and access control by uid is decided
//! there too ([`Viewer`]); the server only identifies the peer with `SO_PEERCRED`.
//!
//! [`CollectorHandle`]: crate::control::CollectorHandle
//! [`Viewer`]: crate::control::Viewer

mod bind;
mod deadline;
mod gates;
mod handler;
mod page;
mod query;
mod request;
mod server;

#[cfg(test)]
mod tests;

use std::{io, path::PathBuf};

pub use bind::{bind, group_id};
pub use request::{ApiRequest, BadRequest, DEFAULT_CPU_SECONDS, MAX_SECONDS, PPROF_PREFIX};
pub use server::{serve, Limits};

/// Why the socket could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("failed to create the socket directory {path}; check its parent's permissions or set [socket] path")]
    CreateDir {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error(
        "the socket directory {path} {problem}; make it root's and writable by its owner only, or set another [socket] path"
    )]
    UnsafeDir { path: PathBuf, problem: String },
    #[error("{path} exists and is not a socket; remove it or set another [socket] path")]
    NotASocket { path: PathBuf },
    #[error(
        "another process is answering on {path}; stop it (`systemctl stop profiler`) or set another [socket] path"
    )]
    InUse { path: PathBuf },
    #[error("failed to remove the stale socket {path}; remove it by hand")]
    RemoveStale {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("failed to check whether the existing socket {path} is in use; remove it if no daemon runs")]
    Probe {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("failed to bind the socket {path}")]
    Bind {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("failed to set the mode of the socket {path} to 0660")]
    Chmod {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("failed to give group {group} access to the socket {path}")]
    Chown {
        path: PathBuf,
        group: String,
        #[source]
        source: io::Error,
    },
    #[error("socket group {group:?} does not exist; create it (`groupadd {group}`) or change [socket] group")]
    UnknownGroup { group: String },
    #[error("failed to look up socket group {group:?}")]
    GroupLookup {
        group: String,
        #[source]
        source: io::Error,
    },
}
