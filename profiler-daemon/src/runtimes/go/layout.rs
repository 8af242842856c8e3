//! Where the goroutine reader finds things in a Go runtime's memory, per Go version: the
//! offsets of `runtime.g`'s, `runtime.gobuf`'s and `runtime.m`'s fields (amd64), the wait
//! reasons' strings, and how `g.labels` is laid out ([`LabelsRepr`]).
//!
//! Sources, per version:
//! - 1.19, 1.21, 1.22, 1.23, 1.24: their `src/runtime/runtime2.go` (Debian's golang-1.x-src),
//!   and checked against the DWARF of a binary each toolchain builds, for every toolchain the
//!   test set-up fetched (`tests::offsets_equal_the_dwarf_of_every_toolchain`);
//! - 1.20: its `runtime2.go`'s `g` (no 1.20 toolchain or source package is reachable here: read
//!   from a public copy of the struct), which has 1.19's field sizes and order up to `labels`
//!   (`parkingOnChan` became an `atomic.Bool`, `atomicstatus` an `atomic.Uint32`, same sizes);
//!   unit-tested only. Its `waitReasonStrings` was not found in a copy that could be dated to
//!   1.20, so its table is empty: the reader takes the strings from the binary.
//!
//! The wait reasons' strings are read from the process itself when its symbol table has
//! `runtime.waitReasonStrings` (the goroutine reader needs the symbol table anyway); the
//! tables here are what it falls back to, and the DWARF test checks them against that array.
//!
//! Go 1.25 is not here: its `gobuf` lost `ret` (every `g` field after `sched` moves 8 bytes
//! down), and the only copies of its `runtime2.go` reachable (golang/go at 00814e7b, a 1.26
//! development snapshot) have a reordered `waitReason` enum that could not be dated to 1.25. A
//! version not here is read from its binary's DWARF ([`super::dwarf`], which is preferred to
//! these tables whenever present); without DWARF it has no layout, and the caller falls back
//! to the OS threads and says why.

/// How a goroutine's pprof labels hang off `g.labels`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LabelsRepr {
    /// Before Go 1.24: a pointer to a `runtime/pprof.labelMap`, a `map[string]string`.
    Map,
    /// Go 1.24 on: a pointer to a `labelMap{LabelSet{list []label}}`, a slice of
    /// `{key, value string}` sorted by key (`src/runtime/pprof/label.go`).
    List,
}

/// Offsets (bytes) of the fields read, from the start of their struct.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    /// `g.stack.lo`, `g.stack.hi`.
    pub stack_lo: u64,
    pub stack_hi: u64,
    /// `g.m` (`*m`).
    pub m: u64,
    /// `g.sched.sp`, `.pc`, `.bp` (`gobuf`, embedded in `g`).
    pub sched_sp: u64,
    pub sched_pc: u64,
    pub sched_bp: u64,
    /// `g.syscallsp`, `g.syscallpc`: where a goroutine in a system call entered it.
    pub syscall_sp: u64,
    pub syscall_pc: u64,
    pub atomicstatus: u64,
    pub goid: u64,
    pub waitsince: u64,
    /// `g.waitreason` (one byte).
    pub waitreason: u64,
    pub lockedm: u64,
    pub gopc: u64,
    pub startpc: u64,
    /// `g.labels` (`unsafe.Pointer`), laid out as [`Layout::labels_repr`] says.
    pub labels: u64,
    pub labels_repr: LabelsRepr,
    /// `g.parentGoid` (Go 1.21 on).
    pub parent_goid: Option<u64>,
    /// Bytes of `g` read: past the last field above.
    pub g_read: u64,
    /// `m.procid`: the thread id of the M.
    pub m_procid: u64,
    /// `m.curg`: the goroutine the M runs.
    pub m_curg: u64,
    /// `waitReasonStrings`, by `waitReason`: the fallback when the binary's own array cannot
    /// be read (empty: none known).
    pub wait_reasons: &'static [&'static str],
}

/// `gStatusStrings`, by status (without the `_Gscan` bit), the same in every version read.
pub const STATUS_STRINGS: [&str; 10] =
    ["idle", "runnable", "running", "syscall", "waiting", "moribund", "dead", "enqueue", "copystack", "preempted"];

/// `_Gscan`: set while the garbage collector scans the stack.
pub const SCAN_BIT: u32 = 0x1000;
pub const G_IDLE: u32 = 0;
pub const G_RUNNING: u32 = 2;
pub const G_SYSCALL: u32 = 3;
pub const G_WAITING: u32 = 4;
pub const G_DEAD: u32 = 6;

