//! The config file as written: serde types that mirror the TOML one to one, with human units
//! kept as written (`"60s"`, `"1GiB"`) and every default in one place (the `Default` impls
//! below). Nothing here checks a value; `Config::try_from` turns a [`RawConfig`] into a
//! [`super::Config`] once.

use std::{collections::BTreeMap, fmt, path::PathBuf};

use serde::{
    de::{self, Unexpected, Visitor},
    Deserialize, Deserializer,
};

use crate::units::format_bytes;

/// The whole file. An empty file is `RawConfig::default()`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RawConfig {
    pub output_dir: PathBuf,
    pub interval: Quantity,
    pub profiles: Vec<String>,
    pub socket: RawSocket,
    pub retention: RawRetention,
    pub cpu: RawCpu,
    pub processes: RawSelection,
    pub heap: RawHeap,
    pub threads: RawThreads,
    pub offcpu: RawOffCpu,
    pub block: RawBlock,
    pub mutex: RawMutex,
    pub limits: RawLimits,
    /// `[[export]]` tables, in the order written.
    #[serde(rename = "export")]
    pub exports: Vec<RawExport>,
}

/// `[socket]`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields, expecting = "a [socket] table")]
pub struct RawSocket {
    pub path: PathBuf,
    pub group: Option<String>,
}

/// `[retention]`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields, expecting = "a [retention] table")]
pub struct RawRetention {
    pub max_age: Quantity,
    pub max_total_bytes: Quantity,
    pub min_free_bytes: Quantity,
}

/// `[cpu]`. Integers are read as `i64`, TOML's own integer, so that an out-of-range value is
/// reported by validation with its key and range rather than as a serde type error.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields, expecting = "a [cpu] table")]
pub struct RawCpu {
    pub frequency_hz: i64,
}

/// `[processes]`: which processes are profiled at all.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields, expecting = "a [processes] table")]
pub struct RawSelection {
    pub include: Vec<RawMatcher>,
    pub exclude: Vec<RawMatcher>,
}

/// `[heap]`: the heap profiler's opt-in list and sampling interval.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields, expecting = "a [heap] table")]
pub struct RawHeap {
    pub include: Vec<RawMatcher>,
    pub sample_bytes: Quantity,
}

/// `[threads]`: whether interval dumps include a thread dump.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields, expecting = "a [threads] table")]
pub struct RawThreads {
    pub interval_dumps: bool,
}

/// `[offcpu]`: the off-CPU profile's sampling.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields, expecting = "an [offcpu] table")]
pub struct RawOffCpu {
    pub rate: Quantity,
    pub sample_every: i64,
}

/// `[block]`: the block profile's sampling rate.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields, expecting = "a [block] table")]
pub struct RawBlock {
    pub rate: Quantity,
}

/// `[limits]`: fair shares of the kernel's stack table.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields, expecting = "a [limits] table")]
pub struct RawLimits {
    pub process_share_percent: i64,
    pub uid_share_percent: i64,
}

impl Default for RawLimits {
    /// Once the table is half full, a process may hold a quarter of it: a flood from one
    /// process takes at most the first half (first come, first served) and leaves the other
    /// for everyone else, and on a table less than half full the cap does not bind at all
    /// (see `profiler_common::share`). No uid cap by default: the flood's own entries count
    /// against its uid, so on a host where most processes share one uid (root), a uid cap
    /// refuses them all along with the flood; set one where users are not trusted.
    fn default() -> Self {
        Self {
            process_share_percent: DEFAULT_PROCESS_SHARE_PERCENT.into(),
            uid_share_percent: DEFAULT_UID_SHARE_PERCENT.into(),
        }
    }
}

/// The daemon's socket (`[socket] path`) by default, and where the clients look for it.
pub const DEFAULT_SOCKET: &str = "/run/profiler/profiler.sock";
/// `[heap] sample_bytes` by default, 512 KiB: Go's `runtime.MemProfileRate` default.
pub const DEFAULT_HEAP_SAMPLE_BYTES: u64 = 512 << 10;
/// `[limits] process_share_percent` by default.
pub const DEFAULT_PROCESS_SHARE_PERCENT: u32 = 25;
/// `[limits] uid_share_percent` by default.
pub const DEFAULT_UID_SHARE_PERCENT: u32 = 100;

