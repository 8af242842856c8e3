//! `/status`: the collector's state as one JSON document (version, uptime, programs,
//! samples, drops per reason, map fill levels, processes, files written, last error).

use profiler_common::maps::{CPU_COUNTS_MAX_ENTRIES, HEAP_LIVE_MAX_ENTRIES};
use serde_json::json;

use super::collector::{Collector, MAX_STACKS};
use crate::config::ProfileKind;

pub(super) fn render(c: &Collector) -> String {
    let counters = c.counters().unwrap_or_default();
    let (cpu, heap, futex, d) = (counters.cpu, counters.heap, counters.futex, &c.dumps);
    let doc = json!({
        "version": env!("CARGO_PKG_VERSION"),
        "uptime_seconds": c.started_at.elapsed().as_secs(),
        "programs": {
            "cpu": c.config.is_enabled(ProfileKind::Cpu),
            "cpu_frequency_hz": c.config.cpu.frequency_hz,
            "heap_processes": c.heap_pids.keys().collect::<Vec<_>>(),
            "block": c.futex_enabled(ProfileKind::Block),
            "mutex": c.futex_enabled(ProfileKind::Mutex),
            "threadcreate": c.futex_enabled(ProfileKind::ThreadCreate),
        },
        "samples": {
            "cpu": cpu.samples,
            "heap": heap.sampled,
            "futex_waits": futex.waits,
            "futex_waits_charged_to_waker": futex.mutex_charged,
            "futex_wakes": futex.wakes,
            "threads_created": futex.threads_created,
        },
        "drops": {
            "cpu_counts_map_full": cpu.counts_map_full,
            "cpu_stacks_map_full": cpu.stacks_map_full,
            "cpu_user_stack_unreadable": cpu.user_stack_failed,
            "cpu_kernel_stack_unreadable": cpu.kernel_stack_failed,
            "cpu_user_stack_truncated": cpu.user_stack_truncated,
            "heap_live_map_full": heap.live_map_full,
            "heap_totals_map_full": heap.totals_map_full,
            "heap_stack_lost": heap.stack_lost,
            "heap_in_flight_map_full": heap.pending_map_full,
            "futex_in_flight_map_full": futex.pending_map_full,
            "futex_block_map_full": futex.block_map_full,
            "futex_mutex_map_full": futex.mutex_map_full,
            "futex_waker_map_update_failed": futex.waker_map_full,
            "futex_woken_without_waker": futex.no_waker,
            "futex_stack_lost": futex.stack_lost,
            "threadcreate_map_full": futex.thread_map_full,
            "userspace_stack_table_full": c.agg.dropped_stacks,
            "profiles_skipped_low_disk_space": d.skipped_low_space,
            "profile_write_errors": d.write_errors,
        },
        "maps": {
            "heap_live": { "entries": c.live_blocks, "capacity": HEAP_LIVE_MAX_ENTRIES },
            "cpu_counts_capacity_per_set": CPU_COUNTS_MAX_ENTRIES,
            "userspace_stacks": { "entries": c.agg.stack_count(), "capacity": MAX_STACKS },
        },
        "processes_tracked": c.agg.processes().count(),
        "output": {
            "dir": c.output_dir(),
            "interval_seconds": c.config.interval.as_secs(),
            "dumps": d.dumps,
            "files_written": d.files_written,
            "bytes_written": d.bytes_written,
            "files_deleted_by_retention": d.files_deleted,
            "retention_errors": d.retention_errors,
            "last_dump_ms": d.last_duration.as_millis() as u64,
        },
        "last_error": c.last_error,
    });
    serde_json::to_string_pretty(&doc).unwrap_or_else(|_| "{}".into()) + "\n"
}
