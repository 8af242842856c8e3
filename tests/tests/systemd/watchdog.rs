//! WatchdogSec= and Restart=on-failure: a daemon that stops answering is killed and
//! started again.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use profiler_tests::daemon::wait_for;

use super::{machine_fit, shipped, wait_active, with_unit, SOCKET, UNIT};

/// Ground truth: SIGSTOP freezes the whole daemon, so its watchdog pings stop. systemd must
/// kill it for the watchdog 15–30 s later (WatchdogSec=30s, pings every 15 s), then start it
/// again (Restart=on-failure) after RestartSec=5s. The new process answers on the socket as
/// soon as systemd shows it active.
#[test]
fn systemd_watchdog_restarts_a_stalled_daemon() {
    if !machine_fit() {
        return;
    }
    let mut container = with_unit(&shipped("profiler.toml"));
    container.boot();
    wait_active(&container);
    assert_eq!(container.show(UNIT, "WatchdogUSec"), "30s");
    assert_eq!(container.show(UNIT, "NRestarts"), "0");
    let stalled = container.show(UNIT, "MainPID");
    container.run_ok(&["kill", "-STOP", &stalled]);
    let since = Instant::now();

    let mut seen = BTreeSet::new();
    let timeout = Duration::from_secs(120);
    let restarted = wait_for(timeout, || {
        let unit = container.properties(UNIT, &["ActiveState", "SubState", "MainPID", "NRestarts"]);
        seen.insert(format!("{}/{}", unit["ActiveState"], unit["SubState"]));
        let new = unit["MainPID"] != stalled && unit["MainPID"] != "0";
        if unit["ActiveState"] == "active" && new && unit["NRestarts"] != "0" {
            // Type=notify: active means the new daemon's socket is already there.
            let answer = profiler_daemon::client::get(&container.path(SOCKET), "/status");
            assert!(
                matches!(answer, Ok((200, _))),
                "systemd shows the restarted daemon active but its socket does not answer: {answer:?}"
            );
            return true;
        }
        false
    });
    let took = since.elapsed();
    let journal = container.journal(UNIT);
    assert!(restarted, "not restarted within {timeout:?} of SIGSTOP (states seen: {seen:?}):\n{journal}");
    assert_eq!(container.show(UNIT, "NRestarts"), "1", "{journal}");
    for line in [
        "profiler.service: Watchdog timeout",
        "Failed with result 'watchdog'",
        "Scheduled restart job, restart counter is at 1",
    ] {
        assert!(journal.contains(line), "the journal lacks {line:?}:\n{journal}");
    }
    // The last ping can be up to 15 s old when the process stops.
    assert!(took >= Duration::from_secs(14), "restarted {took:?} after SIGSTOP: too soon for a 30 s watchdog");
}
