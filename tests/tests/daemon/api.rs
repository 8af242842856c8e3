//! The control socket: every endpoint against the fixtures' known stacks and allocations
//! (read back by `go tool pprof` too), refusals of malformed requests, and what a non-root
//! client may see.

use std::path::PathBuf;

use profiler_tests::daemon::{self, wait_for, Daemon, DaemonConfig};
use profiler_tests::http::{curl, raw_exchange};
use profiler_tests::{expect, go_pprof, listing, preflight, process_dir};
use profiler_tests::{Fixture, FixtureKind, Profile};

use super::{allocate_once_probed, assert_split, index_pids, CPU_SPLIT, FIXTURE_S, FREQUENCY_HZ, HEAP_SITES, SOON};

/// Ground truth: the fixtures' own stacks, served on demand. The index lists both fixtures;
/// `profile?pid&seconds=2` is a CPU profile in which `go tool pprof -top` finds hot_a;
/// `heap` and `allocs` of the heap-opted-in heap_sites fixture are heap profiles whose
/// default sample types are inuse_space and alloc_space and which hold its site functions;
/// `debug=1` is text naming a site; `/status` is JSON; block, mutex and threadcreate (not
/// enabled in this configuration; see `waits`), and heap of a process not opted in, are 404.
#[test]
fn every_endpoint_answers_and_go_pprof_reads_it() {
    if !preflight() {
        return;
    }
    let mut config = DaemonConfig::new(&[CPU_SPLIT, HEAP_SITES]);
    config.profiles = vec!["cpu", "heap"];
    config.heap_include = vec![HEAP_SITES];
    config.sample_bytes = Some("1B".into());
    let daemon = Daemon::start(&config);
    let cpu = Fixture::spawn(FixtureKind::CpuSplitC, FIXTURE_S);
    // It allocates when told (SIGUSR1), once its probes are on: the daemon looks for new
    // heap targets every 5 s, and a loaded machine may take a scan or two longer.
    let mut heap = Fixture::spawn_with_args(FixtureKind::HeapSites, &["usr1", "120"]);
    allocate_once_probed(&daemon, &heap);
    heap.expect_line("allocated");
    let listed = wait_for(SOON, || {
        let pids = index_pids(&daemon.get_ok("/debug/pprof/"));
        pids.contains(&cpu.pid()) && pids.contains(&heap.pid())
    });
    let index = String::from_utf8_lossy(&daemon.get_ok("/debug/pprof/")).into_owned();
    assert!(listed, "the index lacks pid {} or {}:\n{index}", cpu.pid(), heap.pid());
    assert!(index.contains("heap?pid="), "the index lists no heap profile:\n{index}");

    check_cpu_endpoint(&daemon, cpu.pid());
    check_flamegraph_endpoint(&daemon, cpu.pid());
    check_heap_endpoints(&daemon, heap.pid());
    let status = daemon.status();
    for key in ["/version", "/uptime_seconds", "/samples/cpu", "/output/files_written", "/drops"] {
        assert!(status.pointer(key).is_some(), "/status lacks {key}: {status:#}");
    }
    for endpoint in ["block", "mutex", "threadcreate"] {
        let (code, body) = daemon.get(&format!("/debug/pprof/{endpoint}?pid={}", cpu.pid()));
        assert_eq!(code, 404, "{endpoint}: {}", String::from_utf8_lossy(&body));
    }
    let (code, _) = daemon.get(&format!("/debug/pprof/heap?pid={}", cpu.pid()));
    assert_eq!(code, 404, "heap of a process that did not opt in");
    check_heap_dumps(&daemon, heap.pid());

    // Last, so that a format slip does not hide the checks above: what every CPU and heap
    // profile promises, for the on-demand ones.
    let cpu_file = daemon.scratch().join("profile.pb.gz");
    expect::cpu_profile_format(&Profile::decode(&cpu_file), FREQUENCY_HZ);
    let heap_file = daemon.scratch().join("heap.pb.gz");
    expect::heap_profile_format(&Profile::decode(&heap_file), 1);
}

/// The interval dumps of a heap-opted-in process include `heap-<stamp>.pb.gz` files with
/// the live site in them.
fn check_heap_dumps(daemon: &Daemon, pid: u32) {
    let dir = process_dir(daemon.output(), HEAP_SITES, pid);
    let dumped = wait_for(SOON, || {
        daemon::profile_files(&dir, "heap").last().is_some_and(|f| {
            let profile = Profile::decode(f);
            profile.value_where("inuse_space", |s| s.leaf_is("site_malloc_live")) > 0
        })
    });
    assert!(dumped, "no heap dump with site_malloc_live in use within {SOON:?}:\n{}", listing(&dir));
    let last = daemon::profile_files(&dir, "heap").pop().expect("a heap dump");
    let profile = Profile::decode(&last);
    assert_eq!(profile.default_sample_type, "inuse_space", "{}", last.display());
    go_pprof::raw(&last);
}

