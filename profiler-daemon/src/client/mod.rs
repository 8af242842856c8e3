//! The CLI side of the control socket (`profiler status`, `profiler ps`): a blocking,
//! std-only HTTP/1.1 client for one `GET` per connection (no async runtime and no HTTP crate,
//! because the CLI sends one request and exits), and [`show`], which turns the daemon's
//! JSON into text for people.

mod show;

use std::{
    io::{self, BufRead, BufReader, Read, Write},
    os::unix::net::UnixStream,
    path::{Path, PathBuf},
    time::Duration,
};

use crate::api::MAX_SECONDS;

/// Longest status line or header line accepted, and most header lines.
const MAX_LINE_BYTES: usize = 8 * 1024;
const MAX_HEADERS: usize = 100;
/// Largest body accepted; profiles are a few MiB at most.
const MAX_BODY_BYTES: u64 = 256 * 1024 * 1024;
/// The daemon may legitimately stay silent for a whole profile window.
const READ_TIMEOUT: Duration = Duration::from_secs(MAX_SECONDS + 90);

/// Why a request to the daemon failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("cannot connect to {path}; is the daemon running? (`systemctl status profiler`)")]
    NotRunning {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("permission denied on {path}; run as root or as a member of the socket's group ([socket] group)")]
    PermissionDenied { path: PathBuf },
    #[error("failed to talk to the daemon on {path}")]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("the daemon on {path} sent a malformed response: {reason}")]
    Malformed { path: PathBuf, reason: String },
    #[error("the daemon answered {status} to {request}: {reason}")]
    Refused { request: String, status: u16, reason: String },
}

/// Sends `GET {path}` to the daemon on `socket` and returns the status code and the body.
pub fn get(socket: &Path, path: &str) -> Result<(u16, Vec<u8>), ClientError> {
    let mut stream = connect(socket)?;
    let io_err = |source| ClientError::Io { path: socket.to_owned(), source };
    stream.set_read_timeout(Some(READ_TIMEOUT)).map_err(io_err)?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).map_err(io_err)?;
    read_response(&mut BufReader::new(stream)).map_err(|err| match err {
        ReadError::Io(source) => io_err(source),
        ReadError::Malformed(reason) => ClientError::Malformed { path: socket.to_owned(), reason },
    })
}

/// `/status`: a short summary for people, or with `json` the daemon's JSON as sent.
pub fn status(socket: &Path, json: bool) -> Result<String, ClientError> {
    let text = get_text(socket, "/status")?;
    if json {
        return Ok(text);
    }
    show::status(&parse(socket, &text)?)
        .ok_or_else(|| ClientError::Malformed { path: socket.to_owned(), reason: "an unexpected /status".into() })
}

/// The processes the daemon profiles: a table for people, or with `json` the daemon's JSON.
pub fn ps(socket: &Path, json: bool) -> Result<String, ClientError> {
    let text = get_text(socket, "/processes")?;
    if json {
        return Ok(text);
    }
    show::processes(&parse(socket, &text)?)
        .ok_or_else(|| ClientError::Malformed { path: socket.to_owned(), reason: "an unexpected /processes".into() })
}

fn parse(socket: &Path, text: &str) -> Result<serde_json::Value, ClientError> {
    serde_json::from_str(text)
        .map_err(|err| ClientError::Malformed { path: socket.to_owned(), reason: format!("not JSON: {err}") })
}

fn get_text(socket: &Path, path: &str) -> Result<String, ClientError> {
    let (status, body) = get(socket, path)?;
    let text = String::from_utf8_lossy(&body).into_owned();
    if status == 200 {
        return Ok(text);
    }
    Err(ClientError::Refused { request: path.to_owned(), status, reason: text.trim_end().to_owned() })
}

fn connect(socket: &Path) -> Result<UnixStream, ClientError> {
    UnixStream::connect(socket).map_err(|source| match source.kind() {
        io::ErrorKind::PermissionDenied => ClientError::PermissionDenied { path: socket.to_owned() },
        io::ErrorKind::NotFound | io::ErrorKind::ConnectionRefused => {
            ClientError::NotRunning { path: socket.to_owned(), source }
        }
        _ => ClientError::Io { path: socket.to_owned(), source },
    })
}

