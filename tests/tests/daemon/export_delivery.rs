//! Delivery through `[[export]]` when things go wrong: a backend that answers 5xx or 429,
//! is slow, closes mid-request or is down; a daemon restarted with a backlog; a spool that
//! retention has to trim; TLS against a CA of the test's own. Ground truth: the files the
//! daemon wrote (the spool), by content, and their time stamps (their order).

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Duration;

use profiler_tests::backend::{Backend, Tls};
use profiler_tests::daemon::{file_name, wait_for, Daemon, DaemonConfig};
use profiler_tests::{preflight, Fixture, FixtureKind, TempDir};
use serde_json::json;

use super::export::{export_count, spooled_files, ARRIVAL};
use super::{CPU_SPLIT, FIXTURE_S};

/// A daemon exporting cpu_split's CPU profiles to `backend` with short timeouts and backoff.
fn config(backend: &Backend, extra: &str) -> DaemonConfig {
    let mut config = DaemonConfig::new(&[CPU_SPLIT]);
    config.exports = vec![format!(
        "protocol = \"pyroscope\"\nurl = {:?}\ntimeout = \"1s\"\nmax_backoff = \"2s\"\n{extra}",
        backend.url()
    )];
    config
}

/// What arrived, by file: each received body matched to the daemon's file with those bytes,
/// in the order received (repeats kept). Panics on a body that is no file of the daemon's.
fn arrivals(backend: &Backend, spooled: &HashMap<Vec<u8>, PathBuf>) -> Vec<(PathBuf, String)> {
    backend
        .received()
        .iter()
        .map(|record| {
            let bytes = std::fs::read(backend.profile_path(record)).expect("a received body");
            let file = spooled.get(&bytes).unwrap_or_else(|| panic!("{record} is no file the daemon wrote"));
            (file.clone(), record["id"].as_str().unwrap_or_default().to_owned())
        })
        .collect()
}

/// Waits until the export has nothing queued and at least `sent` profiles acknowledged.
fn wait_drained(daemon: &Daemon, sent: u64) {
    let drained = wait_for(ARRIVAL, || {
        export_count(daemon, "pyroscope", "queue_depth") == 0 && export_count(daemon, "pyroscope", "sent") >= sent
    });
    assert!(drained, "the backlog did not drain within {ARRIVAL:?}: {}", daemon.status()["export"]);
}

/// Files in the order they were written: by the time stamp in their name, then by the
/// `-N` a second dump in the same second adds.
fn in_written_order(files: &[PathBuf]) -> bool {
    let order = |f: &PathBuf| {
        let name = file_name(f);
        let mut parts = name.trim_end_matches(".pb.gz").split('-').skip(1);
        let stamp = parts.next().unwrap_or_default().to_owned();
        (stamp, parts.next().map_or(0, |n| n.parse::<u32>().unwrap_or(0)))
    };
    files.windows(2).all(|w| order(&w[0]) <= order(&w[1]))
}

/// The first time each file arrived, in arrival order; asserts repeats carry the same id.
fn first_arrivals(arrived: &[(PathBuf, String)]) -> Vec<PathBuf> {
    let mut ids: HashMap<&PathBuf, &str> = HashMap::new();
    let mut first = Vec::new();
    for (file, id) in arrived {
        match ids.get(file) {
            Some(seen) => assert_eq!(seen, id, "{} was sent again under another id", file.display()),
            None => {
                ids.insert(file, id);
                first.push(file.clone());
            }
        }
    }
    first
}

