//! The errors every stage shares (privileges, pids, the output directory, writes), and
//! [`chain`], how an error prints with its causes. Each boundary has its own error type
//! besides (`ebpf::Error`, `CaptureError`, `ConfigError`, `ApiError`, ...), carrying its
//! source, so a message names the object and the cause (`Permission denied`, `Address in
//! use`) and, where a user can fix it, what to do next. Each command's error wraps the ones
//! it can meet; `main` prints the chain and maps it to the exit code.

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
        "this kernel is Linux {release}; the profiler needs Linux {}.{} or newer (its programs use \
         `bpf_loop` and hash maps allocated on insert from perf-event programs): run it on a newer kernel",
        needed.0,
        needed.1
    )]
    KernelTooOld { release: String, needed: (u32, u32) },

    /// A combination of flags that cannot work, with what to do instead.
    #[error("{0}")]
    Usage(String),

    // `cause` (not `source`) is part of the message, so the chain does not print it twice and
    // the advice stays at the end.
    #[error("cannot write to output directory {}: {cause}; choose another with --output", path.display())]
    OutputDir { path: PathBuf, cause: io::Error },

    #[error("failed to write {}: {cause}", path.display())]
    Write { path: PathBuf, cause: io::Error },

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chains_keep_every_cause() {
        let err = Error::Io { action: "bind /run/x.sock".into(), source: io::Error::from(io::ErrorKind::AddrInUse) };
        let text = chain(&err);
        assert!(text.starts_with("failed to bind /run/x.sock: "), "{text}");
        assert!(text.to_lowercase().contains("in use"), "the cause survives: {text}");
    }
}
