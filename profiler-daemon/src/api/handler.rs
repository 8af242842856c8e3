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

/// Answers one request from `viewer`. `slack` is how long the collector may take beyond the
/// requested window before the client gets a 503 instead of waiting forever.
pub async fn handle<B>(
    req: Request<B>,
    collector: CollectorHandle,
    viewer: Viewer,
    slack: Duration,
) -> Result<Response<Body>, Infallible> {
    let (method, path) = (req.method().as_str(), req.uri().path());
    let response = match ApiRequest::parse(method, path, req.uri().query()) {
        Ok(request) => answer(request, &collector, viewer, slack).await,
        Err(bad) => refuse(&bad),
    };
    debug!(uid = viewer.uid, method, path, status = response.status().as_u16(), "api request");
    Ok(response)
}

async fn answer(request: ApiRequest, collector: &CollectorHandle, viewer: Viewer, slack: Duration) -> Response<Body> {
    let deadline = window(request).unwrap_or_default() + slack;
    match tokio::time::timeout(deadline, dispatch(request, collector, viewer)).await {
        Ok(Ok(response)) => response,
        Ok(Err(err)) => query_error(&err),
        Err(_) => {
            warn!(uid = viewer.uid, ?request, "the collector did not answer in time");
            let reason = format!("the collector did not answer within {}; try again later", format_duration(deadline));
            text(StatusCode::SERVICE_UNAVAILABLE, page::error_body(&reason))
        }
    }
}

async fn dispatch(
    request: ApiRequest,
    collector: &CollectorHandle,
    viewer: Viewer,
) -> Result<Response<Body>, QueryError> {
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
        ApiRequest::Profile { pid, seconds } => {
            ProfileQuery { viewer, pid, view: View::of(ProfileKind::Cpu), window: Some(secs(seconds)), debug: 0 }
        }
        ApiRequest::Named { view, pid, seconds, debug } => {
            ProfileQuery { viewer, pid, view, window: seconds.map(secs), debug }
        }
        ApiRequest::Flamegraph { view, pid, seconds } => {
            let query = ProfileQuery { viewer, pid, view, window: seconds.map(secs), debug: 0 };
            let body = collector.profile(query).await?;
            let title = format!("pid {pid} {}", view.endpoint());
            return Ok(match crate::flame::svg_of_pprof(&body.bytes, "the profile", None, &title) {
                Ok(svg) => response(StatusCode::OK, SVG, svg),
                Err(err @ crate::flame::FlameError::Empty(_)) => {
                    text(StatusCode::NOT_FOUND, page::error_body(&err.to_string()))
                }
                Err(err) => text(StatusCode::INTERNAL_SERVER_ERROR, page::error_body(&crate::error::chain(&err))),
            });
        }
    };
    let (view, pid) = (query.view, query.pid);
    Ok(profile(view, pid, collector.profile(query).await?))
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
    fn refusals_are_plain_text_and_405_says_what_is_allowed() {
        let response = refuse(&BadRequest { status: 405, reason: "no".into() });
        assert_eq!(response.status(), StatusCode::METHOD_NOT_ALLOWED);
        assert_eq!(response.headers()[header::ALLOW], "GET, HEAD");
        assert_eq!(response.headers()[header::CONTENT_TYPE], TEXT);
    }
}
