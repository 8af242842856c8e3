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
        "unwind": unwind_status(c, &counters),
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
            "last_dump": {
                "render_ms": d.last_phases.render.as_millis() as u64,
                "write_ms": d.last_phases.write.as_millis() as u64,
                "retention_ms": d.last_phases.retention.as_millis() as u64,
                "cpu_ms": d.last_phases.cpu.as_millis() as u64,
            },
            "symbol_cache_resets": c.symbol_cache_resets,
            "symbol_file_closes": c.symbol_file_closes,
        },
        "last_error": c.last_error,
    });
    serde_json::to_string_pretty(&doc).unwrap_or_else(|_| "{}".into()) + "\n"
}

/// The unwinder: tables loaded (size, build time) against the memory budget, and the kernel
/// walker's frame counts per method and per fallback and stop reason.
fn unwind_status(c: &Collector, counters: &crate::ebpf::Counters) -> serde_json::Value {
    use profiler_common::UnwindCounter as U;
    let s = c.unwinder.stats();
    let u = counters.unwind;
    let unsupported: serde_json::Map<String, serde_json::Value> = crate::unwind::Unsupported::ALL
        .iter()
        .enumerate()
        .map(|(i, r)| (r.name().to_string(), u.unsupported(i).into()))
        .collect();
    json!({
        "processes": s.processes,
        "table_bytes": s.table_bytes,
        "table_budget_bytes": s.budget_bytes,
        "tables_loaded": s.tables.len(),
        "tables_built": s.builds,
        "build_ms_total": s.build_time.as_secs_f64() * 1e3,
        "files_without_table": s.build_failures,
        "tables_too_large": s.too_large,
        "tables_not_loaded_budget_full": s.budget_full,
        "tables_evicted": s.evictions,
        "mappings_over_limit": s.mappings_over_limit,
        "unreadable_files": s.unreadable_files,
        "largest_tables": s.tables.iter().take(10).map(|t| json!({
            "file": t.name, "rows": t.rows, "bytes": t.bytes, "build_ms": t.build_duration.as_secs_f64() * 1e3,
        })).collect::<Vec<_>>(),
        "frames": {
            "by_table": u.get(U::CfiFrames),
            "by_frame_pointer": u.get(U::FramePointerFrames),
            "fallback_process_not_registered": u.get(U::NoProcess),
            "fallback_no_mapping": u.get(U::NoMapping),
            "fallback_no_table": u.get(U::NoTable),
            "fallback_no_cfi": u.get(U::NoCfi),
            "signal_frames": u.get(U::SignalFrames),
            "leaf_guesses": u.get(U::LeafGuesses),
        },
        "walks_ended": {
            "outermost_frame": u.get(U::EndOfStack),
            "unreadable_stack": u.get(U::BadRead),
            "bad_frame": u.get(U::BadFrame),
            "unsupported_cfi": unsupported,
        },
        "exec_tracking_error": c.session_exec_tracking_error(),
    })
}
