//! Full stacks without frame pointers: fixtures built `-O2 -fomit-frame-pointer` (and Debian's
//! libc, which has none either) must profile as completely as frame-pointer builds, because
//! the kernel walker unwinds with each file's `.eh_frame`. Ground truth: the fixtures' call
//! chains and CPU split by construction, the heap fixture's sites, and `perf record
//! --call-graph dwarf` run on the same process at the same time.

use profiler_tests::heap_sites::{site_is_leaf_and_chained, site_values_match, SITES};
use profiler_tests::perf::{self, cumulative};
use profiler_tests::run::run_profiler_resuming;
use profiler_tests::{assert_success, expect, go_pprof, preflight, run_profiler};
use profiler_tests::{Fixture, FixtureKind, Profile, TempDir};

const FREQUENCY_HZ: i64 = 199;
const CAPTURE_S: u32 = 5;
const FIXTURE_S: u32 = 12;
/// The bar: ≥ 95% of samples carry the whole chain up to `main`.
const MIN_CHAIN_SHARE: f64 = 0.95;

fn snapshot(fixture: &Fixture, out: &TempDir, extra: &[&str]) -> Profile {
    let pid = fixture.pid().to_string();
    let frequency = FREQUENCY_HZ.to_string();
    let duration = format!("{CAPTURE_S}s");
    let out_arg = out.path_arg();
    let mut args =
        vec!["snapshot", "--pid", &pid, "--duration", &duration, "--frequency", &frequency, "--output", &out_arg];
    args.extend_from_slice(extra);
    let output = run_profiler(&args);
    assert_success(&output, "snapshot --pid of a fixture without frame pointers");
    Profile::decode(&expect::profile_written(out.path(), fixture.comm(), fixture.pid()))
}

/// The share of samples (by count) for which `pred` holds, among those where `among` holds.
fn share(
    profile: &Profile,
    among: impl Fn(&profiler_tests::pprof::Sample) -> bool,
    pred: impl Fn(&profiler_tests::pprof::Sample) -> bool,
) -> (f64, i64) {
    let all = profile.value_where("samples", &among);
    let good = profile.value_where("samples", |s| among(s) && pred(s));
    (good as f64 / all.max(1) as f64, all)
}

/// Some samples that fail `pred`, for failure messages.
fn examples(profile: &Profile, pred: impl Fn(&profiler_tests::pprof::Sample) -> bool) -> Vec<Vec<&str>> {
    profile.samples.iter().filter(|s| !pred(s)).take(5).map(|s| s.names()).collect()
}

/// The profile's comment says frames were stepped with unwind tables: the chains below come
/// from CFI, not from a lucky frame-pointer walk.
fn unwound_by_tables(profile: &Profile) {
    let line = profile
        .comments
        .iter()
        .find(|c| c.starts_with("user stack unwinding"))
        .unwrap_or_else(|| panic!("no unwinding comment in {:?}", profile.comments));
    let by_table: u64 = line
        .split("frames by unwind table ")
        .nth(1)
        .and_then(|rest| rest.split(',').next())
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("unparseable unwinding comment: {line}"));
    assert!(by_table > 0, "no frame was unwound by table: {line}");
}

