//! The accept loop and the connections: peer identity, connection slots, timeouts and
//! graceful shutdown. What a request means is [`super::handler`]'s business.

use std::{future::Future, sync::Arc, time::Duration};

use hyper::{server::conn::http1, service::service_fn};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::{
    io::AsyncWriteExt,
    net::{UnixListener, UnixStream},
    sync::{watch, OwnedSemaphorePermit, Semaphore},
    task::JoinSet,
};
use tracing::{debug, info, warn};

use crate::control::{CollectorHandle, Viewer};

use super::{handler, page};

/// The server's bounds. [`Limits::default`] suits the daemon; tests shorten the timeouts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// A client must send a request's whole header within this, and an idle keep-alive
    /// connection is closed after it.
    pub header_read_timeout: Duration,
    /// How long the collector may take beyond the requested window (symbolizing, encoding)
    /// before the client gets a 503.
    pub request_slack: Duration,
    /// The largest request header, request line included, in bytes; larger gets a 431 and
    /// the connection is closed.
    pub max_header_bytes: usize,
    /// Connections served at once; each holds a slot until it closes.
    pub max_connections: usize,
    /// How long a new connection waits for a free slot before it is answered 503.
    pub busy_wait: Duration,
    /// How long shutdown waits for in-flight requests before dropping them.
    pub shutdown_grace: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            header_read_timeout: Duration::from_secs(10),
            request_slack: Duration::from_secs(60),
            max_header_bytes: 8 * 1024,
            max_connections: 32,
            busy_wait: Duration::from_secs(1),
            shutdown_grace: Duration::from_secs(5),
        }
    }
}

/// A request's header may not have more fields than this (curl sends 3).
const MAX_HEADERS: usize = 32;
/// Back-off after a failed accept (e.g. out of file descriptors) so the loop does not spin.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// What every connection task needs; cheap to clone.
#[derive(Clone)]
struct Shared {
    collector: CollectorHandle,
    limits: Limits,
    /// One permit per connection being served.
    slots: Arc<Semaphore>,
    /// One permit per connection waiting for a slot, so a flood cannot queue without bound.
    waiting: Arc<Semaphore>,
    /// Flips once at shutdown.
    stop: watch::Receiver<bool>,
}

/// Serves HTTP/1.1 on `listener` until `shutdown` completes, then stops accepting, lets
/// in-flight requests finish for up to `limits.shutdown_grace` and removes the socket file.
pub async fn serve(
    listener: UnixListener,
    collector: CollectorHandle,
    limits: Limits,
    shutdown: impl Future<Output = ()>,
) {
    let (stop_tx, stop) = watch::channel(false);
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let waiting = Arc::new(Semaphore::new(limits.max_connections));
    let shared = Shared { collector, limits, slots, waiting, stop };
    let mut connections = JoinSet::new();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            () = &mut shutdown => break,
            Some(done) = connections.join_next(), if !connections.is_empty() => {
                if let Err(err) = done {
                    warn!(error = %err, "a socket connection task failed");
                }
            }
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => drop(connections.spawn(admit(stream, shared.clone()))),
                Err(err) => {
                    warn!(error = %err, "failed to accept a connection on the control socket");
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                }
            },
        }
    }
    let path = listener.local_addr().ok().and_then(|addr| addr.as_pathname().map(ToOwned::to_owned));
    drop(listener);
    if let Some(path) = path {
        // The next daemon would remove it as stale anyway; clients get "not running" sooner.
        let _ = std::fs::remove_file(path);
    }
    drain(connections, stop_tx, limits.shutdown_grace).await;
}

async fn drain(mut connections: JoinSet<()>, stop: watch::Sender<bool>, grace: Duration) {
    let _ = stop.send(true);
    let all_done = async { while connections.join_next().await.is_some() {} };
    if tokio::time::timeout(grace, all_done).await.is_err() {
        warn!(connections = connections.len(), "dropping socket connections still busy at shutdown");
        connections.abort_all();
    }
    info!("control socket closed");
}

/// Gives the connection a slot, waiting briefly when all are taken, or answers 503.
async fn admit(stream: UnixStream, shared: Shared) {
    let permit = match Arc::clone(&shared.slots).try_acquire_owned() {
        Ok(permit) => Some(permit),
        Err(_) => wait_for_slot(&shared).await,
    };
    match permit {
        Some(permit) => serve_connection(stream, shared, permit).await,
        None => reject_busy(stream, shared.limits.busy_wait).await,
    }
}

async fn wait_for_slot(shared: &Shared) -> Option<OwnedSemaphorePermit> {
    let _waiting = shared.waiting.try_acquire().ok()?;
    let slot = Arc::clone(&shared.slots).acquire_owned();
    tokio::time::timeout(shared.limits.busy_wait, slot).await.ok()?.ok()
}

/// Answers 503 without parsing anything: the point is to spend nothing on this client.
async fn reject_busy(mut stream: UnixStream, write_timeout: Duration) {
    debug!("control socket busy, answering 503");
    let body = page::error_body("too many connections to the profiler socket; try again later");
    let response = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: text/plain; charset=utf-8\r\n\
         content-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    let write = async {
        stream.write_all(response.as_bytes()).await?;
        stream.shutdown().await
    };
    let _ = tokio::time::timeout(write_timeout, write).await;
}

async fn serve_connection(stream: UnixStream, shared: Shared, _slot: OwnedSemaphorePermit) {
    let viewer = match stream.peer_cred() {
        Ok(cred) => Viewer { uid: cred.uid() },
        Err(err) => {
            // Without a uid there is no access decision to make: refuse by hanging up.
            warn!(error = %err, "failed to read the peer credentials of a socket client");
            return;
        }
    };
    let Shared { collector, limits, mut stop, .. } = shared;
    let service = service_fn(move |req| handler::handle(req, collector.clone(), viewer, limits.request_slack));
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .max_header_size(limits.max_header_bytes)
        .max_headers(MAX_HEADERS);
    let conn = builder.serve_connection(TokioIo::new(stream), service);
    tokio::pin!(conn);
    let result = tokio::select! {
        result = conn.as_mut() => result,
        _ = stop.changed() => {
            conn.as_mut().graceful_shutdown();
            conn.await
        }
    };
    if let Err(err) = result {
        // Timeouts, oversized headers and clients hanging up mid-request all end here.
        debug!(uid = viewer.uid, error = %err, "socket connection ended with an error");
    }
}