/// Go 1.19's `waitReasonStrings`.
const WAIT_REASONS_1_19: &[&str] = &[
    "",
    "GC assist marking",
    "IO wait",
    "chan receive (nil chan)",
    "chan send (nil chan)",
    "dumping heap",
    "garbage collection",
    "garbage collection scan",
    "panicwait",
    "select",
    "select (no cases)",
    "GC assist wait",
    "GC sweep wait",
    "GC scavenge wait",
    "chan receive",
    "chan send",
    "finalizer wait",
    "force gc (idle)",
    "semacquire",
    "sleep",
    "sync.Cond.Wait",
    "timer goroutine (idle)",
    "trace reader (blocked)",
    "wait for GC cycle",
    "GC worker (idle)",
    "preempted",
    "debug call",
];

/// Go 1.23's `waitReasonStrings` (in `waitReason` order); 1.21's are its first 32, 1.22's its
/// first 37 (each version only appended).
const WAIT_REASONS_1_23: &[&str] = &[
    "",
    "GC assist marking",
    "IO wait",
    "chan receive (nil chan)",
    "chan send (nil chan)",
    "dumping heap",
    "garbage collection",
    "garbage collection scan",
    "panicwait",
    "select",
    "select (no cases)",
    "GC assist wait",
    "GC sweep wait",
    "GC scavenge wait",
    "chan receive",
    "chan send",
    "finalizer wait",
    "force gc (idle)",
    "semacquire",
    "sleep",
    "sync.Cond.Wait",
    "sync.Mutex.Lock",
    "sync.RWMutex.RLock",
    "sync.RWMutex.Lock",
    "trace reader (blocked)",
    "wait for GC cycle",
    "GC worker (idle)",
    "GC worker (active)",
    "preempted",
    "debug call",
    "GC mark termination",
    "stopping the world",
    "flushing proc caches",
    "trace goroutine status",
    "trace proc status",
    "page trace flush",
    "coroutine",
    "GC weak to strong wait",
];

/// Go 1.24's: `sync.WaitGroup.Wait` inserted after the mutexes, and synctest's appended.
const WAIT_REASONS_1_24: &[&str] = &[
    "",
    "GC assist marking",
    "IO wait",
    "chan receive (nil chan)",
    "chan send (nil chan)",
    "dumping heap",
    "garbage collection",
    "garbage collection scan",
    "panicwait",
    "select",
    "select (no cases)",
    "GC assist wait",
    "GC sweep wait",
    "GC scavenge wait",
    "chan receive",
    "chan send",
    "finalizer wait",
    "force gc (idle)",
    "semacquire",
    "sleep",
    "sync.Cond.Wait",
    "sync.Mutex.Lock",
    "sync.RWMutex.RLock",
    "sync.RWMutex.Lock",
    "sync.WaitGroup.Wait",
    "trace reader (blocked)",
    "wait for GC cycle",
    "GC worker (idle)",
    "GC worker (active)",
    "preempted",
    "debug call",
    "GC mark termination",
    "stopping the world",
    "flushing proc caches",
    "trace goroutine status",
    "trace proc status",
    "page trace flush",
    "coroutine",
    "GC weak to strong wait",
    "synctest.Run",
    "synctest.Wait",
    "chan receive (synctest)",
    "chan send (synctest)",
    "select (synctest)",
];

/// Go 1.19 (from its runtime2.go; checked against a 1.19 binary's DWARF by the test).
pub const V1_19: Layout = Layout {
    stack_lo: 0,
    stack_hi: 8,
    m: 48,
    sched_sp: 56,
    sched_pc: 64,
    sched_bp: 104,
    syscall_sp: 112,
    syscall_pc: 120,
    atomicstatus: 144,
    goid: 152,
    waitsince: 168,
    waitreason: 176,
    lockedm: 232,
    gopc: 296,
    startpc: 312,
    labels: 360,
    labels_repr: LabelsRepr::Map,
    parent_goid: None,
    g_read: 368,
    m_procid: 72,
    m_curg: 192,
    wait_reasons: WAIT_REASONS_1_19,
};

/// Go 1.20: 1.19's offsets (same field sizes and order up to `labels`); wait reasons from the
/// binary only.
pub const V1_20: Layout = Layout { wait_reasons: &[], ..V1_19 };

