//! The command line: subcommands and their flags. Parsing only; `main` hands the result to
//! the library. Flag names here are relied upon by users and scripts: keep them.

use std::{path::PathBuf, time::Duration};

use clap::{Args, Parser, Subcommand};

use crate::{
    config::{
        raw::{
            DEFAULT_BLOCK_RATE, DEFAULT_HEAP_SAMPLE_BYTES, DEFAULT_MUTEX_FRACTION, DEFAULT_OFFCPU_EVERY,
            DEFAULT_OFFCPU_RATE, DEFAULT_PROCESS_SHARE_PERCENT, DEFAULT_UID_SHARE_PERCENT,
        },
        Config, ConfigError, Overrides, ProfileKind, DEFAULT_SOCKET,
    },
    units::parse_duration,
};

/// A system-wide continuous profiler: Go-style pprof profiles for every native process.
#[derive(Debug, Parser)]
#[command(name = "profiler", version, about, propagate_version = true)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Capture once, write one profile per process, print a summary, exit.
    Snapshot(SnapshotArgs),
    /// Run as a daemon: periodic per-process dumps and a /debug/pprof/ unix socket.
    Run(RunArgs),
    /// Validate a configuration file without running.
    CheckConfig(CheckConfigArgs),
    /// Show the running daemon's status: a summary, or its /status JSON with --json.
    Status(ClientArgs),
    /// List the processes the running daemon profiles, with their units or containers and
    /// events per profile type since it started.
    Ps(ClientArgs),
    /// Draw a pprof profile (any type, from this profiler or not) as a flame graph SVG.
    Flamegraph(FlamegraphArgs),
    /// Dump every thread of a process (stack, state, system call) without stopping it:
    /// Go's goroutine profile for any process, without the daemon.
    Threads(ThreadsArgs),
    /// Build the unwind tables of ELF files and report their size, build time and the CFI
    /// they cannot express (a diagnostic: why a binary's stacks stop early).
    UnwindTable(UnwindTableArgs),
}

