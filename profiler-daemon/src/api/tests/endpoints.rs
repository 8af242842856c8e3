//! What each endpoint answers, and that refusals leave the server serving.

use super::{euid, fake, get_request, test_limits, Server};
use crate::{control::Viewer, pprof};

#[tokio::test]
async fn index_lists_the_viewers_processes() {
    let server = Server::start("index", test_limits()).await;
    let response = server.raw(&get_request("/debug/pprof/")).await;
    assert!(response.starts_with("HTTP/1.1 200 OK\r\n"), "{response}");
    assert!(response.contains("\r\ncontent-type: text/html; charset=utf-8\r\n"), "{response}");
    assert!(
        response.contains(&format!("<td><a href='?pid=4242'>fake</a></td><td>{}</td><td>fake.service</td>", euid()))
    );
    assert!(response.contains("<a href='profile?pid=4242'>cpu</a> 10"), "{response}");
    assert!(response.contains("<a href='allocs?pid=4242&amp;debug=1'>allocs</a> 3"), "{response}");
    // Root sees every process; anyone else only their own (the filter is tested in `page`).
    let sees_theirs = Viewer { uid: euid() }.may_see(euid() + 1);
    assert_eq!(response.contains("?pid=77'>theirs"), sees_theirs, "{response}");
    let (status, body) = server.get("/debug/pprof").await;
    assert_eq!((status, body.contains("?pid=4242'>fake")), (200, true), "{body}");
    // One process's page, as Go's index lays it out; one answer for a pid it does not list.
    let (status, page) = server.get("/debug/pprof/?pid=4242").await;
    assert_eq!(status, 200, "{page}");
    assert!(page.contains("<tr><td>3</td><td><a href='heap?pid=4242&amp;debug=1'>heap</a></td></tr>"), "{page}");
    assert_eq!(server.get("/debug/pprof/?pid=5").await.0, 404);
    let (status, json) = server.get("/processes").await;
    assert_eq!(status, 200);
    assert!(json.contains("\"name\": \"fake\""), "{json}");
    server.stop().await;
}

#[tokio::test]
async fn cpu_profiles_are_gzipped_proto_downloads() {
    let server = Server::start("cpu", test_limits()).await;
    let response = server.raw(&get_request("/debug/pprof/profile?pid=4242&seconds=2")).await;
    assert!(response.starts_with("HTTP/1.1 200 OK\r\n"), "{response}");
    assert!(response.contains("\r\ncontent-type: application/octet-stream\r\n"), "{response}");
    assert!(response.contains("\r\ncontent-disposition: attachment; filename=\"cpu-4242.pb.gz\"\r\n"), "{response}");

    let path = server.path.clone();
    let (status, body) =
        tokio::task::spawn_blocking(move || crate::client::get(&path, "/debug/pprof/profile?pid=4242"))
            .await
            .unwrap()
            .unwrap();
    assert_eq!(status, 200);
    let profile = pprof::decode(&body, "response").expect("a gzipped profile.proto");
    let comment = &profile.string_table[profile.comment[0] as usize];
    // The viewer is the peer's uid, and the CPU window defaults to 30 s.
    assert_eq!(comment, &format!("viewer={} window=Some(30s)", euid()));
    server.stop().await;
}

#[tokio::test]
async fn named_profiles_pass_window_and_debug_through() {
    let server = Server::start("named", test_limits()).await;
    let response = server.raw(&get_request("/debug/pprof/allocs?pid=4242&debug=1&seconds=1")).await;
    assert!(response.starts_with("HTTP/1.1 200 OK\r\n"), "{response}");
    assert!(response.contains("\r\ncontent-type: text/plain; charset=utf-8\r\n"), "{response}");
    assert!(!response.contains("content-disposition"), "{response}");
    assert!(response.ends_with(&format!("\r\n\r\nviewer={} view=allocs window=Some(1s)\n", euid())), "{response}");
    let (status, body) = server.get("/debug/pprof/heap?pid=4242&debug=1").await;
    assert_eq!((status, body), (200, format!("viewer={} view=heap window=None\n", euid())));
    let response = server.raw(&get_request("/debug/pprof/heap?pid=4242")).await;
    assert!(response.contains("filename=\"heap-4242.pb.gz\""), "{response}");
    server.stop().await;
}

