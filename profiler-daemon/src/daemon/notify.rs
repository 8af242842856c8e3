//! Telling systemd how the daemon is doing (`Type=notify`): the `sd_notify(3)` protocol spoken
//! directly over a Unix datagram socket, without libsystemd or a crate. It is a handful of
//! `KEY=VALUE` lines in one datagram to the socket named by `$NOTIFY_SOCKET`.
//!
//! Owns: reading `$NOTIFY_SOCKET`, `$WATCHDOG_USEC` and `$WATCHDOG_PID`, and sending the
//! messages. Does not own *when* to send them (the daemon's lifecycle and its watchdog task
//! decide) nor whether the daemon is healthy enough to ping the watchdog.
//!
//! Not running under systemd (`$NOTIFY_SOCKET` unset) makes every call a no-op, and a failed
//! send is only a warning: the daemon must profile whether or not anyone listens.

use std::{
    ffi::OsStr,
    io,
    os::{
        linux::net::SocketAddrExt,
        unix::{
            ffi::OsStrExt,
            net::{SocketAddr, UnixDatagram},
        },
    },
    sync::Arc,
    time::Duration,
};

/// A handle on the service manager's notification socket. Cheap to clone (the socket is
/// shared), so the watchdog task and the lifecycle code can each hold one.
#[derive(Clone, Debug, Default)]
pub struct Notifier {
    /// `None` when not running under systemd, or when the socket could not be set up.
    target: Option<Arc<Target>>,
    /// How often to send `WATCHDOG=1`; `None` when systemd watches no deadline for us.
    watchdog_interval: Option<Duration>,
}

#[derive(Debug)]
struct Target {
    socket: UnixDatagram,
    addr: SocketAddr,
    /// `$NOTIFY_SOCKET` as written, for messages.
    name: String,
}

impl Notifier {
    /// Reads the environment systemd sets for a `Type=notify` service. The variables are left
    /// in place: the daemon starts no children that could mistake them for their own, and
    /// removing them from a multi-threaded process is not sound.
    pub fn from_env() -> Self {
        let socket = std::env::var_os("NOTIFY_SOCKET");
        let usec = std::env::var("WATCHDOG_USEC").ok();
        let pid = std::env::var("WATCHDOG_PID").ok();
        Self::new(socket.as_deref(), usec.as_deref(), pid.as_deref())
    }

    /// A notifier from explicit values, as `from_env` would read them: `notify_socket` is an
    /// absolute path or `@name` (abstract namespace); `watchdog_usec` is the deadline in µs;
    /// `watchdog_pid`, when set, must be this process for the watchdog to apply to it.
    pub fn new(notify_socket: Option<&OsStr>, watchdog_usec: Option<&str>, watchdog_pid: Option<&str>) -> Self {
        let Some(name) = notify_socket.filter(|name| !name.is_empty()) else {
            return Self::disabled();
        };
        let target = match Target::open(name) {
            Ok(target) => Some(Arc::new(target)),
            Err(err) => {
                tracing::warn!(notify_socket = %name.to_string_lossy(), error = %err,
                    "cannot notify systemd; readiness and watchdog pings will not be sent");
                None
            }
        };
        let watchdog_interval = target.as_ref().and(watchdog_interval(watchdog_usec, watchdog_pid));
        Self { target, watchdog_interval }
    }

    /// A notifier that sends nothing.
    pub fn disabled() -> Self {
        Self::default()
    }

    /// Whether messages go anywhere (running under systemd with a usable socket).
    #[cfg(test)]
    fn is_enabled(&self) -> bool {
        self.target.is_some()
    }

    /// How often to call [`Notifier::watchdog`]: half of `$WATCHDOG_USEC`, the usual margin so
    /// one late tick does not get the service killed. `None` means no watchdog is configured.
    pub fn watchdog_interval(&self) -> Option<Duration> {
        self.watchdog_interval
    }

    /// Startup is complete (the socket is listening, the programs are attached).
    pub fn ready(&self, status: &str) {
        self.send(&format!("READY=1\nSTATUS={}", one_line(status)));
    }

    /// Shutdown has begun; systemd stops expecting watchdog pings.
    pub fn stopping(&self) {
        self.send("STOPPING=1");
    }

