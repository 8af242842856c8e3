//! Timeouts, size limits, connection slots and shutdown.

use std::time::{Duration, Instant};

use tokio::{io::AsyncWriteExt, net::UnixStream};

use super::{exists, fake, get_request, read_to_close, test_limits, Server};
use crate::{api::Limits, client::ClientError};

#[tokio::test]
async fn idle_and_slow_clients_are_disconnected() {
    let limits = Limits { header_read_timeout: Duration::from_millis(300), ..test_limits() };
    let server = Server::start("idle", limits).await;
    let started = Instant::now();
    let mut idle = UnixStream::connect(&server.path).await.unwrap();
    let mut slow = UnixStream::connect(&server.path).await.unwrap();
    slow.write_all(b"GET /status HTTP/1.1\r\nHost: x\r\n").await.unwrap();
    let (idle_sent, slow_sent) = tokio::join!(read_to_close(&mut idle), read_to_close(&mut slow));
    assert!(started.elapsed() >= Duration::from_millis(250), "closed only after the timeout");
    assert!(!idle_sent.contains("200 OK") && !slow_sent.contains("200 OK"), "{idle_sent:?} {slow_sent:?}");
    assert_eq!(server.get("/status").await.0, 200, "still serving");
    server.stop().await;
}

#[tokio::test]
async fn oversized_requests_are_refused_and_closed() {
    let server = Server::start("oversized", test_limits()).await;
    let big_header = format!("GET /status HTTP/1.1\r\nHost: x\r\nX-Big: {}\r\n\r\n", "y".repeat(16 * 1024));
    let response = server.raw(big_header.as_bytes()).await;
    assert!(response.starts_with("HTTP/1.1 431"), "{response}");
    let long_uri = get_request(&format!("/debug/pprof/heap?pid={}", "1".repeat(16 * 1024)));
    let response = server.raw(&long_uri).await;
    assert!(response.starts_with("HTTP/1.1 4"), "{response}");
    assert_eq!(server.get("/status").await.0, 200, "still serving");
    server.stop().await;
}

#[tokio::test]
async fn connections_beyond_the_limit_get_503() {
    let limits =
        Limits { max_connections: 1, root_reserved: 0, busy_wait: Duration::from_millis(100), ..test_limits() };
    let server = Server::start("busy", limits).await;
    let holder = UnixStream::connect(&server.path).await.unwrap();
    // Let the server accept the holder first so it owns the only slot.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let response = server.raw(&get_request("/status")).await;
    assert!(response.starts_with("HTTP/1.1 503 Service Unavailable\r\n"), "{response}");
    assert!(response.ends_with("\r\n\r\ntoo many connections to the profiler socket; try again later\n"), "{response}");
    drop(holder);
    let deadline = Instant::now() + Duration::from_secs(3);
    while server.raw(&get_request("/status")).await.contains(" 503 ") {
        assert!(Instant::now() < deadline, "the slot is freed when the holder hangs up");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    server.stop().await;
}

#[tokio::test]
async fn a_client_that_pipelines_and_never_reads_loses_its_connection() {
    let limits = Limits {
        max_connections: 1,
        root_reserved: 0,
        write_timeout: Duration::from_secs(1),
        busy_wait: Duration::from_millis(50),
        ..test_limits()
    };
    let server = Server::start("pipelined", limits).await;
    // Thousands of requests in one write, none of the answers ever read: hyper answers
    // them in turn until the socket buffer is full, and then the write has to time out.
    let mut holder = UnixStream::connect(&server.path).await.unwrap();
    let flood = b"GET /status HTTP/1.1\r\nHost: localhost\r\n\r\n".repeat(20_000);
    // The write itself stalls once the server stops reading; it ends when the server hangs up.
    let flooding = tokio::spawn(async move {
        let _ = tokio::io::AsyncWriteExt::write_all(&mut holder, &flood).await;
        holder
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let first = server.raw(&get_request("/status")).await;
    assert!(first.contains(" 503 "), "the flooding client holds the slot: {first}");
    let deadline = Instant::now() + Duration::from_secs(5);
    while server.raw(&get_request("/status")).await.contains(" 503 ") {
        assert!(Instant::now() < deadline, "the pipelining client still holds the only slot");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    drop(flooding);
    server.stop().await;
}

#[tokio::test]
async fn a_collector_that_does_not_answer_gets_503() {
    let limits = Limits { request_slack: Duration::from_millis(200), ..test_limits() };
    let server = Server::start("slow", limits).await;
    let started = Instant::now();
    let (status, body) = server.get(&format!("/debug/pprof/heap?pid={}", fake::PID_SLOW)).await;
    assert_eq!((status, body.as_str()), (503, "the collector did not answer within 200ms; try again later\n"));
    assert!(started.elapsed() < fake::SLOW_DEFAULT, "answered at the deadline, not when the collector did");
    // A window extends the deadline: 1 s of profile plus 0.2 s of slack succeeds.
    let (status, _) = server.get(&format!("/debug/pprof/profile?pid={}&seconds=1", fake::PID_SLOW)).await;
    assert_eq!(status, 200);
    server.stop().await;
}

#[tokio::test]
async fn shutdown_finishes_in_flight_requests_and_removes_the_socket() {
    let server = Server::start("shutdown", test_limits()).await;
    let path = server.path.clone();
    let uri = format!("/debug/pprof/profile?pid={}&seconds=1", fake::PID_SLOW);
    let in_flight = tokio::task::spawn_blocking({
        let path = path.clone();
        move || crate::client::get(&path, &uri)
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    server.stop().await;
    let (status, _) = in_flight.await.unwrap().expect("the in-flight request is answered");
    assert_eq!(status, 200);
    assert!(!exists(&path), "the socket file is removed at shutdown");
    let err = crate::client::get(&path, "/status").unwrap_err();
    assert!(matches!(err, ClientError::NotRunning { .. }), "{err:?}");
}

#[tokio::test]
async fn shutdown_is_bounded_by_the_grace_period() {
    let limits = Limits { shutdown_grace: Duration::from_millis(200), ..test_limits() };
    let server = Server::start("grace", limits).await;
    let mut stream = UnixStream::connect(&server.path).await.unwrap();
    let request = get_request(&format!("/debug/pprof/heap?pid={}", fake::PID_SLOW));
    stream.write_all(&request).await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let started = Instant::now();
    server.stop().await;
    assert!(started.elapsed() < Duration::from_secs(2), "did not wait for the 10 s request");
    assert_eq!(read_to_close(&mut stream).await, "", "the dropped request gets no answer");
}