/// Go 1.21 and 1.22: the trace fields moved into `g.trace` (after `labels`: `lockedm` and what
/// follows move 24 bytes up), `parentGoid` added before `gopc`.
pub const V1_21: Layout = Layout {
    lockedm: 208,
    parent_goid: Some(272),
    gopc: 280,
    startpc: 296,
    labels: 344,
    g_read: 352,
    wait_reasons: WAIT_REASONS_1_23.split_at(32).0,
    ..V1_19
};

pub const V1_22: Layout = Layout { wait_reasons: WAIT_REASONS_1_23.split_at(37).0, ..V1_21 };

/// Go 1.23: `g.syscallbp` added after `syscallpc` (everything from `atomicstatus` 8 bytes down).
pub const V1_23: Layout = Layout {
    atomicstatus: 152,
    goid: 160,
    waitsince: 176,
    waitreason: 184,
    lockedm: 216,
    parent_goid: Some(280),
    gopc: 288,
    startpc: 304,
    labels: 352,
    g_read: 360,
    wait_reasons: WAIT_REASONS_1_23,
    ..V1_21
};

/// Go 1.24: 1.23's offsets; the labels a sorted slice.
pub const V1_24: Layout = Layout { labels_repr: LabelsRepr::List, wait_reasons: WAIT_REASONS_1_24, ..V1_23 };

/// Every version with a layout, for the tests.
pub const KNOWN: [((u32, u32), &Layout); 6] =
    [((1, 19), &V1_19), ((1, 20), &V1_20), ((1, 21), &V1_21), ((1, 22), &V1_22), ((1, 23), &V1_23), ((1, 24), &V1_24)];

/// The Go versions the reader knows, for messages: `1.19-1.24`.
pub fn known_versions() -> String {
    let (first, last) = (KNOWN[0].0, KNOWN[KNOWN.len() - 1].0);
    format!("{}.{}-{}.{}", first.0, first.1, last.0, last.1)
}

/// The layout of Go `major.minor`, if the reader knows it.
pub fn for_version(major: u32, minor: u32) -> Option<&'static Layout> {
    KNOWN.iter().find(|(version, _)| *version == (major, minor)).map(|(_, layout)| *layout)
}

