//! profiler's userspace: a one-way pipeline from the kernel's maps to pprof files.
//!
//! ```text
//! ebpf (load, attach, drain) → aggregate (one owner, /proc capture) → resolve + symbolize
//!   → pprof (encode) → output (atomic files)
//! ```
//!
//! Only [`ebpf`] touches aya, only [`symbolize`] touches blazesym, only [`pprof`] touches the
//! protobuf types. [`snapshot`] wires the stages for the one-shot command.

pub mod aggregate;
pub mod api;
pub mod cli;
pub mod client;
pub mod config;
pub mod daemon;
pub mod ebpf;
pub mod error;
pub mod output;
pub mod pprof;
pub mod preflight;
pub mod primitive;
pub mod procs;
pub mod profiles;
pub mod resolve;
pub mod snapshot;
pub mod symbolize;
pub mod units;
pub mod unwind;

pub use error::{Error, Result};
