//! `[[export]]` end to end: the daemon pushes its interval profiles to the test backend
//! (`tests/backend/backend.py`), which decodes Pyroscope's push.v1 with the .proto we wrote
//! from Pyroscope's field numbers and OTLP with PyPI's opentelemetry-proto classes. Ground
//! truth: the files the daemon wrote (the spool), the fixtures' known splits, and
//! `go tool pprof` for the bodies. Failures and restarts are in `export_delivery`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use profiler_tests::backend::Backend;
use profiler_tests::daemon::{wait_for, Daemon, DaemonConfig};
use profiler_tests::{go_pprof, preflight, Fixture, FixtureKind, Profile};

use super::{assert_split, CPU_SPLIT, HEAP_SITES, SOON};

/// Long enough for heap_sites to allocate after its probes attach, and for a few dumps.
pub(super) const ARRIVAL: Duration = Duration::from_secs(60);

/// Every `*.pb.gz` under the output directory, by content: what a received body must be.
pub(super) fn spooled_files(output: &Path) -> HashMap<Vec<u8>, PathBuf> {
    let mut files = HashMap::new();
    for dir in std::fs::read_dir(output).into_iter().flatten().flatten() {
        if dir.file_name().to_string_lossy().starts_with('.') {
            continue;
        }
        for file in std::fs::read_dir(dir.path()).into_iter().flatten().flatten() {
            let path = file.path();
            if path.to_string_lossy().ends_with(".pb.gz") {
                files.insert(std::fs::read(&path).expect("read a spooled profile"), path);
            }
        }
    }
    files
}

/// `/status`'s `export.<name>.<field>`.
pub(super) fn export_count(daemon: &Daemon, export: &str, field: &str) -> u64 {
    daemon.status_u64(&format!("/export/{export}/{field}"))
}

pub(super) fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname").expect("the hostname").trim().to_owned()
}

/// The service name the daemon derives by default: the container, else the systemd
/// service, else the process name.
fn default_service(pid: u32, comm: &str) -> String {
    let cgroup = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
    let cgroup = cgroup.lines().find_map(|l| l.strip_prefix("0::")).unwrap_or_default();
    if let Some(id) = profiler_daemon::procs::container_of(cgroup) {
        return id[..12].to_owned();
    }
    match profiler_daemon::procs::unit_of(cgroup).and_then(|u| u.strip_suffix(".service")) {
        Some(service) => service.to_owned(),
        None => comm.to_owned(),
    }
}

/// Every profile type goes out twice, to Pyroscope and to OTLP, with auth and an extra header.
/// Pyroscope: each body is byte for byte a file the daemon wrote, `__name__` is Pyroscope's
/// name for the file's type, the labels name the service, host and process, `__delta__` is
/// "false", and `go tool pprof` reads the bodies (cpu_split's 75/25 split included). OTLP:
/// the resource names the process and host, each pprof sample type arrives as its own
/// profile whose values add up to the file's, and cpu_split's split holds in the stacks.
/// `/status` counts what was sent and nothing failed.
#[test]
fn every_profile_type_arrives_with_its_labels_and_values() {
    if !preflight() {
        return;
    }
    let backend = Backend::start(None);
    let mut config = DaemonConfig::new(&[CPU_SPLIT, HEAP_SITES, "lock_contention", "thread_spawner"]);
    config.profiles = vec!["cpu", "heap", "block", "mutex", "threadcreate"];
    config.heap_include = vec![HEAP_SITES];
    config.sample_bytes = Some("1B".into());
    config.exports = vec![
        format!(
            "protocol = \"pyroscope\"\nurl = {:?}\nheaders = {{ X-Scope-OrgID = \"tenant-7\" }}\n\
             basic_auth = {{ username = \"fleet\", password = \"pw\" }}",
            backend.url()
        ),
        format!("protocol = \"otlp\"\nurl = {:?}\nbearer_token = \"tok\"", backend.url()),
    ];
    let daemon = Daemon::start(&config);
    let cpu = Fixture::spawn(FixtureKind::CpuSplitC, super::FIXTURE_S);
    let _heap = Fixture::spawn_with_args(FixtureKind::HeapSites, &["8", "120"]);
    let _locks = Fixture::spawn_with_args(FixtureKind::LockContention, &["2", "120"]);
    let _threads = Fixture::spawn_with_args(FixtureKind::ThreadSpawner, &["2", "120"]);

    let names = ["process_cpu", "memory", "block", "mutex", "threadcreate"];
    // Each export delivers at its own pace: wait until each has every type, not for a count
    // (the first dump may come before the heap probes attach).
    let arrived = wait_for(ARRIVAL, || {
        let received = backend.received();
        let pyroscope_names: Vec<&str> = received.iter().filter_map(|r| r["labels"]["__name__"].as_str()).collect();
        let otlp = otlp_types(&received);
        names.iter().all(|n| pyroscope_names.contains(n)) && OTLP_TYPES.iter().all(|t| otlp.contains(*t))
    });
    assert!(
        arrived,
        "not every profile type arrived within {ARRIVAL:?}; backend got {} profiles",
        backend.received().len()
    );
    // The files sent so far are on disk now: the backend's copies are compared with them.
    let spooled = spooled_files(daemon.output());
    let received = backend.received();
    check_pyroscope(&backend, &received, &spooled, &cpu);
    check_otlp(&received, &spooled, &cpu);
    // `/status` is published every few hundred ms: its counts may trail what arrived.
    let counted = wait_for(SOON, || ["pyroscope", "otlp"].iter().all(|e| export_count(&daemon, e, "sent") >= 5));
    for export in ["pyroscope", "otlp"] {
        assert!(counted, "{export}: fewer than 5 sent within {SOON:?} of their arrival: {}", daemon.status()["export"]);
        assert_eq!(export_count(&daemon, export, "failed"), 0, "{export}: {}", daemon.status()["export"]);
        assert_eq!(export_count(&daemon, export, "dropped"), 0);
    }
}

