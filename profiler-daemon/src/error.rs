//! The library's error type. Each variant names the object and, for errors a user can fix,
//! what to do next. `main` prints the chain and maps it to the exit code.

use std::{io, path::PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(
        "missing privileges: {missing} not in the effective capability set; run as root or \
         grant CAP_BPF, CAP_PERFMON, CAP_SYS_PTRACE and CAP_SYSLOG (e.g. `sudo profiler ...`)"
    )]
    Privileges { missing: String },

    #[error("no such process: pid {0} (check the pid with `ps -p {0}`)")]
    NoSuchProcess(u32),

    #[error(
        "pid {0} maps no C library exporting malloc and free (statically linked, or a custom \
         allocator?); heap profiling probes the C library's allocator"
    )]
    NoAllocator(u32),

    #[error("{0}")]
    Usage(String),

    // `cause` (not `source`) is part of the message, so the chain does not print it twice and
    // the advice stays at the end.
    #[error("cannot write to output directory {}: {cause}; choose another with --output", path.display())]
    OutputDir { path: PathBuf, cause: io::Error },

    #[error("failed to write {}: {cause}", path.display())]
    Write { path: PathBuf, cause: io::Error },

    #[error("the kernel lacks {feature}: {detail}")]
    KernelFeature { feature: &'static str, detail: String },

    #[error("failed to load the eBPF programs")]
    Load(#[source] aya::EbpfError),

    #[error("failed to {action} the eBPF program {program}")]
    Program {
        action: &'static str,
        program: &'static str,
        #[source]
        source: aya::programs::ProgramError,
    },

    #[error("failed to {action} the BPF map {map}")]
    Map {
        action: &'static str,
        map: &'static str,
        #[source]
        source: aya::maps::MapError,
    },

    #[error("failed to {action}")]
    Io {
        action: String,
        #[source]
        source: io::Error,
    },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// An error and its sources, joined with ": " (how `main` and the daemon's logs print them).
pub fn chain(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}
