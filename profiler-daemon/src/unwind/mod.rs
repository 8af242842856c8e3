//! Unwind tables: each executable file's call-frame information (`.eh_frame`, `.debug_frame`)
//! turned into a compact, sorted table of [`profiler_common::UnwindRow`]s that the kernel
//! walker binary-searches to step from a frame to its caller without frame pointers.
//!
//! Owns the CFI evaluation (gimli), the row encoding, and
//! ([`Unwinder`]) which tables are loaded for which process mappings, shared by build id and
//! bounded in memory. The kernel walk is `profiler-ebpf/src/user_stack.rs`; see
//! `docs/unwinding.md` for the whole design.

mod cfi;
mod go_cgo;
mod refused;
mod registry;
mod report;
mod rule;
mod table;
mod unwinder;

#[cfg(test)]
mod ground_truth;
#[cfg(test)]
mod readelf;

pub use report::{report, ReportError};
pub use rule::{CfaRegister, RbpRule, ReasonCounts, Rule, Unsupported, MAX_CFA_OFFSET};
pub use table::{build, BuildError, BuildStats, UnwindTable};
pub use unwinder::{rows_for_budget, HeldTables, TableReport, Unwinder, UnwinderStats, DEFAULT_TABLE_BYTES};