/// The block profile's default rate. Measured with `cargo xtask bench futex --pin-cpu 1`
/// (see README): a handoff's wait is a few microseconds, so at 1ms about 1 in 250 of them
/// walks a stack, while a wait of a millisecond or more is always recorded. At 100us the
/// walks alone cost the handoff 2-3%, past the 1.10x budget.
pub const DEFAULT_BLOCK_RATE: &str = "1ms";
/// The mutex profile's default fraction: none on top of the rate. A wake is walked by what
/// its waits have waited (the block rate decides, see `profiler_common::sampling`), which
/// already keeps the walks of a handoff of a few microseconds to about 1 in 250; a 1-in-N
/// fraction on top would leave a lock that hands off a few hundred times a few samples.
pub const DEFAULT_MUTEX_FRACTION: u32 = 1;
/// The off-CPU profile's default rate: every interval off a CPU of at least 1ms recorded,
/// a shorter one of length d with probability d/1ms. A pipe handoff's interval is a few
/// microseconds (`cargo xtask bench offcpu`), so about 1 in 300 of them walks its stacks.
pub const DEFAULT_OFFCPU_RATE: &str = "1ms";
/// The off-CPU profile's 1-in-N sampling on kernels without `sched_exit_tp` (before Linux
/// 6.16), where stacks are walked at the switch-out, before the interval's length is known.
pub const DEFAULT_OFFCPU_EVERY: u32 = 50;

/// `[mutex]`: the mutex profile's sampling fraction.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields, expecting = "a [mutex] table")]
pub struct RawMutex {
    pub fraction: i64,
}

/// One `[[export]]` table. `protocol` and `url` are required; the rest have defaults.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, expecting = "an [[export]] table with protocol and url")]
pub struct RawExport {
    pub name: Option<String>,
    pub protocol: String,
    pub url: String,
    #[serde(default = "RawExport::default_timeout")]
    pub timeout: Quantity,
    #[serde(default = "RawExport::default_max_backoff")]
    pub max_backoff: Quantity,
    pub ca_file: Option<PathBuf>,
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    pub basic_auth: Option<RawAuth>,
    pub bearer_token: Option<String>,
    pub bearer_token_file: Option<PathBuf>,
    #[serde(default = "RawExport::default_service_name")]
    pub service_name: String,
}

/// `basic_auth = { username = "...", password_file = "..." }`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, expecting = "a table with username and password or password_file")]
pub struct RawAuth {
    pub username: String,
    pub password: Option<String>,
    pub password_file: Option<PathBuf>,
}

/// One entry of an include/exclude list, e.g. `{ name = "nginx" }`. Exactly one field must be
/// set; a struct of options (not a serde enum) lets validation say which keys clashed.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = "a table with one of pid, name, exe, cgroup or unit, e.g. { name = \"nginx\" }"
)]
pub struct RawMatcher {
    pub pid: Option<i64>,
    pub name: Option<String>,
    pub exe: Option<String>,
    pub cgroup: Option<String>,
    pub unit: Option<String>,
}

/// A duration or byte size as written: a string with a unit, or a bare integer (bytes, or an
/// error for durations, which require a unit).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Quantity {
    Integer(i64),
    Text(String),
}

impl Quantity {
    fn text(text: &str) -> Self {
        Self::Text(text.to_owned())
    }
}

/// As it would be written in TOML, so messages quote the user's own value: `"7 days"`, `60`.
impl fmt::Display for Quantity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Integer(value) => write!(f, "{value}"),
            Self::Text(text) => write!(f, "{text:?}"),
        }
    }
}

impl<'de> Deserialize<'de> for Quantity {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(QuantityVisitor)
    }
}

struct QuantityVisitor;