/// Ground truth: the request grammar. Each malformed request gets its 4xx with a one-line
/// reason (or, for a 100 KB request line or header, a 4xx or a closed connection), and the
/// daemon answers /status afterwards.
#[test]
fn malformed_requests_get_4xx_and_the_daemon_keeps_serving() {
    if !preflight() {
        return;
    }
    let fixture = Fixture::spawn(FixtureKind::CpuSplitC, FIXTURE_S);
    let daemon = Daemon::start(&DaemonConfig::new(&[CPU_SPLIT]));
    let pid = fixture.pid();
    let cases: [(String, u16); 10] = [
        ("/nope".into(), 404),
        ("/debug/pprof/nope".into(), 404),
        ("/debug/pprof/profile".into(), 400),
        ("/debug/pprof/profile?pid=abc".into(), 400),
        (format!("/debug/pprof/profile?pid={pid}&seconds=x"), 400),
        (format!("/debug/pprof/profile?pid={pid}&seconds=100000"), 400),
        (format!("/debug/pprof/profile?pid={pid}&second=5"), 400),
        (format!("/debug/pprof/profile?pid={pid}&pid={pid}"), 400),
        ("/status?verbose=1".into(), 400),
        ("/debug/pprof/profile?pid=4194304&seconds=1".into(), 404),
    ];
    for (path, expected) in &cases {
        let (code, body) = daemon.get(path);
        let body = String::from_utf8_lossy(&body);
        assert_eq!(code, *expected, "GET {path}: {body}");
        assert!(
            !body.trim_end().is_empty() && !body.trim_end().contains('\n'),
            "GET {path}: the reason should be one line: {body:?}"
        );
    }
    let post = b"POST /status HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
    assert_eq!(raw_exchange(daemon.socket(), post), Some(405), "POST /status");
    let long_line = format!("GET /{} HTTP/1.1\r\nHost: x\r\n\r\n", "a".repeat(100_000));
    let long_header = format!("GET /status HTTP/1.1\r\nHost: x\r\nX-Big: {}\r\n\r\n", "b".repeat(100_000));
    for (what, request) in [("request line", long_line), ("header", long_header)] {
        let code = raw_exchange(daemon.socket(), request.as_bytes());
        assert!(code.is_none_or(|c| (400..500).contains(&c)), "a 100 KB {what} got {code:?}");
    }
    let garbage = b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03 not http at all\r\n\r\n";
    let code = raw_exchange(daemon.socket(), garbage);
    assert!(code.is_none_or(|c| (400..500).contains(&c)), "garbage got {code:?}");
    daemon.get_ok("/status");
}

/// Ground truth: uids. With `[socket] group = "nogroup"`, a client running as nobody (in
/// that group) sees in the index the cpu_split it runs itself and not the one root runs,
/// gets for root's process the same 404 answer as for a pid that does not exist (the socket
/// is no oracle of which pids run), and 200 for its own.
#[test]
fn a_non_root_client_cannot_see_roots_processes() {
    if !preflight() {
        return;
    }
    let mut config = DaemonConfig::new(&[CPU_SPLIT]);
    config.socket_group = Some("nogroup");
    let daemon = Daemon::start(&config);
    let roots = Fixture::spawn(FixtureKind::CpuSplitC, FIXTURE_S);
    let nobodys = Fixture::spawn_as_nobody(FixtureKind::CpuSplitC, FIXTURE_S, daemon.scratch());
    let both = wait_for(SOON, || {
        let pids = index_pids(&daemon.get_ok("/debug/pprof/"));
        pids.contains(&roots.pid()) && pids.contains(&nobodys.pid())
    });
    assert!(both, "root's index lacks a fixture: {}", String::from_utf8_lossy(&daemon.get_ok("/debug/pprof/")));

    let index = curl(daemon.socket(), "/debug/pprof/", true);
    let text = String::from_utf8_lossy(&index.body);
    assert_eq!(index.status, 200, "index as nobody: {text}");
    let pids = index_pids(&index.body);
    assert!(pids.contains(&nobodys.pid()), "nobody's index lacks its own pid {}:\n{text}", nobodys.pid());
    assert!(!pids.contains(&roots.pid()), "nobody's index shows root's pid {}:\n{text}", roots.pid());
    let path = |pid: u32| format!("/debug/pprof/profile?pid={pid}&seconds=1");
    let denied = curl(daemon.socket(), &path(roots.pid()), true);
    let denied_text = String::from_utf8_lossy(&denied.body).replace(&roots.pid().to_string(), "PID");
    assert_eq!(denied.status, 404, "root's profile as nobody: {denied_text}");
    let absent = curl(daemon.socket(), &path(4_194_000), true);
    let absent_text = String::from_utf8_lossy(&absent.body).replace("4194000", "PID");
    assert_eq!((absent.status, absent_text), (404, denied_text), "not yours and no such process answer alike");
    let own = curl(daemon.socket(), &path(nobodys.pid()), true);
    assert_eq!(own.status, 200, "own profile as nobody: {}", String::from_utf8_lossy(&own.body));
}