#[derive(Debug, Args)]
pub struct FlamegraphArgs {
    /// A pprof profile, gzipped or not (`cpu.pb.gz`).
    pub file: PathBuf,
    /// The sample type to draw (e.g. cpu, alloc_space, delay) [default: the profile's default].
    #[arg(long = "sample-index", value_name = "NAME")]
    pub sample_index: Option<String>,
    /// Where to write the SVG [default: next to FILE, `.pb.gz` replaced by `.svg`].
    #[arg(short, long)]
    pub output: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct ThreadsArgs {
    /// The process to dump.
    pub pid: u32,
    /// 0: a gzipped pprof profile (goroutine/count, one sample per thread, labelled); 1: Go's
    /// text, threads grouped by stack; 2: every thread with its own stack.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u8).range(0..=2))]
    pub debug: u8,
    /// For a Go process: its OS threads, not its goroutines (the default).
    #[arg(long)]
    pub os_threads: bool,
    /// Where to write the dump [default: stdout].
    #[arg(short, long)]
    pub output: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct UnwindTableArgs {
    /// ELF files (executables, shared libraries).
    #[arg(required = true)]
    pub files: Vec<PathBuf>,
}

#[derive(Debug, Args)]
pub struct RunArgs {
    /// Configuration file [default: /etc/profiler/profiler.toml, optional]. Flags override it.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Directory for the periodic dumps [default: from the config, /var/lib/profiler].
    #[arg(long)]
    pub output: Option<PathBuf>,
    /// Unix socket to serve /debug/pprof/ on [default: from the config, /run/profiler/profiler.sock].
    #[arg(long)]
    pub socket: Option<PathBuf>,
    /// Time between dumps, with a unit [default: from the config, 60s].
    #[arg(long, value_parser = parse_duration)]
    pub interval: Option<Duration>,
}

#[derive(Debug, Args)]
pub struct CheckConfigArgs {
    /// The configuration file to validate.
    pub file: PathBuf,
}

#[derive(Debug, Args)]
pub struct ClientArgs {
    /// The daemon's socket.
    #[arg(long, default_value = DEFAULT_SOCKET)]
    pub socket: PathBuf,
    /// Print the daemon's JSON as it sent it, not the summary.
    #[arg(long)]
    pub json: bool,
}

/// `profiler snapshot`'s flags. Those with a config key (the sampling, the profiles, the
/// shares) are checked by the config's validation, not here: [`SnapshotArgs::config`] turns
/// them into [`Overrides`] of the built-in defaults, so a flag has the range of its key and an
/// error names the flag. Their defaults are the config's, but for the two a short capture
/// wants otherwise (`--frequency`, `--profiles`).
#[derive(Debug, Args)]
pub struct SnapshotArgs {
    /// How long to capture, with a unit (e.g. 10s, 500ms, 2m).
    #[arg(long, default_value = "10s", value_parser = parse_capture_duration)]
    pub duration: Duration,
    /// Profile only this process (repeat for several). Default: every process.
    #[arg(long = "pid", value_name = "PID")]
    pub pids: Vec<u32>,
    /// CPU sampling frequency per CPU, in Hz.
    // Above the daemon's default: a capture of seconds needs more samples than one of hours.
    #[arg(long = "frequency", default_value_t = 99)]
    pub frequency_hz: u32,
    /// Directory to write `<name>-<pid>/cpu.pb.gz` files into.
    #[arg(long, default_value = "./profiles")]
    pub output: PathBuf,
    /// Profile types to capture, comma-separated: cpu, heap, block, mutex, threadcreate,
    /// threads (every thread of each process at the end of the capture), offcpu.
    #[arg(long, value_delimiter = ',', default_value = "cpu")]
    pub profiles: Vec<ProfileKind>,
    /// Heap: mean bytes allocated between samples (1 records every allocation).
    #[arg(long = "heap-sample-bytes", default_value_t = DEFAULT_HEAP_SAMPLE_BYTES)]
    pub heap_sample_bytes: u64,
    /// Heap: how many sampled live blocks can be tracked; past it new samples are dropped
    /// from the in-use view and counted. Default: 32 GiB of live heap at the sampling rate,
    /// between 65536 and 262144.
    #[arg(long = "heap-max-live", value_parser = clap::value_parser!(u32).range(1..=16 << 20))]
    pub heap_max_live: Option<u32>,
    /// Off-CPU: intervals off a CPU at least this long are all recorded, shorter ones with
    /// probability length/rate, scaled as Go scales block waits (1ns records every one).
    #[arg(long = "offcpu-rate", value_name = "DUR", default_value = DEFAULT_OFFCPU_RATE, value_parser = parse_duration)]
    pub offcpu_rate: Duration,
    /// Off-CPU, on kernels without sched_exit_tp (before Linux 6.16) only: record 1 in N
    /// context switches, values scaled by N (1 records every one).
    #[arg(long = "offcpu-every", value_name = "N", default_value_t = DEFAULT_OFFCPU_EVERY)]
    pub offcpu_every: u32,
    /// Block: waits at least this long are all recorded, shorter ones with probability
    /// length/rate, scaled as Go scales them (1ns records every wait).
    #[arg(long = "block-rate", value_name = "DUR", default_value = DEFAULT_BLOCK_RATE, value_parser = parse_duration)]
    pub block_rate: Duration,
    /// Mutex: record 1 in N contention events, values scaled by N (1 records every one).
    #[arg(long = "mutex-fraction", value_name = "N", default_value_t = DEFAULT_MUTEX_FRACTION)]
    pub mutex_fraction: u32,
    /// Once the kernel's stack table is half full, a process may add new stacks only while it
    /// holds less than this percent of it (100: no cap; not applied with a single --pid).
    #[arg(long = "process-share", value_name = "PERCENT", default_value_t = DEFAULT_PROCESS_SHARE_PERCENT)]
    pub process_share: u32,
    /// The same for all processes of one uid together.
    #[arg(long = "uid-share", value_name = "PERCENT", default_value_t = DEFAULT_UID_SHARE_PERCENT)]
    pub uid_share: u32,
    /// Also write `<type>.svg`, a flame graph, next to each `<type>.pb.gz`.
    #[arg(long)]
    pub flamegraph: bool,
    /// Enable kernel BPF run-time statistics and print the CPU program's cost on exit
    /// (`bpf-stats: program=... run_count=N run_time_ns=T`), for benchmarks.
    #[arg(long, hide = true)]
    pub bpf_stats: bool,
}

impl SnapshotArgs {
    /// The flags that have a config key, as overrides of it.
    pub fn overrides(&self) -> Overrides {
        Overrides {
            profiles: Some(self.profiles.clone()),
            frequency_hz: Some(self.frequency_hz),
            heap_sample_bytes: Some(self.heap_sample_bytes),
            offcpu_rate: Some(self.offcpu_rate),
            offcpu_sample_every: Some(self.offcpu_every),
            block_rate: Some(self.block_rate),
            mutex_fraction: Some(self.mutex_fraction),
            process_share_percent: Some(self.process_share),
            uid_share_percent: Some(self.uid_share),
            ..Overrides::default()
        }
    }

    /// The built-in defaults with these flags applied, validated as a config file is: what
    /// the snapshot captures with (a flag out of range is refused, naming the flag).
    pub fn config(&self) -> Result<Config, ConfigError> {
        Config::load_with(None, &self.overrides())
    }
}

fn parse_capture_duration(text: &str) -> Result<Duration, String> {
    let duration = parse_duration(text)?;
    if duration < Duration::from_millis(100) {
        return Err(format!("`{text}` is too short; capture for at least 100ms"));
    }
    Ok(duration)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("profiler").chain(args.iter().copied()))
    }

