//! A member of the socket's group trying to take the socket from everyone else: every
//! connection it may have, each stuffed with pipelined requests it never reads, and more
//! concurrent captures than its share. Root still gets answers at once; the flooder gets
//! 429s, loses the connections it stopped reading, and every refusal is counted.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use profiler_tests::daemon::{wait_for, Daemon, DaemonConfig};
use profiler_tests::http::curl;
use profiler_tests::{preflight, Fixture, FixtureKind};

use super::{CPU_SPLIT, FIXTURE_S, SOON};

/// What root may wait for `/status` under the flood.
const ANSWER_WITHIN: Duration = Duration::from_secs(2);
/// The daemon's shares (`api::Limits::default`, the collector's window share).
const CONNECTIONS_PER_UID: usize = 8;
const WINDOWS_PER_UID: usize = 4;
/// The server's write timeout, plus time for the collector to answer the backlog.
const WRITE_TIMEOUT: Duration = Duration::from_secs(10);

/// Opens `connections` connections to `socket`, writes `requests` pipelined `GET /status`
/// on each without reading, prints `opened N` and then holds them.
const FLOODER: &str = r#"
import socket, sys, time
path, n, m = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
request = b"GET /status HTTP/1.1\r\nhost: x\r\n\r\n" * m
held = []
for _ in range(n):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(path)
    s.setblocking(False)
    try:
        s.send(request)
    except OSError:
        pass
    held.append(s)
print("opened", len(held), flush=True)
time.sleep(300)
"#;

/// Ground truth: four uids of the socket's group (nobody and three without a name, all in
/// group nogroup) open 12 + 8 + 8 + 8 connections, more than the server's 32 slots, each
/// stuffed with 5000 pipelined requests, and read nothing. Root's `/status` still answers
/// within 2 s (4 slots are root's alone); the first uid's 4 connections over its share of 8
/// are refused (429), 4 more find no slot left to other users (503), both counted; the
/// stalled ones are closed by the write timeout (counted), after which nobody is served
/// again. Before that, nobody asks for 5 captures of its own process at once: 4 run, the
/// fifth gets 429.
#[test]
fn a_flooding_client_cannot_take_the_socket() {
    if !preflight() {
        return;
    }
    let mut config = DaemonConfig::new(&[CPU_SPLIT]);
    config.socket_group = Some("nogroup");
    let daemon = Daemon::start(&config);
    let nobodys = Fixture::spawn_as_nobody(FixtureKind::CpuSplitC, FIXTURE_S, daemon.scratch());
    assert!(
        wait_for(SOON, || curl(daemon.socket(), &format!("/debug/pprof/?pid={}", nobodys.pid()), true).status == 200),
        "nobody's process never appeared in its index"
    );

    let socket = daemon.socket().to_owned();
    let pid = nobodys.pid();
    let captures: Vec<_> = (0..=WINDOWS_PER_UID)
        .map(|_| {
            let socket = socket.clone();
            std::thread::spawn(move || curl(&socket, &format!("/debug/pprof/profile?pid={pid}&seconds=4"), true))
        })
        .collect();
    let mut statuses: Vec<u16> = captures.into_iter().map(|c| c.join().unwrap().status).collect();
    statuses.sort_unstable();
    assert_eq!(statuses, [vec![200; WINDOWS_PER_UID], vec![429]].concat(), "5 captures at once as nobody");
    assert_eq!(daemon.status_u64("/refused/windows_over_uid_share"), 1);

    let flooders: Vec<Flooder> = [(65534, 12), (65533, 8), (65532, 8), (65531, 8)]
        .map(|(uid, n)| Flooder::start(daemon.socket(), uid, n, 5000))
        .into();
    for round in 0..5 {
        let started = Instant::now();
        let status = curl(daemon.socket(), "/status", false);
        let took = started.elapsed();
        assert_eq!(status.status, 200, "round {round}: root's /status under the flood");
        assert!(took < ANSWER_WITHIN, "round {round}: root's /status took {took:?} under the flood");
    }
    let over_share = daemon.status_u64("/refused/socket/connections_over_uid_share");
    assert_eq!(over_share, (12 - CONNECTIONS_PER_UID) as u64, "connections refused over nobody's share");
    let busy = wait_for(SOON, || daemon.status_u64("/refused/socket/connections_busy") >= 4);
    assert!(busy, "the others' share of slots did not run out: {:#}", daemon.status());
    let closed = wait_for(WRITE_TIMEOUT + SOON, || daemon.status_u64("/refused/socket/write_timeouts") > 0);
    assert!(closed, "no stalled connection was closed: {:#}", daemon.status());
    // With its stalled connections gone, nobody is served again.
    let again = wait_for(SOON, || curl(daemon.socket(), "/status", true).status == 200);
    assert!(again, "nobody is never served again after its connections were closed");
    drop(flooders);
}

struct Flooder {
    child: Child,
}

impl Flooder {
    /// Runs [`FLOODER`] as `uid`, in group nogroup (65534) only.
    fn start(socket: &std::path::Path, uid: u32, connections: usize, requests: usize) -> Self {
        let mut cmd = Command::new("setpriv");
        cmd.arg(format!("--reuid={uid}"))
            .args(["--regid=65534", "--groups=65534", "--", "/usr/bin/python3", "-c", FLOODER])
            .arg(socket)
            .args([connections.to_string(), requests.to_string()])
            .stdout(Stdio::piped());
        let mut child = cmd.spawn().unwrap_or_else(|e| panic!("failed to start {cmd:?}: {e}"));
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
        assert!(line.starts_with("opened "), "the flooder as uid {uid} printed {line:?}");
        Self { child }
    }

    fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Flooder {
    fn drop(&mut self) {
        self.stop();
    }
}
