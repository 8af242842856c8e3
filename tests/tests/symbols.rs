//! Stripped binaries named, against ground truth: `cpu_split_nofp` (75% of its CPU in
//! `hot_a`, 25% in `hot_b`, both called from `work_loop` from `main`; no frame pointers, so
//! unwound by `.eh_frame`) is copied and `strip --strip-all`ed, then profiled three ways:
//!
//! - its debug file (`objcopy --only-keep-debug`) under `/usr/lib/debug/.build-id/xx/….debug`
//!   inside a private mount namespace of the fixture's own (a tmpfs over `/usr/lib/debug`
//!   that the host never sees): the names, files and lines come from it, found in the
//!   process's root by build id;
//! - MiniDebugInfo added as Fedora's `find-debuginfo` does (the symbols the dynamic table
//!   lacks, from the debug file's symbol table, xz'd into `.gnu_debugdata`);
//! - nothing: every frame in the file is `cpu_split_nofp+0xOFFSET`, and the offsets, mapped
//!   onto the unstripped binary's symbol table, give the same split; the mapping carries the
//!   build id `readelf -n` reads.
//!
//! In each the split is within 3.5σ of a binomial share at the sample count, the chains
//! reach `main`, and `go tool pprof -symbolize=none` reads the same names.

use std::path::{Path, PathBuf};
use std::process::Command;

use profiler_tests::fixture::FixtureKind;
use profiler_tests::run::Running;
use profiler_tests::{assert_success, expect, go_pprof, preflight, Fixture, Profile, TempDir};

const FREQUENCY_HZ: &str = "199";
const CAPTURE: &str = "5s";
/// Long enough to outlast profiler startup plus the capture; the guard kills it after.
const FIXTURE_S: &str = "15";
/// hot_a's share of hot_a + hot_b, by construction of the fixture.
const HOT_A_SHARE: f64 = 0.75;
/// Chains lost only for samples in a prologue or libc's clock_gettime (~1% of the time).
const MIN_CHAIN_SHARE: f64 = 0.90;
const COMM: &str = "cpu_split_nofp";

/// The fixture stripped, with what was taken from it.
struct Stripped {
    _dir: TempDir,
    /// The stripped program.
    binary: PathBuf,
    /// Its unstripped build (ground truth: symbol table and segments).
    unstripped: PathBuf,
    /// `objcopy --only-keep-debug` of the unstripped build.
    debug: PathBuf,
    /// The build id, as `readelf -n` reads it.
    build_id: String,
}

fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(out.status.success(), "{cmd:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn stripped(name: &str) -> Stripped {
    let dir = TempDir::new(name);
    let built = FixtureKind::CpuSplitNoFp.build();
    let unstripped = dir.path().join("unstripped");
    std::fs::copy(&built, &unstripped).unwrap();
    let binary = dir.path().join(COMM);
    std::fs::copy(&built, &binary).unwrap();
    let debug = dir.path().join(format!("{COMM}.debug"));
    run(Command::new("objcopy").arg("--only-keep-debug").arg(&unstripped).arg(&debug));
    run(Command::new("strip").arg("--strip-all").arg(&binary));
    let notes = run(Command::new("readelf").arg("-n").arg(&binary));
    let build_id = notes
        .lines()
        .find_map(|l| l.trim().strip_prefix("Build ID: "))
        .unwrap_or_else(|| panic!("readelf -n shows no build id:\n{notes}"))
        .to_string();
    Stripped { _dir: dir, binary, unstripped, debug, build_id }
}

/// Profiles `fixture` (the stripped program, however started); returns the profile's path.
fn profile(fixture: &Fixture, out: &TempDir) -> PathBuf {
    let pid = fixture.pid().to_string();
    let out_arg = out.path_arg();
    let args = ["snapshot", "--pid", &pid, "--duration", CAPTURE, "--frequency", FREQUENCY_HZ, "--output", &out_arg];
    let mut profiler = Running::start(&args);
    profiler.wait_capturing();
    let output = profiler.finish();
    assert_success(&output, "snapshot --pid of the stripped fixture");
    expect::profile_written(out.path(), COMM, fixture.pid())
}

/// hot_a's share of the samples in `a` + `b` is within 3.5σ of the truth.
fn check_share(a: f64, b: f64, what: &str) {
    let n = a + b;
    assert!(n >= 200.0, "only {n} samples in hot_a/hot_b ({what}): too few to judge a share");
    let share = a / n;
    let sigma = (HOT_A_SHARE * (1.0 - HOT_A_SHARE) / n).sqrt();
    assert!(
        (share - HOT_A_SHARE).abs() <= 3.5 * sigma,
        "hot_a share {share:.3} of {n} samples ({what}), expected {HOT_A_SHARE} ± {:.3} (3.5σ)",
        3.5 * sigma
    );
}

