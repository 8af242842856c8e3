//! Command-line flags that override the file: `profiler run`'s `--output`, `--socket` and
//! `--interval`, and every `profiler snapshot` flag that has a key here (its sampling, its
//! profiles, its shares). They are written into the raw values before validation, so a flag
//! is checked by the same code as the key it replaces, with the same ranges, and an error
//! names the flag rather than the key.

use std::{path::PathBuf, time::Duration};

use super::{
    raw::{Quantity, RawConfig},
    ProfileKind,
};
use crate::units::format_duration;

/// The flags given, each replacing one key (`None`: the file's value, or its default).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Overrides {
    /// `--output` of `run`: `output_dir`.
    pub output_dir: Option<PathBuf>,
    /// `--socket`: `socket.path`.
    pub socket: Option<PathBuf>,
    /// `--interval`: `interval`.
    pub interval: Option<Duration>,
    /// `--profiles`: `profiles`.
    pub profiles: Option<Vec<ProfileKind>>,
    /// `--frequency`: `cpu.frequency_hz`.
    pub frequency_hz: Option<u32>,
    /// `--heap-sample-bytes`: `heap.sample_bytes`.
    pub heap_sample_bytes: Option<u64>,
    /// `--offcpu-rate`: `offcpu.rate`.
    pub offcpu_rate: Option<Duration>,
    /// `--offcpu-every`: `offcpu.sample_every`.
    pub offcpu_sample_every: Option<u32>,
    /// `--block-rate`: `block.rate`.
    pub block_rate: Option<Duration>,
    /// `--mutex-fraction`: `mutex.fraction`.
    pub mutex_fraction: Option<u32>,
    /// `--process-share`: `limits.process_share_percent`.
    pub process_share_percent: Option<u32>,
    /// `--uid-share`: `limits.uid_share_percent`.
    pub uid_share_percent: Option<u32>,
}

impl Overrides {
    /// Writes each flag given into `raw`, as the file would have written its key.
    pub(super) fn apply(&self, raw: &mut RawConfig) {
        if let Some(dir) = &self.output_dir {
            raw.output_dir.clone_from(dir);
        }
        if let Some(socket) = &self.socket {
            raw.socket.path.clone_from(socket);
        }
        set_duration(&mut raw.interval, self.interval);
        if let Some(kinds) = &self.profiles {
            raw.profiles = kinds.iter().map(|kind| kind.as_str().to_owned()).collect();
        }
        set_integer(&mut raw.cpu.frequency_hz, self.frequency_hz);
        if let Some(bytes) = self.heap_sample_bytes {
            // Past i64 (TOML's integer) it is out of range anyway: written with its unit, it
            // is refused as such, quoting the number given.
            raw.heap.sample_bytes =
                i64::try_from(bytes).map_or_else(|_| Quantity::Text(format!("{bytes}B")), Quantity::Integer);
        }
        set_duration(&mut raw.offcpu.rate, self.offcpu_rate);
        set_integer(&mut raw.offcpu.sample_every, self.offcpu_sample_every);
        set_duration(&mut raw.block.rate, self.block_rate);
        set_integer(&mut raw.mutex.fraction, self.mutex_fraction);
        set_integer(&mut raw.limits.process_share_percent, self.process_share_percent);
        set_integer(&mut raw.limits.uid_share_percent, self.uid_share_percent);
    }

    /// The flag that set `key` (a dotted key as validation names it, `profiles[2]` for an
    /// entry of a list), if one did.
    pub(super) fn flag_for(&self, key: &str) -> Option<&'static str> {
        let key = key.split_once('[').map_or(key, |(list, _)| list);
        let (given, flag) = match key {
            "output_dir" => (self.output_dir.is_some(), "--output"),
            "socket.path" => (self.socket.is_some(), "--socket"),
            "interval" => (self.interval.is_some(), "--interval"),
            "profiles" => (self.profiles.is_some(), "--profiles"),
            "cpu.frequency_hz" => (self.frequency_hz.is_some(), "--frequency"),
            "heap.sample_bytes" => (self.heap_sample_bytes.is_some(), "--heap-sample-bytes"),
            "offcpu.rate" => (self.offcpu_rate.is_some(), "--offcpu-rate"),
            "offcpu.sample_every" => (self.offcpu_sample_every.is_some(), "--offcpu-every"),
            "block.rate" => (self.block_rate.is_some(), "--block-rate"),
            "mutex.fraction" => (self.mutex_fraction.is_some(), "--mutex-fraction"),
            "limits.process_share_percent" => (self.process_share_percent.is_some(), "--process-share"),
            "limits.uid_share_percent" => (self.uid_share_percent.is_some(), "--uid-share"),
            _ => return None,
        };
        given.then_some(flag)
    }
}

