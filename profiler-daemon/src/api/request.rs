//! The socket's request grammar: [`ApiRequest::parse`] turns a method, a path and a query
//! string into one of the few requests the daemon answers, or a [`BadRequest`] with the HTTP
//! status and a one-line reason. Pure: no I/O, no collector, so it can be fuzzed.
//!
//! It is strict on purpose: an unknown, duplicated or malformed parameter is an error rather
//! than ignored, so a typo (`?pid=1&second=5`) never silently turns into a 30-second default.

use std::fmt;

use crate::{
    config::PID_MAX_LIMIT,
    ids::Pid,
    profiles::{ProfileKind, View},
};

use super::query::{ParamError, Params};

/// The longest window a client may ask for, in seconds: long enough for any interactive look,
/// short enough that a forgotten `curl` does not pin a connection slot for long.
pub const MAX_SECONDS: u64 = 300;

/// The CPU window when `seconds` is absent, as in Go's `net/http/pprof`.
pub const DEFAULT_CPU_SECONDS: u64 = 30;

/// Where the index lives; everything profile-related is under it.
pub const PPROF_PREFIX: &str = "/debug/pprof/";

/// A request the daemon answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ApiRequest {
    /// `GET /debug/pprof/[?pid=P]`: the processes the viewer may see (Go's index page for
    /// process `P`).
    Index { pid: Option<Pid> },
    /// `GET /processes`: the processes the viewer may see, as JSON (for `profiler ps`).
    Processes,
    /// `GET /debug/pprof/profile?pid=P[&seconds=S]`: CPU over the next `seconds`.
    Profile { pid: Pid, seconds: u64 },
    /// `GET /debug/pprof/{heap,allocs,block,mutex,threadcreate}?pid=P[&seconds=S][&debug=0|1]`,
    /// `GET /debug/pprof/goroutine?pid=P[&debug=0|1|2][&threads=os]` (alias `threads`).
    Named {
        view: View,
        pid: Pid,
        /// A delta over the next `seconds`; `None` = since the daemon started (heap: live now).
        seconds: Option<u64>,
        /// Go's `debug`: 0 gzipped protobuf, 1 Go's legacy text form, 2 (goroutine only)
        /// every thread with its own stack.
        debug: u8,
        /// `threads=os` (goroutine only): a Go process's OS threads, not its goroutines.
        os_threads: bool,
    },
    /// `GET /debug/pprof/flamegraph?pid=P[&type=T][&seconds=S]`: a profile of type `T` (an
    /// endpoint's name: profile, heap, allocs, block, mutex, threadcreate; default profile)
    /// drawn as an SVG flame graph. `seconds` as for that endpoint (profile: default 30).
    Flamegraph { view: View, pid: Pid, seconds: Option<u64> },
    /// `GET /status`: the daemon's health as JSON.
    Status,
}

/// Why a request was refused: a 4xx status and a one-line reason for the body.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BadRequest {
    pub status: u16,
    pub reason: String,
}

impl BadRequest {
    fn new(status: u16, reason: impl Into<String>) -> Self {
        Self { status, reason: reason.into() }
    }

    fn bad(reason: impl Into<String>) -> Self {
        Self::new(400, reason)
    }
}

impl fmt::Display for BadRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.status, self.reason)
    }
}

impl std::error::Error for BadRequest {}

impl From<ParamError> for BadRequest {
    fn from(err: ParamError) -> Self {
        Self::bad(err.to_string())
    }
}

/// The routes, before their parameters are read.
#[derive(Clone, Copy)]
enum Route {
    Index,
    Processes,
    Status,
    Cpu,
    Named(View),
    Flamegraph,
}

impl ApiRequest {
    /// Parses a request line's parts: `query` is the raw text after `?`, still
    /// percent-encoded. HEAD is accepted wherever GET is (hyper omits the body).
    pub fn parse(method: &str, path: &str, query: Option<&str>) -> Result<Self, BadRequest> {
        let route = route(path)?;
        if method != "GET" && method != "HEAD" {
            return Err(BadRequest::new(405, format!("method {method} is not allowed on {path}; use GET")));
        }
        let params = Params::parse(query.unwrap_or(""))?;
        match route {
            Route::Index => {
                params.only(path, &["pid"])?;
                let pid = params.get("pid").map(|_| pid(&params)).transpose()?;
                Ok(Self::Index { pid })
            }
            Route::Processes => params.only(path, &[]).map(|()| Self::Processes).map_err(Into::into),
            Route::Status => params.only(path, &[]).map(|()| Self::Status).map_err(Into::into),
            Route::Cpu => cpu(path, &params),
            Route::Named(kind) => named(path, kind, &params),
            Route::Flamegraph => flamegraph(path, &params),
        }
    }
}

