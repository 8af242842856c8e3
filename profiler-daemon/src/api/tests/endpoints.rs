//! What each endpoint answers, and that refusals leave the server serving.

use super::{euid, fake, get_request, test_limits, Server};
use crate::{control::Viewer, pprof};

#[tokio::test]
async fn index_lists_the_viewers_processes() {
    let server = Server::start("index", test_limits()).await;
    let response = server.raw(&get_request("/debug/pprof/")).await;
    assert!(response.starts_with("HTTP/1.1 200 OK\r\n"), "{response}");
    assert!(response.contains("\r\ncontent-type: text/plain; charset=utf-8\r\n"), "{response}");
    assert!(response.contains(&format!("\n4242 fake {}\n", euid())), "{response}");
    assert!(response.contains("  cpu                 10  /debug/pprof/profile?pid=4242\n"), "{response}");
    assert!(response.contains("  allocs               3  /debug/pprof/allocs?pid=4242\n"), "{response}");
    // Root sees every process; anyone else only their own (the filter is tested in `render`).
    let sees_theirs = Viewer { uid: euid() }.may_see(euid() + 1);
    assert_eq!(response.contains("\n77 theirs "), sees_theirs, "{response}");
    let (status, body) = server.get("/debug/pprof").await;
    assert_eq!((status, body.contains("4242 fake")), (200, true), "{body}");
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
    let text = tokio::task::spawn_blocking(move || crate::client::status(&path)).await.unwrap().unwrap();
    assert_eq!(text, format!("{}\n", fake::STATUS_JSON));
    let path = server.path.clone();
    let ps = tokio::task::spawn_blocking(move || crate::client::ps(&path)).await.unwrap().unwrap();
    assert!(ps.contains("4242 fake"), "{ps}");
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
        ("/debug/pprof/heap?pid=77", 403, "pid 77 belongs to another user\n"),
        ("/debug/pprof/heap?pid=5", 404, "no data for pid 5: the process is unknown or has exited\n"),
        ("/debug/pprof/block?pid=4242", 404, "the block profile is not enabled for this process\n"),
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
