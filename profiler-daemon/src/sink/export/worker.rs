//! One export's loop: read the next files from the spool, send them, and move the export's cursor
//! past them only when the backend acknowledged them (or refused them for good). A failure
//! that may pass (no connection, a timeout, 408, 429, 5xx) is retried with exponential
//! backoff capped at `max_backoff` (or the server's `Retry-After`), re-reading the files each
//! time, so a file retention deleted meanwhile is counted as dropped and memory stays at one
//! request whatever the outage's length.

use std::{
    path::PathBuf,
    sync::{atomic::Ordering, Arc},
    time::Duration,
};

use hyper::header::{HeaderName, HeaderValue, AUTHORIZATION, CONTENT_TYPE};
use tokio::sync::watch;

use super::{
    client::{self, Client},
    request::{self, Host, Refused, Spooled},
    Shared,
};
use crate::{
    config::{Auth, ExportConfig, Protocol, Secret},
    sink::spool::{self, Cursor},
};

/// The first retry waits this long; each failure in a row doubles it, up to `max_backoff`.
const FIRST_BACKOFF: Duration = Duration::from_secs(1);
/// An idle export looks at the spool again after this long even without a wake-up (a
/// manifest written by a previous run, a lost notification).
const IDLE_RECHECK: Duration = Duration::from_secs(30);

/// The files of one request, and where the cursor goes once it is done.
#[derive(Default)]
struct Collected {
    profiles: Vec<Spooled>,
    end: Cursor,
    /// Files retention deleted before they were sent.
    dropped: u64,
    /// Files that will never be sent (too large, unreadable).
    refused: Vec<Refused>,
}

impl Collected {
    fn files(&self) -> u64 {
        (self.profiles.len() + self.refused.len()) as u64 + self.dropped
    }
}

/// How a send ended, when it did not succeed.
enum Failure {
    Retry { error: String, after: Option<Duration> },
    Permanent(String),
}

/// What a request needs beyond the files: the connection and the fixed headers.
struct Prepared {
    client: Client,
    headers: Vec<(HeaderName, HeaderValue)>,
}

pub struct Worker {
    pub config: ExportConfig,
    pub dir: PathBuf,
    pub host: Host,
    pub shared: Arc<Shared>,
    /// Every export's shared state, to find the manifests all of them have passed.
    pub all: Arc<[Arc<Shared>]>,
    pub cursor: Cursor,
    pub stop: watch::Receiver<bool>,
    prepared: Option<Prepared>,
}

impl Worker {
    pub fn new(
        config: ExportConfig,
        dir: PathBuf,
        host: Host,
        shared: Arc<Shared>,
        all: Arc<[Arc<Shared>]>,
        cursor: Cursor,
        stop: watch::Receiver<bool>,
    ) -> Self {
        Self { config, dir, host, shared, all, cursor, stop, prepared: None }
    }

    /// Sends until stopped; once stopped, it still sends what is queued, until idle or until
    /// a send fails (the owner bounds how long).
    pub async fn run(mut self) {
        let mut failures = 0u32;
        loop {
            let collected = self.collect().await;
            if collected.profiles.is_empty() {
                if collected.end != self.cursor {
                    self.advance(collected, 0).await;
                    continue;
                }
                if *self.stop.borrow() || !self.idle().await {
                    return;
                }
                continue;
            }
            match self.send(&collected.profiles).await {
                Ok(rejected) => {
                    if failures > 0 {
                        tracing::info!(export = self.config.name, "export recovered after {failures} failed tries");
                    }
                    failures = 0;
                    let sent = collected.profiles.len() as u64;
                    self.shared.counters.sent.fetch_add(sent.saturating_sub(rejected), Ordering::Relaxed);
                    self.shared.counters.failed.fetch_add(rejected, Ordering::Relaxed);
                    self.advance(collected, 0).await;
                }
                Err(Failure::Permanent(error)) => {
                    failures = 0;
                    tracing::error!(
                        export = self.config.name,
                        files = collected.profiles.len(),
                        "profiles refused for good: {error}"
                    );
                    self.shared.record_error(error);
                    let refused = collected.profiles.len() as u64;
                    self.advance(collected, refused).await;
                }
                Err(Failure::Retry { error, after }) => {
                    if failures == 0 {
                        tracing::warn!(export = self.config.name, "export failed, retrying with backoff: {error}");
                    }
                    self.shared.counters.retried.fetch_add(1, Ordering::Relaxed);
                    self.shared.record_error(error);
                    let wait = backoff(failures, after, self.config.max_backoff);
                    failures = failures.saturating_add(1);
                    if *self.stop.borrow() || !self.sleep(wait).await {
                        return;
                    }
                }
            }
        }
    }