    /// The daemon is alive; must be sent within every `$WATCHDOG_USEC`.
    pub fn watchdog(&self) {
        self.send("WATCHDOG=1");
    }

    /// A reload (SIGHUP) has begun. systemd ≥ 253 (`Type=notify-reload`) needs the
    /// `MONOTONIC_USEC` timestamp to match the reload to this message; older versions ignore
    /// the extra field, so it is always sent.
    pub fn reloading(&self) {
        match monotonic_usec() {
            Ok(usec) => self.send(&format!("RELOADING=1\nMONOTONIC_USEC={usec}")),
            Err(err) => {
                tracing::warn!(error = %err, "failed to read CLOCK_MONOTONIC for the reload notification");
                self.send("RELOADING=1");
            }
        }
    }

    /// The reload finished (applied or not); the daemon is ready again. `status` is the line
    /// `systemctl status` shows.
    pub fn ready_after_reload(&self, status: &str) {
        self.ready(status);
    }

    fn send(&self, message: &str) {
        let Some(target) = &self.target else { return };
        if let Err(err) = target.socket.send_to_addr(message.as_bytes(), &target.addr) {
            let first_line = message.lines().next().unwrap_or_default();
            tracing::warn!(notify_socket = %target.name, message = first_line, error = %err,
                "failed to notify systemd");
        }
    }
}

impl Target {
    fn open(name: &OsStr) -> io::Result<Self> {
        let addr = parse_addr(name)?;
        let socket = UnixDatagram::unbound()?;
        // The calls come from the async executor. A full queue means systemd is not draining
        // its socket; blocking would stall the daemon's timers and socket server with it, so a
        // full queue is reported like any other failed send instead.
        socket.set_nonblocking(true)?;
        Ok(Self { socket, addr, name: name.to_string_lossy().into_owned() })
    }
}

/// `/path` is a filesystem socket, `@name` one in the abstract namespace (a leading NUL on the
/// wire). Anything else (a relative path, systemd ≥ 254's `vsock:`) is rejected, as libsystemd
/// does for the forms it does not know.
fn parse_addr(name: &OsStr) -> io::Result<SocketAddr> {
    match name.as_bytes() {
        [b'/', ..] => SocketAddr::from_pathname(name),
        [b'@', abstract_name @ ..] => SocketAddr::from_abstract_name(abstract_name),
        _ => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "NOTIFY_SOCKET is neither an absolute path nor an @abstract name",
        )),
    }
}

/// Half the deadline in `$WATCHDOG_USEC`, if it is set, positive, and meant for this process.
fn watchdog_interval(usec: Option<&str>, pid: Option<&str>) -> Option<Duration> {
    let usec = usec?;
    // Set for a parent (e.g. a wrapper script exec'ing us keeps it; a forked child does not).
    if let Some(pid) = pid {
        if pid.trim().parse::<u32>().ok() != Some(std::process::id()) {
            return None;
        }
    }
    match usec.trim().parse::<u64>() {
        Ok(0) => None,
        Ok(usec) => Some(Duration::from_micros(usec) / 2),
        Err(_) => {
            tracing::warn!(watchdog_usec = usec, "ignoring WATCHDOG_USEC: not a number of microseconds");
            None
        }
    }
}

/// A newline would start a new `KEY=VALUE` assignment in the datagram.
fn one_line(text: &str) -> String {
    text.replace(['\n', '\r'], " ")
}

