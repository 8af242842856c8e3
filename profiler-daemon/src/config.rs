//! The daemon's configuration (`profiler run --config FILE`, `profiler check-config FILE`), and
//! `profiler snapshot`'s flags, which are checked as the keys they replace: the typed
//! [`Config`], loading it from a TOML file with command-line [`Overrides`], and the errors that
//! name the file (or the flag), the key and the allowed values. Data and validation only:
//! resolving the socket group to a gid and reading `/proc` for process matching belong to the
//! callers.
//!
//! Two layers: [`raw::RawConfig`] mirrors the file (serde, unknown keys rejected, human units
//! kept as written), and `Config::try_from(raw)` (in `config/validate.rs`) checks every value
//! once. The documented default file is `config/profiler.toml`; an empty file means the same.

mod check;
mod export;
mod overrides;
pub mod raw;
mod select;
mod validate;

#[cfg(test)]
mod tests;

use std::{
    fmt, io,
    path::{Path, PathBuf},
    time::Duration,
};

pub use crate::kind::ProfileKind;
pub use export::{
    Auth, ExportConfig, ExportUrl, Protocol, Secret, Template, EXPORT_BACKOFF_RANGE, EXPORT_NAME_MAX_BYTES,
    EXPORT_TIMEOUT_RANGE, SERVICE_NAME_FIELDS,
};
pub use overrides::Overrides;
pub use raw::{RawConfig, DEFAULT_SOCKET};
pub use select::{matches_any, Matcher, ProcessFacts, ProcessSelection, COMM_MAX_BYTES, PID_MAX_LIMIT, UNIT_SUFFIXES};
pub use validate::{
    BLOCK_RATE_RANGE, FREQUENCY_HZ_RANGE, INTERVAL_RANGE, MUTEX_FRACTION_RANGE, OFFCPU_SAMPLE_EVERY_RANGE,
    SAMPLE_BYTES_RANGE, SHARE_PERCENT_RANGE, SOCKET_PATH_MAX_BYTES,
};

use crate::units::{format_bytes, format_duration};

/// The validated configuration. Every field has a default (see `config/profiler.toml`);
/// [`Config::default`] is what an empty file loads to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// Where profiles are written; absolute. Default `/var/lib/profiler`.
    pub output_dir: PathBuf,
    /// The control socket.
    pub socket: SocketConfig,
    /// How often profiles are cut and written; within [`INTERVAL_RANGE`]. Default 60s.
    pub interval: Duration,
    /// When old profiles are deleted.
    pub retention: Retention,
    /// The enabled profile types, in the order written, without duplicates, never empty.
    /// Default `[cpu]`.
    pub profiles: Vec<ProfileKind>,
    /// The CPU profiler.
    pub cpu: CpuConfig,
    /// Which processes are profiled at all.
    pub processes: ProcessSelection,
    /// The heap profiler's opt-in list and sampling interval.
    pub heap: HeapConfig,
    /// Thread dumps in interval dumps.
    pub threads: ThreadsConfig,
    /// The off-CPU profile's sampling.
    pub offcpu: OffCpuConfig,
    /// `[block] rate` and `[mutex] fraction`: how the contention profiles (block and mutex) are
    /// sampled.
    pub contention: ContentionSampling,
    /// `[limits]`: each process's and uid's share of the kernel's stack table.
    pub limits: StackShares,
    /// `[[export]]`: backends the interval profiles are pushed to; empty (the default)
    /// means none.
    pub exports: Vec<ExportConfig>,
}

/// `[socket]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SocketConfig {
    /// Absolute, at most [`SOCKET_PATH_MAX_BYTES`]. Default [`DEFAULT_SOCKET`].
    pub path: PathBuf,
    /// Group given access to the socket; a syntactically valid name, not yet resolved to a
    /// gid. Default none (root only).
    pub group: Option<String>,
}

/// `[retention]`: a profile is deleted when any limit is reached, oldest first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Retention {
    /// Profiles older than this are deleted; at least `interval`. Default 7d.
    pub max_age: Duration,
    /// Total size of the output directory, in bytes; at least 1. Default 1GiB.
    pub max_total_bytes: u64,
    /// Free space to leave on the output file system, in bytes; 0 disables. Default 512MiB.
    pub min_free_bytes: u64,
}