/// The sample types every profile kind brings to OTLP.
const OTLP_TYPES: [&str; 7] = ["samples", "cpu", "alloc_space", "inuse_space", "contentions", "delay", "threadcreate"];

/// The sample types of the OTLP profiles received so far.
fn otlp_types(received: &[serde_json::Value]) -> std::collections::BTreeSet<String> {
    received
        .iter()
        .filter(|r| r["protocol"] == "otlp")
        .filter_map(|r| r["profiles"].as_array())
        .flatten()
        .filter_map(|p| p["type"].as_str().map(str::to_owned))
        .collect()
}

fn check_pyroscope(
    backend: &Backend,
    received: &[serde_json::Value],
    spooled: &HashMap<Vec<u8>, PathBuf>,
    cpu: &Fixture,
) {
    let host = hostname();
    let mut cpu_split_checked = false;
    for record in received.iter().filter(|r| r["protocol"] == "pyroscope") {
        let body = backend.profile_path(record);
        let bytes = std::fs::read(&body).expect("the received body");
        let file = spooled.get(&bytes).unwrap_or_else(|| panic!("{record} is no file the daemon wrote"));
        let labels = &record["labels"];
        let kind = profiler_tests::daemon::file_name(file).split('-').next().unwrap().to_owned();
        let dir = profiler_tests::daemon::file_name(file.parent().unwrap());
        let (comm, pid) = dir.rsplit_once('-').unwrap();
        assert_eq!(labels["__name__"], profiler_daemon::sink::export::pyroscope_name(&kind), "{record}");
        assert_eq!(labels["pid"], pid, "{record}");
        assert_eq!(labels["process_name"], comm, "{record}");
        assert_eq!(labels["hostname"], host.as_str(), "{record}");
        assert_eq!(labels["__delta__"], "false", "{record}");
        assert_eq!(labels["service_name"], default_service(pid.parse().unwrap(), comm).as_str(), "{record}");
        assert_eq!(record["headers"]["x-scope-orgid"], "tenant-7");
        assert_eq!(record["headers"]["authorization"], "Basic ZmxlZXQ6cHc=");
        assert_eq!(record["headers"]["connect-protocol-version"], "1");
        assert_eq!(record["id"].as_str().map(str::len), Some(36), "a UUID: {record}");
        if pid == cpu.pid().to_string() && kind == "cpu" && !cpu_split_checked {
            assert!(go_pprof::raw(&body).contains("hot_a"), "go tool pprof cannot read {}", body.display());
            let profile = Profile::decode(&body);
            if profile.value_where("samples", |s| s.contains("hot_a") || s.contains("hot_b")) >= 50 {
                assert_split(&profile, &body);
                cpu_split_checked = true;
            }
        }
    }
    assert!(cpu_split_checked, "no received cpu_split profile had 50 samples to check the split on");
}

