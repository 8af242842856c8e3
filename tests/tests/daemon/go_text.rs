//! `?debug=1` against Go: Go's own `runtime/pprof` writes the heap, block, mutex and
//! threadcreate texts (tests/fixtures/go_text.go), a line grammar is checked on them, and our
//! answers for fixtures with known allocations, lock waits and threads must follow the same
//! grammar line by line; `go tool pprof` reads each of our texts back to the samples of the
//! protobuf profile we serve for the same data.

use std::time::Duration;

use profiler_tests::daemon::{wait_for, Daemon, DaemonConfig};
use profiler_tests::go_text::{self, Layout};
use profiler_tests::{go_pprof, preflight, Fixture, FixtureKind, TempDir};

use super::{allocate_once_probed, HEAP_SITES, SOON};

const LOCK_CONTENTION: &str = "lock_contention";
const THREAD_SPAWNER: &str = "thread_spawner";

/// Ground truth: Go's texts (their grammar holds on them first, so it is Go's grammar), and
/// for ours, the protobuf profile served for the same frozen data (the fixtures are done and
/// stopped): `go tool pprof -raw` of our text and of our proto list the same samples, with
/// the same values and stacks. The heap is sampled every 64 KiB, so its text holds sampled
/// counts that pprof must scale to our proto's estimates; delays are nanoseconds.
#[test]
fn debug1_texts_follow_gos_grammar_and_read_back_as_the_served_profiles() {
    if !preflight() {
        return;
    }
    let scratch = TempDir::new("go-text");
    let reference = go_text::reference(&scratch.path().join("go"));
    let layouts = [
        ("heap", Layout::Heap),
        ("block", Layout::Contention { mutex: false }),
        ("mutex", Layout::Contention { mutex: true }),
        ("threadcreate", Layout::Count),
    ];
    for (name, layout) in layouts {
        let parsed = go_text::check(layout, &reference[name])
            .unwrap_or_else(|e| panic!("Go's own {name} text breaks the grammar: {e}\n{}", reference[name]));
        assert!(!parsed.records.is_empty(), "Go's {name} text has no records:\n{}", reference[name]);
    }

    let mut config = DaemonConfig::new(&[HEAP_SITES, LOCK_CONTENTION, THREAD_SPAWNER]);
    config.profiles = vec!["heap", "block", "mutex", "threadcreate"];
    config.heap_include = vec![HEAP_SITES];
    config.sample_bytes = Some("64KiB".into());
    let daemon = Daemon::start(&config);
    // heap_sites allocates when told, once its probes are on (the daemon looks every 5 s).
    let mut heap = Fixture::spawn_with_args(FixtureKind::HeapSites, &["usr1", "120"]);
    let mut locks = Fixture::spawn_with_args(FixtureKind::LockContention, &["2", "120"]);
    let mut threads = Fixture::spawn_with_args(FixtureKind::ThreadSpawner, &["2", "120"]);
    allocate_once_probed(&daemon, &heap);
    heap.expect_line("allocated");
    locks.read_value("lock_wait_ns");
    locks.read_value("cond_wait_ns");
    locks.expect_line("done");
    threads.expect_line("done");
    // Frozen: stopped, then two drains so every count is in.
    for fixture in [&heap, &locks, &threads] {
        // SAFETY: kill has no memory preconditions; the pid is our child's.
        unsafe { libc::kill(fixture.pid() as i32, libc::SIGSTOP) };
    }
    std::thread::sleep(Duration::from_millis(2500));

    for ((name, layout), pid) in layouts.into_iter().zip([heap.pid(), locks.pid(), locks.pid(), threads.pid()]) {
        let query = format!("/debug/pprof/{name}?pid={pid}");
        let ready = wait_for(SOON, || daemon.get(&query).0 == 200);
        assert!(ready, "{query} never answered 200: {:?}", String::from_utf8_lossy(&daemon.get(&query).1));
        let text = String::from_utf8(daemon.get_ok(&format!("{query}&debug=1"))).expect("UTF-8 text");
        let parsed = go_text::check(layout, &text)
            .unwrap_or_else(|e| panic!("our {name} text breaks Go's grammar: {e}\n{text}"));
        assert!(!parsed.records.is_empty(), "our {name} text has no records:\n{text}");
        assert!(parsed.symbolized_frames > 0, "our {name} text names no function:\n{text}");
        let text_file = scratch.path().join(format!("{name}.txt"));
        std::fs::write(&text_file, &text).unwrap();
        let proto_file = scratch.path().join(format!("{name}.pb.gz"));
        std::fs::write(&proto_file, daemon.get_ok(&query)).unwrap();
        let from_text = go_text::raw_samples(&go_pprof::raw(&text_file));
        let from_proto = go_text::raw_samples(&go_pprof::raw(&proto_file));
        assert!(!from_proto.is_empty(), "no samples in `go tool pprof -raw` of our {name} proto");
        assert_eq!(from_text, from_proto, "{name}: what go tool pprof reads from our text and from our proto\n{text}");
    }
    for fixture in [&heap, &locks, &threads] {
        // SAFETY: as above.
        unsafe { libc::kill(fixture.pid() as i32, libc::SIGCONT) };
    }
}
