//! Unwind tables: each executable file's call-frame information (`.eh_frame`, `.debug_frame`)
//! turned into a compact, sorted table of [`profiler_common::UnwindRow`]s that the kernel
//! walker binary-searches to step from a frame to its caller without frame pointers.
//!
//! Owns the ELF section lookup, the CFI evaluation (gimli) and the row encoding. Does not own
//! loading tables into BPF maps, sharing them per build id, or the kernel walk; see
//! `docs/unwinding.md` for the whole design.

mod cfi;
mod elf;
mod rule;
mod table;

#[cfg(test)]
mod ground_truth;
#[cfg(test)]
mod readelf;

pub use rule::{CfaRegister, RbpRule, ReasonCounts, Rule, Unsupported, MAX_CFA_OFFSET};
pub use table::{build, BuildError, BuildStats, UnwindTable};