/// `CLOCK_MONOTONIC` in µs, the clock systemd compares `MONOTONIC_USEC` against.
fn monotonic_usec() -> io::Result<u64> {
    let mut now = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `now` is a valid, writable timespec for the duration of the call.
    if unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut now) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(now.tv_sec as u64 * 1_000_000 + now.tv_nsec as u64 / 1_000)
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;

    /// A socket standing in for systemd's, in a fresh temp dir removed on drop.
    struct FakeSystemd {
        dir: PathBuf,
        socket: UnixDatagram,
    }

    impl FakeSystemd {
        fn bind(test: &str) -> Self {
            let dir = std::env::temp_dir().join(format!("profiler-notify-{test}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).unwrap();
            let socket = UnixDatagram::bind(dir.join("notify")).unwrap();
            socket.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            Self { dir, socket }
        }

        fn path(&self) -> PathBuf {
            self.dir.join("notify")
        }

        fn recv(&self) -> String {
            let mut buf = [0u8; 4096];
            let len = self.socket.recv(&mut buf).unwrap();
            String::from_utf8(buf[..len].to_vec()).unwrap()
        }
    }

    impl Drop for FakeSystemd {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }

    #[test]
    fn sends_lifecycle_messages_to_a_path_socket() {
        let systemd = FakeSystemd::bind("path");
        let notifier = Notifier::new(Some(systemd.path().as_os_str()), None, None);
        assert!(notifier.is_enabled());
        notifier.ready("profiling 3 processes");
        assert_eq!(systemd.recv(), "READY=1\nSTATUS=profiling 3 processes");
        notifier.ready_after_reload("two\nlines");
        assert_eq!(systemd.recv(), "READY=1\nSTATUS=two lines", "a status is one line");
        notifier.watchdog();
        assert_eq!(systemd.recv(), "WATCHDOG=1");
        notifier.stopping();
        assert_eq!(systemd.recv(), "STOPPING=1");
    }

    #[test]
    fn reload_sends_a_monotonic_timestamp_then_ready() {
        let systemd = FakeSystemd::bind("reload");
        let notifier = Notifier::new(Some(systemd.path().as_os_str()), None, None);
        let before = monotonic_usec().unwrap();
        notifier.reloading();
        let message = systemd.recv();
        let usec: u64 = message.strip_prefix("RELOADING=1\nMONOTONIC_USEC=").unwrap().parse().unwrap();
        assert!(usec >= before && usec <= monotonic_usec().unwrap(), "{message}");
        notifier.ready_after_reload("reloaded");
        assert_eq!(systemd.recv(), "READY=1\nSTATUS=reloaded");
    }

    #[test]
    fn sends_to_an_abstract_socket() {
        let name = format!("profiler-notify-test-{}", std::process::id());
        let addr = SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
        let socket = UnixDatagram::bind_addr(&addr).unwrap();
        socket.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let notifier = Notifier::new(Some(OsStr::new(&format!("@{name}"))), None, None);
        notifier.watchdog();
        let mut buf = [0u8; 64];
        let len = socket.recv(&mut buf).unwrap();
        assert_eq!(&buf[..len], b"WATCHDOG=1");
    }

    #[test]
    fn without_a_socket_every_call_is_a_no_op() {
        for notifier in [
            Notifier::new(None, Some("30000000"), None),
            Notifier::new(Some(OsStr::new("")), None, None),
            Notifier::new(Some(OsStr::new("relative/path")), None, None),
        ] {
            assert!(!notifier.is_enabled());
            assert_eq!(notifier.watchdog_interval(), None, "no watchdog without a socket");
            notifier.ready("x");
            notifier.reloading();
            notifier.watchdog();
            notifier.stopping();
        }
    }

    #[test]
    fn a_vanished_socket_is_only_a_warning() {
        let systemd = FakeSystemd::bind("vanished");
        let notifier = Notifier::new(Some(systemd.path().as_os_str()), None, None);
        drop(systemd);
        notifier.ready("nobody listens");
        assert!(notifier.is_enabled());
    }

    #[test]
    fn watchdog_interval_is_half_the_deadline_for_this_process() {
        let own_pid = std::process::id().to_string();
        let other_pid = (std::process::id() + 1).to_string();
        let half = Some(Duration::from_secs(15));
        assert_eq!(watchdog_interval(Some("30000000"), None), half);
        assert_eq!(watchdog_interval(Some("30000000"), Some(&own_pid)), half);
        assert_eq!(watchdog_interval(Some("30000000"), Some(&other_pid)), None);
        assert_eq!(watchdog_interval(Some("0"), None), None);
        assert_eq!(watchdog_interval(Some("30s"), None), None);
        assert_eq!(watchdog_interval(None, Some(&own_pid)), None);

        let systemd = FakeSystemd::bind("interval");
        let notifier = Notifier::new(Some(systemd.path().as_os_str()), Some("30000000"), Some(&own_pid));
        assert_eq!(notifier.watchdog_interval(), half);
    }
}
