//! Heap profiling under the unit: refused with a message naming CAP_SYS_ADMIN as shipped,
//! working with the drop-in the unit documents.

use std::time::Duration;

use profiler_tests::daemon::wait_for;
use profiler_tests::nspawn::Container;
use profiler_tests::FixtureKind;

use super::{machine_fit, replace_once, shipped, status, wait_active, with_unit, DROP_IN, FIXTURE_S, SOON, UNIT};

/// How long heap_sites waits before it allocates.
pub(super) const HEAP_DELAY_S: &str = "15";

/// Ground truth: uprobes need CAP_SYS_ADMIN on this kernel (6.16+), which the unit does not
/// grant. With `heap` and a `[heap]` matcher for heap_sites in the config but the unit as
/// shipped, the journal names CAP_SYS_ADMIN for heap_sites and no heap probe is attached.
/// With the drop-in the unit's comments document (read from the unit file itself), systemd
/// grants it, the probes attach to heap_sites and its allocations are counted.
#[test]
fn systemd_heap_profiling_works_with_the_documented_drop_in() {
    if !machine_fit() {
        return;
    }
    let mut container = with_unit(&heap_config());
    container.boot();
    wait_active(&container);
    let refused = container.spawn_fixture(FixtureKind::HeapSites, &[HEAP_DELAY_S, FIXTURE_S]);
    container.wait_for_journal(UNIT, "CAP_SYS_ADMIN", 1, SOON);
    let journal = container.journal(UNIT);
    let line = journal.lines().find(|l| l.contains("CAP_SYS_ADMIN")).expect("waited for it");
    assert!(line.contains("heap_sites"), "the CAP_SYS_ADMIN message does not name the process: {line}");
    assert_eq!(heap_processes(&container), Vec::<u64>::new());
    assert_eq!(container.show(UNIT, "ActiveState"), "active");
    drop(refused);

    container.write(DROP_IN, &documented_drop_in());
    container.systemctl(&["daemon-reload"]);
    for property in ["CapabilityBoundingSet", "AmbientCapabilities"] {
        let caps = container.show(UNIT, property);
        assert!(caps.contains("cap_sys_admin"), "{property} with the drop-in: {caps}");
    }
    container.systemctl(&["restart", UNIT]);
    wait_active(&container);
    let refusals = container.journal(UNIT).matches("CAP_SYS_ADMIN").count();
    // The daemon looks for new heap targets every 5 s; the probes must be on before
    // heap_sites allocates, and a loaded VM may take a scan or two longer.
    // heap_sites allocates when told (SIGUSR1), once its probes are seen on.
    let mut heap = container.spawn_fixture(FixtureKind::HeapSites, &["usr1", FIXTURE_S]);
    let pids = [u64::from(heap.ns_pid()), u64::from(heap.host_pid())];
    let attached = wait_for(Duration::from_secs(13), || heap_processes(&container).iter().any(|p| pids.contains(p)));
    assert!(
        attached,
        "no heap probes on heap_sites (pid {} in the container, {} on the host): {:#}\n{}",
        pids[0],
        pids[1],
        status(&container)["programs"],
        container.journal_verbose(UNIT)
    );
    container.wait_for_journal(UNIT, "heap probes attached", 1, SOON);
    heap.signal(libc::SIGUSR1);
    heap.expect_line("allocated");
    let counted = wait_for(SOON, || status(&container)["samples"]["heap"].as_u64().unwrap_or(0) > 0);
    assert!(counted, "no heap samples after heap_sites allocated: {:#}", status(&container));
    assert_eq!(
        container.journal(UNIT).matches("CAP_SYS_ADMIN").count(),
        refusals,
        "CAP_SYS_ADMIN still refused with the drop-in:\n{}",
        container.journal(UNIT)
    );
}

/// The shipped config with `heap` added to `profiles` and heap_sites in `[heap] include`.
pub(super) fn heap_config() -> String {
    let config = replace_once(
        &shipped("profiler.toml"),
        "profiles = [\"cpu\", \"threads\"]",
        "profiles = [\"cpu\", \"threads\", \"heap\"]",
    );
    let (before, heap) = config.split_once("\n[heap]\n").expect("the shipped config has a [heap] table");
    let heap = heap.replacen("include = []", "include = [{ name = \"heap_sites\" }]", 1);
    assert!(heap.contains("heap_sites"), "no `include = []` in the shipped [heap] table");
    format!("{before}\n[heap]\n{heap}")
}

/// The drop-in the unit's comments give for heap profiling, as a file: the indented comment
/// lines after "add with `systemctl edit profiler`:".
pub(super) fn documented_drop_in() -> String {
    let unit = shipped("profiler.service");
    let lines: Vec<&str> = unit
        .lines()
        .skip_while(|l| !l.contains("add with `systemctl edit profiler`:"))
        .skip(1)
        .map_while(|l| l.strip_prefix("#     "))
        .collect();
    let text = lines.join("\n") + "\n";
    assert!(
        text.starts_with("[Service]\n")
            && text.contains("CapabilityBoundingSet=CAP_SYS_ADMIN")
            && text.contains("AmbientCapabilities=CAP_SYS_ADMIN"),
        "config/profiler.service no longer documents the heap drop-in as expected: {text:?}"
    );
    text
}

pub(super) fn heap_processes(container: &Container) -> Vec<u64> {
    let status = status(container);
    let pids =
        status["programs"]["heap_processes"].as_array().unwrap_or_else(|| panic!("no heap_processes: {status:#}"));
    pids.iter().filter_map(serde_json::Value::as_u64).collect()
}
