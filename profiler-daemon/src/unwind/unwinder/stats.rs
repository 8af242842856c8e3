//! What the unwinder reports of itself: [`UnwinderStats`] and its tables, for `/status`,
//! profile comments and the bench.

use std::time::Duration;

use super::Unwinder;
use crate::runtimes::{RegistrationStats, Runtime};

/// What the unwinder did, for `/status`, profile comments and the bench.
#[derive(Debug, Clone, Default)]
pub struct UnwinderStats {
    /// Processes whose mappings the kernel walker has.
    pub processes: usize,
    /// Tables built, and their total build time.
    pub builds: u64,
    pub build_time: Duration,
    /// Files with no table: build failed (no CFI, not ELF, ...), by file; never retried.
    pub build_failures: u64,
    /// Tables too large for one table or the whole budget.
    pub too_large: u64,
    /// Tables not loaded because the tables in use filled the budget (retried later).
    pub budget_full: u64,
    /// Tables evicted (unused) to make room.
    pub evictions: u64,
    /// Executable mappings beyond the per-process limit (those fall back to frame pointers).
    pub mappings_over_limit: u64,
    /// Registrations refused because both kernel process maps were full (retried at the
    /// next drain; meanwhile the process is walked with frame pointers).
    pub process_maps_full: u64,
    /// Registrations written before an exec of their process (inherited at its fork, or the
    /// old image's after a failed exec), which the exec deleted in the kernel: dropped at the
    /// next drain and written anew.
    pub undone_by_exec: u64,
    /// Mapped files that could not be opened or parsed.
    pub unreadable_files: u64,
    /// Mapped files not read because their file system did not answer (see
    /// [`crate::offload`]).
    pub stalled_files: u64,
    /// Processes given to the runtimes' walkers (see [`crate::runtimes`]), by runtime.
    pub runtimes: RegistrationStats,
    /// Go processes given to the sampling program's label read (`processes` is filled in by
    /// [`Unwinder::stats`]).
    pub go_labels: crate::runtimes::Registrations,
    /// Bytes of row memory in use, and the budget.
    pub table_bytes: u64,
    pub budget_bytes: u64,
    /// Loaded tables: (file, rows, bytes, build time), largest first.
    pub tables: Vec<TableReport>,
}

/// One loaded table, for reports.
#[derive(Debug, Clone)]
pub struct TableReport {
    pub name: String,
    pub rows: u32,
    pub bytes: u64,
    pub build_duration: Duration,
}

impl Unwinder {
    /// What the unwinder did so far.
    pub fn stats(&self) -> UnwinderStats {
        let mut stats = self.stats.clone();
        stats.processes = self.processes.len();
        for runtime in Runtime::ALL {
            stats.runtimes.of_mut(runtime).processes =
                self.processes.values().filter(|r| r.runtime.is_some_and(|w| w.runtime() == runtime)).count() as u64;
        }
        stats.go_labels.processes = self.processes.values().filter(|r| r.go.is_some()).count() as u64;
        stats.evictions = self.registry.evictions;
        (stats.table_bytes, stats.budget_bytes) = self.registry.usage();
        stats.tables = self
            .registry
            .tables()
            .map(|(_, t)| TableReport {
                name: t.name.clone(),
                rows: t.rows,
                bytes: t.bytes(),
                build_duration: t.build_duration,
            })
            .collect();
        stats.tables.sort_by(|a, b| b.bytes.cmp(&a.bytes).then_with(|| a.name.cmp(&b.name)));
        stats
    }
}