/// Ground truth: what the kernel itself lets nobody see. nobody starts a setuid-root copy
/// of cpu_split (real uid nobody, effective and saved uid root, not dumpable, as `su` is):
/// nobody's index does not list it and its profile gets the answer of a pid that does not
/// exist, while root sees it. nobody's own syscall_heavy profile names its kernel frames but
/// holds no kernel address (root's does: the test can fail). nobody's `/status` holds
/// counters only: no path, pid list or error text.
#[test]
fn a_non_root_client_sees_only_what_the_kernel_lets_it_see() {
    if !preflight() {
        return;
    }
    let mut config = DaemonConfig::new(&[CPU_SPLIT, "syscall_heavy"]);
    config.socket_group = Some("nogroup");
    let daemon = Daemon::start(&config);
    let setuid = Fixture::spawn_setuid_root_as_nobody(FixtureKind::CpuSplitC, FIXTURE_S, daemon.scratch());
    let creds = std::fs::read_to_string(format!("/proc/{}/status", setuid.pid())).unwrap();
    let uid_line = creds.lines().find(|l| l.starts_with("Uid:")).unwrap().to_string();
    assert!(uid_line.split_whitespace().skip(1).eq(["65534", "0", "0", "0"]), "not setuid root: {uid_line}");
    let kernels = Fixture::spawn_as_nobody(FixtureKind::SyscallHeavy, FIXTURE_S, daemon.scratch());
    let both = wait_for(SOON, || {
        let pids = index_pids(&daemon.get_ok("/debug/pprof/"));
        pids.contains(&setuid.pid()) && pids.contains(&kernels.pid())
    });
    assert!(both, "root's index lacks a fixture: {}", String::from_utf8_lossy(&daemon.get_ok("/debug/pprof/")));

    let index = curl(daemon.socket(), "/debug/pprof/", true);
    let pids = index_pids(&index.body);
    assert!(pids.contains(&kernels.pid()), "nobody's index lacks its own process");
    assert!(!pids.contains(&setuid.pid()), "nobody's index shows its setuid-root process");
    let path = |pid: u32| format!("/debug/pprof/profile?pid={pid}&seconds=1");
    let denied = curl(daemon.socket(), &path(setuid.pid()), true);
    let denied_text = String::from_utf8_lossy(&denied.body).replace(&setuid.pid().to_string(), "PID");
    let absent = curl(daemon.socket(), &path(4_194_000), true);
    let absent_text = String::from_utf8_lossy(&absent.body).replace("4194000", "PID");
    assert_eq!((denied.status, denied_text), (absent.status, absent_text), "setuid process as nobody");
    assert_eq!(absent.status, 404);

    const KERNEL_SPACE: u64 = 0xffff_8000_0000_0000;
    let kernel_frames = |body: &[u8], name: &str| {
        let profile = Profile::decode(&save(&daemon, name, body));
        profile.samples.iter().flat_map(|s| s.kernel_frames().cloned().collect::<Vec<_>>()).collect::<Vec<_>>()
    };
    let long = |pid: u32| format!("/debug/pprof/profile?pid={pid}&seconds=2");
    let own = curl(daemon.socket(), &long(kernels.pid()), true);
    assert_eq!(own.status, 200, "own profile as nobody: {}", String::from_utf8_lossy(&own.body));
    let frames = kernel_frames(&own.body, "nobody.pb.gz");
    assert!(frames.iter().any(|f| !f.function.is_empty()), "nobody's profile has no named kernel frame");
    let exposed: Vec<_> = frames.iter().filter(|f| f.address >= KERNEL_SPACE).collect();
    assert!(exposed.is_empty(), "kernel addresses shown to nobody: {:x?}", &exposed[..exposed.len().min(3)]);
    let roots = kernel_frames(&daemon.get_ok(&long(kernels.pid())), "root.pb.gz");
    assert!(roots.iter().all(|f| f.address >= KERNEL_SPACE) && !roots.is_empty(), "root's kernel frames");

    let status = curl(daemon.socket(), "/status", true);
    assert_eq!(status.status, 200);
    let doc: serde_json::Value = serde_json::from_slice(&status.body).expect("/status is JSON");
    let mut leaks = Vec::new();
    find_text(&doc, "", &mut leaks);
    assert!(leaks.is_empty(), "nobody's /status holds more than counters: {leaks:?}");
    assert!(doc["samples"]["cpu"].as_u64().is_some_and(|n| n > 0), "nobody's /status lacks counters: {doc:#}");
}

