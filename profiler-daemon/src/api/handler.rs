//! One HTTP request to one response: parse, ask the collector within a deadline, answer.
//! Knows HTTP status codes and content types; knows nothing about sockets or connections.

use std::{convert::Infallible, time::Duration};

use http_body_util::Full;
use hyper::{
    body::Bytes,
    header::{self, HeaderValue},
    Request, Response, StatusCode,
};
use tracing::{debug, warn};

use crate::{
    control::{CollectorHandle, ProfileBody, ProfileQuery, QueryError, Viewer},
    ids::Pid,
    profiles::{ProfileKind, View},
    units::format_duration,
};

use super::{
    gates::{DumpRefusal, Gates},
    page,
    request::{ApiRequest, BadRequest},
};

/// Every response is built in memory: profiles are small and finished before sending.
pub type Body = Full<Bytes>;

const TEXT: &str = "text/plain; charset=utf-8";
const HTML: &str = "text/html; charset=utf-8";
const JSON: &str = "application/json";
const PROTO: &str = "application/octet-stream";
const SVG: &str = "image/svg+xml";

/// The most frames a flame graph is drawn from (see [`crate::flame::svg_of_pprof`]): about
/// a quarter of a second and 90 MB of drawing. The catalogue holds up to 4 M frames.
pub const MAX_FLAME_FRAMES: usize = 500_000;

/// What answering a request needs besides the request: the collector, the per-uid gates,
/// and how long the collector may take beyond the requested window before the client gets
/// a 503 instead of waiting forever.
#[derive(Clone)]
pub struct Front {
    pub collector: CollectorHandle,
    pub gates: Gates,
    pub slack: Duration,
}

/// Answers one request from `viewer`.
pub async fn handle<B>(req: Request<B>, front: Front, viewer: Viewer) -> Result<Response<Body>, Infallible> {
    let (method, path) = (req.method().as_str(), req.uri().path());
    let response = match ApiRequest::parse(method, path, req.uri().query()) {
        Ok(request) => answer(request, &front, viewer).await,
        Err(bad) => refuse(&bad),
    };
    debug!(uid = viewer.uid, method, path, status = response.status().as_u16(), "api request");
    Ok(response)
}

async fn answer(request: ApiRequest, front: &Front, viewer: Viewer) -> Response<Body> {
    // Checked before the collector is asked, and held until it answers.
    let _dump = match is_dump(request).then(|| front.gates.dump(viewer)) {
        Some(Err(refusal)) => return too_many_dumps(viewer, refusal),
        permit => permit,
    };
    let deadline = window(request).unwrap_or_default() + front.slack;
    match tokio::time::timeout(deadline, dispatch(request, front, viewer)).await {
        Ok(Ok(response)) => response,
        Ok(Err(err)) => query_error(&err),
        Err(_) => {
            warn!(uid = viewer.uid, ?request, "the collector did not answer in time");
            let reason = format!("the collector did not answer within {}; try again later", format_duration(deadline));
            text(StatusCode::SERVICE_UNAVAILABLE, page::error_body(&reason))
        }
    }
}

async fn dispatch(request: ApiRequest, front: &Front, viewer: Viewer) -> Result<Response<Body>, QueryError> {
    let collector = &front.collector;
    let query = match request {
        ApiRequest::Index { pid: None } => {
            let entries = collector.index(viewer, None).await?;
            return Ok(response(StatusCode::OK, HTML, page::index(viewer, &entries).into_bytes()));
        }
        ApiRequest::Index { pid: Some(pid) } => {
            let entries = collector.index(viewer, Some(pid)).await?;
            return match entries.first() {
                Some(entry) => Ok(response(StatusCode::OK, HTML, page::process(entry).into_bytes())),
                // Root is told why (no such process, exited) by a profile query of it; the
                // index answers alike for every pid it does not list.
                None => Err(QueryError::NotVisible(pid)),
            };
        }
        ApiRequest::Processes => {
            let entries = collector.index(viewer, None).await?;
            return Ok(json(page::processes(viewer, &entries)));
        }
        ApiRequest::Status => return Ok(json(collector.status(viewer)?)),
        ApiRequest::Profile { pid, seconds } => ProfileQuery {
            viewer,
            pid,
            view: View::of(ProfileKind::Cpu),
            window: Some(secs(seconds)),
            debug: 0,
            os_threads: false,
        },
        ApiRequest::Named { view, pid, seconds, debug, os_threads } => {
            ProfileQuery { viewer, pid, view, window: seconds.map(secs), debug, os_threads }
        }
        ApiRequest::Flamegraph { view, pid, seconds } => {
            let _turn = front.gates.flame_turn(viewer).await;
            let query = ProfileQuery { viewer, pid, view, window: seconds.map(secs), debug: 0, os_threads: false };
            let body = collector.profile(query).await?;
            return Ok(flamegraph(body, format!("pid {pid} {}", view.endpoint())).await);
        }
    };
    let (view, pid) = (query.view, query.pid);
    Ok(profile(view, pid, collector.profile(query).await?))
}

/// Draws `body` on the blocking pool: decoding and drawing take up to a quarter of a second,
/// which on the front would hold up `/status`, every other answer and the watchdog's ping.
async fn flamegraph(body: ProfileBody, title: String) -> Response<Body> {
    use crate::flame::{svg_of_pprof, FlameError};
    let drawn =
        tokio::task::spawn_blocking(move || svg_of_pprof(&body.bytes, "the profile", None, &title, MAX_FLAME_FRAMES));
    match drawn.await {
        Ok(Ok(svg)) => response(StatusCode::OK, SVG, svg),
        Ok(Err(err @ FlameError::Empty(_))) => text(StatusCode::NOT_FOUND, page::error_body(&err.to_string())),
        Ok(Err(err @ FlameError::TooLarge { .. })) => {
            text(StatusCode::PAYLOAD_TOO_LARGE, page::error_body(&err.to_string()))
        }
        Ok(Err(err)) => text(StatusCode::INTERNAL_SERVER_ERROR, page::error_body(&crate::error::chain(&err))),
        Err(err) => {
            warn!(error = %err, "drawing a flame graph failed");
            text(StatusCode::INTERNAL_SERVER_ERROR, page::error_body("drawing the flame graph failed"))
        }
    }
}

