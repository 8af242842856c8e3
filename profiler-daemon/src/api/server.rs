//! The accept loop and the connections: peer identity, connection slots (a share per uid,
//! and some only root may use), timeouts and graceful shutdown. What a request means is
//! [`super::handler`]'s business.

use std::{
    collections::HashMap,
    future::Future,
    sync::{Arc, Mutex},
    time::Duration,
};

use hyper::{server::conn::http1, service::service_fn};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::{
    io::AsyncWriteExt,
    net::{UnixListener, UnixStream},
    sync::{watch, OwnedSemaphorePermit, Semaphore},
    task::JoinSet,
};
use tracing::{debug, info, warn};

use crate::control::{CollectorHandle, Refusals, Viewer};

use super::{deadline::WriteDeadline, gates::Gates, handler, page, MAX_SECONDS};

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
    /// Of those, the ones only root may take, so that other users cannot lock root out.
    pub root_reserved: usize,
    /// Connections one uid other than root may hold at once; more get a 429.
    pub max_connections_per_uid: usize,
    /// How long a response write may make no progress (a client that does not read)
    /// before the connection is closed.
    pub write_timeout: Duration,
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
            root_reserved: 4,
            max_connections_per_uid: 8,
            write_timeout: Duration::from_secs(10),
            busy_wait: Duration::from_secs(1),
            shutdown_grace: Duration::from_secs(5),
        }
    }
}

/// A request's header may not have more fields than this (curl sends 3).
const MAX_HEADERS: usize = 32;
/// Back-off after a failed accept (e.g. out of file descriptors) so the loop does not spin.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

impl Limits {
    /// The longest a connection may live: a whole header, the longest capture, the slack,
    /// and a write. Keep-alive requests share it, so no client holds a slot for ever.
    pub fn max_lifetime(&self) -> Duration {
        self.header_read_timeout + Duration::from_secs(MAX_SECONDS) + self.request_slack + self.write_timeout
    }
}

