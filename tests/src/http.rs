//! Clients of the daemon's socket besides the crate's own: `curl`, as root or as another
//! user (for per-uid visibility and response headers), and raw bytes (for requests no
//! well-behaved client sends).

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

/// A response as `curl` saw it.
#[derive(Debug)]
pub struct CurlReply {
    pub status: u16,
    pub content_type: String,
    pub body: Vec<u8>,
}

/// `GET path` on `socket` with `curl`, as root or, with `as_nobody`, as uid/gid 65534 with
/// group 65534 (nogroup) only: the access a member of the socket's group has.
pub fn curl(socket: &Path, path: &str, as_nobody: bool) -> CurlReply {
    let mut cmd = if as_nobody {
        let mut cmd = Command::new("setpriv");
        cmd.args(["--reuid=65534", "--regid=65534", "--groups=65534", "--", "curl"]);
        cmd
    } else {
        Command::new("curl")
    };
    cmd.args(["-s", "--max-time", "60", "-w", "\n%{http_code} %{content_type}", "--unix-socket"])
        .arg(socket)
        .arg(format!("http://localhost{path}"));
    let output = crate::run::run_with_timeout(&mut cmd, Duration::from_secs(90));
    let out = output.stdout;
    let split = out.iter().rposition(|&b| b == b'\n').unwrap_or_else(|| {
        panic!("{cmd:?} printed no status ({}): {}", output.status, String::from_utf8_lossy(&output.stderr))
    });
    let trailer = String::from_utf8_lossy(&out[split + 1..]).into_owned();
    let (code, content_type) = trailer.split_once(' ').unwrap_or((trailer.as_str(), ""));
    CurlReply {
        status: code.parse().unwrap_or_else(|_| panic!("{cmd:?}: bad status trailer {trailer:?}")),
        content_type: content_type.to_owned(),
        body: out[..split].to_vec(),
    }
}

/// Writes `request` as is and returns the response's status code, or `None` if the daemon
/// closed the connection without one. A write the daemon cut short (it may hang up before
/// reading a huge request to the end) is not an error.
pub fn raw_exchange(socket: &Path, request: &[u8]) -> Option<u16> {
    let mut stream =
        UnixStream::connect(socket).unwrap_or_else(|e| panic!("failed to connect to {}: {e}", socket.display()));
    stream.set_read_timeout(Some(Duration::from_secs(30))).expect("set a read timeout");
    let _ = stream.write_all(request);
    let mut line = String::new();
    BufReader::new(stream).read_line(&mut line).ok()?;
    let code = line.strip_prefix("HTTP/1.")?.split(' ').nth(1)?;
    code.parse().ok()
}
