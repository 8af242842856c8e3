//! Why a BPF operation failed: the only error type that carries aya's errors, so the rest of
//! the crate never sees aya. Each variant names the program or map and the operation.

use std::io;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    // aya's errors are large; boxed so every `Result` of this module stays small.
    #[error("failed to load the eBPF programs")]
    Load(#[source] Box<aya::EbpfError>),

    #[error("failed to {action} the eBPF program {program}")]
    Program {
        action: std::borrow::Cow<'static, str>,
        program: &'static str,
        #[source]
        source: Box<aya::programs::ProgramError>,
    },

    #[error("failed to {action} the BPF map {map}")]
    Map {
        action: &'static str,
        map: &'static str,
        #[source]
        source: Box<aya::maps::MapError>,
    },

    #[error("{name} is missing from the embedded eBPF object; rebuild profiler")]
    Missing { name: &'static str },

    #[error("the kernel lacks {feature}: {detail}")]
    KernelFeature { feature: &'static str, detail: String },

    /// Since Linux 6.16 (and in stable backports) perf needs CAP_SYS_ADMIN for uprobes again.
    #[error(
        "missing privileges: CAP_SYS_ADMIN is needed to put uprobes on {function} in pid {pid}; under the \
         service, add it to the unit with `systemctl edit profiler` ([Service] CapabilityBoundingSet=CAP_SYS_ADMIN \
         and AmbientCapabilities=CAP_SYS_ADMIN, as config/profiler.service shows), or run as root"
    )]
    UprobePermission { pid: u32, function: &'static str },

    #[error("the tracepoint records are not laid out as the profiler reads them")]
    TracepointLayout(#[from] super::tracefs::LayoutError),

    #[error("failed to find task_struct's layout in the kernel's BTF (thread dumps read it)")]
    TaskLayout(#[source] super::btf::BtfError),

    #[error("failed to {action}")]
    Io {
        action: String,
        #[source]
        source: io::Error,
    },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

pub(super) fn map_error(action: &'static str, map: &'static str) -> impl Fn(aya::maps::MapError) -> Error {
    move |source| Error::Map { action, map, source: Box::new(source) }
}

pub(super) fn program_error(
    action: impl Into<std::borrow::Cow<'static, str>>,
    program: &'static str,
) -> impl Fn(aya::programs::ProgramError) -> Error {
    let action = action.into();
    move |source| Error::Program { action: action.clone(), program, source: Box::new(source) }
}

pub(super) fn missing(name: &'static str) -> Error {
    Error::Missing { name }
}
