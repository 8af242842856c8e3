//! `Config::try_from(RawConfig)`: every check on a value, done once, each error naming the
//! dotted key and what is allowed. Matcher checks live with the matchers in [`super::select`].

use std::{ops::RangeInclusive, path::Path, path::PathBuf, time::Duration};

use super::{
    check::{absolute_path, duration, duration_in},
    export::exports_from_raw,
    raw::{Quantity, RawConfig, RawRetention, DEFAULT_SOCKET},
    select::matchers_from_raw,
    Config, ContentionSampling, CpuConfig, HeapConfig, InvalidValue, OffCpuConfig, ProcessSelection, ProfileKind,
    Retention, SocketConfig, StackShares, ThreadsConfig,
};
use crate::units::{format_bytes, format_duration, parse_bytes};

/// `interval`: below a second the per-interval work (encode, write) dominates; above a day
/// nothing is written often enough to notice a problem.
pub const INTERVAL_RANGE: RangeInclusive<Duration> = Duration::from_secs(1)..=Duration::from_secs(86_400);

/// `cpu.frequency_hz`: above 10 kHz the sampling itself dominates the cost.
pub const FREQUENCY_HZ_RANGE: RangeInclusive<u32> = 1..=10_000;

/// `heap.sample_bytes`: 1 samples every allocation; past 1GiB almost nothing is sampled.
pub const SAMPLE_BYTES_RANGE: RangeInclusive<u64> = 1..=1 << 30;

/// `offcpu.sample_every`: 1 records every context switch; past a million almost none.
pub const OFFCPU_SAMPLE_EVERY_RANGE: RangeInclusive<u32> = 1..=1_000_000;

/// `block.rate`: 1ns records every wait; past 10s almost none is short enough to sample.
pub const BLOCK_RATE_RANGE: RangeInclusive<Duration> = Duration::from_nanos(1)..=Duration::from_secs(10);

/// `mutex.fraction`: 1 records every contention event.
pub const MUTEX_FRACTION_RANGE: RangeInclusive<u32> = 1..=1_000_000;

/// `limits.*_share_percent`: 1 lets an owner hold 1% of the table; 100 is no cap.
pub const SHARE_PERCENT_RANGE: RangeInclusive<u32> = 1..=100;

/// Longest unix socket path: `sun_path` is 108 bytes including the terminating NUL.
pub const SOCKET_PATH_MAX_BYTES: usize = 107;

impl TryFrom<RawConfig> for Config {
    type Error = InvalidValue;

    fn try_from(raw: RawConfig) -> Result<Self, InvalidValue> {
        let interval = duration_in(&raw.interval, "interval", INTERVAL_RANGE)?;
        Ok(Self {
            output_dir: absolute_path(&raw.output_dir, "output_dir", "/var/lib/profiler")?,
            socket: SocketConfig {
                path: socket_path(&raw.socket.path, "socket.path")?,
                group: raw.socket.group.as_deref().map(|group| group_name(group, "socket.group")).transpose()?,
            },
            interval,
            retention: retention(&raw.retention, interval)?,
            profiles: profiles(&raw.profiles, "profiles")?,
            cpu: CpuConfig { frequency_hz: integer_in(raw.cpu.frequency_hz, "cpu.frequency_hz", FREQUENCY_HZ_RANGE)? },
            processes: ProcessSelection {
                include: matchers_from_raw(&raw.processes.include, "processes.include")?,
                exclude: matchers_from_raw(&raw.processes.exclude, "processes.exclude")?,
            },
            heap: HeapConfig {
                include: matchers_from_raw(&raw.heap.include, "heap.include")?,
                sample_bytes: bytes_in(&raw.heap.sample_bytes, "heap.sample_bytes", SAMPLE_BYTES_RANGE)?,
            },
            threads: ThreadsConfig { interval_dumps: raw.threads.interval_dumps },
            contention: ContentionSampling {
                block_rate: duration_in(&raw.block.rate, "block.rate", BLOCK_RATE_RANGE)?,
                mutex_fraction: integer_in(raw.mutex.fraction, "mutex.fraction", MUTEX_FRACTION_RANGE)?,
            },
            offcpu: OffCpuConfig {
                rate: duration_in(&raw.offcpu.rate, "offcpu.rate", BLOCK_RATE_RANGE)?,
                sample_every: integer_in(raw.offcpu.sample_every, "offcpu.sample_every", OFFCPU_SAMPLE_EVERY_RANGE)?,
            },
            limits: StackShares {
                process_percent: integer_in(
                    raw.limits.process_share_percent,
                    "limits.process_share_percent",
                    SHARE_PERCENT_RANGE,
                )?,
                uid_percent: integer_in(raw.limits.uid_share_percent, "limits.uid_share_percent", SHARE_PERCENT_RANGE)?,
            },
            exports: exports_from_raw(&raw.exports)?,
        })
    }
}

