//! `/debug/pprof/goroutine` (and its alias `threads`): the daemon's thread dump of a fixture
//! whose threads block in known functions, in all three forms, listed in the index, read by
//! `go tool pprof -traces`, and written with the interval dumps when configured. The busy
//! thread, on a CPU when it is dumped, shows its latest CPU sample's stack.

use std::path::Path;

use profiler_tests::daemon::{self, wait_for, Daemon, DaemonConfig};
use profiler_tests::{go_pprof, listing, preflight, process_dir, Fixture, FixtureKind, Profile};

use super::{FIXTURE_S, SOON};

const COMM: &str = "tdump_c";

fn decode(bytes: &[u8]) -> Profile {
    let raw = profiler_daemon::pprof::decode(bytes, "the goroutine answer").expect("a profile");
    Profile::from_proto(&raw)
}

#[test]
fn goroutine_dumps_every_thread_in_gos_three_forms() {
    if !preflight() || !Path::new("/sys/kernel/btf/vmlinux").exists() {
        eprintln!("skipping: thread dumps need the kernel's BTF (/sys/kernel/btf/vmlinux)");
        return;
    }
    let mut config = DaemonConfig::new(&[COMM]);
    config.profiles = vec!["cpu", "threads"];
    config.thread_interval_dumps = true;
    let daemon = Daemon::start(&config);
    let fixture = Fixture::spawn(FixtureKind::ThreadDumpC, FIXTURE_S);
    let pid = fixture.pid();

    // The busy thread's samples reach the daemon within a drain or two.
    let (mut profile, mut busy_source) = (None, String::new());
    let sampled = wait_for(SOON, || {
        let p = decode(&daemon.get_ok(&format!("/debug/pprof/goroutine?pid={pid}")));
        let busy = p.samples.iter().find(|s| s.label_str("thread") == Some("busy")).expect("the busy thread");
        busy_source = busy.label_str("stack").unwrap_or_default().to_string();
        let done = busy.has_chain(&["spin", "busy_thread", "start_thread"]);
        profile = Some(p);
        done
    });
    let profile = profile.expect("at least one answer");
    assert!(sampled, "the busy thread never had its stack ({busy_source})");
    assert!(busy_source == "walked" || busy_source.starts_with("cpu sample"), "{busy_source}");
    assert_eq!(profile.samples.len(), 9, "one sample per thread");
    let cond = profile.samples.iter().find(|s| s.label_str("thread") == Some("cond_wait")).expect("cond_wait");
    assert!(cond.has_chain(&["wait_on_cond", "cond_thread", "start_thread"]), "{:?}", cond.names());
    assert_eq!((cond.label_str("state"), cond.label_str("syscall")), (Some("S"), Some("futex")));

    let grouped =
        String::from_utf8_lossy(&daemon.get_ok(&format!("/debug/pprof/threads?pid={pid}&debug=1"))).into_owned();
    assert!(grouped.starts_with("threads profile: total 9\n"), "{grouped}");
    assert!(grouped.contains("wait_on_cond+0x"), "{grouped}");
    let each =
        String::from_utf8_lossy(&daemon.get_ok(&format!("/debug/pprof/goroutine?pid={pid}&debug=2"))).into_owned();
    assert_eq!(each.matches("\nthread ").count() + usize::from(each.starts_with("thread ")), 9, "{each}");
    assert!(each.contains("\"epoll_wait\" [epoll_wait, S, wchan "), "{each}");

    // The index lists processes with data (the busy thread's CPU samples, after a drain).
    let listed = wait_for(SOON, || daemon.get(&format!("/debug/pprof/?pid={pid}")).0 == 200);
    assert!(listed, "pid {pid} not in the index within {SOON:?}");
    let page = String::from_utf8_lossy(&daemon.get_ok(&format!("/debug/pprof/?pid={pid}"))).into_owned();
    assert!(
        page.contains(&format!("<tr><td>9</td><td><a href='goroutine?pid={pid}&amp;debug=1'>goroutine</a>")),
        "{page}"
    );

    let file = daemon.scratch().join("goroutine.pb.gz");
    std::fs::write(&file, daemon.get_ok(&format!("/debug/pprof/goroutine?pid={pid}"))).unwrap();
    let traces = go_pprof::traces(&file);
    assert!(traces.contains("thread:  pipe_read\n") && traces.contains("read_pipe\n"), "{traces}");

    let dir = process_dir(daemon.output(), COMM, pid);
    let dumped = wait_for(SOON, || !daemon::profile_files(&dir, "threads").is_empty());
    assert!(dumped, "no threads-<stamp>.pb.gz with interval_dumps = true:\n{}", listing(&dir));
    let last = daemon::profile_files(&dir, "threads").pop().expect("a dump");
    assert_eq!(Profile::decode(&last).samples.len(), 9);
}
