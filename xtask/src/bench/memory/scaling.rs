//! What each map's kernel memory follows, as decided for the budget of #51 (`bench memory`'s
//! `scales with` column), and which maps are the drained half of a pair of sets.
//!
//! The decisions: per-CPU maps grow with the possible CPUs (scratch of one walk per context,
//! counters), except the two caches, which keep to one budget for all CPUs; counts maps
//! follow the keys a drain interval makes (one set of each pair full at a time); the stack
//! table follows the stacks; the unwinder's and the runtimes' process maps follow the
//! processes (`profiler_common::maps::SIZED_PROCESSES`); the thread-indexed futex and off-CPU
//! state follows the threads blocked at once; the unwind rows are the unwind-table budget.

use profiler_common::maps::*;
use profiler_common::runtimes::cpython::maps::{PYTHON_PROCESSES, PYTHON_STATE};
use profiler_common::runtimes::go::maps::{GO_LABELS, GO_PROCESSES};

use super::kernel::Shape;

/// Printed under the table.
pub const LEGEND: &str = "scales with: `CPUs` grows with the possible CPUs; `CPUs, budget` keeps to \
one size for all CPUs (fewer entries each past 64); `processes` is sized for 4,096 processes \
(allocated as they come); `keys/s` is the distinct keys of one drain interval (a pair's drained \
set is empty); `fixed` does not grow.";

/// What the map named `name` (the kernel's name: 15 bytes at most) scales with.
pub fn scales_with(name: &str, shape: &Shape) -> &'static str {
    if let Some(&(_, scales)) = DECIDED.iter().find(|(full, _)| named(name, full)) {
        return scales;
    }
    if shape.type_name().starts_with("percpu") {
        return "CPUs";
    }
    if name.starts_with('.') {
        return "fixed (constants)";
    }
    "not decided"
}

/// Whether map `name` is the set being drained of a pair of counts maps allocated on insert,
/// priced empty: userspace deletes its entries within milliseconds of a flip.
pub fn drained_set(name: &str, shape: &Shape) -> bool {
    const DRAINED: [&str; 7] =
        [CPU_COUNTS_1, BLOCK_COUNTS_1, MUTEX_COUNTS_1, OFFCPU_COUNTS_1, THREAD_COUNTS_1, HEAP_TOTALS_1, STACK_SHARES_1];
    !shape.preallocated() && DRAINED.iter().any(|full| named(name, full))
}

/// Whether the kernel's `name` is map `full`'s (the kernel keeps 15 bytes of a name).
fn named(name: &str, full: &str) -> bool {
    full.starts_with(name) && (name.len() == full.len() || name.len() == 15)
}

const KEYS: &str = "keys/s (one set full)";
const PROCESSES: &str = "processes";
const THREADS: &str = "threads blocked (fixed)";
const FIXED: &str = "fixed";