    /// Waits for a new manifest; false when stopped.
    async fn idle(&mut self) -> bool {
        tokio::select! {
            _ = self.shared.wake.notified() => true,
            _ = tokio::time::sleep(IDLE_RECHECK) => true,
            _ = self.stop.changed() => false,
        }
    }

    /// Sleeps; false when stopped meanwhile.
    async fn sleep(&mut self, wait: Duration) -> bool {
        tokio::select! {
            _ = tokio::time::sleep(wait) => true,
            _ = self.stop.changed() => false,
        }
    }

    /// Reads the next request's files from the spool (off the executor).
    async fn collect(&self) -> Collected {
        let (dir, cursor, protocol) = (self.dir.clone(), self.cursor, self.config.protocol);
        tokio::task::spawn_blocking(move || collect(&dir, cursor, protocol)).await.unwrap_or_default()
    }

    /// Moves the cursor past a finished request, counting what it did not send; `failed` of
    /// its profiles were refused by the backend.
    async fn advance(&mut self, collected: Collected, failed: u64) {
        let counters = &self.shared.counters;
        counters.dropped.fetch_add(collected.dropped, Ordering::Relaxed);
        counters.failed.fetch_add(failed + collected.refused.len() as u64, Ordering::Relaxed);
        counters.queued.fetch_sub(collected.files() as i64, Ordering::Relaxed);
        if collected.dropped > 0 {
            tracing::error!(
                export = self.config.name,
                files = collected.dropped,
                "profiles deleted by retention before they were sent"
            );
        }
        if let Some(refused) = collected.refused.last() {
            let error = crate::error::chain(refused);
            tracing::error!(export = self.config.name, files = collected.refused.len(), "{error}");
            self.shared.record_error(error);
        }
        self.cursor = collected.end;
        counters.cursor_seq.store(self.cursor.seq, Ordering::Relaxed);
        let (dir, name, cursor) = (self.dir.clone(), self.config.name.clone(), self.cursor);
        let oldest = self.all.iter().map(|s| s.counters.cursor_seq.load(Ordering::Relaxed)).min().unwrap_or(cursor.seq);
        let written = tokio::task::spawn_blocking(move || {
            let written = spool::write_cursor(&dir, &name, cursor);
            spool::remove_before(&dir, oldest);
            written
        })
        .await;
        if let Ok(Err(err)) = written {
            self.shared.record_error(crate::error::chain(&err));
        }
    }

    /// Sends `profiles` in one request; `Ok(n)`: acknowledged, `n` of them rejected anyway
    /// (an OTLP partial success).
    async fn send(&mut self, profiles: &[Spooled]) -> Result<u64, Failure> {
        let (config, host, owned) = (self.config.clone(), self.host.clone(), profiles.to_vec());
        let (body, refused) = tokio::task::spawn_blocking(move || request::encode(&config, &host, &owned))
            .await
            .map_err(|err| Failure::Retry { error: format!("encoding failed: {err}"), after: None })?;
        let protocol = self.config.protocol;
        let url = self.config.url.text.clone();
        let prepared = self.prepare().map_err(|error| Failure::Retry { error, after: None })?;
        let mut headers = prepared.headers.clone();
        headers.push((CONTENT_TYPE, HeaderValue::from_static(body.content_type)));
        let bytes = body.bytes.len() as u64;
        let answer = prepared
            .client
            .post(protocol.path(), &headers, body.bytes)
            .await
            .map_err(|err| Failure::Retry { error: crate::error::chain(&err), after: None })?;
        let excerpt = || String::from_utf8_lossy(&answer.body[..answer.body.len().min(300)]).trim().to_owned();
        match answer.status {
            200..=299 => {
                self.shared.counters.bytes_sent.fetch_add(bytes, Ordering::Relaxed);
                let mut rejected = refused.len() as u64;
                if let Some(refused) = refused.last() {
                    self.shared.record_error(crate::error::chain(refused));
                }
                if protocol == Protocol::Otlp {
                    if let Some(partial) = crate::pprof::otlp::partial_success(&answer.body) {
                        rejected += partial.rejected_profiles.max(0) as u64;
                        self.shared.record_error(format!(
                            "{url} rejected {} profiles: {}",
                            partial.rejected_profiles, partial.message
                        ));
                    }
                }
                Ok(rejected.min(profiles.len() as u64))
            }
            408 | 429 | 500..=599 => Err(Failure::Retry {
                error: format!("{url} answered {}: {}", answer.status, excerpt()),
                after: answer.retry_after,
            }),
            status => Err(Failure::Permanent(format!("{url} answered {status}: {}", excerpt()))),
        }
    }