#[derive(Debug)]
enum ReadError {
    Io(io::Error),
    Malformed(String),
}

impl From<io::Error> for ReadError {
    fn from(err: io::Error) -> Self {
        Self::Io(err)
    }
}

fn malformed<T>(reason: impl Into<String>) -> Result<T, ReadError> {
    Err(ReadError::Malformed(reason.into()))
}

/// Reads one response: status line, headers, and a body framed by `Transfer-Encoding:
/// chunked`, `Content-Length` or the end of the stream, in that order of precedence (RFC 9112).
fn read_response(reader: &mut impl BufRead) -> Result<(u16, Vec<u8>), ReadError> {
    let status = status_code(&read_line(reader)?)?;
    let headers = read_headers(reader)?;
    let header = |name: &str| headers.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str());
    let body = if header("transfer-encoding").is_some_and(|v| v.to_ascii_lowercase().contains("chunked")) {
        read_chunked(reader)?
    } else if let Some(length) = header("content-length") {
        let length: u64 = length.parse().or_else(|_| malformed(format!("bad content-length {length:?}")))?;
        read_exact_body(reader, length)?
    } else {
        read_body(reader, u64::MAX)?
    };
    Ok((status, body))
}

fn status_code(line: &str) -> Result<u16, ReadError> {
    let mut parts = line.splitn(3, ' ');
    let (version, code) = (parts.next().unwrap_or_default(), parts.next().unwrap_or_default());
    match code.parse::<u16>() {
        Ok(code @ 100..=599) if version.starts_with("HTTP/1.") => Ok(code),
        _ => malformed(format!("bad status line {line:?}")),
    }
}

fn read_headers(reader: &mut impl BufRead) -> Result<Vec<(String, String)>, ReadError> {
    let mut headers = Vec::new();
    loop {
        let line = read_line(reader)?;
        if line.is_empty() {
            return Ok(headers);
        }
        if headers.len() == MAX_HEADERS {
            return malformed(format!("more than {MAX_HEADERS} header lines"));
        }
        let Some((name, value)) = line.split_once(':') else {
            return malformed(format!("bad header {line:?}"));
        };
        headers.push((name.trim().to_owned(), value.trim().to_owned()));
    }
}

fn read_chunked(reader: &mut impl BufRead) -> Result<Vec<u8>, ReadError> {
    let mut body = Vec::new();
    loop {
        let line = read_line(reader)?;
        let size_text = line.split(';').next().unwrap_or_default().trim();
        let size = u64::from_str_radix(size_text, 16).or_else(|_| malformed(format!("bad chunk size {line:?}")))?;
        if size == 0 {
            read_headers(reader)?; // trailers, ignored
            return Ok(body);
        }
        if body.len() as u64 + size > MAX_BODY_BYTES {
            return malformed(format!("body larger than {MAX_BODY_BYTES} bytes"));
        }
        body.extend(read_exact_body(reader, size)?);
        if !read_line(reader)?.is_empty() {
            return malformed("chunk not followed by CRLF");
        }
    }
}

fn read_exact_body(reader: &mut impl BufRead, length: u64) -> Result<Vec<u8>, ReadError> {
    let body = read_body(reader, length)?;
    if (body.len() as u64) < length {
        return malformed(format!("body ended after {} of {length} bytes", body.len()));
    }
    Ok(body)
}

/// Reads up to `limit` bytes (to the end of the stream for `u64::MAX`), refusing bodies
/// over [`MAX_BODY_BYTES`].
fn read_body(reader: &mut impl BufRead, limit: u64) -> Result<Vec<u8>, ReadError> {
    if limit != u64::MAX && limit > MAX_BODY_BYTES {
        return malformed(format!("body of {limit} bytes is larger than {MAX_BODY_BYTES}"));
    }
    let mut body = Vec::new();
    (&mut *reader).take(limit.min(MAX_BODY_BYTES + 1)).read_to_end(&mut body)?;
    if body.len() as u64 > MAX_BODY_BYTES {
        return malformed(format!("body larger than {MAX_BODY_BYTES} bytes"));
    }
    Ok(body)
}