/// The split, the chains to main, and go tool pprof's reading of the names.
fn check_named(path: &Path, profile: &Profile) {
    let in_fn = |f: &str| profile.value_where("samples", |s| s.contains(f)) as f64;
    let total = profile.total("samples") as f64;
    let (a, b) = (in_fn("hot_a"), in_fn("hot_b"));
    assert!(
        a + b >= 0.9 * total,
        "only {a} + {b} of {total} samples named hot_a/hot_b: {:?}",
        profile.function_names()
    );
    check_share(a, b, "by name");
    for hot in ["hot_a", "hot_b"] {
        let chain = [hot, "work_loop", "main"];
        let inside = profile.value_where("samples", |s| s.contains(hot)) as f64;
        let chained = profile.value_where("samples", |s| s.contains(hot) && s.has_chain(&chain)) as f64;
        assert!(chained >= MIN_CHAIN_SHARE * inside, "only {chained} of {inside} samples in {hot} carry {chain:?}");
    }
    let raw = go_pprof::raw(path);
    assert!(raw.contains("hot_a") && raw.contains("work_loop") && raw.contains("main"), "go tool pprof -raw:\n{raw}");
}

/// The profile comment's count for `source` (`frame names by source: … debug file N, …`).
fn source_count(profile: &Profile, source: &str) -> u64 {
    let line = profile
        .comments
        .iter()
        .find(|c| c.starts_with("frame names by source"))
        .unwrap_or_else(|| panic!("no per-source count in the comments: {:?}", profile.comments));
    let at = line.find(&format!("{source} ")).unwrap_or_else(|| panic!("{source} not in {line}"));
    line[at + source.len() + 1..].split(|c: char| !c.is_ascii_digit()).next().unwrap().parse().unwrap()
}

/// The first and last line of function `name` in the fixture's source (`void name(` to the
/// next `}` in column 0).
fn source_lines(name: &str) -> (i64, i64) {
    let source = std::fs::read_to_string(profiler_tests::workspace_root().join("tests/fixtures/cpu_split.c")).unwrap();
    let lines: Vec<&str> = source.lines().collect();
    let first = lines.iter().position(|l| l.contains(&format!("void {name}("))).unwrap();
    let last = first + lines[first..].iter().position(|l| l.starts_with('}')).unwrap();
    (first as i64 + 1, last as i64 + 1)
}

#[test]
fn a_debug_file_found_by_build_id_in_the_process_root_names_files_and_lines() {
    if !preflight() {
        return;
    }
    let s = stripped("symbols-build-id");
    let (dir, file) = (&s.build_id[..2], format!("{}.debug", &s.build_id[2..]));
    let host_path = Path::new("/usr/lib/debug/.build-id").join(dir).join(&file);
    assert!(!host_path.exists(), "{} exists on the host: the test would not prove the lookup", host_path.display());
    // The mount point must exist; the tmpfs over it is the fixture's alone.
    std::fs::create_dir_all("/usr/lib/debug").unwrap();
    let script = format!(
        "set -e; mount -t tmpfs profiler-test /usr/lib/debug; mkdir -p /usr/lib/debug/.build-id/{dir}; \
         cp \"$1\" /usr/lib/debug/.build-id/{dir}/{file}; exec \"$0\" {FIXTURE_S}"
    );
    let mut cmd = Command::new("unshare");
    cmd.args(["--mount", "--propagation", "private", "--", "sh", "-c", &script]).arg(&s.binary).arg(&s.debug);
    let fixture = Fixture::from_command(FixtureKind::CpuSplitNoFp, cmd);
    assert!(!host_path.exists(), "the debug file leaked to the host's {}", host_path.display());
    let out = TempDir::new("symbols-build-id-out");
    let path = profile(&fixture, &out);
    let profile = Profile::decode(&path);
    check_named(&path, &profile);
    assert!(source_count(&profile, "debug file") > 0, "comments: {:?}", profile.comments);
    // hot_a's frames carry cpu_split.c and a line inside hot_a's body.
    let (first, last) = source_lines("hot_a");
    let frames: Vec<_> =
        profile.samples.iter().flat_map(|s| s.stack.iter()).filter(|f| f.function == "hot_a").collect();
    assert!(!frames.is_empty());
    for frame in frames {
        assert!(frame.file.ends_with("cpu_split.c"), "hot_a's file is {:?}", frame.file);
        assert!((first..=last).contains(&frame.line), "hot_a at line {}, outside {first}..={last}", frame.line);
    }
}