/// `cpu_split.c` at -O2 without frame pointers: 75/25 within 6 points, and ≥ 95% of samples
/// carry their whole chain to `main` (hot_X → work_loop → main for the hot functions).
#[test]
fn omit_frame_pointer_split_matches_ground_truth() {
    if !preflight() {
        return;
    }
    let out = TempDir::new("nofp-split");
    let fixture = Fixture::spawn(FixtureKind::CpuSplitNoFp, FIXTURE_S);
    let profile = snapshot(&fixture, &out, &[]);
    unwound_by_tables(&profile);

    let (a, b) = (
        profile.value_where("samples", |s| s.contains("hot_a")) as f64,
        profile.value_where("samples", |s| s.contains("hot_b")) as f64,
    );
    let hot_share = a / (a + b);
    assert!((hot_share - 0.75).abs() <= 0.06, "hot_a share {hot_share:.3} of {} samples, expected 0.75 ± 0.06", a + b);

    let (whole, n) = share(&profile, |_| true, |s| s.contains("main"));
    assert!(
        whole >= MIN_CHAIN_SHARE,
        "only {whole:.3} of {n} samples reach main; some that do not: {:?}",
        examples(&profile, |s| s.contains("main"))
    );
    for hot in ["hot_a", "hot_b"] {
        let chain = [hot, "work_loop", "main"];
        let (chained, n) = share(&profile, |s| s.contains(hot), |s| s.has_chain(&chain));
        assert!(
            chained >= MIN_CHAIN_SHARE,
            "only {chained:.3} of {n} samples in {hot} carry {chain:?}; some that do not: {:?}",
            examples(&profile, |s| !s.contains(hot) || s.has_chain(&chain))
        );
    }
    let top = go_pprof::top(&expect::profile_written(out.path(), fixture.comm(), fixture.pid()));
    assert!(
        top.contains("hot_a") && top.contains("work_loop"),
        "go tool pprof -top lacks the fixture's functions:\n{top}"
    );
}

/// Hot paths inside libc (qsort calling back into the program, a large memcpy): the caller
/// above libc is present, and the top-10 cumulative functions are the set perf's DWARF
/// unwinding finds on the same process over the same seconds.
#[test]
fn callers_above_libc_are_found_like_perf_dwarf() {
    if !preflight() {
        return;
    }
    let out = TempDir::new("libc-hot");
    let fixture = Fixture::spawn(FixtureKind::LibcHot, FIXTURE_S);
    let perf_data = out.path().join("perf.data");
    let mut perf = perf::record_dwarf(fixture.pid(), 99, CAPTURE_S, &perf_data);
    let profile = snapshot(&fixture, &out, &[]);
    let perf_status = perf.wait().expect("wait for perf");
    assert!(perf_status.success(), "perf record failed: {perf_status}");
    unwound_by_tables(&profile);

    let in_sort = |s: &profiler_tests::pprof::Sample| {
        s.contains("compare_ints") || s.stack.iter().any(|f| f.function.contains("qsort"))
    };
    let (sorted, n_sort) = share(&profile, in_sort, |s| s.has_chain(&["sort_loop", "main"]));
    assert!(n_sort > 0, "no sample in qsort or compare_ints: {:?}", profile.function_names());
    assert!(
        sorted >= MIN_CHAIN_SHARE,
        "only {sorted:.3} of {n_sort} samples in qsort/compare_ints carry sort_loop → main: {:?}",
        examples(&profile, |s| !in_sort(s) || s.has_chain(&["sort_loop", "main"]))
    );
    assert!(
        profile.samples.iter().any(|s| s.has_chain(&["compare_ints", "sort_loop", "main"])
            && s.stack.iter().any(|f| f.function.contains("qsort"))),
        "no sample has compare_ints called back from libc's qsort under sort_loop"
    );
    let in_copy = |s: &profiler_tests::pprof::Sample| {
        s.user_frames().first().is_some_and(|f| f.function.contains("memcpy") || f.function.contains("memmove"))
            && !s.stack.iter().any(|f| f.function.contains("msort"))
    };
    let (copied, n_copy) = share(&profile, in_copy, |s| s.has_chain(&["copy_big", "copy_loop", "main"]));
    assert!(n_copy > 0, "no sample in memcpy: {:?}", profile.function_names());
    assert!(
        copied >= MIN_CHAIN_SHARE,
        "only {copied:.3} of {n_copy} samples in memcpy carry copy_big → copy_loop → main: {:?}",
        examples(&profile, |s| !in_copy(s) || s.has_chain(&["copy_big", "copy_loop", "main"]))
    );

    let ours = perf::profile_user_stacks(&profile);
    let ours = cumulative(ours.iter().map(|(s, n)| (s.as_slice(), *n)));
    let theirs = perf::user_stacks(&perf_data);
    assert!(theirs.len() >= 100, "perf recorded only {} samples", theirs.len());
    let theirs = cumulative(theirs.iter().map(|s| (s.as_slice(), 1)));
    let top = |list: &[(String, f64)]| -> Vec<String> {
        let mut names: Vec<String> = list.iter().take(10).map(|(f, _)| f.clone()).collect();
        names.sort();
        names
    };
    assert_eq!(
        top(&ours),
        top(&theirs),
        "top-10 cumulative functions differ\n ours: {:?}\n perf: {:?}",
        &ours[..ours.len().min(14)],
        &theirs[..theirs.len().min(14)]
    );
}

