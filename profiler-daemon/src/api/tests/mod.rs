//! The server over a real unix socket, against a fake collector: what every endpoint
//! answers, refusals, limits and timeouts, shutdown. No root needed.

mod endpoints;
mod fake;
mod limits;
mod request;
mod socket;

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::UnixStream,
    sync::oneshot,
    task::JoinHandle,
};

use super::{bind, serve, Limits};
use crate::{config::SocketConfig, control};

/// A scratch directory removed on drop.
pub(super) struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("profiler-api-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("create a scratch directory");
        Self(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A running server on a scratch socket.
struct Server {
    _dir: TempDir,
    path: PathBuf,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<()>,
}

impl Server {
    async fn start(name: &str, limits: Limits) -> Self {
        let dir = TempDir::new(name);
        // A missing parent directory is created by `bind`.
        let path = dir.0.join("run/profiler.sock");
        let listener = bind(&SocketConfig { path: path.clone(), group: None }).expect("bind the test socket");
        let (handle, commands) = control::channel();
        fake::collector(commands);
        let (stop, stopped) = oneshot::channel::<()>();
        let shutdown = async move {
            let _ = stopped.await;
        };
        let task = tokio::spawn(serve(listener, handle, limits, shutdown));
        Self { _dir: dir, path, stop: Some(stop), task }
    }

    /// `GET uri` through the CLI's client.
    async fn get(&self, uri: &str) -> (u16, String) {
        let (path, uri) = (self.path.clone(), uri.to_owned());
        let (status, body) = tokio::task::spawn_blocking(move || crate::client::get(&path, &uri))
            .await
            .expect("client task")
            .expect("client request");
        (status, String::from_utf8_lossy(&body).into_owned())
    }

    /// Sends `request` as is and returns everything the server sends until it hangs up.
    async fn raw(&self, request: &[u8]) -> String {
        let mut stream = UnixStream::connect(&self.path).await.expect("connect");
        let _ = stream.write_all(request).await;
        read_to_close(&mut stream).await
    }

    async fn stop(mut self) {
        let _ = self.stop.take().expect("stopped once").send(());
        tokio::time::timeout(Duration::from_secs(10), &mut self.task).await.expect("server stops").unwrap();
    }
}

/// Everything until EOF or a reset, failing the test if that takes over 5 s.
async fn read_to_close(stream: &mut UnixStream) -> String {
    let mut out = Vec::new();
    let read = async {
        let mut buf = [0u8; 4096];
        while let Ok(n @ 1..) = stream.read(&mut buf).await {
            out.extend_from_slice(&buf[..n]);
        }
    };
    tokio::time::timeout(Duration::from_secs(5), read).await.expect("the server hangs up");
    String::from_utf8_lossy(&out).into_owned()
}

fn test_limits() -> Limits {
    Limits { header_read_timeout: Duration::from_secs(2), shutdown_grace: Duration::from_secs(3), ..Limits::default() }
}

fn get_request(uri: &str) -> Vec<u8> {
    format!("GET {uri} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n").into_bytes()
}

fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

fn exists(path: &Path) -> bool {
    std::fs::symlink_metadata(path).is_ok()
}
