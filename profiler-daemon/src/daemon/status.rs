//! `/status`: the daemon's state as one JSON document (version, uptime, programs, samples,
//! drops per reason, map fill levels, processes, files written, last error), rendered from a
//! [`Status`] value the collector fills in.

use std::{path::PathBuf, time::Duration};

use profiler_common::{
    maps::{CPU_COUNTS_MAX_ENTRIES, HEAP_LIVE_MAX_ENTRIES},
    Unsupported, UnwindCounter as U,
};
use serde_json::json;

use crate::{
    declined::DeclinedStats,
    ebpf::Counters,
    ids::Pid,
    offload::OffloadStats,
    procs::PidNamespace,
    profiles::{ProfileKind, Settings},
    sideband::{latency::BOUNDS_US, FollowLatency, SidebandStats},
    sink::{export::ExportStatus, DumpStats},
    unwind::UnwinderStats,
};

/// What `/status` shows, as the collector knows it.
#[derive(Debug)]
pub struct Status {
    pub uptime: Duration,
    /// The sampling in force: CPU frequency, heap, off-CPU, block and mutex rates.
    pub settings: Settings,
    /// The kinds served (enabled and attached).
    pub serving: Vec<ProfileKind>,
    pub heap_pids: Vec<Pid>,
    pub counters: Counters,
    pub live_blocks: usize,
    pub stacks: usize,
    pub max_stacks: usize,
    /// Frames of the stacks held, and the most they may have.
    pub stack_frames: usize,
    pub max_stack_frames: usize,
    pub stacks_dropped: u64,
    /// Stacks forgotten for new ones, named only by history (seen last before a dump).
    pub stacks_evicted: u64,
    /// Refusals of a new stack because its process (or its uid) held its share of the
    /// kernel's or the daemon's stack table: in total, and the process refused most (pid,
    /// count).
    pub stacks_over_share: u64,
    pub stacks_over_share_most: Option<(Pid, u64)>,
    pub processes: usize,
    pub unwinder: UnwinderStats,
    pub exec_tracking_error: Option<String>,
    pub pid_namespace: Option<PidNamespace>,
    pub output_dir: PathBuf,
    pub interval: Duration,
    pub dumps: DumpStats,
    /// Each `[[export]]`'s counts.
    pub exports: Vec<ExportStatus>,
    pub symbol_cache_resets: u64,
    pub symbol_file_closes: u64,
    /// Files the symbolizer closed for being idle (their symbols kept).
    pub symbol_idle_file_closes: u64,
    /// Exited threads folded together in since-start totals, counted once per profile kind
    /// (CPU, off-CPU) that named them.
    pub threads_folded: u64,
    /// Entries of since-start totals (and windows) whose stacks the stack table evicted,
    /// folded together (`profiles::Counts::fold_evicted_stacks`).
    pub evicted_rows_folded: u64,
    /// JIT perf map reads refused (not a regular file, not the process's owner's, too large).
    pub perf_maps_refused: u64,
    /// Frame names by where they came from, summed over every naming of a process's samples
    /// (distinct addresses each time: each profile, and each process named as it exits), in [`crate::symbolize::NameSource::ALL`]'s order.
    pub names_by_source: [u64; crate::symbolize::NameSource::ALL.len()],
    /// What the socket server refused, by reason ([`crate::control::Refusals::read`]).
    pub front: [(&'static str, u64); 4],
    /// Profile captures (`seconds=`) refused for being over their uid's share.
    pub windows_over_uid_share: u64,
    /// Pages of mapped files that were truncated while read, read as zeros instead
    /// ([`crate::sigbus`]).
    pub truncated_pages: u64,
    /// File reads given up or skipped because their file system did not answer.
    pub offload: OffloadStats,
    /// The kernel's process events read and lost; why they are not read, if they are not.
    pub process_events: Option<SidebandStats>,
    pub process_events_error: Option<String>,
    /// How long after their exec processes were registered with the unwinder.
    pub follow_latency: FollowLatency,
    /// Processes the selection leaves out whose walks were told to stop asking.
    pub declined: DeclinedStats,
    pub last_error: Option<String>,
}

/// The JSON document; `full` for root. Anyone else gets its counters only (numbers and
/// flags): no paths, pids, error messages or lists, which would tell them about other
/// users' processes.
pub fn render(s: &Status, full: bool) -> serde_json::Value {
    let doc = json!({
        "version": env!("CARGO_PKG_VERSION"),
        "uptime_seconds": s.uptime.as_secs(),
        "programs": programs_status(s),
        "samples": samples_status(s),
        "drops": drops_status(s),
        "maps": maps_status(s),
        "unwind": unwind_status(s),
        "processes_tracked": s.processes,
        "process_events": process_events_status(s),
        // A daemon in a pid namespace of its own profiles that namespace's processes only.
        "pid_namespace": match s.pid_namespace {
            None => json!({ "initial": true }),
            Some(ns) => json!({ "initial": false, "inode": ns.ino }),
        },
        "output": output_status(s),
        "export": export_status(&s.exports),
        "refused": refused_status(s),
        "stalled": stalled_status(s),
        "frame_names_by_source": crate::symbolize::NameSource::ALL
            .iter()
            .map(|source| (source.label().replace(' ', "_"), json!(s.names_by_source[*source as usize])))
            .collect::<serde_json::Map<_, _>>(),
        "last_error": s.last_error,
    });
    if full {
        doc
    } else {
        counters_only(doc)
    }
}

/// What is attached, and what decides which events each program records.
fn programs_status(s: &Status) -> serde_json::Value {
    let serves = |kind| s.serving.contains(&kind);
    json!({
        "cpu": serves(ProfileKind::Cpu),
        "cpu_frequency_hz": s.settings.frequency_hz,
        "heap_processes": s.heap_pids.iter().map(|p| p.0).collect::<Vec<_>>(),
        "block": serves(ProfileKind::Block),
        "mutex": serves(ProfileKind::Mutex),
        "threadcreate": serves(ProfileKind::ThreadCreate),
        "offcpu": serves(ProfileKind::OffCpu),
        // What decides which off-CPU intervals and waits are walked (see the README's
        // sampling sections); `offcpu_sample_every` only on kernels before 6.16.
        "offcpu_rate_ns": s.settings.offcpu_rate_ns,
        "offcpu_sample_every": s.settings.offcpu_sample_every,
        "block_rate_ns": s.settings.block_rate_ns,
        "mutex_fraction": s.settings.mutex_fraction,
        "heap_sample_bytes": s.settings.heap_sample_bytes,
        // False on kernels without sched_exit_tp (before 6.16): see the offcpu comment.
        "offcpu_walks_at_switch_in": serves(ProfileKind::OffCpu) && !s.counters.offcpu.walked_at_switch_out,
    })
}

/// Events recorded, by program.
fn samples_status(s: &Status) -> serde_json::Value {
    let (cpu, heap, futex, threads) = (s.counters.cpu, s.counters.heap, s.counters.futex, s.counters.threadcreate);
    json!({
        "cpu": cpu.samples,
        "heap": heap.sampled,
        "futex_waits": futex.waits,
        "futex_waits_charged_to_waker": futex.mutex_charged,
        "futex_wakes": futex.wakes,
        "threads_created": threads.created,
        "offcpu_switches_sampled": s.counters.offcpu.charged,
    })
}

/// Events and stacks lost, and where: the kernel's maps, the catalogue, the output.
fn drops_status(s: &Status) -> serde_json::Value {
    let (cpu, heap, futex, threads, d) =
        (s.counters.cpu, s.counters.heap, s.counters.futex, s.counters.threadcreate, &s.dumps);
    json!({
        "cpu_counts_map_full": cpu.counts_map_full,
        "cpu_stacks_map_full": cpu.stacks_map_full,
        "cpu_user_stack_unreadable": cpu.user_stack_failed,
        "cpu_kernel_stack_unreadable": cpu.kernel_stack_failed,
        "cpu_user_stack_truncated": cpu.user_stack_truncated,
        "cpu_cgroup_not_selected": cpu.cgroup_filtered,
        "cpu_ticks_missed": cpu.ticks_missed,
        "cpu_ticks_due": cpu.ticks_due,
        "heap_live_map_full": heap.live_map_full,
        "heap_totals_map_full": heap.totals_map_full,
        "heap_stack_lost": heap.stack_lost,
        "heap_live_reads_cut": heap.live_reads_cut,
        "heap_in_flight_map_full": heap.pending_map_full,
        "futex_in_flight_map_full": futex.pending_map_full,
        "futex_block_map_full": futex.block_map_full,
        "futex_mutex_map_full": futex.mutex_map_full,
        "futex_waker_map_update_failed": futex.waker_map_full,
        "futex_woken_without_waker": futex.no_waker,
        "futex_stack_lost": futex.stack_lost,
        "threadcreate_map_full": threads.map_full,
        "threadcreate_stack_lost": threads.stack_lost,
        "offcpu_in_flight_map_full": s.counters.offcpu.pending_map_full,
        "offcpu_counts_map_full": s.counters.offcpu.counts_map_full,
        "offcpu_stack_lost": s.counters.offcpu.stack_lost,
        "offcpu_cgroup_not_selected": s.counters.offcpu.cgroup_filtered,
        "userspace_stack_table_full": s.stacks_dropped,
        "userspace_stacks_evicted": s.stacks_evicted,
        "stacks_refused_over_share": s.stacks_over_share,
        "stacks_refused_over_share_most": s.stacks_over_share_most.map(|(pid, count)| json!({ "pid": pid.0, "count": count })),
        "profiles_skipped_low_disk_space": d.skipped_low_space,
        "profile_write_errors": d.write_errors,
    })
}

/// How full the maps that can fill are.
fn maps_status(s: &Status) -> serde_json::Value {
    json!({
        "heap_live": { "entries": s.live_blocks, "capacity": HEAP_LIVE_MAX_ENTRIES },
        "cpu_counts_capacity_per_set": CPU_COUNTS_MAX_ENTRIES,
        "userspace_stacks": {
            "entries": s.stacks,
            "capacity": s.max_stacks,
            "frames": s.stack_frames,
            "frames_capacity": s.max_stack_frames,
        },
    })
}

/// Forks, execs, mappings and exits as the kernel reports them (perf's side band).
fn process_events_status(s: &Status) -> serde_json::Value {
    json!({
        "read": s.process_events.map(|e| e.events),
        "lost": s.process_events.map(|e| e.lost),
        // Records came so fast lately that they are read every 20 ms (and when a walker
        // asks for a process's registration), not as each comes.
        "storm": s.process_events.map(|e| e.storm),
        "storm_ms": s.process_events.map(|e| e.storm_time.as_millis() as u64),
        "registration_asks": s.process_events.map(|e| e.asks),
        // Processes the selection leaves out, whose walks no longer ask (`held` now;
        // `full`: refused by a full map, so those still ask).
        "registrations_declined": {
            "held": s.declined.held,
            "total": s.declined.declined,
            "full": s.declined.full,
        },
        "error": s.process_events_error,
        // Until registered, a new program is walked with frame pointers only.
        "registered_after_exec": follow_latency(&s.follow_latency),
    })
}

/// The output directory's dumps, writes and retention, and the last dump's phases.
fn output_status(s: &Status) -> serde_json::Value {
    let d = &s.dumps;
    json!({
        "dir": s.output_dir,
        "interval_seconds": s.interval.as_secs(),
        "dumps": d.dumps,
        "files_written": d.files_written,
        "bytes_written": d.bytes_written,
        "files_deleted_by_retention": d.files_deleted,
        "retention_errors": d.retention_errors,
        "retention_held_at_free_space_floor": d.retention_held_at_floor,
        "retention_passes": d.retention_passes,
        "last_dump_ms": d.last_duration.as_millis() as u64,
        "last_dump": {
            "render_ms": d.last_phases.render.as_millis() as u64,
            "write_ms": d.last_phases.write.as_millis() as u64,
            "retention_ms": d.last_phases.retention.as_millis() as u64,
            "cpu_ms": d.last_phases.cpu.as_millis() as u64,
        },
        "symbol_cache_resets": s.symbol_cache_resets,
        "symbol_file_closes": s.symbol_file_closes,
        "symbol_idle_files_closed": s.symbol_idle_file_closes,
        "exited_threads_folded": s.threads_folded,
        "evicted_stack_rows_folded": s.evicted_rows_folded,
    })
}

/// What was refused for what it would cost or who asked.
fn refused_status(s: &Status) -> serde_json::Value {
    json!({
        "perf_maps": s.perf_maps_refused,
        "windows_over_uid_share": s.windows_over_uid_share,
        "truncated_file_pages_read_as_zeros": s.truncated_pages,
        "socket": s.front.iter().map(|&(name, n)| (name.to_string(), json!(n))).collect::<serde_json::Map<_, _>>(),
    })
}

/// Reads of processes' files that never returned (a FUSE or NFS server that does not
/// answer): given up after a while, their devices skipped until they answer.
fn stalled_status(s: &Status) -> serde_json::Value {
    json!({
        "reads_given_up": s.offload.stalls,
        "reads_skipped": s.offload.refused,
        "reads_returned_later": s.offload.recovered,
        "threads_stuck_now": s.offload.stuck_threads,
        "devices_skipped_now": s.offload.stalled_devices.iter().map(|d| d.to_string()).collect::<Vec<_>>(),
        "file_reads": s.offload.jobs,
    })
}

/// `doc` with only its numbers and booleans (and the version), objects kept as the path to
/// them: what a non-root client may see.
fn counters_only(doc: serde_json::Value) -> serde_json::Value {
    use serde_json::Value;
    fn keep(value: Value) -> Option<Value> {
        match value {
            Value::Number(_) | Value::Bool(_) => Some(value),
            Value::Object(fields) => {
                let fields: serde_json::Map<String, Value> =
                    fields.into_iter().filter_map(|(key, value)| Some((key, keep(value)?))).collect();
                (!fields.is_empty()).then_some(Value::Object(fields))
            }
            Value::Null | Value::String(_) | Value::Array(_) => None,
        }
    }
    let version = doc["version"].clone();
    let mut kept = keep(doc).unwrap_or_else(|| json!({}));
    kept["version"] = version;
    kept
}

/// Each export by name: its backend and counts. Profiles are counted once each: `sent`
/// (acknowledged), `failed` (refused for good), `dropped` (deleted by retention before they
/// were sent) or still in `queue_depth`; `retried` counts failed tries.
fn export_status(exports: &[ExportStatus]) -> serde_json::Value {
    let exports = exports.iter().map(|s| {
        let export = json!({
            "protocol": s.protocol.as_str(),
            "url": s.url,
            "sent": s.sent,
            "retried": s.retried,
            "failed": s.failed,
            "dropped": s.dropped,
            "queue_depth": s.queue_depth,
            "bytes_sent": s.bytes_sent,
            "last_error": s.last_error,
        });
        (s.name.clone(), export)
    });
    serde_json::Value::Object(exports.collect())
}

/// The unwinder: tables loaded (size, build time) against the memory budget, and the kernel
/// walker's frame counts per method and per fallback and stop reason.
/// The exec-to-registration histogram: `counts[i]` processes took at most `bounds_ms[i]`
/// (and more than the bound before); the last count is those above every bound.
fn follow_latency(l: &FollowLatency) -> serde_json::Value {
    json!({
        "processes": l.count(),
        "bounds_ms": BOUNDS_US.iter().map(|&us| us as f64 / 1e3).collect::<Vec<_>>(),
        "counts": l.buckets,
        "max_ms": l.max_us as f64 / 1e3,
        "exited_unregistered": l.exited_unregistered,
    })
}

fn unwind_status(s: &Status) -> serde_json::Value {
    let (t, u) = (&s.unwinder, s.counters.unwind);
    let unsupported: serde_json::Map<String, serde_json::Value> =
        Unsupported::ALL.into_iter().map(|r| (r.name().to_string(), u.unsupported(r).into())).collect();
    let mut unwinding = json!({
        "processes": t.processes,
        "table_bytes": t.table_bytes,
        "table_budget_bytes": t.budget_bytes,
        "tables_loaded": t.tables.len(),
        "tables_built": t.builds,
        "build_ms_total": t.build_time.as_secs_f64() * 1e3,
        "files_without_table": t.build_failures,
        "tables_too_large": t.too_large,
        "tables_not_loaded_budget_full": t.budget_full,
        "tables_evicted": t.evictions,
        "mappings_over_limit": t.mappings_over_limit,
        "process_maps_full": t.process_maps_full,
        "registrations_undone_by_exec": t.undone_by_exec,
        "unreadable_files": t.unreadable_files,
        "stalled_files": t.stalled_files,
        "largest_tables": t.tables.iter().take(10).map(|t| json!({
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
            "uprobe_frames_restored": u.get(U::UprobeFrames),
            "go_cgo_stack_switches": u.get(U::GoStackSwitches),
        },
        "walks_ended": {
            "outermost_frame": u.get(U::EndOfStack),
            "unreadable_stack": u.get(U::BadRead),
            "bad_frame": u.get(U::BadFrame),
            "unsupported_cfi": unsupported,
        },
        "exec_tracking_error": s.exec_tracking_error,
    });
    for (key, value) in crate::runtimes::status(&t.runtimes, &s.counters.runtimes) {
        unwinding[key] = value;
    }
    let (g, cpu) = (&t.go_labels, s.counters.cpu);
    unwinding["go_labels"] = json!({
        "processes": g.processes,
        "map_full": g.map_full,
        "unsupported": g.unsupported,
        "last_unsupported_reason": g.unsupported_reason,
        "samples_with_labels": cpu.go_labels,
        "unreadable": cpu.go_labels_unreadable,
        "labels_map_full": cpu.go_labels_map_full,
    });
    unwinding
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn others_get_counters_only() {
        let doc = json!({
            "version": "1.2.3",
            "samples": { "cpu": 5, "heap": 0 },
            "programs": { "cpu": true, "heap_processes": [1, 2] },
            "output": { "dir": "/var/lib/profiler", "dumps": 3 },
            "unwind": { "largest_tables": [{ "file": "/home/alice/lib.so" }] },
            "last_error": "cannot heap-profile secret (pid 7): …",
            "pid_namespace": { "initial": true },
        });
        let expected = json!({
            "version": "1.2.3",
            "samples": { "cpu": 5, "heap": 0 },
            "programs": { "cpu": true },
            "output": { "dumps": 3 },
            "pid_namespace": { "initial": true },
        });
        assert_eq!(counters_only(doc), expected);
    }
}