    /// The client and fixed headers, built on first use (and again after a failure to build
    /// them: a CA or secret file may be fixed while the daemon runs).
    fn prepare(&mut self) -> Result<&mut Prepared, String> {
        if self.prepared.is_none() {
            let config = &self.config;
            let tls = match config.url.tls {
                true => Some(client::tls_config(config.ca_file.as_deref()).map_err(|e| crate::error::chain(&e))?),
                false => None,
            };
            let mut headers = Vec::new();
            if config.protocol == Protocol::Pyroscope {
                headers.push((HeaderName::from_static("connect-protocol-version"), HeaderValue::from_static("1")));
            }
            for (name, value) in &config.headers {
                let name = HeaderName::from_bytes(name.as_bytes()).map_err(|e| e.to_string())?;
                headers.push((name, HeaderValue::from_str(value).map_err(|e| e.to_string())?));
            }
            if let Some(auth) = &config.auth {
                let mut value = HeaderValue::from_str(&authorization(auth)?)
                    .map_err(|_| "the credentials are not valid in a header".to_owned())?;
                value.set_sensitive(true);
                headers.push((AUTHORIZATION, value));
            }
            let client = Client::new(&config.url, tls, config.timeout);
            self.prepared = Some(Prepared { client, headers });
        }
        Ok(self.prepared.as_mut().expect("just built"))
    }
}

/// The files of the next request from `start`: up to the request limits, skipping (and
/// counting) those retention deleted and those the backend would refuse.
fn collect(dir: &std::path::Path, start: Cursor, protocol: Protocol) -> Collected {
    let mut c = Collected { end: start, ..Collected::default() };
    let mut uncompressed = 0u64;
    let Some(mut seq) = spool::first_from(dir, start.seq) else { return c };
    let mut index = if seq == start.seq { start.index } else { 0 };
    loop {
        // An unreadable manifest is skipped: its files cannot be named.
        let files = spool::read(dir, seq).map(|m| m.files).unwrap_or_default();
        for entry in files.into_iter().skip(index) {
            if c.profiles.len() >= request::MAX_REQUEST_PROFILES {
                return c;
            }
            match std::fs::read(dir.join(&entry.path)) {
                Ok(bytes) => {
                    let profile = Spooled { entry, bytes };
                    let size = profile.uncompressed_bytes();
                    match request::check(protocol, &profile) {
                        Ok(())
                            if !c.profiles.is_empty() && uncompressed + size > request::MAX_REQUEST_PROFILE_BYTES =>
                        {
                            return c
                        }
                        Ok(()) => {
                            uncompressed += size;
                            c.profiles.push(profile);
                        }
                        Err(refused) => c.refused.push(refused),
                    }
                }
                Err(err) if err.kind() == std::io::ErrorKind::NotFound => c.dropped += 1,
                Err(source) => c.refused.push(Refused::Read { path: entry.path, source }),
            }
            index += 1;
            c.end = Cursor { seq, index };
        }
        match spool::first_from(dir, seq + 1) {
            Some(next) => {
                (seq, index) = (next, 0);
                c.end = Cursor { seq, index };
            }
            None => return c,
        }
    }
}