/// `[cpu]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CpuConfig {
    /// Samples per second per CPU; within [`FREQUENCY_HZ_RANGE`]. Default 19.
    pub frequency_hz: u32,
}

/// `[heap]`. Heap profiling costs more than CPU sampling, so it is opt-in per process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeapConfig {
    /// Processes to heap-profile; empty (the default) means none.
    pub include: Vec<Matcher>,
    /// Mean bytes allocated between samples; within [`SAMPLE_BYTES_RANGE`], 1 samples every
    /// allocation. Default 512KiB.
    pub sample_bytes: u64,
}

/// `[block] rate` and `[mutex] fraction`, as Go's `SetBlockProfileRate` and
/// `SetMutexProfileFraction`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContentionSampling {
    /// Waits at least this long are always recorded, shorter ones with probability
    /// length/rate (scaled as Go scales them); within [`BLOCK_RATE_RANGE`].
    pub block_rate: Duration,
    /// 1 in this many contention events recorded, scaled by it; within
    /// [`MUTEX_FRACTION_RANGE`].
    pub mutex_fraction: u32,
}

/// `[limits]`: the share of a map set's stack table one process, or one uid, may hold once
/// the table is half full (see `profiler_common::share`); 100 is no cap.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StackShares {
    /// Within [`SHARE_PERCENT_RANGE`]. Default 25.
    pub process_percent: u32,
    /// Within [`SHARE_PERCENT_RANGE`]. Default 100 (no cap).
    pub uid_percent: u32,
}

impl StackShares {
    /// No caps: one chosen process has the whole table.
    pub const NONE: Self = Self { process_percent: 100, uid_percent: 100 };
}

/// `[offcpu]`: the off-CPU profile's sampling.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OffCpuConfig {
    /// Intervals off a CPU at least this long are always recorded, shorter ones with
    /// probability length/rate (scaled as Go scales block waits); within
    /// [`BLOCK_RATE_RANGE`]. Default 1ms.
    pub rate: Duration,
    /// Kernels without `sched_exit_tp` only (before Linux 6.16), where stacks are walked at
    /// the switch-out: record 1 in this many context switches, values scaled by it; within
    /// [`OFFCPU_SAMPLE_EVERY_RANGE`]. Default 50.
    pub sample_every: u32,
}

/// `[threads]`. A thread dump is served on demand (`/debug/pprof/goroutine`) whenever
/// "threads" is in `profiles`; writing one per process at every interval is opt-in.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ThreadsConfig {
    /// Each interval dump also writes `threads-<stamp>.pb.gz` for every process it writes.
    /// Default false.
    pub interval_dumps: bool,
}

impl HeapConfig {
    /// Whether the process opted in. Opt-in: an empty list matches nothing.
    pub fn matches(&self, process: &ProcessFacts<'_>) -> bool {
        matches_any(&self.include, process)
    }
}

impl Config {
    /// Reads and validates the file at `path`.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        Self::load_with(Some(path), &Overrides::default())
    }

    /// Reads the file at `path` (`None`: the defaults, as an empty file), applies the
    /// flags, and validates the result once.
    pub fn load_with(path: Option<&Path>, overrides: &Overrides) -> Result<Self, ConfigError> {
        let (mut raw, path) = match path {
            Some(path) => {
                let text = std::fs::read_to_string(path)
                    .map_err(|source| ConfigError::Read { path: path.to_owned(), source })?;
                (parse_raw(&text, path)?, path.to_owned())
            }
            None => (RawConfig::default(), PathBuf::from("the built-in defaults")),
        };
        overrides.apply(&mut raw);
        Self::try_from(raw).map_err(|invalid| match overrides.flag_for(&invalid.key) {
            Some(flag) => ConfigError::Flag { flag, problem: invalid.problem },
            None => invalid.in_file(&path),
        })
    }

    /// Validates TOML text; `path` is only used in messages.
    pub fn parse(text: &str, path: &Path) -> Result<Self, ConfigError> {
        Self::try_from(parse_raw(text, path)?).map_err(|invalid| invalid.in_file(path))
    }

    /// Whether the profile type is enabled.
    pub fn is_enabled(&self, kind: ProfileKind) -> bool {
        self.profiles.contains(&kind)
    }

    /// Whether the process gets a heap profile: heap enabled, selected by `[processes]`, and
    /// opted in by `[heap] include`.
    pub fn heap_profiles(&self, process: &ProcessFacts<'_>) -> bool {
        self.is_enabled(ProfileKind::Heap) && self.processes.matches(process) && self.heap.matches(process)
    }
}

