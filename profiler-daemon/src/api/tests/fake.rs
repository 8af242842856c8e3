//! A collector stand-in that answers [`Command`]s from fixed data, so the server is tested
//! without BPF. Which pid and view are asked for decides the answer. It runs on its own
//! thread and reads the same std channel as the real collector.

use std::time::Duration;

use super::euid;
use crate::{
    control::{
        Command, Commands, IndexEntry, ProfileBody, ProfileQuery, PublishedStatus, QueryError, Reloaded, Viewer,
    },
    ids::Pid,
    pprof::{encode_gzip, ProfileBuilder},
    profiles::ProfileKind,
};

/// Has data, answers at once.
pub const PID_OK: u32 = 4242;
/// Owned by someone else.
pub const PID_FORBIDDEN: u32 = 77;
/// Answers after its window, or after [`SLOW_DEFAULT`] without one.
pub const PID_SLOW: u32 = 9;
pub const SLOW_DEFAULT: Duration = Duration::from_secs(10);
/// As the front serves it: pretty, keys sorted.
pub const STATUS_JSON: &str = "{\n  \"uptime_s\": 1,\n  \"version\": \"test\"\n}";

/// Publishes `/status` (as the real collector does before the daemon is ready) and returns a
/// thread that answers until every handle is gone.
pub fn collector(commands: Commands) -> std::thread::JoinHandle<()> {
    let status: serde_json::Value = serde_json::from_str(STATUS_JSON).expect("valid JSON");
    commands.status.publish(PublishedStatus { full: status.clone(), counters_only: status });
    std::thread::spawn(move || answer(commands))
}

fn answer(commands: Commands) {
    while let Ok(command) = commands.recv() {
        match command {
            Command::Index { viewer, pid, reply } => {
                drop(reply.send(index(viewer).into_iter().filter(|e| pid.is_none_or(|p| p == e.pid)).collect()))
            }
            // Profiles run concurrently, as the real collector's windows do.
            Command::Profile { query, reply } => drop(std::thread::spawn(move || reply.send(profile(query)))),
            Command::Shutdown { reply } => drop(reply.send(())),
            Command::Reload { reply, .. } => drop(reply.send(Ok(Reloaded::default()))),
        }
    }
}

/// Like the real collector, filters by viewer: one process is ours, one is another uid's.
fn index(viewer: Viewer) -> Vec<IndexEntry> {
    let ours = IndexEntry {
        pid: Pid(PID_OK),
        name: "fake".into(),
        uid: euid(),
        unit: Some("fake.service".into()),
        container: None,
        profiles: vec![(ProfileKind::Cpu, 10), (ProfileKind::Heap, 3)],
    };
    let theirs = IndexEntry {
        pid: Pid(PID_FORBIDDEN),
        name: "theirs".into(),
        uid: euid() + 1,
        unit: None,
        container: None,
        profiles: vec![],
    };
    [ours, theirs].into_iter().filter(|e| viewer.may_see(e.uid)).collect()
}

fn profile(query: ProfileQuery) -> Result<ProfileBody, QueryError> {
    match (query.pid.0, query.view.kind) {
        (PID_FORBIDDEN, _) => return Err(QueryError::NotVisible(query.pid)),
        (PID_SLOW, _) => std::thread::sleep(query.window.unwrap_or(SLOW_DEFAULT)),
        (PID_OK, ProfileKind::Block) => {
            return Err(QueryError::NotEnabled { kind: ProfileKind::Block, fix: "add it".into() })
        }
        (PID_OK, ProfileKind::ThreadCreate) => return Err(QueryError::Unavailable("shutting down".into())),
        (PID_OK, _) => {}
        _ => return Err(QueryError::UnknownPid(query.pid)),
    }
    if query.debug > 0 {
        // Echo the query so tests see what reached the collector.
        let text = format!("viewer={} view={} window={:?}\n", query.viewer.uid, query.view.name(), query.window);
        return Ok(ProfileBody { bytes: text.into_bytes(), text: true });
    }
    let mut builder = ProfileBuilder::new(&[("samples", "count")], ("cpu", "nanoseconds"), 1);
    builder.add_comment(&format!("viewer={} window={:?}", query.viewer.uid, query.window));
    Ok(ProfileBody { bytes: encode_gzip(&builder.finish()), text: false })
}