/// Two 503s, a 429 with `Retry-After: 1`, a connection closed halfway through the request,
/// then an answer slower than the 1 s timeout: each is retried (counted), and once the backend
/// behaves, every file the daemon wrote arrives, in the order written, nothing failed or
/// dropped; a file sent again (the slow answer came after the timeout) has the same id.
#[test]
fn a_failing_backend_is_retried_until_everything_arrives_in_order() {
    if !preflight() {
        return;
    }
    let backend = Backend::start(None);
    backend.set_mode(&json!({"mode": "status", "status": 503, "count": 2}));
    let daemon = Daemon::start(&config(&backend, ""));
    let _cpu = Fixture::spawn(FixtureKind::CpuSplitC, FIXTURE_S);
    let seen = |n: u64| wait_for(ARRIVAL, || backend.stats()["pushes"].as_u64().unwrap_or(0) >= n);
    assert!(seen(2), "no push reached the backend: {}", daemon.status()["export"]);
    backend.set_mode(&json!({"mode": "status", "status": 429, "retry_after": 1, "count": 1}));
    assert!(seen(3));
    backend.set_mode(&json!({"mode": "close", "count": 1}));
    assert!(seen(4));
    backend.set_mode(&json!({"mode": "slow", "delay": 3, "count": 1}));
    assert!(seen(5));
    wait_drained(&daemon, 3);
    let status = daemon.status();
    assert!(export_count(&daemon, "pyroscope", "retried") >= 5, "{}", status["export"]);
    assert_eq!(export_count(&daemon, "pyroscope", "failed"), 0, "{}", status["export"]);
    assert_eq!(export_count(&daemon, "pyroscope", "dropped"), 0);
    let last_error = status["export"]["pyroscope"]["last_error"].as_str().unwrap_or_default().to_owned();
    assert!(!last_error.is_empty(), "the last failure is shown: {}", status["export"]);

    let spooled = spooled_files(daemon.output());
    let first = first_arrivals(&arrivals(&backend, &spooled));
    assert!(in_written_order(&first), "not sent in the order written: {first:?}");
    let mut all: Vec<&PathBuf> = spooled.values().collect();
    all.sort();
    let sent = export_count(&daemon, "pyroscope", "sent") as usize;
    assert!(first.len() >= sent, "{} files arrived, {sent} acknowledged", first.len());
}

/// A backend that is down while three dumps are written: the export retries (connection
/// refused, shown as its last error), queues, keeps nothing in memory but its cursor, and when
/// the backend is back sends the backlog in order, each file once.
#[test]
fn a_backend_that_was_down_gets_the_backlog_in_order() {
    if !preflight() {
        return;
    }
    let mut backend = Backend::start(None);
    backend.stop();
    let daemon = Daemon::start(&config(&backend, ""));
    let _cpu = Fixture::spawn(FixtureKind::CpuSplitC, FIXTURE_S);
    let queued = wait_for(ARRIVAL, || export_count(&daemon, "pyroscope", "queue_depth") >= 3);
    assert!(queued, "nothing queued while the backend is down: {}", daemon.status()["export"]);
    let error = daemon.status()["export"]["pyroscope"]["last_error"].as_str().unwrap_or_default().to_owned();
    assert!(error.contains("failed to connect to 127.0.0.1:"), "{error}");
    assert!(export_count(&daemon, "pyroscope", "retried") >= 1);
    backend.restart();
    wait_drained(&daemon, 3);
    let spooled = spooled_files(daemon.output());
    let arrived = arrivals(&backend, &spooled);
    let first = first_arrivals(&arrived);
    assert_eq!(first.len(), arrived.len(), "a file was sent twice: {arrived:?}");
    assert!(in_written_order(&first), "{first:?}");
}

/// Two dumps acknowledged, then the backend goes down and two more queue, then the daemon is
/// stopped (its final dump queued too) and started again on the same directory with the
/// backend back: every file the two daemons wrote arrives exactly once (none lost, none
/// acknowledged sent again).
#[test]
fn a_restart_mid_backlog_loses_nothing_and_repeats_nothing_acknowledged() {
    if !preflight() {
        return;
    }
    let mut backend = Backend::start(None);
    let out = TempDir::new("export-restart");
    let mut config = config(&backend, "");
    config.output_dir = Some(out.path().join("out"));
    let _cpu = Fixture::spawn(FixtureKind::CpuSplitC, FIXTURE_S);
    let mut first_daemon = Daemon::start(&config);
    wait_drained(&first_daemon, 2);
    backend.stop();
    let acknowledged = export_count(&first_daemon, "pyroscope", "sent");
    let queued = wait_for(ARRIVAL, || export_count(&first_daemon, "pyroscope", "queue_depth") >= 2);
    assert!(queued, "{}", first_daemon.status()["export"]);
    first_daemon.signal(libc::SIGTERM);
    assert!(
        first_daemon.wait_exit(Duration::from_secs(20)).is_some_and(|s| s.success()),
        "the daemon did not stop cleanly"
    );
    let written = spooled_files(&out.path().join("out")).len();
    assert!(written as u64 > acknowledged, "{written} files written, {acknowledged} acknowledged");

    backend.restart();
    let second_daemon = Daemon::start(&config);
    wait_drained(&second_daemon, (written as u64) - acknowledged);
    second_daemon.signal(libc::SIGTERM);
    drop(second_daemon);
    let spooled = spooled_files(&out.path().join("out"));
    let arrived = arrivals(&backend, &spooled);
    let first = first_arrivals(&arrived);
    assert_eq!(first.len(), arrived.len(), "a file was sent twice across the restart");
    assert!(first.len() >= written, "{} of the {written} files of the first daemon arrived", first.len());
    assert!(in_written_order(&first), "{first:?}");
}