/// `heap_sites.c` at -O2 without frame pointers, every allocation recorded: each site's
/// values exact and the site itself the frame under the allocator, chained to main. The stack
/// is taken at the allocator's return, inside the site: only CFI finds main from there.
#[test]
fn heap_sites_without_frame_pointers_are_attributed() {
    if !preflight() {
        return;
    }
    let out = TempDir::new("nofp-heap");
    // Stopped after `ready` until the profiler is capturing.
    let mut fixture = Fixture::spawn_with_args(FixtureKind::HeapSitesNoFp, &["stop", "30"]);
    let pid = fixture.pid().to_string();
    let out_arg = out.path_arg();
    let args = [
        "snapshot",
        "--pid",
        &pid,
        "--duration",
        "4s",
        "--output",
        &out_arg,
        "--profiles",
        "heap",
        "--heap-sample-bytes",
        "1",
    ];
    let output = run_profiler_resuming(&args, &[], &fixture);
    assert_success(&output, "heap snapshot of a fixture without frame pointers");
    fixture.expect_line("allocated");
    let profile = Profile::decode(&expect::heap_profile_written(out.path(), fixture.comm(), fixture.pid()));
    unwound_by_tables(&profile);
    for site in &SITES {
        site_values_match(&profile, site);
        site_is_leaf_and_chained(&profile, site.name, "alloc_space");
    }
}

/// Rust at opt-level 3 without frame pointers: demangled names, the whole chain
/// spin → run → main, and `mix` shown as an inlined frame at spin's addresses.
#[test]
fn rust_release_build_has_demangled_inlined_frames() {
    if !preflight() {
        return;
    }
    let out = TempDir::new("rust-release");
    let fixture = Fixture::spawn(FixtureKind::InlineRust, FIXTURE_S);
    let profile = snapshot(&fixture, &out, &[]);
    unwound_by_tables(&profile);
    let chain = ["inline_rs::spin", "inline_rs::run", "inline_rs::main"];
    let (chained, n) = share(&profile, |s| s.contains("inline_rs::spin"), |s| s.has_chain(&chain));
    assert!(n > 0, "no sample in inline_rs::spin: {:?}", profile.function_names());
    assert!(
        chained >= MIN_CHAIN_SHARE,
        "only {chained:.3} of {n} samples in spin carry {chain:?}: {:?}",
        examples(&profile, |s| !s.contains("inline_rs::spin") || s.has_chain(&chain))
    );
    // An inlined frame: mix directly above spin at the same address (one location, two lines).
    let inlined = |s: &profiler_tests::pprof::Sample| {
        s.stack.windows(2).any(|w| {
            w[0].function == "inline_rs::mix" && w[1].function == "inline_rs::spin" && w[0].address == w[1].address
        })
    };
    let (with_mix, n) = share(&profile, |s| s.contains("inline_rs::spin"), inlined);
    assert!(
        with_mix >= 0.5,
        "only {with_mix:.3} of {n} samples in spin show mix inlined into it: {:?}",
        examples(&profile, |s| !s.contains("inline_rs::spin") || inlined(s))
    );
    assert!(
        profile.function_names().iter().all(|f| !f.starts_with("_ZN") && !f.starts_with("_R")),
        "mangled names left: {:?}",
        profile.function_names()
    );
}