/// A duration flag, written with the largest unit that keeps it exact.
fn set_duration(key: &mut Quantity, flag: Option<Duration>) {
    if let Some(duration) = flag {
        *key = Quantity::Text(format_duration(duration));
    }
}

fn set_integer(key: &mut i64, flag: Option<u32>) {
    if let Some(value) = flag {
        *key = value.into();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    /// Every flag, set to a value of its own, as `(overrides, key it replaces)`.
    fn each_flag() -> Vec<(Overrides, &'static str)> {
        let none = Overrides::default;
        let ms = Duration::from_millis;
        vec![
            (Overrides { output_dir: Some("/o".into()), ..none() }, "output_dir"),
            (Overrides { socket: Some("/s".into()), ..none() }, "socket.path"),
            (Overrides { interval: Some(ms(7000)), ..none() }, "interval"),
            (Overrides { profiles: Some(vec![ProfileKind::Mutex]), ..none() }, "profiles"),
            (Overrides { frequency_hz: Some(7), ..none() }, "cpu.frequency_hz"),
            (Overrides { heap_sample_bytes: Some(7), ..none() }, "heap.sample_bytes"),
            (Overrides { offcpu_rate: Some(ms(7)), ..none() }, "offcpu.rate"),
            (Overrides { offcpu_sample_every: Some(7), ..none() }, "offcpu.sample_every"),
            (Overrides { block_rate: Some(ms(7)), ..none() }, "block.rate"),
            (Overrides { mutex_fraction: Some(7), ..none() }, "mutex.fraction"),
            (Overrides { process_share_percent: Some(7), ..none() }, "limits.process_share_percent"),
            (Overrides { uid_share_percent: Some(7), ..none() }, "limits.uid_share_percent"),
        ]
    }

    #[test]
    fn each_flag_changes_its_key_only_and_claims_its_key_only() {
        let defaults = RawConfig::default();
        for (overrides, key) in each_flag() {
            let mut raw = RawConfig::default();
            overrides.apply(&mut raw);
            assert_ne!(raw, defaults, "{key}: the flag changed nothing");
            let config = Config::try_from(raw).unwrap_or_else(|err| panic!("{key}: {err}"));
            assert_ne!(config, Config::default(), "{key}");
            assert!(overrides.flag_for(key).is_some(), "{key}");
            assert_eq!(overrides.flag_for(&format!("{key}[3]")), overrides.flag_for(key), "a list entry's key");
            let others = each_flag().into_iter().map(|(_, other)| other).filter(|other| *other != key);
            for other in others {
                assert_eq!(overrides.flag_for(other), None, "{key}'s flag claimed {other}");
            }
        }
        assert_eq!(Overrides::default().flag_for("cpu.frequency_hz"), None, "no flag, the file's key");
    }

    #[test]
    fn a_flag_is_checked_as_its_key_and_named() {
        let bad = Overrides { frequency_hz: Some(0), ..Overrides::default() };
        let err = Config::load_with(None, &bad).unwrap_err().to_string();
        assert!(err.starts_with("--frequency: 0 is out of range; allowed 1 to 10000"), "{err}");
        let twice = Overrides { profiles: Some(vec![ProfileKind::Cpu, ProfileKind::Cpu]), ..Overrides::default() };
        let err = Config::load_with(None, &twice).unwrap_err().to_string();
        assert!(err.starts_with("--profiles: "), "{err}");
        // Past TOML's integers, written with its unit and still refused as out of range.
        let huge = Overrides { heap_sample_bytes: Some(u64::MAX), ..Overrides::default() };
        let err = Config::load_with(None, &huge).unwrap_err().to_string();
        assert!(err.starts_with("--heap-sample-bytes: ") && err.contains(&u64::MAX.to_string()), "{err}");
    }

    #[test]
    fn durations_are_written_exactly() {
        for nanos in [1, 999, 1_500_000, 2_000_000_000, 90_000_000_000] {
            let rate = Duration::from_nanos(nanos);
            let config = Config::load_with(None, &Overrides { block_rate: Some(rate), ..Overrides::default() });
            assert_eq!(config.map(|c| c.contention.block_rate).ok(), (rate <= Duration::from_secs(10)).then_some(rate));
        }
    }
}