/// With the backend down, retention (`max_total_bytes`) has to delete the oldest files: the
/// export counts them as dropped, and when the backend is back every file retention kept
/// arrives; dropped + arrived covers everything written.
#[test]
fn a_full_spool_drops_the_oldest_and_counts_them() {
    if !preflight() {
        return;
    }
    let mut backend = Backend::start(None);
    backend.stop();
    let mut config = config(&backend, "");
    config.max_total_bytes = Some("12KiB".into());
    let daemon = Daemon::start(&config);
    let _cpu = Fixture::spawn(FixtureKind::CpuSplitC, FIXTURE_S);
    let trimmed = wait_for(ARRIVAL, || daemon.status_u64("/output/files_deleted_by_retention") >= 2);
    assert!(trimmed, "retention deleted nothing: {}", daemon.status()["output"]);
    backend.restart();
    let drained = wait_for(ARRIVAL, || {
        export_count(&daemon, "pyroscope", "queue_depth") == 0 && export_count(&daemon, "pyroscope", "dropped") >= 1
    });
    assert!(drained, "{}", daemon.status()["export"]);
    let kept = spooled_files(daemon.output());
    // Retention keeps deleting the oldest files after they were sent (the spool stays over
    // its 12 KiB): a body may match no file left, and is judged only by the counts below.
    let arrived: Vec<PathBuf> = backend
        .received()
        .iter()
        .filter_map(|record| kept.get(&std::fs::read(backend.profile_path(record)).expect("a received body")).cloned())
        .collect();
    let kept_before: Vec<&PathBuf> = kept.values().filter(|f| !arrived.contains(f)).collect();
    // Files written after the drain may still be on their way; everything older arrived.
    let newest_arrived = arrived.iter().map(|f| file_name(f)).max().unwrap_or_default();
    let missing: Vec<&&PathBuf> = kept_before.iter().filter(|f| file_name(f) < newest_arrived).collect();
    assert!(missing.is_empty(), "files retention kept were not sent: {missing:?}");
    let status = daemon.status();
    let (dropped, sent) = (export_count(&daemon, "pyroscope", "dropped"), export_count(&daemon, "pyroscope", "sent"));
    let written = status["output"]["files_written"].as_u64().unwrap();
    assert!(
        dropped + sent <= written && dropped + sent + 2 >= written,
        "dropped {dropped} + sent {sent} vs {written} written"
    );
}

/// https with the test's own CA as `ca_file`: profiles arrive. The same backend with the
/// system's roots instead: the certificate is refused (TLS error, retried), nothing arrives.
#[test]
fn tls_verifies_the_backend_against_the_ca_file() {
    if !preflight() {
        return;
    }
    let certs = TempDir::new("export-tls");
    let tls = Tls::generate(certs.path());
    let backend = Backend::start(Some(&tls));
    let daemon = Daemon::start(&config(&backend, &format!("ca_file = {:?}", tls.ca.display().to_string())));
    let _cpu = Fixture::spawn(FixtureKind::CpuSplitC, FIXTURE_S);
    let arrived = wait_for(ARRIVAL, || !backend.received().is_empty());
    assert!(arrived, "nothing arrived over TLS: {}", daemon.status()["export"]);
    drop(daemon);

    let untrusted = TempDir::new("export-tls-untrusted");
    let mut config = config(&backend, "");
    config.output_dir = Some(untrusted.path().join("out"));
    let before = backend.received().len();
    let daemon = Daemon::start(&config);
    let refused = wait_for(ARRIVAL, || export_count(&daemon, "pyroscope", "retried") >= 2);
    let error = daemon.status()["export"]["pyroscope"]["last_error"].as_str().unwrap_or_default().to_owned();
    assert!(refused && error.contains("TLS handshake"), "{error}");
    assert_eq!(backend.received().len(), before, "a profile went to a backend whose certificate is not trusted");
}