/// One line without its CRLF (a bare LF is accepted too).
fn read_line(reader: &mut impl BufRead) -> Result<String, ReadError> {
    let mut line = Vec::new();
    (&mut *reader).take(MAX_LINE_BYTES as u64 + 1).read_until(b'\n', &mut line)?;
    if line.is_empty() {
        return malformed("the connection closed before a complete response");
    }
    if line.last() != Some(&b'\n') {
        let why = if line.len() > MAX_LINE_BYTES { "a line longer than 8 KiB" } else { "the stream ended mid-line" };
        return malformed(why);
    }
    line.pop();
    if line.last() == Some(&b'\r') {
        line.pop();
    }
    String::from_utf8(line).or_else(|_| malformed("a header line that is not UTF-8"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(raw: &[u8]) -> Result<(u16, Vec<u8>), ReadError> {
        read_response(&mut &raw[..])
    }

    fn reason(raw: &[u8]) -> String {
        match parse(raw) {
            Err(ReadError::Malformed(reason)) => reason,
            other => panic!("expected malformed, got {other:?}"),
        }
    }

    #[test]
    fn content_length_bodies() {
        let raw = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 5\r\n\r\nhello, and more";
        assert_eq!(parse(raw).unwrap(), (200, b"hello".to_vec()));
        assert_eq!(reason(b"HTTP/1.1 200 OK\r\ncontent-length: 9\r\n\r\nshort"), "body ended after 5 of 9 bytes");
        assert_eq!(reason(b"HTTP/1.1 200 OK\r\ncontent-length: x\r\n\r\n"), "bad content-length \"x\"");
    }

    #[test]
    fn chunked_bodies_win_over_content_length() {
        let raw = b"HTTP/1.1 404 Not Found\r\nTransfer-Encoding: chunked\r\nContent-Length: 1\r\n\r\n\
            4;ext=1\r\nno s\r\n7\r\nuch pid\r\n0\r\nTrailer: x\r\n\r\n";
        assert_eq!(parse(raw).unwrap(), (404, b"no such pid".to_vec()));
        assert_eq!(reason(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n"), "bad chunk size \"zz\"");
    }

    #[test]
    fn bodies_without_framing_run_to_the_end() {
        assert_eq!(parse(b"HTTP/1.0 503 Busy\n\nbusy\n").unwrap(), (503, b"busy\n".to_vec()));
    }

    #[test]
    fn malformed_heads() {
        assert_eq!(reason(b"SSH-2.0-OpenSSH\r\n"), "bad status line \"SSH-2.0-OpenSSH\"");
        assert_eq!(reason(b"HTTP/1.1 999 Nope\r\n\r\n"), "bad status line \"HTTP/1.1 999 Nope\"");
        assert_eq!(reason(b"HTTP/1.1 200 OK\r\nno colon\r\n\r\n"), "bad header \"no colon\"");
        assert_eq!(reason(b"HTTP/1.1 200 OK\r\nX: y"), "the stream ended mid-line");
        assert_eq!(reason(b""), "the connection closed before a complete response");
        let long = format!("HTTP/1.1 200 OK\r\nX: {}\r\n\r\n", "y".repeat(MAX_LINE_BYTES));
        assert_eq!(reason(long.as_bytes()), "a line longer than 8 KiB");
    }

    #[test]
    fn a_missing_socket_says_to_check_the_daemon() {
        let err = get(Path::new("/nonexistent/profiler.sock"), "/status").unwrap_err();
        assert!(matches!(err, ClientError::NotRunning { .. }), "{err:?}");
        assert_eq!(
            err.to_string(),
            "cannot connect to /nonexistent/profiler.sock; is the daemon running? (`systemctl status profiler`)"
        );
    }
}