/// `FIRST_BACKOFF` doubled per failure in a row, up to `max`, less up to a quarter at random
/// (so that a fleet whose backend came back does not retry in step); a server's
/// `Retry-After` instead, up to `max`.
fn backoff(failures: u32, retry_after: Option<Duration>, max: Duration) -> Duration {
    if let Some(after) = retry_after {
        return after.min(max);
    }
    let full = FIRST_BACKOFF.saturating_mul(1 << failures.min(20)).min(max);
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().subsec_nanos();
    full - full.mul_f64(f64::from(nanos % 1000) / 4000.0)
}

/// The `Authorization` value; secret files are read here.
fn authorization(auth: &Auth) -> Result<String, String> {
    let read = |secret: &Secret| match secret {
        Secret::Inline(text) => Ok(text.clone()),
        Secret::File(path) => std::fs::read_to_string(path)
            .map(|text| text.trim().to_owned())
            .map_err(|err| format!("failed to read the secret in {}: {err}", path.display())),
    };
    match auth {
        Auth::Basic { username, password } => {
            Ok(format!("Basic {}", base64(format!("{username}:{}", read(password)?).as_bytes())))
        }
        Auth::Bearer(token) => Ok(format!("Bearer {}", read(token)?)),
    }
}

/// Standard base64 with padding (RFC 4648), for basic auth.
fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let n = chunk.iter().enumerate().fold(0u32, |n, (i, &b)| n | u32::from(b) << (16 - 8 * i));
        for i in 0..4 {
            match i <= chunk.len() {
                true => out.push(ALPHABET[(n >> (18 - 6 * i) & 63) as usize] as char),
                false => out.push('='),
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sink::spool::{Entry, Manifest};

    #[test]
    fn base64_matches_rfc_4648() {
        for (plain, encoded) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foobar", "Zm9vYmFy"),
            ("user:pass", "dXNlcjpwYXNz"),
        ] {
            assert_eq!(base64(plain.as_bytes()), encoded);
        }
    }

    #[test]
    fn backoff_doubles_up_to_the_cap_and_obeys_retry_after() {
        let max = Duration::from_secs(60);
        let within = |d: Duration, full: u64| d <= Duration::from_secs(full) && d >= Duration::from_secs(full) * 3 / 4;
        assert!(within(backoff(0, None, max), 1));
        assert!(within(backoff(3, None, max), 8));
        assert!(within(backoff(30, None, max), 60));
        assert_eq!(backoff(0, Some(Duration::from_secs(7)), max), Duration::from_secs(7));
        assert_eq!(backoff(0, Some(Duration::from_secs(3600)), max), max);
    }

    #[test]
    fn collect_walks_manifests_in_order_and_counts_deleted_files() {
        let dir = std::env::temp_dir().join(format!("profiler-collect-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("app-1")).unwrap();
        let entry =
            |name: &str| Entry { path: format!("app-1/{name}"), kind: "cpu".into(), pid: 1, ..Entry::default() };
        for (seq, names) in [(3, vec!["a", "gone", "b"]), (7, vec!["c"])] {
            let files = names.iter().map(|n| entry(n)).collect();
            spool::write(&dir, &Manifest { seq, files, ..Manifest::default() }).unwrap();
        }
        for name in ["a", "b", "c"] {
            std::fs::write(dir.join("app-1").join(name), name).unwrap();
        }
        let all = collect(&dir, Cursor { seq: 0, index: 0 }, Protocol::Otlp);
        let names: Vec<&str> = all.profiles.iter().map(|p| p.entry.path.as_str()).collect();
        assert_eq!(names, ["app-1/a", "app-1/b", "app-1/c"]);
        assert_eq!((all.dropped, all.end, all.files()), (1, Cursor { seq: 7, index: 1 }, 4));
        let rest = collect(&dir, Cursor { seq: 3, index: 2 }, Protocol::Otlp);
        assert_eq!(rest.profiles.len(), 2, "from b on");
        let done = collect(&dir, all.end, Protocol::Otlp);
        assert!(done.profiles.is_empty() && done.end == all.end, "nothing new");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