#[test]
fn minidebuginfo_names_a_stripped_binary() {
    if !preflight() {
        return;
    }
    let s = stripped("symbols-minidebuginfo");
    // Fedora's find-debuginfo (gdb's manual, "MiniDebugInfo"): the function symbols the
    // dynamic symbol table lacks, from the debug file, xz'd into .gnu_debugdata.
    let script = r#"set -e
        nm -D "$1" --format=posix --defined-only | awk '{ print $1 }' | sort > "$3.dynsyms"
        nm "$2" --format=posix --defined-only | awk '{ if ($2 == "T" || $2 == "t" || $2 == "D") print $1 }' \
            | sort > "$3.funcsyms"
        comm -13 "$3.dynsyms" "$3.funcsyms" > "$3.keep"
        objcopy -S --remove-section .gdb_index --remove-section .comment --keep-symbols="$3.keep" "$2" "$3.mini"
        xz -f "$3.mini"
        objcopy --add-section .gnu_debugdata="$3.mini.xz" "$1""#;
    let work = s.binary.with_extension("work");
    run(Command::new("sh").args(["-c", script, "sh"]).arg(&s.binary).arg(&s.debug).arg(&work));
    let sections = run(Command::new("readelf").arg("-SW").arg(&s.binary));
    assert!(sections.contains(".gnu_debugdata") && !sections.contains(".symtab"), "{sections}");
    let fixture = Fixture::from_command(FixtureKind::CpuSplitNoFp, {
        let mut cmd = Command::new(&s.binary);
        cmd.arg(FIXTURE_S);
        cmd
    });
    let out = TempDir::new("symbols-minidebuginfo-out");
    let path = profile(&fixture, &out);
    let profile = Profile::decode(&path);
    check_named(&path, &profile);
    assert!(source_count(&profile, "MiniDebugInfo") > 0, "comments: {:?}", profile.comments);
}

#[test]
fn an_unnamed_address_is_kept_as_file_and_offset_with_the_build_id() {
    if !preflight() {
        return;
    }
    let s = stripped("symbols-unnamed");
    let fixture = Fixture::from_command(FixtureKind::CpuSplitNoFp, {
        let mut cmd = Command::new(&s.binary);
        cmd.arg(FIXTURE_S);
        cmd
    });
    let out = TempDir::new("symbols-unnamed-out");
    let path = profile(&fixture, &out);
    let profile = Profile::decode(&path);
    assert!(source_count(&profile, "unnamed") > 0, "comments: {:?}", profile.comments);
    // The mapping of the program carries its build id.
    let raw = profiler_daemon::pprof::decode_file(&path).unwrap();
    let string = |i: i64| raw.string_table[i as usize].clone();
    let mapping = raw
        .mapping
        .iter()
        .find(|m| string(m.filename).ends_with(COMM))
        .unwrap_or_else(|| panic!("no mapping of {COMM}"));
    assert_eq!(string(mapping.build_id), s.build_id);
    assert!(!mapping.has_functions, "nothing in {COMM} was really named");
    // Ground truth: hot_a's and hot_b's file offsets from the unstripped build.
    let range = |name: &str| symbol_file_range(&s.unstripped, name);
    let (a_range, b_range) = (range("hot_a"), range("hot_b"));
    let prefix = format!("{COMM}+0x");
    let offset_of = |name: &str| name.strip_prefix(&prefix).map(|hex| u64::from_str_radix(hex, 16).unwrap());
    let leaf_in = |r: &std::ops::Range<u64>| {
        profile.value_where("samples", |s| {
            s.stack.first().and_then(|f| offset_of(&f.function)).is_some_and(|off| r.contains(&off))
        }) as f64
    };
    let (a, b) = (leaf_in(&a_range), leaf_in(&b_range));
    let total = profile.total("samples") as f64;
    assert!(a + b >= 0.9 * total, "only {a} + {b} of {total} leaves in hot_a/hot_b: {:?}", profile.function_names());
    check_share(a, b, "by file offset");
    assert!(profile.function_names().iter().all(|n| !n.starts_with("0x")), "{:?}", profile.function_names());
    let raw_text = go_pprof::raw(&path);
    assert!(raw_text.contains(&prefix), "go tool pprof -raw lacks {prefix}:\n{raw_text}");
}

/// The file offsets of symbol `name` of `binary` (`nm -S`'s address and size, through the
/// `PT_LOAD` segment `readelf -lW` shows holding it).
fn symbol_file_range(binary: &Path, name: &str) -> std::ops::Range<u64> {
    let hex = |s: &str| u64::from_str_radix(s.trim_start_matches("0x"), 16).unwrap();
    let nm = run(Command::new("nm").arg("-S").arg(binary));
    let (addr, size) = nm
        .lines()
        .find_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() == 4 && f[3] == name).then(|| (hex(f[0]), hex(f[1])))
        })
        .unwrap_or_else(|| panic!("nm shows no {name}"));
    let segments = run(Command::new("readelf").arg("-lW").arg(binary));
    let (offset, vaddr) = segments
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.first() == Some(&"LOAD")).then(|| (hex(f[1]), hex(f[2]), hex(f[4])))
        })
        .find(|&(_, vaddr, filesz)| addr >= vaddr && addr < vaddr + filesz)
        .map(|(offset, vaddr, _)| (offset, vaddr))
        .unwrap_or_else(|| panic!("no LOAD segment holds {name}:\n{segments}"));
    let start = addr - vaddr + offset;
    start..start + size
}
