//! End-to-end test support: runs the real `profiler` release binary against fixture programs
//! with known CPU costs or known allocations and reads back the pprof it writes.
//!
//! Owns: building the fixtures (`fixture`), running the binary with a timeout (`run`), looking
//! at a decoded profile as symbolized stacks (`pprof`, the only module that touches the daemon's
//! prost types), running Go's own `go tool pprof` over the same files (`go_pprof`), the Go fixture built as Go programs ship (`go_build`), Go's own text profiles and their grammar (`go_text`), reading
//! the summary the binary prints (`summary`), `perf`'s DWARF unwinding to compare with (`perf`), the heap fixture's ground truth and the checks
//! against it (`heap_sites`), elfutils' `eu-stack` as the thread dumps' reference (`eu_stack`),
//! the assertions several tests share (`expect`), a FUSE file system that stops answering
//! (`fuse`); running the
//! daemon (`daemon`), talking to its socket (`http`) and giving it a tmpfs to fill
//! (`tmpfs`); CPython interpreters and the Python fixtures (`python`); the export tests' stand-in for Pyroscope and an OTLP collector (`backend`); booting a container with a real systemd as its PID 1 to run the shipped unit
//! under (`nspawn`).
//! Does not own: any profiler logic. When the machine is not fit (not root, no compiler, no
//! Go) it panics with a message saying what to do.

pub mod backend;
pub mod cc;
pub mod daemon;
pub mod eu_stack;
pub mod expect;
pub mod fixture;
pub mod fuse;
pub mod go_build;
pub mod go_pprof;
pub mod go_text;
pub mod heap_sites;
pub mod http;
pub mod lock_waits;
pub mod nspawn;
pub mod perf;
pub mod pprof;
pub mod preflight;
pub mod python;
pub mod run;
pub mod summary;
pub mod tmpfs;

pub use fixture::{Fixture, FixtureKind};
pub use pprof::{name_matches, Frame, Profile};
pub use preflight::preflight;
pub use run::{
    assert_success, heap_profile_path, listing, process_dir, profile_path, run_profiler, run_profiler_as_nobody,
    run_profiler_with_env, TempDir,
};

use std::path::PathBuf;

/// The workspace root (the parent of this crate's manifest directory).
pub fn workspace_root() -> PathBuf {
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    manifest.parent().expect("tests/ has a parent").to_path_buf()
}

/// Cargo's target directory: `CARGO_TARGET_DIR` if set, else `<workspace>/target`.
pub fn target_dir() -> PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => workspace_root().join("target"),
    }
}
