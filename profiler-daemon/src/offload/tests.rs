use super::{worker::thread_cpu, *};
use crate::ids::Pid;

const DEVICE: Device = Device { major: 0, minor: 99 };

#[test]
fn jobs_run_on_the_worker_and_keep_their_state() {
    let mut offload = Offload::new("offload-test", None);
    let tid = offload.call("a tid", None, |_| unsafe { libc::gettid() }).unwrap();
    // SAFETY: gettid has no preconditions.
    assert_ne!(tid, unsafe { libc::gettid() }, "not the caller's thread");
    offload.call("count", None, |s| *s.get::<u32>() += 1).unwrap();
    assert_eq!(offload.call("count", None, |s| *s.get::<u32>()).unwrap(), 1);
    assert_eq!(offload.stats().jobs, 3);
}

#[test]
fn a_panicking_job_fails_and_the_next_one_gets_a_new_worker() {
    let mut offload = Offload::new("offload-test", None);
    let err = offload.call("boom", None, |_| -> u32 { panic!("job panics") }).unwrap_err();
    assert_eq!(err, Stall::WorkerFailed { what: "boom".into() });
    assert_eq!(offload.call("after", None, |_| 7).unwrap(), 7);
}

/// A job that sleeps without CPU is given up after `STALL_AFTER`, its device is then
/// skipped by every sibling, and freed once the thread comes back.
#[test]
fn a_sleeping_job_is_given_up_and_its_device_skipped_until_it_returns() {
    let heartbeat = Heartbeat::new();
    let mut offload = Offload::new("offload-test", Some(heartbeat.clone()));
    let mut sibling = offload.sibling("offload-test2");
    let (release, released) = mpsc::channel::<()>();
    let started = Instant::now();
    let err = offload
        .call("a hung read", Some(DEVICE), move |_| {
            let _ = released.recv();
        })
        .unwrap_err();
    assert!(matches!(err, Stall::Stalled { .. }), "{err}");
    assert!(started.elapsed() >= STALL_AFTER && started.elapsed() < STALL_AFTER * 2);
    assert!(heartbeat.age() < Duration::from_secs(1), "beaten while waiting");
    let refused = sibling.call("another read", Some(DEVICE), |_| ()).unwrap_err();
    assert!(matches!(refused, Stall::DeviceStalled { .. }), "{refused}");
    assert_eq!(sibling.call("elsewhere", None, |_| 5).unwrap(), 5, "other devices still work");
    let stats = offload.stats();
    assert_eq!((stats.stalls, stats.refused, stats.stuck_threads), (1, 1, 1));
    assert_eq!(stats.stalled_devices, vec![DEVICE]);
    // The stuck thread returns (the server answered): its device is usable again.
    release.send(()).unwrap();
    let freed = (0..50).any(|_| {
        std::thread::sleep(Duration::from_millis(20));
        offload.stats().stuck_threads == 0
    });
    assert!(freed);
    assert_eq!(offload.call("read again", Some(DEVICE), |_| 1).unwrap(), 1);
    assert_eq!(offload.stats().recovered, 1);
}

/// A job stuck while walking a path (it said so) leaves its device usable; a perf map's
/// stall is counted in its own lane; an owner with two threads stuck gets no third
/// while others still get theirs.
#[test]
fn stalls_are_charged_where_they_are_and_to_whom() {
    let own = Pid(std::process::id());
    let offload = Offload::new("offload-test", None);
    let (release, released) = mpsc::channel::<()>();
    let released = Arc::new(Mutex::new(released));
    // Both stalls at once, on two siblings: one STALL_AFTER in all.
    let stalls: Vec<_> = [Charge::file(DEVICE, own), Charge::perf_map(own)]
        .into_iter()
        .map(|charge| {
            let mut sibling = offload.sibling("offload-test");
            let released = Arc::clone(&released);
            std::thread::spawn(move || {
                sibling.call("a hung walk", charge, move |state| {
                    state.charger().charge_to(None);
                    let _ = released.lock().unwrap().recv();
                })
            })
        })
        .collect();
    for stall in stalls {
        let err = stall.join().unwrap().unwrap_err();
        assert!(matches!(err, Stall::Stalled { device: DeviceName(None), .. }), "{err}");
    }
    let mut other = offload.sibling("offload-test");
    let stats = other.stats();
    assert_eq!((stats.stuck_threads, stats.stuck_perf_map_threads), (2, 1));
    assert!(stats.stalled_devices.is_empty(), "a path walk names no device");
    let refused = other.call("a third read", Charge::file(DEVICE, own), |_| ()).unwrap_err();
    assert!(matches!(refused, Stall::OwnerStuck { .. }), "{refused}");
    assert_eq!(other.call("the daemon's own work", None, |_| 3).unwrap(), 3, "others still run");
    release.send(()).unwrap();
    release.send(()).unwrap();
    let freed = (0..50).any(|_| {
        std::thread::sleep(Duration::from_millis(20));
        other.stats().stuck_threads == 0
    });
    assert!(freed);
    assert_eq!(other.call("after", Charge::file(DEVICE, own), |_| 4).unwrap(), 4);
}

#[test]
fn a_busy_job_is_not_a_stall() {
    let mut offload = Offload::new("offload-test", None);
    let spin = Duration::from_secs(6);
    let done = offload.call("a long parse", None, move |_| {
        let start = Instant::now();
        let mut x = 0u64;
        while start.elapsed() < spin {
            x = std::hint::black_box(x.wrapping_add(1));
        }
        x > 0
    });
    assert_eq!(done, Ok(true));
}

#[test]
fn reads_a_threads_cpu_and_state() {
    // SAFETY: gettid has no preconditions.
    let (ticks, state) = thread_cpu(unsafe { libc::gettid() }).unwrap();
    assert_eq!(state, 'R', "this thread is running");
    assert!(ticks < u64::MAX);
    assert_eq!(thread_cpu(0), None);
}
