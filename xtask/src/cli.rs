//! The command line: one variant per subcommand. Pass-through ARGS take everything after the
//! subcommand, hyphens included, with or without a `--` separator.

use clap::Parser;

use crate::bench;

#[derive(Parser, Debug)]
#[command(name = "xtask", bin_name = "cargo xtask", about = "Set up, run, test and benchmark the profiler.")]
pub enum Cli {
    /// Check the build and run prerequisites; install what is missing when root on Debian.
    Setup {
        /// Also require what `cargo xtask test` needs (golang-go for `go tool pprof`).
        #[arg(long)]
        for_test: bool,
    },
    /// Build in release mode and take a snapshot; ARGS go to `profiler snapshot`.
    Snapshot {
        /// Passed to `profiler snapshot`, e.g. `--duration 5s --pid 1`.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Build in release mode and run all tests; ARGS go to the test harness.
    Test {
        /// Only the unit tests (no set-up, no root, no end-to-end binaries), in parallel.
        #[arg(long)]
        unit: bool,
        /// Only this end-to-end test binary, `tests/tests/NAME.rs` or `tests/tests/NAME/`
        /// (e.g. `systemd`, `daemon`); repeat for several. Before ARGS, which take the rest.
        #[arg(long = "test", value_name = "NAME", conflicts_with = "unit")]
        tests: Vec<String>,
        /// Passed to the test harness after `--test-threads=1`, e.g. a test name filter.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Regenerate the daemon's prost code (`profiler-daemon/src/pprof/*proto.rs`) from its
    /// vendored .proto files.
    Protos {
        /// Write nothing; fail if a checked-in file is not what would be generated.
        #[arg(long)]
        check: bool,
    },
    /// Benchmarks that print a comparison table (not pass/fail tests).
    #[command(subcommand)]
    Bench(bench::Bench),
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snapshot_args(argv: &[&str]) -> Vec<String> {
        match Cli::try_parse_from(argv).expect("parses") {
            Cli::Snapshot { args } => args,
            other => panic!("parsed as {other:?}"),
        }
    }

    #[test]
    fn pass_through_with_and_without_separator() {
        let expected = ["--duration", "5s", "--pid", "1"];
        assert_eq!(snapshot_args(&["x", "snapshot", "--", "--duration", "5s", "--pid", "1"]), expected);
        assert_eq!(snapshot_args(&["x", "snapshot", "--duration", "5s", "--pid", "1"]), expected);
        assert!(snapshot_args(&["x", "snapshot"]).is_empty());
    }

    #[test]
    fn test_selects_binaries_and_keeps_the_name_filter() {
        let parse = |argv: &[&str]| match Cli::try_parse_from(argv).expect("parses") {
            Cli::Test { unit, tests, args } => (unit, tests, args),
            other => panic!("parsed as {other:?}"),
        };
        let (unit, tests, args) = parse(&["x", "test", "--test", "systemd", "--test", "daemon", "watchdog"]);
        assert!(!unit);
        assert_eq!(tests, ["systemd", "daemon"]);
        assert_eq!(args, ["watchdog"]);
        assert_eq!(parse(&["x", "test", "python"]), (false, vec![], vec!["python".to_string()]));
        // After the first harness argument everything is the harness's, `--test` included.
        assert_eq!(parse(&["x", "test", "python", "--test", "x"]).2, ["python", "--test", "x"]);
        assert!(Cli::try_parse_from(["x", "test", "--unit", "--test", "systemd"]).is_err());
    }

    #[test]
    fn bench_cpu_defaults() {
        let cli = Cli::try_parse_from(["x", "bench", "cpu", "--seconds", "5"]).expect("parses");
        assert!(matches!(cli, Cli::Bench(bench::Bench::Cpu(_))));
    }

    #[test]
    fn bench_futex_iterations() {
        let cli = Cli::try_parse_from(["x", "bench", "futex", "--iterations", "1000"]).expect("parses");
        assert!(matches!(cli, Cli::Bench(bench::Bench::Futex(_))));
    }

    #[test]
    fn bench_soak_and_unwind_flags() {
        let cli =
            Cli::try_parse_from(["x", "bench", "soak", "--stacks", "1000", "--max-minutes", "1"]).expect("parses");
        assert!(matches!(cli, Cli::Bench(bench::Bench::Soak(_))));
        assert!(Cli::try_parse_from(["x", "bench", "unwind", "--rounds", "9"]).is_ok());
        assert!(Cli::try_parse_from(["x", "bench", "soak", "--stacks", "many"]).is_err());
    }

    #[test]
    fn bench_all_takes_quick() {
        let cli = Cli::try_parse_from(["x", "bench", "all", "--quick"]).expect("parses");
        assert!(matches!(cli, Cli::Bench(bench::Bench::All(_))));
        assert!(Cli::try_parse_from(["x", "bench", "all", "--quick", "--rounds", "3"]).is_err());
    }

    #[test]
    fn bench_heap_iterations() {
        let cli = Cli::try_parse_from(["x", "bench", "heap", "--iterations", "1000"]).expect("parses");
        assert!(matches!(cli, Cli::Bench(bench::Bench::Heap(_))));
        assert!(Cli::try_parse_from(["x", "bench", "heap"]).is_ok());
    }
}