/// Whether answering `request` takes a thread dump (a moment: never with seconds).
fn is_dump(request: ApiRequest) -> bool {
    match request {
        ApiRequest::Named { view, seconds: None, .. } | ApiRequest::Flamegraph { view, seconds: None, .. } => {
            view.kind == ProfileKind::Threads
        }
        _ => false,
    }
}

/// The 429 for a dump over `viewer`'s limits, with `Retry-After`.
fn too_many_dumps(viewer: Viewer, refusal: DumpRefusal) -> Response<Body> {
    debug!(uid = viewer.uid, ?refusal, "thread dump refused");
    let mut response = text(StatusCode::TOO_MANY_REQUESTS, page::error_body(&refusal.message(viewer.uid)));
    response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(refusal.retry_after_secs()));
    response
}

fn window(request: ApiRequest) -> Option<Duration> {
    match request {
        ApiRequest::Profile { seconds, .. } => Some(secs(seconds)),
        ApiRequest::Named { seconds, .. } | ApiRequest::Flamegraph { seconds, .. } => seconds.map(secs),
        ApiRequest::Index { .. } | ApiRequest::Processes | ApiRequest::Status => None,
    }
}

fn secs(seconds: u64) -> Duration {
    Duration::from_secs(seconds)
}

fn profile(view: View, pid: Pid, body: ProfileBody) -> Response<Body> {
    if body.text {
        return response(StatusCode::OK, TEXT, body.bytes);
    }
    let mut response = response(StatusCode::OK, PROTO, body.bytes);
    if let Ok(value) = HeaderValue::try_from(page::attachment(view, pid)) {
        response.headers_mut().insert(header::CONTENT_DISPOSITION, value);
    }
    response
}

fn json(mut document: String) -> Response<Body> {
    if !document.ends_with('\n') {
        document.push('\n');
    }
    response(StatusCode::OK, JSON, document.into_bytes())
}

fn refuse(bad: &BadRequest) -> Response<Body> {
    let status = StatusCode::from_u16(bad.status).unwrap_or(StatusCode::BAD_REQUEST);
    let mut response = text(status, page::error_body(&bad.reason));
    if status == StatusCode::METHOD_NOT_ALLOWED {
        response.headers_mut().insert(header::ALLOW, HeaderValue::from_static("GET, HEAD"));
    }
    response
}

/// The HTTP status for each way a query can fail (see [`QueryError`]).
pub fn status_of(err: &QueryError) -> StatusCode {
    match err {
        QueryError::UnknownPid(_)
        | QueryError::Exited { .. }
        | QueryError::NotVisible(_)
        | QueryError::NotEnabled { .. }
        | QueryError::NotSelected { .. } => StatusCode::NOT_FOUND,
        QueryError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
        QueryError::Limited(_) => StatusCode::TOO_MANY_REQUESTS,
    }
}

fn query_error(err: &QueryError) -> Response<Body> {
    text(status_of(err), page::error_body(&err.to_string()))
}

fn text(status: StatusCode, body: String) -> Response<Body> {
    response(status, TEXT, body.into_bytes())
}

fn response(status: StatusCode, content_type: &'static str, body: Vec<u8>) -> Response<Body> {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    // As Go's net/http/pprof: browsers must not guess a type for profile bytes.
    headers.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_errors_map_to_http_statuses() {
        let cases = [
            (QueryError::UnknownPid(Pid(1)), 404),
            (QueryError::NotEnabled { kind: ProfileKind::Heap, fix: "x".into() }, 404),
            (QueryError::NotVisible(Pid(1)), 404),
            (QueryError::Unavailable("busy".into()), 503),
            (QueryError::Limited("4 captures".into()), 429),
        ];
        for (err, status) in cases {
            assert_eq!(status_of(&err).as_u16(), status, "{err}");
        }
    }

    #[test]
    fn only_thread_dumps_are_gated_as_dumps() {
        let pid = Pid(1);
        let threads = View::of(ProfileKind::Threads);
        assert!(is_dump(ApiRequest::Named { view: threads, pid, seconds: None, debug: 2, os_threads: false }));
        assert!(is_dump(ApiRequest::Flamegraph { view: threads, pid, seconds: None }));
        let cpu = View::of(ProfileKind::Cpu);
        assert!(!is_dump(ApiRequest::Named { view: cpu, pid, seconds: None, debug: 0, os_threads: false }));
        assert!(!is_dump(ApiRequest::Profile { pid, seconds: 1 }));
    }

    #[test]
    fn a_refused_dump_says_when_to_retry() {
        let refusal = DumpRefusal::Budget { retry_after: Duration::from_millis(2_500) };
        let response = too_many_dumps(Viewer { uid: 65534 }, refusal);
        assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(response.headers()[header::RETRY_AFTER], "3");
    }

    #[test]
    fn refusals_are_plain_text_and_405_says_what_is_allowed() {
        let response = refuse(&BadRequest { status: 405, reason: "no".into() });
        assert_eq!(response.status(), StatusCode::METHOD_NOT_ALLOWED);
        assert_eq!(response.headers()[header::ALLOW], "GET, HEAD");
        assert_eq!(response.headers()[header::CONTENT_TYPE], TEXT);
    }
}