impl Default for Config {
    /// The same as an empty file.
    fn default() -> Self {
        Self::try_from(RawConfig::default()).expect("the built-in defaults are valid (tested)")
    }
}

/// One line for people: what the daemon would do with this config.
impl fmt::Display for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let profiles: Vec<&str> = self.profiles.iter().map(|kind| kind.as_str()).collect();
        write!(f, "profiles {} every {}", profiles.join(","), format_duration(self.interval))?;
        if self.is_enabled(ProfileKind::Cpu) {
            write!(f, ", cpu at {} Hz", self.cpu.frequency_hz)?;
        }
        if self.is_enabled(ProfileKind::Heap) {
            let opted_in = self.heap.include.len();
            write!(f, ", heap for {opted_in} matcher(s) every {}", format_bytes(self.heap.sample_bytes))?;
        }
        let processes = &self.processes;
        if processes.is_all() {
            f.write_str(", all processes")?;
        } else {
            write!(f, ", processes: {} include, {} exclude", processes.include.len(), processes.exclude.len())?;
        }
        for export in &self.exports {
            write!(f, ", export {} to {} ({})", export.name, export.url.text, export.protocol)?;
        }
        let retention = &self.retention;
        write!(
            f,
            "; into {} (keep {}, at most {}, leave {} free); socket {}",
            self.output_dir.display(),
            format_duration(retention.max_age),
            format_bytes(retention.max_total_bytes),
            format_bytes(retention.min_free_bytes),
            self.socket.path.display(),
        )?;
        match &self.socket.group {
            Some(group) => write!(f, " (group {group})"),
            None => Ok(()),
        }
    }
}

fn parse_raw(text: &str, path: &Path) -> Result<RawConfig, ConfigError> {
    toml::from_str(text).map_err(|source| ConfigError::Parse { path: path.to_owned(), source })
}

/// What `profiler check-config FILE` prints on success: `ok: FILE: <summary>`.
pub fn check(path: &Path) -> Result<String, ConfigError> {
    let config = Config::load(path)?;
    Ok(format!("ok: {}: {config}", path.display()))
}

/// Why a config file was rejected. Print it with its source chain (as `main` does): the TOML
/// parser's message, with line and column, is the source of [`ConfigError::Parse`].
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("failed to read config file {}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: io::Error,
    },

    /// TOML syntax, a type mismatch, or an unknown key.
    #[error("{} is not a valid profiler config", path.display())]
    Parse {
        path: PathBuf,
        #[source]
        source: toml::de::Error,
    },

    /// A well-formed value outside what the key allows.
    #[error("{}: {key}: {problem}", path.display())]
    Invalid { path: PathBuf, key: String, problem: String },

    /// A command-line flag's value outside what the key it overrides allows.
    #[error("{flag}: {problem}")]
    Flag { flag: &'static str, problem: String },
}

/// A value rejected by `Config::try_from(raw)`, before a file name is known.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{key}: {problem}")]
pub struct InvalidValue {
    /// Dotted path of the key, e.g. `retention.max_age` or `processes.include[2].exe`.
    pub key: String,
    /// What is wrong and what is allowed.
    pub problem: String,
}

impl InvalidValue {
    /// `key` is the dotted path; `problem` says what is wrong and what is allowed.
    pub fn new(key: &str, problem: impl Into<String>) -> Self {
        Self { key: key.to_owned(), problem: problem.into() }
    }

    /// Attaches the file the value came from.
    pub fn in_file(self, path: &Path) -> ConfigError {
        ConfigError::Invalid { path: path.to_owned(), key: self.key, problem: self.problem }
    }
}