impl Visitor<'_> for QuantityVisitor {
    type Value = Quantity;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a number with a unit in a string, such as \"60s\" or \"1GiB\"")
    }

    fn visit_i64<E: de::Error>(self, value: i64) -> Result<Quantity, E> {
        Ok(Quantity::Integer(value))
    }

    fn visit_u64<E: de::Error>(self, value: u64) -> Result<Quantity, E> {
        let value = i64::try_from(value).map_err(|_| E::invalid_value(Unexpected::Unsigned(value), &self))?;
        Ok(Quantity::Integer(value))
    }

    fn visit_str<E: de::Error>(self, text: &str) -> Result<Quantity, E> {
        Ok(Quantity::text(text))
    }
}

// The defaults. `config/profiler.toml` spells out the same values; a test keeps them equal.

impl Default for RawConfig {
    fn default() -> Self {
        Self {
            output_dir: PathBuf::from("/var/lib/profiler"),
            interval: Quantity::text("60s"),
            // Thread dumps answer `/debug/pprof/goroutine`, the endpoint Go users type first
            // (net/http/pprof always serves it): they cost nothing until asked for.
            profiles: vec!["cpu".to_owned(), "threads".to_owned()],
            socket: RawSocket::default(),
            retention: RawRetention::default(),
            cpu: RawCpu::default(),
            processes: RawSelection::default(),
            heap: RawHeap::default(),
            threads: RawThreads::default(),
            offcpu: RawOffCpu::default(),
            block: RawBlock::default(),
            mutex: RawMutex::default(),
            limits: RawLimits::default(),
            exports: Vec::new(),
        }
    }
}

impl Default for RawSocket {
    fn default() -> Self {
        Self { path: PathBuf::from(DEFAULT_SOCKET), group: None }
    }
}

impl Default for RawRetention {
    fn default() -> Self {
        Self {
            max_age: Quantity::text("7d"),
            max_total_bytes: Quantity::text("1GiB"),
            min_free_bytes: Quantity::text("512MiB"),
        }
    }
}

impl Default for RawOffCpu {
    /// See [`DEFAULT_OFFCPU_RATE`]. 1 in 50 on kernels without `sched_exit_tp`: there
    /// `cargo xtask bench offcpu` (two threads ping-ponging on a pipe) costs about the floor
    /// (empty programs on the same tracepoint) at 50, while every switch walks two stacks at 1.
    fn default() -> Self {
        Self { rate: Quantity::text(DEFAULT_OFFCPU_RATE), sample_every: DEFAULT_OFFCPU_EVERY.into() }
    }
}

impl Default for RawBlock {
    /// See [`DEFAULT_BLOCK_RATE`].
    fn default() -> Self {
        Self { rate: Quantity::text(DEFAULT_BLOCK_RATE) }
    }
}

impl Default for RawMutex {
    /// See [`DEFAULT_MUTEX_FRACTION`].
    fn default() -> Self {
        Self { fraction: DEFAULT_MUTEX_FRACTION.into() }
    }
}

impl Default for RawCpu {
    /// 19 Hz: a prime, so sampling does not beat with periodic work (timers at 10, 100 or
    /// 1000 Hz), and low enough to run continuously on every CPU.
    fn default() -> Self {
        Self { frequency_hz: 19 }
    }
}

impl Default for RawHeap {
    /// See [`DEFAULT_HEAP_SAMPLE_BYTES`].
    fn default() -> Self {
        Self { include: Vec::new(), sample_bytes: Quantity::Text(format_bytes(DEFAULT_HEAP_SAMPLE_BYTES)) }
    }
}

impl RawExport {
    /// A push waits at most this long for an answer; a slow backend is retried.
    fn default_timeout() -> Quantity {
        Quantity::text("10s")
    }

    /// Retries back off exponentially up to a minute: a backend back from an outage is found
    /// within a minute, and one that is down costs a try a minute.
    fn default_max_backoff() -> Quantity {
        Quantity::text("60s")
    }

    /// The systemd unit, else the container, else the process name.
    fn default_service_name() -> String {
        "{service}".to_owned()
    }
}
