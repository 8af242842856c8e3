//! The bench's backend: an HTTP/1.1 server on 127.0.0.1 that reads each request (keep-alive)
//! and answers 200 with an empty body, counting requests and body bytes. It decodes
//! nothing, so what the bench measures is the daemon's side. Stopping it closes the
//! listener (connections are refused) and makes open connections close at their next
//! request, as a backend that went down does.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use anyhow::{Context, Result};

#[derive(Default)]
struct Counts {
    requests: AtomicU64,
    bytes: AtomicU64,
    /// When the first request since the last (re)start arrived.
    first: Mutex<Option<Instant>>,
}

pub struct Backend {
    port: u16,
    counts: Arc<Counts>,
    /// Set while down; each listener's thread owns its own flag.
    down: Arc<AtomicBool>,
}

impl Backend {
    pub fn start() -> Result<Self> {
        let mut backend = Self { port: 0, counts: Arc::default(), down: Arc::new(AtomicBool::new(true)) };
        backend.listen()?;
        Ok(backend)
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn requests(&self) -> u64 {
        self.counts.requests.load(Ordering::Relaxed)
    }

    pub fn bytes(&self) -> u64 {
        self.counts.bytes.load(Ordering::Relaxed)
    }

    /// When the first request since the last (re)start arrived.
    pub fn first_request(&self) -> Option<Instant> {
        *self.counts.first.lock().expect("first lock")
    }

    /// Refuses connections, and closes open ones at their next request.
    pub fn stop(&mut self) {
        self.down.store(true, Ordering::Relaxed);
        // Wakes the accept loop so it sees the flag and drops the listener.
        let _ = TcpStream::connect(("127.0.0.1", self.port));
    }

    /// Listens again on the same port.
    pub fn restart(&mut self) -> Result<()> {
        *self.counts.first.lock().expect("first lock") = None;
        self.listen()
    }

    fn listen(&mut self) -> Result<()> {
        let listener = TcpListener::bind(("127.0.0.1", self.port)).context("failed to bind the bench backend")?;
        self.port = listener.local_addr()?.port();
        let down = Arc::new(AtomicBool::new(false));
        self.down = Arc::clone(&down);
        let counts = Arc::clone(&self.counts);
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                if down.load(Ordering::Relaxed) {
                    return;
                }
                let Ok(stream) = stream else { continue };
                let (counts, down) = (Arc::clone(&counts), Arc::clone(&down));
                std::thread::spawn(move || serve(stream, &counts, &down));
            }
        });
        Ok(())
    }
}

impl Drop for Backend {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Answers the connection's requests until it closes or the backend goes down.
fn serve(stream: TcpStream, counts: &Counts, down: &AtomicBool) {
    let Ok(mut writer) = stream.try_clone() else { return };
    let mut reader = BufReader::new(stream);
    loop {
        let mut length = 0usize;
        let mut line = String::new();
        loop {
            line.clear();
            match reader.read_line(&mut line) {
                Ok(0) | Err(_) => return,
                Ok(_) if line == "\r\n" => break,
                Ok(_) => {
                    if let Some((name, value)) = line.split_once(':') {
                        if name.eq_ignore_ascii_case("content-length") {
                            length = value.trim().parse().unwrap_or(0);
                        }
                    }
                }
            }
        }
        let mut body = vec![0; length];
        if reader.read_exact(&mut body).is_err() || down.load(Ordering::Relaxed) {
            return;
        }
        counts.first.lock().expect("first lock").get_or_insert_with(Instant::now);
        counts.requests.fetch_add(1, Ordering::Relaxed);
        counts.bytes.fetch_add(length as u64, Ordering::Relaxed);
        if writer.write_all(b"HTTP/1.1 200 OK\r\nContent-Type: application/proto\r\nContent-Length: 0\r\n\r\n").is_err()
        {
            return;
        }
    }
}
