//! Kernel stacks against `syscall_heavy`, which spends almost all of its time inside read(2)
//! of /dev/zero called from kernel_work ← main. Checks that most samples carry symbolized
//! kernel frames (in the `[kernel.kallsyms]` mapping, named, not hex), that kernel frames
//! come before user frames, and that the user stack under them is still kernel_work → main.

use profiler_tests::pprof::{Sample, KERNEL_MAPPING};
use profiler_tests::{assert_success, expect, preflight, run_profiler};
use profiler_tests::{Fixture, FixtureKind, Profile, TempDir};

const FREQUENCY_HZ: i64 = 199;
/// The fixture is >95% system time (see `time syscall_heavy 3`); 50% leaves room for the
/// profiler's own interference without accepting a profiler that drops kernel stacks.
const MIN_KERNEL_SHARE: f64 = 0.5;
/// The read is issued inline from kernel_work, so its user stack unwinds by frame pointer.
const MIN_USER_CHAIN_SHARE: f64 = 0.9;

/// Kernel frames present, named, ordered before user frames, over an intact user stack.
#[test]
fn syscall_heavy_has_symbolized_kernel_frames() {
    if !preflight() {
        return;
    }
    let out = TempDir::new("kernel");
    let fixture = Fixture::spawn(FixtureKind::SyscallHeavy, 10);
    let pid = fixture.pid().to_string();
    let frequency = FREQUENCY_HZ.to_string();
    let output = run_profiler(&[
        "snapshot",
        "--pid",
        &pid,
        "--duration",
        "5s",
        "--frequency",
        &frequency,
        "--output",
        &out.path_arg(),
    ]);
    assert_success(&output, "snapshot --pid syscall_heavy");
    let path = expect::profile_written(out.path(), fixture.comm(), fixture.pid());
    let profile = Profile::decode(&path);
    expect::cpu_profile_format(&profile, FREQUENCY_HZ);
    expect::single_thread_labels(&profile, fixture.pid(), fixture.comm());

    let in_kernel = |s: &Sample| s.kernel_frames().next().is_some();
    let share = profile.fraction_where("samples", in_kernel);
    assert!(
        share >= MIN_KERNEL_SHARE,
        "only {:.1}% of samples have a location in the {KERNEL_MAPPING} mapping; functions: {:?}",
        share * 100.0,
        profile.function_names()
    );
    check_kernel_names(&profile);
    check_kernel_before_user(&profile);
    check_user_chain(&profile, in_kernel);
}

fn looks_like_address(name: &str) -> bool {
    let digits = name.strip_prefix("0x").unwrap_or(name);
    !digits.is_empty() && digits.chars().all(|c| c.is_ascii_hexdigit())
}

/// Every kernel frame has a real name, and the read path is among them.
fn check_kernel_names(profile: &Profile) {
    let mut names: Vec<&str> =
        profile.samples.iter().flat_map(|s| s.kernel_frames().map(|f| f.function.as_str())).collect();
    names.sort_unstable();
    names.dedup();
    let bad: Vec<&str> = names.iter().copied().filter(|n| n.is_empty() || looks_like_address(n)).collect();
    assert!(bad.is_empty(), "unnamed or hex kernel frames {bad:?} among {names:?}");
    assert!(
        names.iter().any(|n| n.contains("read") || n.to_lowercase().contains("syscall")),
        "no kernel frame names the read path (read_zero, vfs_read, do_syscall_64, ...): {names:?}"
    );
}

/// Leaf first means all kernel frames, then all user frames; never a kernel frame under a user one.
fn check_kernel_before_user(profile: &Profile) {
    for sample in &profile.samples {
        let user = sample.user_frames();
        assert!(
            user.iter().all(|f| !f.kernel),
            "kernel frame below a user frame in {:?}",
            sample.stack.iter().map(|f| (f.function.as_str(), f.kernel)).collect::<Vec<_>>()
        );
    }
}

/// The user part of kernel-mode samples is still kernel_work → main.
fn check_user_chain(profile: &Profile, in_kernel: impl Fn(&Sample) -> bool) {
    let chain = ["kernel_work", "main"];
    let user_chain = |s: &Sample| profiler_tests::pprof::has_chain(s.user_frames(), &chain);
    let kernel = profile.value_where("samples", &in_kernel);
    let chained = profile.value_where("samples", |s| in_kernel(s) && user_chain(s));
    let broken: Vec<Vec<&str>> =
        profile.samples.iter().filter(|s| in_kernel(s) && !user_chain(s)).take(5).map(|s| s.names()).collect();
    assert!(
        chained as f64 >= MIN_USER_CHAIN_SHARE * kernel as f64,
        "only {chained} of {kernel} kernel-mode samples have user frames {chain:?}; some that do not: {broken:?}"
    );
}
