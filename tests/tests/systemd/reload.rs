//! `systemctl reload` (ExecReload= sends SIGHUP): a bad file is refused and the running
//! configuration kept, a good one applied, both without a restart.

use profiler_tests::daemon::wait_for;

use super::{
    machine_fit, replace_once, shipped, status, wait_active, with_unit, CONFIG, SHIPPED_INTERVAL_S, SOON, UNIT,
};

/// Ground truth: the config file's contents. `systemctl reload` with a file that is not TOML
/// goes through (ExecReload= only signals), the daemon reports it in the journal and keeps
/// the 60 s interval, and the unit stays active with the same main process. With a valid
/// file at 30 s the journal says so and `/status` shows the new interval, same process.
#[test]
fn systemd_reload_keeps_the_old_config_when_the_new_one_is_bad() {
    if !machine_fit() {
        return;
    }
    let shipped = shipped("profiler.toml");
    let mut container = with_unit(&shipped);
    container.boot();
    wait_active(&container);
    let main_pid = container.show(UNIT, "MainPID");

    container.write(CONFIG, "interval = [this is not toml\n");
    container.systemctl(&["reload", UNIT]);
    container.wait_for_journal(UNIT, "invalid configuration, keeping the old one", 1, SOON);
    container.wait_for_journal(UNIT, "Reloaded profiler.service", 1, SOON);
    wait_active(&container);
    assert_eq!(container.show(UNIT, "MainPID"), main_pid, "the bad reload replaced the daemon");
    assert_eq!(container.show(UNIT, "NRestarts"), "0");
    assert_eq!(status(&container)["output"]["interval_seconds"], SHIPPED_INTERVAL_S);

    let good = replace_once(&shipped, "interval = \"60s\"", "interval = \"30s\"");
    container.write(CONFIG, &good);
    container.systemctl(&["reload", UNIT]);
    container.wait_for_journal(UNIT, "configuration reloaded", 1, SOON);
    container.wait_for_journal(UNIT, "Reloaded profiler.service", 2, SOON);
    let applied = wait_for(SOON, || status(&container)["output"]["interval_seconds"] == 30);
    assert!(applied, "the reloaded interval is not in /status: {:#}", status(&container));
    wait_active(&container);
    assert_eq!(container.show(UNIT, "MainPID"), main_pid, "the good reload replaced the daemon");
}