    #[test]
    fn run_flags_are_optional_overrides() {
        let Command::Run(args) = parse(&["run"]).unwrap().command else { panic!("not run") };
        assert!(args.config.is_none() && args.output.is_none() && args.interval.is_none());
        let cli =
            parse(&["run", "--config", "/c.toml", "--output", "/o", "--socket", "/s", "--interval", "5s"]).unwrap();
        let Command::Run(args) = cli.command else { panic!("not run") };
        assert_eq!(args.interval, Some(Duration::from_secs(5)));
        assert_eq!(args.socket.as_deref(), Some(std::path::Path::new("/s")));
        assert!(parse(&["run", "--interval", "soon"]).is_err());
        assert!(parse(&["check-config"]).is_err(), "needs a file");
        let Command::Status(args) = parse(&["status"]).unwrap().command else { panic!("not status") };
        assert_eq!(args.socket, PathBuf::from(DEFAULT_SOCKET));
    }

    #[test]
    fn snapshot_defaults() {
        let Command::Snapshot(args) = parse(&["snapshot"]).unwrap().command else { panic!("not snapshot") };
        assert_eq!(args.duration, Duration::from_secs(10));
        assert_eq!(args.frequency_hz, 99);
        assert!(args.pids.is_empty());
        assert_eq!(args.output, PathBuf::from("./profiles"));
        assert_eq!(args.profiles, [ProfileKind::Cpu]);
        assert_eq!(args.heap_sample_bytes, 512 * 1024);
    }

    #[test]
    fn snapshot_profiles_list() {
        let cli = parse(&["snapshot", "--profiles", "cpu,heap", "--pid", "1", "--heap-sample-bytes", "1"]).unwrap();
        let Command::Snapshot(args) = cli.command else { panic!("not snapshot") };
        assert_eq!(args.profiles, [ProfileKind::Cpu, ProfileKind::Heap]);
        assert_eq!(args.heap_sample_bytes, 1);
        assert!(parse(&["snapshot", "--profiles", "cpu,gpu"]).is_err());
        assert!(snapshot_config(&["snapshot", "--heap-sample-bytes", "0"]).is_err());
    }

    #[test]
    fn snapshot_flags() {
        let cli = parse(&[
            "snapshot",
            "--duration",
            "3s",
            "--pid",
            "1",
            "--pid",
            "42",
            "--frequency",
            "250",
            "--output",
            "/tmp/p",
        ])
        .unwrap();
        let Command::Snapshot(args) = cli.command else { panic!("not snapshot") };
        assert_eq!(args.duration, Duration::from_secs(3));
        assert_eq!(args.pids, vec![1, 42]);
        assert_eq!(args.frequency_hz, 250);
        assert_eq!(args.output, PathBuf::from("/tmp/p"));
    }

    /// What a snapshot would capture with: its flags parsed, then validated as config keys.
    fn snapshot_config(args: &[&str]) -> Result<Config, String> {
        let Command::Snapshot(args) = parse(args).map_err(|err| err.to_string())?.command else {
            panic!("not snapshot")
        };
        args.config().map_err(|err| err.to_string())
    }