/// Every string (but the version) and list in `doc`, by JSON pointer.
fn find_text(doc: &serde_json::Value, at: &str, found: &mut Vec<String>) {
    match doc {
        serde_json::Value::String(_) if at != "/version" => found.push(format!("{at} = {doc}")),
        serde_json::Value::Array(_) => found.push(format!("{at} = {doc}")),
        serde_json::Value::Object(fields) => {
            for (key, value) in fields {
                find_text(value, &format!("{at}/{key}"), found);
            }
        }
        _ => {}
    }
}

/// Saves a response body next to the daemon's config, for the decoders.
fn save(daemon: &Daemon, name: &str, body: &[u8]) -> PathBuf {
    let path = daemon.scratch().join(name);
    std::fs::write(&path, body).unwrap_or_else(|e| panic!("failed to write {}: {e}", path.display()));
    path
}

/// `profile?pid&seconds=2`: a 199 Hz CPU profile in which Go's pprof finds hot_a.
fn check_cpu_endpoint(daemon: &Daemon, pid: u32) {
    let body = daemon.get_ok(&format!("/debug/pprof/profile?pid={pid}&seconds=2"));
    let file = save(daemon, "profile.pb.gz", &body);
    let profile = Profile::decode(&file);
    assert_split(&profile, &file);
    let top = go_pprof::top(&file);
    assert!(go_pprof::flat_percent(&top, "hot_a").is_some(), "go tool pprof -top lacks hot_a:\n{top}");
}

/// `flamegraph?pid&seconds=2`: an SVG with cpu_split's frames, by curl (to see the
/// content type); a type that is no profile gets a 400 naming the types.
fn check_flamegraph_endpoint(daemon: &Daemon, pid: u32) {
    let reply = curl(daemon.socket(), &format!("/debug/pprof/flamegraph?pid={pid}&seconds=2"), false);
    let svg = String::from_utf8_lossy(&reply.body);
    assert_eq!((reply.status, reply.content_type.as_str()), (200, "image/svg+xml"), "{svg}");
    for function in ["hot_a", "hot_b", "work_loop"] {
        assert!(svg.contains(&format!("<title>{function} (")), "the flame graph lacks {function}");
    }
    let (status, body) = daemon.get(&format!("/debug/pprof/flamegraph?pid={pid}&type=goroutines"));
    let body = String::from_utf8_lossy(&body);
    assert!(status == 400 && body.contains("type must be one of profile"), "{status} {body}");
}

/// heap, allocs and heap?debug=1 of the heap_sites fixture.
fn check_heap_endpoints(daemon: &Daemon, pid: u32) {
    for (endpoint, default_type) in [("heap", "inuse_space"), ("allocs", "alloc_space")] {
        let body = daemon.get_ok(&format!("/debug/pprof/{endpoint}?pid={pid}"));
        let file = save(daemon, &format!("{endpoint}.pb.gz"), &body);
        let profile = Profile::decode(&file);
        let types: Vec<&str> = profile.sample_types.iter().map(|(t, _)| t.as_str()).collect();
        let wanted: Vec<&str> = expect::HEAP_SAMPLE_TYPES.iter().map(|(t, _)| *t).collect();
        assert_eq!(types, wanted, "{endpoint} sample types");
        assert_eq!(profile.default_sample_type, default_type, "{endpoint} default sample type");
        // 1000 x malloc(1000), kept; every allocation is sampled at 1 B, so within 1%.
        let live = profile.value_where("inuse_space", |s| s.leaf_is("site_malloc_live"));
        assert!(
            (990_000..=1_010_000).contains(&live),
            "{endpoint}: inuse_space of site_malloc_live is {live}, expected 1000000 ± 1%"
        );
        let top = go_pprof::top(&file);
        assert!(top.contains("site_"), "go tool pprof -top of {endpoint} names no site:\n{top}");
    }
    let text = curl(daemon.socket(), &format!("/debug/pprof/heap?pid={pid}&debug=1"), false);
    let body = String::from_utf8_lossy(&text.body);
    assert_eq!(text.status, 200, "heap?debug=1: {body}");
    assert!(text.content_type.starts_with("text/plain"), "heap?debug=1 content type {:?}", text.content_type);
    assert!(body.contains("site_malloc_live"), "heap?debug=1 names no site:\n{body}");
}