fn retention(raw: &RawRetention, interval: Duration) -> Result<Retention, InvalidValue> {
    let max_age = duration(&raw.max_age, "retention.max_age")?;
    // Otherwise each profile would be deleted before the next one is written.
    if max_age < interval {
        return Err(InvalidValue::new(
            "retention.max_age",
            format!(
                "{} is shorter than interval ({}); allowed: at least the interval",
                raw.max_age,
                format_duration(interval)
            ),
        ));
    }
    Ok(Retention {
        max_age,
        max_total_bytes: bytes_in(&raw.max_total_bytes, "retention.max_total_bytes", 1..=u64::MAX)?,
        min_free_bytes: bytes(&raw.min_free_bytes, "retention.min_free_bytes")?,
    })
}

fn bytes(value: &Quantity, key: &str) -> Result<u64, InvalidValue> {
    let invalid = || {
        InvalidValue::new(
            key,
            format!(
                "{value} is not a byte size; write a number and a unit (B, KiB, MiB, GiB, TiB, KB, MB, \
                 GB or TB), e.g. \"512MiB\", or an integer number of bytes"
            ),
        )
    };
    match value {
        Quantity::Text(text) => parse_bytes(text).map_err(|_| invalid()),
        Quantity::Integer(number) => u64::try_from(*number).map_err(|_| invalid()),
    }
}

fn bytes_in(value: &Quantity, key: &str, range: RangeInclusive<u64>) -> Result<u64, InvalidValue> {
    let parsed = bytes(value, key)?;
    if !range.contains(&parsed) {
        let max = if *range.end() == u64::MAX { "no limit".to_owned() } else { format_bytes(*range.end()) };
        let min = format_bytes(*range.start());
        return Err(InvalidValue::new(key, format!("{value} is out of range; allowed {min} to {max}")));
    }
    Ok(parsed)
}

fn integer_in(value: i64, key: &str, range: RangeInclusive<u32>) -> Result<u32, InvalidValue> {
    match u32::try_from(value) {
        Ok(number) if range.contains(&number) => Ok(number),
        _ => Err(InvalidValue::new(
            key,
            format!("{value} is out of range; allowed {} to {}", range.start(), range.end()),
        )),
    }
}

fn socket_path(path: &Path, key: &str) -> Result<PathBuf, InvalidValue> {
    let path = absolute_path(path, key, DEFAULT_SOCKET)?;
    let length = path.as_os_str().len();
    if length > SOCKET_PATH_MAX_BYTES {
        let problem = format!(
            "the path is {length} bytes; a unix socket path is at most {SOCKET_PATH_MAX_BYTES} bytes, so \
             choose a shorter one, e.g. {DEFAULT_SOCKET:?}"
        );
        return Err(InvalidValue::new(key, problem));
    }
    Ok(path)
}

/// Only the syntax: whether the group exists is checked when the daemon creates the socket.
/// `:` is refused too because `/etc/group` could never hold such a name.
fn group_name(group: &str, key: &str) -> Result<String, InvalidValue> {
    let bad_char = |c: char| c == '/' || c == ':' || c.is_whitespace() || c.is_control();
    if group.is_empty() || group.contains(bad_char) {
        let problem = format!(
            "{group:?} is not a group name; write a non-empty name without '/', ':' or spaces, \
             e.g. \"profiler\""
        );
        return Err(InvalidValue::new(key, problem));
    }
    Ok(group.to_owned())
}

fn profiles(names: &[String], key: &str) -> Result<Vec<ProfileKind>, InvalidValue> {
    if names.is_empty() {
        let problem = format!("the list is empty; enable at least one of {}", ProfileKind::allowed());
        return Err(InvalidValue::new(key, problem));
    }
    let mut kinds = Vec::with_capacity(names.len());
    for (index, name) in names.iter().enumerate() {
        let kind: ProfileKind =
            name.parse().map_err(|problem| InvalidValue::new(&format!("{key}[{index}]"), problem))?;
        if kinds.contains(&kind) {
            return Err(InvalidValue::new(&format!("{key}[{index}]"), format!("{name:?} is listed twice")));
        }
        kinds.push(kind);
    }
    Ok(kinds)
}
