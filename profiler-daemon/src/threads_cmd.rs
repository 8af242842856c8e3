//! `profiler threads PID`: a thread dump without the daemon, the third driver of the capture
//! pipeline. Loads only the task iterator (no sampling, no tracepoints), registers the
//! process with the unwinder, dumps its threads once, renders them as `debug` says
//! (0: gzipped pprof, 1: Go's grouped text, 2: every thread) and writes them to a file or
//! stdout. The process is never stopped.

use std::{
    io::{IsTerminal, Write},
    sync::Arc,
};

use crate::{
    capture::{Capture, CaptureConfig, CaptureError},
    cli::ThreadsArgs,
    config::{Config, StackShares},
    error::Error,
    ids::Pid,
    output, preflight,
    profiles::{Context, ProcessCounts, ProfileKind, Settings, View},
    render::{Renderer, Window},
    resolve::Namers,
};

/// Why `profiler threads` failed.
#[derive(Debug, thiserror::Error)]
pub enum ThreadsError {
    /// Usage, privileges, the process, or writing the output.
    #[error(transparent)]
    Setup(#[from] Error),
    /// Loading the task iterator, or the dump itself.
    #[error(transparent)]
    Capture(#[from] CaptureError),
}

/// Runs `profiler threads` and writes its output.
pub fn run(args: &ThreadsArgs) -> Result<(), ThreadsError> {
    if args.debug == 0 && args.output.is_none() && std::io::stdout().is_terminal() {
        return Err(Error::Usage(
            "refusing to write a gzipped profile to a terminal: add --output FILE, or --debug 1 or 2 for text".into(),
        )
        .into());
    }
    preflight::check_privileges()?;
    preflight::check_pids(&[args.pid])?;
    let bytes = dump(Pid(args.pid), args.debug, args.os_threads)?;
    match &args.output {
        Some(path) => output::write_atomic(output::parent_dir(path), path, &bytes)?,
        None => std::io::stdout()
            .write_all(&bytes)
            .map_err(|source| Error::Io { action: "write to stdout".into(), source })?,
    }
    Ok(())
}

/// The thread dump of `pid` in the form `debug` names: of a Go process, its goroutines,
/// unless `os_threads`.
pub fn dump(pid: Pid, debug: u8, os_threads: bool) -> Result<Vec<u8>, ThreadsError> {
    // No sampling here: the defaults only fill what a thread dump does not read.
    let settings = Settings::from(&Config::default());
    let mut capture = Capture::start(&CaptureConfig {
        pids: vec![pid],
        kinds: vec![ProfileKind::Threads],
        settings,
        heap_max_live: 1,
        max_stacks: usize::MAX,
        max_frames: usize::MAX,
        enable_stats: false,
        heartbeat: None,
        selection: Default::default(),
        shares: StackShares::NONE,
        state_dir: None,
    })?;
    let dump = Arc::new(capture.thread_dump(pid)?);
    let counters = capture.counters()?;
    let window = Window { start: dump.taken, duration: dump.duration };
    let mut counts = ProcessCounts::default();
    counts.threads.dump = Some(dump);
    counts.threads.os_threads = os_threads;
    let renderer = Renderer {
        catalog: capture.catalog(),
        settings,
        context: Context::Snapshot,
        window,
        counters: &counters,
        kernel_addresses: true,
    };
    let process = capture.catalog().process(pid).ok_or(Error::NoSuchProcess(pid.0))?;
    let view = View::of(ProfileKind::Threads);
    let mut sym = Namers::new(capture.symbolizer());
    Ok(match debug {
        0 => renderer.render(process, &counts, view, Vec::new(), &mut sym).encoded.gzip(),
        debug => renderer.text(process, &counts, view, debug, &mut sym).into_bytes(),
    })
}