#[tokio::test]
async fn status_is_json() {
    let server = Server::start("status", test_limits()).await;
    let response = server.raw(&get_request("/status")).await;
    assert!(response.starts_with("HTTP/1.1 200 OK\r\n"), "{response}");
    assert!(response.contains("\r\ncontent-type: application/json\r\n"), "{response}");
    assert!(response.ends_with(&format!("\r\n\r\n{}\n", fake::STATUS_JSON)), "{response}");
    let head = server.raw(b"HEAD /status HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").await;
    assert!(head.starts_with("HTTP/1.1 200 OK\r\n") && head.ends_with("\r\n\r\n"), "no body for HEAD: {head}");
    let path = server.path.clone();
    let text = tokio::task::spawn_blocking(move || crate::client::status(&path, true)).await.unwrap().unwrap();
    assert_eq!(text, format!("{}\n", fake::STATUS_JSON), "--json: the daemon's JSON as sent");
    let path = server.path.clone();
    let summary = tokio::task::spawn_blocking(move || crate::client::status(&path, false)).await.unwrap();
    assert!(summary.is_err(), "the fake's JSON is not a full /status: {summary:?}");
    let path = server.path.clone();
    let ps = tokio::task::spawn_blocking(move || crate::client::ps(&path, false)).await.unwrap().unwrap();
    let row = ps.lines().find(|l| l.contains("fake")).unwrap_or_else(|| panic!("no row for the fake: {ps}"));
    assert!(row.trim_start().starts_with("4242 fake") && row.contains("fake.service"), "{ps}");
    server.stop().await;
}

#[tokio::test]
async fn bad_requests_get_a_4xx_and_the_server_keeps_serving() {
    let server = Server::start("bad", test_limits()).await;
    let cases = [
        ("/nope", 404, "no such endpoint /nope; see /debug/pprof/ or /status\n"),
        ("/debug/pprof/profile", 400, "missing pid parameter\n"),
        ("/debug/pprof/heap?pid=abc", 400, "pid must be a process id from 1 to 4194304, got \"abc\"\n"),
        ("/debug/pprof/profile?pid=1&seconds=abc", 400, "seconds must be a whole number of seconds, got \"abc\"\n"),
        ("/debug/pprof/profile?pid=1&seconds=301", 400, "seconds=301 is over the cap of 300 seconds\n"),
        ("/debug/pprof/heap?pid=1&debug=2", 400, "debug must be 0 or 1, got \"2\"\n"),
        ("/status?x=1", 400, "unknown parameter \"x\": /status takes no parameters\n"),
    ];
    for (uri, status, reason) in cases {
        assert_eq!(server.get(uri).await, (status, reason.to_string()), "{uri}");
    }
    let post = server.raw(b"POST /status HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n").await;
    assert!(post.starts_with("HTTP/1.1 405 Method Not Allowed\r\n"), "{post}");
    assert!(post.contains("\r\nallow: GET, HEAD\r\n"), "{post}");
    let garbage = server.raw(b"\x16\x03\x01 not http at all\r\n\r\n").await;
    assert!(garbage.starts_with("HTTP/1.1 400"), "{garbage}");
    assert_eq!(server.get("/status").await.0, 200, "still serving");
    server.stop().await;
}

#[tokio::test]
async fn collector_errors_map_to_statuses() {
    let server = Server::start("errors", test_limits()).await;
    let cases = [
        ("/debug/pprof/heap?pid=77", 404, "no data for pid 77: no such process of yours is profiled\n"),
        ("/debug/pprof/heap?pid=5", 404, "no such process: pid 5 is not running and the daemon has no data of it\n"),
        ("/debug/pprof/block?pid=4242", 404, "the block profile is not enabled: add it\n"),
        ("/debug/pprof/threadcreate?pid=4242", 503, "the daemon is unavailable: shutting down\n"),
    ];
    for (uri, status, reason) in cases {
        assert_eq!(server.get(uri).await, (status, reason.to_string()), "{uri}");
    }
    server.stop().await;
}

#[tokio::test]
async fn keep_alive_serves_several_requests_on_one_connection() {
    let server = Server::start("keepalive", test_limits()).await;
    let two = b"GET /status HTTP/1.1\r\nHost: x\r\n\r\nGET /nope HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
    let response = server.raw(two).await;
    assert_eq!(response.matches("HTTP/1.1 200 OK\r\n").count(), 1, "{response}");
    assert_eq!(response.matches("HTTP/1.1 404 Not Found\r\n").count(), 1, "{response}");
    server.stop().await;
}