/// A process that calls `execve` while profiled: the kernel drops its old mappings at the
/// exec (the new image must not be unwound with the shell's tables) and the profiler
/// registers the new ones at the next drain, so the fixture's stacks are whole again. With
/// the old tables the fixture's addresses fall in no known mapping and, without frame
/// pointers, its chains break.
#[test]
fn a_process_that_execs_gets_its_new_tables() {
    if !preflight() {
        return;
    }
    let out = TempDir::new("exec");
    let mut fixture = Fixture::spawn_exec_later(FixtureKind::CpuSplitNoFp, "1", FIXTURE_S);
    let (pid, out_arg) = (fixture.pid().to_string(), out.path_arg());
    let output = std::thread::scope(|scope| {
        let args = ["snapshot", "--pid", &pid, "--duration", "6s", "--frequency", "199", "--output", &out_arg];
        let profiler = scope.spawn(move || run_profiler(&args));
        fixture.expect_line("ready");
        profiler.join().expect("profiler runner panicked")
    });
    assert_success(&output, "snapshot of a process that execs");
    // Named after what the pid was when first seen (the shell, or the fixture).
    let dir = std::fs::read_dir(out.path())
        .expect("output dir")
        .filter_map(|e| e.ok())
        .find(|e| e.file_name().to_string_lossy().ends_with(&format!("-{pid}")))
        .unwrap_or_else(|| panic!("no profile directory for pid {pid}: {}", profiler_tests::listing(out.path())));
    let profile = Profile::decode(&dir.path().join("cpu.pb.gz"));
    let chain_of = |hot| [hot, "work_loop", "main"];
    let (chained, n) = share(
        &profile,
        |s| s.contains("hot_a") || s.contains("hot_b"),
        |s| s.has_chain(&chain_of("hot_a")) || s.has_chain(&chain_of("hot_b")),
    );
    // About 4.5 s of the fixture, at most ~1 s of it before the re-registration.
    assert!(n > 0, "no fixture samples after the exec: {:?}", profile.function_names());
    assert!(
        chained >= 0.6,
        "only {chained:.3} of {n} fixture samples carry their chain after the exec: {:?}",
        examples(&profile, |s| !(s.contains("hot_a") || s.contains("hot_b"))
            || s.has_chain(&chain_of("hot_a"))
            || s.has_chain(&chain_of("hot_b")))
    );
}

/// JIT code: anonymous executable memory with no CFI and no frame pointer, named only in the
/// process's `/tmp/perf-PID.map`. Its samples are named from the perf map, and the leaf is
/// stepped through `[rsp]`, so the chain run_jit → main is whole.
#[test]
fn jit_code_is_named_from_the_perf_map() {
    if !preflight() {
        return;
    }
    let out = TempDir::new("jit");
    let fixture = Fixture::spawn(FixtureKind::JitSpin, FIXTURE_S);
    let profile = snapshot(&fixture, &out, &[]);
    let (named, n) = share(&profile, |_| true, |s| s.leaf_is("jit_spin"));
    assert!(
        named >= 0.9,
        "only {named:.3} of {n} samples have the perf map's jit_spin as leaf: {:?}",
        examples(&profile, |s| s.leaf_is("jit_spin"))
    );
    let chain = ["jit_spin", "run_jit", "main"];
    let (chained, n) = share(&profile, |s| s.leaf_is("jit_spin"), |s| s.has_chain(&chain));
    assert!(
        chained >= MIN_CHAIN_SHARE,
        "only {chained:.3} of {n} jit_spin samples carry {chain:?}: {:?}",
        examples(&profile, |s| !s.leaf_is("jit_spin") || s.has_chain(&chain))
    );
}