/// What every connection task needs; cheap to clone.
#[derive(Clone)]
struct Shared {
    collector: CollectorHandle,
    limits: Limits,
    /// One permit per connection being served.
    slots: Arc<Semaphore>,
    /// One permit per connection of a uid other than root (`max_connections -
    /// root_reserved`), taken before a slot.
    others: Arc<Semaphore>,
    /// Connections per uid (root not counted).
    per_uid: Arc<Mutex<HashMap<u32, usize>>>,
    /// One permit per connection waiting for a slot, so a flood cannot queue without bound.
    waiting: Arc<Semaphore>,
    /// Flips once at shutdown.
    stop: watch::Receiver<bool>,
    /// Per-uid limits of thread dumps and flame graphs.
    gates: Gates,
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
    let others = Arc::new(Semaphore::new(limits.max_connections.saturating_sub(limits.root_reserved)));
    let waiting = Arc::new(Semaphore::new(limits.max_connections));
    let per_uid = Arc::default();
    let shared = Shared { collector, limits, slots, others, per_uid, waiting, stop, gates: Gates::default() };
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

/// Identifies the peer, holds it to its uid's share, gives the connection a slot (waiting
/// briefly when all are taken), or answers 429 or 503.
async fn admit(stream: UnixStream, shared: Shared) {
    let viewer = match stream.peer_cred() {
        Ok(cred) => Viewer { uid: cred.uid() },
        Err(err) => {
            // Without a uid there is no access decision to make: refuse by hanging up.
            warn!(error = %err, "failed to read the peer credentials of a socket client");
            return;
        }
    };
    let refusals = Arc::clone(&shared.collector.refusals);
    let Some(_share) = UidShare::claim(&shared, viewer) else {
        Refusals::count(&refusals.uid_connections);
        let max = shared.limits.max_connections_per_uid;
        let why = format!("uid {} already has {max} connections to the profiler socket; close one", viewer.uid);
        return reject(stream, "429 Too Many Requests", &why, shared.limits.busy_wait).await;
    };
    let others = match viewer == Viewer::ROOT {
        true => None,
        false => match acquire(&shared, &shared.others).await {
            Some(permit) => Some(permit),
            None => return busy(stream, &shared).await,
        },
    };
    match acquire(&shared, &shared.slots).await {
        Some(slot) => serve_connection(stream, shared, viewer, (slot, others)).await,
        None => busy(stream, &shared).await,
    }
}

/// A permit of `semaphore`, waiting up to `busy_wait` when there is none (with a bounded
/// number of connections waiting).
async fn acquire(shared: &Shared, semaphore: &Arc<Semaphore>) -> Option<OwnedSemaphorePermit> {
    if let Ok(permit) = Arc::clone(semaphore).try_acquire_owned() {
        return Some(permit);
    }
    let _waiting = shared.waiting.try_acquire().ok()?;
    let slot = Arc::clone(semaphore).acquire_owned();
    tokio::time::timeout(shared.limits.busy_wait, slot).await.ok()?.ok()
}

/// One connection of a uid other than root, counted against its share while it lives.
struct UidShare {
    per_uid: Arc<Mutex<HashMap<u32, usize>>>,
    uid: u32,
}

impl UidShare {
    /// A share for `viewer` (root always has one), or `None` when its uid has all its own.
    fn claim(shared: &Shared, viewer: Viewer) -> Option<Option<UidShare>> {
        if viewer == Viewer::ROOT {
            return Some(None);
        }
        let mut counts = shared.per_uid.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let count = counts.entry(viewer.uid).or_default();
        if *count >= shared.limits.max_connections_per_uid {
            return None;
        }
        *count += 1;
        Some(Some(UidShare { per_uid: Arc::clone(&shared.per_uid), uid: viewer.uid }))
    }
}

impl Drop for UidShare {
    fn drop(&mut self) {
        let mut counts = self.per_uid.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(count) = counts.get_mut(&self.uid) {
            *count -= 1;
            if *count == 0 {
                counts.remove(&self.uid);
            }
        }
    }
}

async fn busy(stream: UnixStream, shared: &Shared) {
    debug!("control socket busy, answering 503");
    Refusals::count(&shared.collector.refusals.busy);
    let why = "too many connections to the profiler socket; try again later";
    reject(stream, "503 Service Unavailable", why, shared.limits.busy_wait).await;
}

/// Answers `status` without parsing anything: the point is to spend nothing on this client.
async fn reject(mut stream: UnixStream, status: &str, why: &str, write_timeout: Duration) {
    let body = page::error_body(why);
    let response = format!(
        "HTTP/1.1 {status}\r\ncontent-type: text/plain; charset=utf-8\r\n\
         content-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    let write = async {
        stream.write_all(response.as_bytes()).await?;
        stream.shutdown().await
    };
    let _ = tokio::time::timeout(write_timeout, write).await;
}

/// The permits a served connection holds until it closes.
type Slot = (OwnedSemaphorePermit, Option<OwnedSemaphorePermit>);

async fn serve_connection(stream: UnixStream, shared: Shared, viewer: Viewer, _slot: Slot) {
    let Shared { collector, limits, mut stop, gates, .. } = shared;
    let stream = WriteDeadline::new(stream, limits.write_timeout, Arc::clone(&collector.refusals));
    let front = handler::Front { collector, gates, slack: limits.request_slack };
    let service = service_fn(move |req| handler::handle(req, front.clone(), viewer));
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .max_header_size(limits.max_header_bytes)
        .max_headers(MAX_HEADERS);
    let conn = builder.serve_connection(TokioIo::new(stream), service);
    tokio::pin!(conn);
    let lifetime = tokio::time::sleep(limits.max_lifetime());
    tokio::pin!(lifetime);
    let result = tokio::select! {
        result = conn.as_mut() => result,
        () = &mut lifetime => {
            debug!(uid = viewer.uid, "closing a socket connection at the end of its lifetime");
            return;
        }
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