fn route(path: &str) -> Result<Route, BadRequest> {
    if path == "/status" {
        return Ok(Route::Status);
    }
    if path == "/processes" {
        return Ok(Route::Processes);
    }
    if path == PPROF_PREFIX || path == PPROF_PREFIX.trim_end_matches('/') {
        return Ok(Route::Index);
    }
    let name = path.strip_prefix(PPROF_PREFIX).unwrap_or_default();
    if name == "flamegraph" {
        return Ok(Route::Flamegraph);
    }
    match View::at_endpoint(name) {
        Some(view) if view.kind == ProfileKind::Cpu => Ok(Route::Cpu),
        Some(view) => Ok(Route::Named(view)),
        None => Err(BadRequest::new(404, format!("no such endpoint {path}; see {PPROF_PREFIX} or /status"))),
    }
}

fn cpu(path: &str, params: &Params) -> Result<ApiRequest, BadRequest> {
    params.only(path, &["pid", "seconds"])?;
    let pid = pid(params)?;
    let seconds = seconds(params)?.unwrap_or(DEFAULT_CPU_SECONDS);
    Ok(ApiRequest::Profile { pid, seconds })
}

fn named(path: &str, view: View, params: &Params) -> Result<ApiRequest, BadRequest> {
    // A thread dump is a moment, not a window.
    let dump = view.kind == ProfileKind::Threads;
    params.only(path, if dump { &["pid", "debug", "threads"] } else { &["pid", "seconds", "debug"] })?;
    let pid = pid(params)?;
    let seconds = seconds(params)?;
    let debug = match params.get("debug") {
        None | Some("0") => 0,
        Some("1") => 1,
        Some("2") if dump => 2,
        Some(other) if dump => return Err(BadRequest::bad(format!("debug must be 0, 1 or 2, got {other:?}"))),
        Some(other) => return Err(BadRequest::bad(format!("debug must be 0 or 1, got {other:?}"))),
    };
    let os_threads = match params.get("threads") {
        None | Some("goroutines") => false,
        Some("os") => true,
        Some(other) => return Err(BadRequest::bad(format!("threads must be os or goroutines, got {other:?}"))),
    };
    Ok(ApiRequest::Named { view, pid, seconds, debug, os_threads })
}

fn flamegraph(path: &str, params: &Params) -> Result<ApiRequest, BadRequest> {
    params.only(path, &["pid", "type", "seconds"])?;
    let pid = pid(params)?;
    let name = params.get("type").unwrap_or("profile");
    let view = View::at_endpoint(name).ok_or_else(|| {
        let names: Vec<&str> = View::ALL.iter().map(|v| v.endpoint()).collect();
        BadRequest::bad(format!("type must be one of {}, got {name:?}", names.join(", ")))
    })?;
    let seconds = match (seconds(params)?, view.kind) {
        (None, ProfileKind::Cpu) => Some(DEFAULT_CPU_SECONDS),
        (Some(_), ProfileKind::Threads) => {
            return Err(BadRequest::bad("a thread dump is one moment: type=goroutine takes no seconds"));
        }
        (seconds, _) => seconds,
    };
    Ok(ApiRequest::Flamegraph { view, pid, seconds })
}

fn pid(params: &Params) -> Result<Pid, BadRequest> {
    let text = params.get("pid").ok_or_else(|| BadRequest::bad("missing pid parameter"))?;
    match digits(text) {
        Some(pid @ 1..) if pid <= u64::from(PID_MAX_LIMIT) => Ok(Pid(pid as u32)),
        _ => Err(BadRequest::bad(format!("pid must be a process id from 1 to {PID_MAX_LIMIT}, got {text:?}"))),
    }
}

fn seconds(params: &Params) -> Result<Option<u64>, BadRequest> {
    let Some(text) = params.get("seconds") else { return Ok(None) };
    match digits(text) {
        None => Err(BadRequest::bad(format!("seconds must be a whole number of seconds, got {text:?}"))),
        Some(0) => Err(BadRequest::bad("seconds must be at least 1")),
        Some(n) if n > MAX_SECONDS => {
            Err(BadRequest::bad(format!("seconds={n} is over the cap of {MAX_SECONDS} seconds")))
        }
        Some(n) => Ok(Some(n)),
    }
}

/// A plain decimal number: ASCII digits only (no sign, no spaces), saturating on overflow so
/// that a huge value reads as "over the cap" rather than "not a number".
fn digits(text: &str) -> Option<u64> {
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some(text.bytes().fold(0u64, |n, b| n.saturating_mul(10).saturating_add(u64::from(b - b'0'))))
}