fn check_otlp(received: &[serde_json::Value], spooled: &HashMap<Vec<u8>, PathBuf>, cpu: &Fixture) {
    let host = hostname();
    // The files by (pid, start time): an OTLP profile's time is its file's. The kinds of one
    // dump share a time, and block and mutex share their sample types: a record must match
    // one of its candidates in every type's total.
    let mut by_time: HashMap<(u32, u64), Vec<&PathBuf>> = HashMap::new();
    for path in spooled.values() {
        let raw = profiler_daemon::pprof::decode_file(path).expect("decode a spooled file");
        let dir = profiler_tests::daemon::file_name(path.parent().unwrap());
        let pid = dir.rsplit_once('-').unwrap().1.parse().unwrap();
        by_time.entry((pid, raw.time_nanos as u64)).or_default().push(path);
    }
    let (mut hot_a, mut hot_b, mut types_seen) = (0i64, 0i64, std::collections::BTreeSet::new());
    for record in received.iter().filter(|r| r["protocol"] == "otlp") {
        let resource = &record["resource"];
        let pid = resource["process.pid"].as_u64().expect("process.pid") as u32;
        assert_eq!(resource["host.name"], host.as_str(), "{resource}");
        assert!(resource["service.name"].as_str().is_some_and(|s| !s.is_empty()), "{resource}");
        assert!(resource["process.executable.name"].as_str().is_some_and(|s| !s.is_empty()), "{resource}");
        assert_eq!(record["headers"]["authorization"], "Bearer tok");
        let profiles = record["profiles"].as_array().expect("profiles");
        let totals: Vec<(&str, i64)> = profiles
            .iter()
            .map(|p| {
                let sum = p["samples"].as_array().unwrap().iter().map(|s| s["values"][0].as_i64().unwrap()).sum();
                (p["type"].as_str().unwrap(), sum)
            })
            .collect();
        let time = profiles[0]["time_unix_nano"].as_u64().unwrap();
        let candidates = by_time.get(&(pid, time)).cloned().unwrap_or_default();
        let matches = |file: &&PathBuf| {
            let truth = Profile::decode(file);
            let types: Vec<&str> = truth.sample_types.iter().map(|(ty, _)| ty.as_str()).collect();
            types == totals.iter().map(|(ty, _)| *ty).collect::<Vec<_>>()
                && totals.iter().all(|(ty, sum)| truth.total(ty) == *sum)
        };
        assert!(
            candidates.iter().any(matches),
            "no file of pid {pid} at {time} has the totals {totals:?}: {candidates:?}"
        );
        for profile in profiles {
            let sample_type = profile["type"].as_str().unwrap();
            types_seen.insert(sample_type.to_owned());
            assert_eq!(profile["scope"], "profiler");
            if pid == cpu.pid() && sample_type == "samples" {
                for sample in profile["samples"].as_array().unwrap() {
                    let stack: Vec<&str> =
                        sample["stack"].as_array().unwrap().iter().filter_map(|f| f.as_str()).collect();
                    let value = sample["values"][0].as_i64().unwrap();
                    match stack.first() {
                        Some(&"hot_a") => hot_a += value,
                        Some(&"hot_b") => hot_b += value,
                        _ => {}
                    }
                    if stack.first().is_some_and(|f| f.starts_with("hot_")) {
                        assert_eq!(stack.get(1), Some(&"work_loop"), "leaf first, callers after: {stack:?}");
                    }
                }
            }
        }
    }
    for wanted in OTLP_TYPES {
        assert!(types_seen.contains(wanted), "no OTLP profile of type {wanted}: {types_seen:?}");
    }
    let share = hot_a as f64 / (hot_a + hot_b).max(1) as f64;
    assert!(
        hot_a + hot_b >= 50 && (share - super::HOT_A_SHARE).abs() <= super::SHARE_TOLERANCE,
        "hot_a {hot_a}, hot_b {hot_b}"
    );
}
