//! profiler's userspace: a one-way pipeline from the kernel's maps to pprof files.
//!
//! ```text
//! capture (ebpf: load, attach, drain; catalog: processes and stacks; unwind: the kernel
//!   walker's tables) → profiles (each kind's counts and samples) → render (resolve +
//!   symbolize → pprof) → sink (files) or a socket reply
//! ```
//!
//! Only [`ebpf`] touches aya, only [`symbolize`] touches blazesym, only [`pprof`] touches the
//! protobuf types. [`snapshot`] and [`daemon`] are the two drivers of the same pipeline;
//! [`control`] is the protocol between the daemon's front and its collector.

pub mod api;
pub mod capture;
pub mod catalog;
pub mod cgroups;
pub mod cli;
pub mod client;
pub mod config;
pub mod control;
pub mod daemon;
pub mod declined;
pub mod ebpf;
pub(crate) mod elf;
pub mod error;
pub mod flame;
pub mod heartbeat;
pub mod ids;
pub mod kind;
pub mod offload;
pub mod opened;
pub mod output;
pub mod pprof;
pub mod preflight;
pub mod procs;
pub mod profiles;
#[cfg(test)]
mod properties;
pub mod render;
pub mod resolve;
pub mod runtimes;
pub mod sideband;
pub mod sigbus;
pub mod sink;
pub mod snapshot;
pub mod symbolize;
pub mod thread_dump;
pub mod threads_cmd;
pub mod units;
pub mod untrusted;
pub mod unwind;

pub use error::{Error, Result};