    #[test]
    fn snapshot_rejects_bad_values() {
        for bad in [
            &["snapshot", "--duration", "abc"][..],
            &["snapshot", "--duration", "0s"],
            &["snapshot", "--frequency", "0"],
            &["snapshot", "--frequency", "100000"],
            &["snapshot", "--pid", "-1"],
            &["snapshot", "--bogus"],
        ] {
            assert!(snapshot_config(bad).is_err(), "{bad:?} was accepted");
        }
    }

    #[test]
    fn snapshot_flags_out_of_their_keys_range_are_refused_naming_the_flag() {
        for (flag, value) in [
            ("--frequency", "0"),
            ("--frequency", "10001"),
            ("--heap-sample-bytes", "0"),
            ("--heap-sample-bytes", "18446744073709551615"),
            ("--offcpu-rate", "0s"),
            ("--offcpu-every", "0"),
            ("--block-rate", "11s"),
            ("--mutex-fraction", "1000001"),
            ("--process-share", "0"),
            ("--uid-share", "101"),
            ("--profiles", "cpu,cpu"),
        ] {
            let message = snapshot_config(&["snapshot", flag, value]).expect_err(flag);
            assert!(message.starts_with(&format!("{flag}: ")), "{flag} {value} => {message}");
            assert!(message.contains("allowed") || message.contains("twice"), "{flag} {value} => {message}");
        }
        // The bounds themselves are accepted.
        let edges = ["snapshot", "--frequency", "10000", "--heap-sample-bytes", "1", "--block-rate", "10s"];
        assert!(snapshot_config(&edges).is_ok());
    }

    #[test]
    fn snapshot_flags_override_the_defaults_and_the_rest_are_the_configs() {
        let defaults = Config::default();
        let config = snapshot_config(&["snapshot"]).unwrap();
        // The snapshot's own two defaults...
        assert_eq!(config.profiles, [ProfileKind::Cpu]);
        assert_ne!(config.cpu.frequency_hz, defaults.cpu.frequency_hz);
        // ...and the config's for every other key a flag has.
        assert_eq!(
            (&config.heap, &config.offcpu, &config.contention),
            (&defaults.heap, &defaults.offcpu, &defaults.contention)
        );
        assert_eq!(config.limits, defaults.limits);
        let flags = ["snapshot", "--mutex-fraction", "7", "--offcpu-rate", "250us", "--uid-share", "40"];
        let config = snapshot_config(&flags).unwrap();
        assert_eq!(config.contention.mutex_fraction, 7);
        assert_eq!(config.offcpu.rate, Duration::from_micros(250));
        assert_eq!(config.limits.uid_percent, 40);
        assert_eq!(config.limits.process_percent, defaults.limits.process_percent);
    }

    #[test]
    fn snapshot_and_daemon_get_the_same_settings_from_the_same_values() {
        use crate::profiles::Settings;
        let file = "profiles = [\"cpu\", \"block\", \"offcpu\"]\n[cpu]\nfrequency_hz = 250\n\
                    [heap]\nsample_bytes = \"4KiB\"\n[offcpu]\nrate = \"3ms\"\nsample_every = 9\n\
                    [block]\nrate = \"1500us\"\n[mutex]\nfraction = 4\n\
                    [limits]\nprocess_share_percent = 30\nuid_share_percent = 60\n";
        let daemon = Config::parse(file, std::path::Path::new("test.toml")).unwrap();
        let snapshot = snapshot_config(&[
            "snapshot",
            "--profiles",
            "cpu,block,offcpu",
            "--frequency",
            "250",
            "--heap-sample-bytes",
            "4096",
            "--offcpu-rate",
            "3ms",
            "--offcpu-every",
            "9",
            "--block-rate",
            "1.5ms",
            "--mutex-fraction",
            "4",
            "--process-share",
            "30",
            "--uid-share",
            "60",
        ])
        .unwrap();
        assert_eq!(Settings::from(&snapshot), Settings::from(&daemon));
        assert_eq!((&snapshot.profiles, snapshot.limits), (&daemon.profiles, daemon.limits));
        assert_ne!(Settings::from(&daemon), Settings::from(&Config::default()), "the values are not the defaults");
    }
}