/// Every map but the per-CPU counters and scratch, whose type says it.
const DECIDED: [(&str, &str); 47] = [
    (ROW_CACHE, "CPUs, budget"),
    (STORED_STACKS, "CPUs, budget"),
    (PYTHON_STATE, "CPUs"),
    (CPU_COUNTS_0, KEYS),
    (CPU_COUNTS_1, KEYS),
    (BLOCK_COUNTS_0, KEYS),
    (BLOCK_COUNTS_1, KEYS),
    (MUTEX_COUNTS_0, KEYS),
    (MUTEX_COUNTS_1, KEYS),
    (OFFCPU_COUNTS_0, KEYS),
    (OFFCPU_COUNTS_1, KEYS),
    (THREAD_COUNTS_0, KEYS),
    (THREAD_COUNTS_1, KEYS),
    (HEAP_TOTALS_0, "keys/s at the heap rate"),
    (HEAP_TOTALS_1, "keys/s at the heap rate"),
    (HEAP_LIVE, "live heap at the heap rate"),
    (STACKS, "stacks (both sets)"),
    (STACK_SHARES_0, "stacks' owners"),
    (STACK_SHARES_1, "stacks' owners"),
    (UNWIND_ROWS, "unwind table budget"),
    (UNWIND_TABLES, "unwind table budget"),
    (UNWIND_PROCESSES_LARGE, PROCESSES),
    (UNWIND_PROCESSES, PROCESSES),
    (REGISTER_DECLINED, PROCESSES),
    (REGISTER_ASKED, PROCESSES),
    (TARGET_PIDS, "processes (--pid list)"),
    (PYTHON_PROCESSES, PROCESSES),
    (GO_PROCESSES, PROCESSES),
    (GO_LABELS, "label sets (both sets)"),
    (UNWIND_EXECS, "execs a second"),
    (CGROUP_FILTER, "cgroups selected"),
    (FUTEX_PENDING, THREADS),
    (FUTEX_PENDING_SPILL, THREADS),
    (FUTEX_WAKERS, "futex words (fixed)"),
    (OFFCPU_OUT, THREADS),
    (OFFCPU_PENDING, THREADS),
    (OFFCPU_MAYBE_PENDING, THREADS),
    (HEAP_PENDING, THREADS),
    (CONTROL, FIXED),
    (TARGET_PID_SLOTS, FIXED),
    (HEAP_INTERVALS, FIXED),
    (REGISTER_ASKS, FIXED),
    (FUTEX_SPILLED, FIXED),
    (FUTEX_CONFIG, FIXED),
    (OFFCPU_CONFIG, FIXED),
    (THREAD_RECORD, "CPUs"),
    (FUTEX_RANDOM, "CPUs"),
];

#[cfg(test)]
mod tests {
    use profiler_common::runtimes::cpython::maps::PYTHON_COUNTERS;
    use profiler_common::runtimes::go::maps::GO_LABEL_SCRATCH;

    use super::*;

    fn shape(map_type: u32, flags: u32) -> Shape {
        Shape { map_type, key_size: 4, value_size: 8, max_entries: 16, flags }
    }

    /// The per-CPU maps of the object (`PerCpuArray`/`PerCpuHashMap` in `profiler-ebpf`),
    /// whose type decides what they grow with.
    const PER_CPU: [&str; 18] = [
        CPU_COUNTERS,
        FUTEX_COUNTERS,
        FUTEX_RANDOM,
        GO_LABEL_SCRATCH,
        HEAP_COUNTDOWN,
        HEAP_COUNTERS,
        KERNEL_SCRATCH,
        OFFCPU_COUNTERS,
        PYTHON_COUNTERS,
        PYTHON_STATE,
        ROW_CACHE,
        STACK_SCRATCH,
        STACK_WINDOW,
        STORED_STACKS,
        THREAD_COUNTERS,
        THREAD_RECORD,
        UNWIND_COUNTERS,
        UNWIND_STATE,
    ];

    /// A map added without a decision on what it may grow with fails here: every map of the
    /// object is per-CPU or decided (a hash or array map the table lacks is "not decided").
    #[test]
    fn every_map_of_the_object_has_a_decision() {
        let percpu = shape(6, 0);
        let hash = shape(1, 0);
        for full in ALL {
            let kernel_name = &full[..full.len().min(15)];
            let shape = if PER_CPU.contains(&full) { percpu } else { hash };
            assert_ne!(scales_with(kernel_name, &shape), "not decided", "{full}: decide what it scales with");
        }
        assert_eq!(scales_with("SOMETHING_NEW", &hash), "not decided");
    }

    #[test]
    fn only_the_second_set_of_a_pair_allocated_on_insert_is_priced_drained() {
        let (lazy, preallocated) = (shape(1, 1), shape(1, 0));
        assert!(drained_set("OFFCPU_COUNTS_1", &lazy));
        assert!(!drained_set("OFFCPU_COUNTS_1", &preallocated));
        assert!(!drained_set("OFFCPU_COUNTS_0", &lazy));
        assert!(!drained_set("STACKS", &lazy));
        // Truncated names still name their map; a shorter prefix does not.
        assert!(drained_set("HEAP_TOTALS_1", &lazy));
        assert!(!drained_set("HEAP_TOTALS_", &lazy));
        assert_eq!(scales_with("UNWIND_PROCESSE", &lazy), PROCESSES);
    }
}