/// `go1.19.8` (or `go1.19`, `go1.21rc2`) as (1, 19); `None` for a development build.
pub fn parse_version(version: &str) -> Option<(u32, u32)> {
    let rest = version.strip_prefix("go")?;
    let mut parts = rest.split('.');
    let major = parts.next()?.parse().ok()?;
    let minor_text = parts.next()?;
    let digits: String = minor_text.chars().take_while(char::is_ascii_digit).collect();
    Some((major, digits.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_parse_like_runtime_version_prints_them() {
        assert_eq!(parse_version("go1.19.8"), Some((1, 19)));
        assert_eq!(parse_version("go1.21rc2"), Some((1, 21)));
        assert_eq!(parse_version("go1.22"), Some((1, 22)));
        assert_eq!(parse_version("devel go1.23-abc"), None);
        for minor in 19..=24 {
            assert!(for_version(1, minor).is_some(), "1.{minor}");
        }
        assert!(for_version(1, 99).is_none(), "an unknown version has no layout");
        assert_eq!(known_versions(), "1.19-1.24");
    }

    /// What the tables say across versions, where the DWARF test cannot look (1.20 has no
    /// toolchain here): the changes each version's runtime2.go made.
    #[test]
    fn layouts_change_where_the_runtime_sources_did() {
        assert_eq!(V1_20, Layout { wait_reasons: V1_20.wait_reasons, ..V1_19 });
        assert!(V1_20.wait_reasons.is_empty(), "1.20's strings come from the binary");
        // 1.21: 24 bytes of trace fields left `g` before `lockedm`; `parentGoid` came in.
        assert_eq!(V1_19.lockedm - V1_21.lockedm, 24);
        assert_eq!(V1_21.parent_goid, Some(V1_21.gopc - 8));
        // 1.23: `syscallbp` pushed everything from `atomicstatus` on 8 bytes down.
        assert_eq!(V1_23.atomicstatus - V1_22.atomicstatus, 8);
        assert_eq!(V1_23.labels - V1_22.labels, 8);
        for (_, l) in KNOWN {
            assert_eq!(l.g_read, l.labels + 8);
            assert!(l.wait_reasons.len() <= 256, "waitReason is a uint8");
        }
        assert_eq!(V1_21.wait_reasons.last(), Some(&"stopping the world"));
        assert_eq!(V1_22.wait_reasons.last(), Some(&"coroutine"));
        assert_eq!(
            V1_24.wait_reasons[21..25],
            ["sync.Mutex.Lock", "sync.RWMutex.RLock", "sync.RWMutex.Lock", "sync.WaitGroup.Wait"]
        );
        assert_eq!(V1_24.labels_repr, LabelsRepr::List);
        assert!(KNOWN.iter().filter(|(v, _)| v.1 < 24).all(|(_, l)| l.labels_repr == LabelsRepr::Map));
    }

    /// For every Go toolchain on the machine (`go` on PATH, Debian's 1.19 on the test
    /// machines, and those `cargo xtask setup --for-test` fetched into
    /// `<target>/go-toolchains`, 1.21-1.24): a program it builds has, in its DWARF, the offsets
    /// of `runtime.g`, `gobuf`, `stack` and `m` fields the table of its version says, the labels
    /// representation it says, and in its memory (run) the `runtime.waitReasonStrings` the
    /// table lists.
    #[test]
    fn offsets_equal_the_dwarf_of_every_toolchain() {
        let toolchains = toolchains();
        if toolchains.is_empty() {
            eprintln!("skipped: no go toolchain (install golang-go; `cargo xtask setup --for-test` fetches 1.21-1.24)");
            return;
        }
        let mut checked = Vec::new();
        for go in &toolchains {
            checked.push(check_toolchain(go));
        }
        eprintln!("checked against the DWARF and memory of: {}", checked.join(", "));
    }

    /// Checks one toolchain; returns its version.
    fn check_toolchain(go: &std::path::Path) -> String {
        let dir = std::env::temp_dir()
            .join(format!("profiler-go-layout-{}-{}", std::process::id(), go.display()).replace('/', "_"));
        let binary = build_go_binary(go, &dir);
        let bytes = std::fs::read(&binary).expect("read the built binary");
        let facts = super::super::binary::read(&bytes).unwrap().unwrap();
        let version = facts.version.clone();
        let (major, minor) = parse_version(&version).unwrap();
        let l = *for_version(major, minor)
            .unwrap_or_else(|| panic!("{} builds {version}, which has no layout", go.display()));
        let members = super::super::dwarf::members(&bytes).unwrap().expect("DWARF");
        let get = |ty: &str, name: &str| members.get(&(ty.to_string(), name.to_string())).copied();
        let field =
            |ty: &str, name: &str| get(ty, name).unwrap_or_else(|| panic!("{version}: {ty}.{name} in the DWARF"));
        let sched = field("runtime.g", "sched");
        let what = |name: &str| format!("{version}: {name}");
        assert_eq!(l.stack_lo, field("runtime.g", "stack") + field("runtime.stack", "lo"), "{}", what("stack.lo"));
        assert_eq!(l.stack_hi, field("runtime.g", "stack") + field("runtime.stack", "hi"), "{}", what("stack.hi"));
        assert_eq!(l.m, field("runtime.g", "m"), "{}", what("m"));
        assert_eq!(l.sched_sp, sched + field("runtime.gobuf", "sp"), "{}", what("sched.sp"));
        assert_eq!(l.sched_pc, sched + field("runtime.gobuf", "pc"), "{}", what("sched.pc"));
        assert_eq!(l.sched_bp, sched + field("runtime.gobuf", "bp"), "{}", what("sched.bp"));
        for (offset, name) in [
            (l.syscall_sp, "syscallsp"),
            (l.syscall_pc, "syscallpc"),
            (l.atomicstatus, "atomicstatus"),
            (l.goid, "goid"),
            (l.waitsince, "waitsince"),
            (l.waitreason, "waitreason"),
            (l.lockedm, "lockedm"),
            (l.gopc, "gopc"),
            (l.startpc, "startpc"),
            (l.labels, "labels"),
        ] {
            assert_eq!(offset, field("runtime.g", name), "{}", what(name));
        }
        assert_eq!(l.parent_goid, get("runtime.g", "parentGoid"), "{}", what("parentGoid"));
        assert_eq!(l.g_read, l.labels + 8);
        assert_eq!(l.m_procid, field("runtime.m", "procid"), "{}", what("m.procid"));
        assert_eq!(l.m_curg, field("runtime.m", "curg"), "{}", what("m.curg"));
        // From 1.24 labelMap is a struct embedding LabelSet (its `list`); before, a map type.
        let list = get("runtime/pprof.labelMap", "LabelSet").is_some();
        assert_eq!(l.labels_repr, if list { LabelsRepr::List } else { LabelsRepr::Map }, "{}", what("labels"));
        // The reader's own DWARF reading gives the same layout.
        let from_dwarf = super::super::dwarf::layout(&bytes, (major, minor)).unwrap().expect("DWARF");
        assert_eq!(from_dwarf, l, "{}", what("the layout read from the DWARF"));
        let strings = run_and_read_wait_reasons(&binary, &facts);
        let _ = std::fs::remove_dir_all(&dir);
        if !l.wait_reasons.is_empty() {
            assert_eq!(l.wait_reasons, strings, "{}", what("waitReasonStrings"));
        }
        version
    }

    /// Runs the program and reads its `runtime.waitReasonStrings` as the goroutine reader does.
    fn run_and_read_wait_reasons(binary: &std::path::Path, facts: &super::super::binary::GoBinary) -> Vec<String> {
        use std::io::Read;
        let mut child = std::process::Command::new(binary)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("run the built program");
        let mut ready = [0u8; 6];
        child.stdout.as_mut().expect("piped").read_exact(&mut ready).expect("the program starts");
        let remote = crate::runtimes::cpython::memory::Remote { pid: crate::ids::Pid(child.id()) };
        let symbols = facts.symbols.as_ref().expect("a symbol table");
        let read = super::super::goroutines::wait_reasons(&remote, symbols, 0);
        let _ = child.kill();
        let _ = child.wait();
        read.expect("runtime.waitReasonStrings read from the running program")
    }

    /// `go` on PATH (if it runs) and every toolchain the test set-up fetched.
    fn toolchains() -> Vec<std::path::PathBuf> {
        use std::path::PathBuf;
        let mut found = Vec::new();
        if std::process::Command::new("go").arg("version").output().is_ok_and(|o| o.status.success()) {
            found.push(PathBuf::from("go"));
        }
        let workspace = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
        let target = std::env::var_os("CARGO_TARGET_DIR").map_or(workspace.join("target"), |t| workspace.join(t));
        let Ok(entries) = std::fs::read_dir(target.join("go-toolchains")) else { return found };
        let mut fetched: Vec<PathBuf> = entries
            .flatten()
            .map(|e| e.path())
            .filter(|dir| dir.join(".complete").exists())
            .filter_map(|dir| {
                let version = dir.file_name()?.to_str()?.strip_prefix("go-")?.to_string();
                Some(dir.join(format!("usr/lib/go-{version}/bin/go")))
            })
            .collect();
        fetched.sort();
        found.extend(fetched);
        found
    }

    /// Builds a small labelled Go program with uncompressed DWARF with `go` into `dir`. It
    /// prints `ready` and waits for its stdin to close.
    fn build_go_binary(go: &std::path::Path, dir: &std::path::Path) -> std::path::PathBuf {
        std::fs::create_dir_all(dir).expect("a scratch dir");
        let source = "package main\n\nimport (\n\t\"context\"\n\t\"os\"\n\t\"runtime/pprof\"\n)\n\n\
                      func main() {\n\tpprof.Do(context.Background(), pprof.Labels(\"k\", \"v\"), func(context.Context) {\n\
                      \t\tos.Stdout.WriteString(\"ready\\n\")\n\t\tos.Stdin.Read(make([]byte, 1))\n\t})\n}\n";
        std::fs::write(dir.join("main.go"), source).expect("write main.go");
        // The fetched toolchains' shared cache when there is one (their runtimes built once).
        let shared = go.ancestors().find(|a| a.ends_with("go-toolchains")).map(|root| root.join("gocache"));
        let cache = shared.unwrap_or_else(|| dir.join("cache"));
        let output = std::process::Command::new(go)
            .args(["build", "-ldflags=-compressdwarf=false", "-o", "prog", "main.go"])
            .current_dir(dir)
            .env("GOCACHE", cache)
            .env("GO111MODULE", "off")
            .env("GOTOOLCHAIN", "local")
            .env("CGO_ENABLED", "0")
            .output()
            .expect("run go build");
        assert!(
            output.status.success(),
            "{} build failed in {}: {}",
            go.display(),
            dir.display(),
            String::from_utf8_lossy(&output.stderr)
        );
        dir.join("prog")
    }
}
