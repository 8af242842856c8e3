//! Where the goroutine reader finds things in a Go runtime's memory, per Go version: the
//! offsets of `runtime.g`'s, `runtime.gobuf`'s and `runtime.m`'s fields (amd64), the wait
//! reasons' strings, and how `g.labels` is laid out. Written from each version's
//! `src/runtime/runtime2.go`; Go 1.19's are checked against the DWARF of a binary built by
//! the test (`tests::go_1_19_offsets_equal_the_dwarf_of_a_real_binary`). A version not here
//! has no layout: the caller falls back to the OS threads and says why.

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
    pub labels: u64,
    /// `g.parentGoid` (Go 1.21 on).
    pub parent_goid: Option<u64>,
    /// Bytes of `g` read: past the last field above.
    pub g_read: u64,
    /// `m.procid`: the thread id of the M.
    pub m_procid: u64,
    /// `waitReasonStrings`, by `waitReason`.
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
    parent_goid: None,
    g_read: 368,
    m_procid: 72,
    wait_reasons: WAIT_REASONS_1_19,
};

/// The layout of Go `major.minor`, if the reader knows it.
pub fn for_version(major: u32, minor: u32) -> Option<&'static Layout> {
    match (major, minor) {
        (1, 19) => Some(&V1_19),
        _ => None,
    }
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
        assert!(for_version(1, 19).is_some());
        assert!(for_version(1, 99).is_none(), "an unknown version has no layout");
    }

    /// The offsets of Go 1.19's `runtime.g`, `gobuf`, `stack` and `m` fields in the DWARF of
    /// a program built now by the machine's Go (`go` on PATH, 1.19 on the test machines).
    #[test]
    fn go_1_19_offsets_equal_the_dwarf_of_a_real_binary() {
        let Some(binary) = build_go_binary() else {
            eprintln!("skipped: no go toolchain");
            return;
        };
        let bytes = std::fs::read(&binary).expect("read the built binary");
        let _ = std::fs::remove_dir_all(binary.parent().expect("a scratch dir"));
        let version = super::super::binary::read(&bytes).unwrap().unwrap().version;
        let Some((1, 19)) = parse_version(&version) else {
            eprintln!("skipped: the machine's Go is {version}, the test checks 1.19");
            return;
        };
        let members = dwarf::members(&bytes, &["runtime.g", "runtime.gobuf", "runtime.stack", "runtime.m"]);
        let field = |ty: &str, name: &str| {
            *members.get(&(ty.to_string(), name.to_string())).unwrap_or_else(|| panic!("{ty}.{name} in the DWARF"))
        };
        let sched = field("runtime.g", "sched");
        let l = V1_19;
        assert_eq!(l.stack_lo, field("runtime.g", "stack") + field("runtime.stack", "lo"));
        assert_eq!(l.stack_hi, field("runtime.g", "stack") + field("runtime.stack", "hi"));
        assert_eq!(l.m, field("runtime.g", "m"));
        assert_eq!(l.sched_sp, sched + field("runtime.gobuf", "sp"));
        assert_eq!(l.sched_pc, sched + field("runtime.gobuf", "pc"));
        assert_eq!(l.sched_bp, sched + field("runtime.gobuf", "bp"));
        assert_eq!(l.syscall_sp, field("runtime.g", "syscallsp"));
        assert_eq!(l.syscall_pc, field("runtime.g", "syscallpc"));
        assert_eq!(l.atomicstatus, field("runtime.g", "atomicstatus"));
        assert_eq!(l.goid, field("runtime.g", "goid"));
        assert_eq!(l.waitsince, field("runtime.g", "waitsince"));
        assert_eq!(l.waitreason, field("runtime.g", "waitreason"));
        assert_eq!(l.lockedm, field("runtime.g", "lockedm"));
        assert_eq!(l.gopc, field("runtime.g", "gopc"));
        assert_eq!(l.startpc, field("runtime.g", "startpc"));
        assert_eq!(l.labels, field("runtime.g", "labels"));
        assert!(!members.contains_key(&("runtime.g".into(), "parentGoid".into())));
        assert_eq!(l.g_read, l.labels + 8);
        assert_eq!(l.m_procid, field("runtime.m", "procid"));
    }

    /// Builds a small Go program with uncompressed DWARF in a scratch directory; `None` when
    /// the machine has no `go`.
    fn build_go_binary() -> Option<std::path::PathBuf> {
        let dir = std::env::temp_dir().join(format!("profiler-go-layout-{}", std::process::id()));
        std::fs::create_dir_all(&dir).ok()?;
        std::fs::write(dir.join("main.go"), "package main\n\nfunc main() { println(\"hi\") }\n").ok()?;
        let status = std::process::Command::new("go")
            .args(["build", "-ldflags=-compressdwarf=false", "-o", "prog", "main.go"])
            .current_dir(&dir)
            .env("GOCACHE", dir.join("cache"))
            .env("GOFLAGS", "-mod=mod")
            .env("GO111MODULE", "off")
            .status()
            .ok()?;
        assert!(status.success(), "go build failed in {}", dir.display());
        Some(dir.join("prog"))
    }

    mod dwarf {
        use std::collections::HashMap;

        use gimli::{EndianSlice, LittleEndian};

        use crate::elf::Elf;

        /// `(struct, member) → offset` for the structs named `types`.
        pub fn members(bytes: &[u8], types: &[&str]) -> HashMap<(String, String), u64> {
            let elf = Elf::parse(bytes).unwrap();
            let section = |id: gimli::SectionId| -> Result<EndianSlice<'_, LittleEndian>, gimli::Error> {
                let data = elf.section(id.name()).map(|s| elf.data(&s).unwrap().into_owned()).unwrap_or_default();
                Ok(EndianSlice::new(Box::leak(data.into_boxed_slice()), LittleEndian))
            };
            let dwarf = gimli::Dwarf::load(section).unwrap();
            let mut out = HashMap::new();
            let mut units = dwarf.units();
            while let Some(header) = units.next().unwrap() {
                let unit = dwarf.unit(header).unwrap();
                let mut entries = unit.entries();
                let mut current: Option<String> = None;
                while let Some(entry) = entries.next_dfs().unwrap() {
                    let depth = entry.depth();
                    let name = entry
                        .attr_value(gimli::DW_AT_name)
                        .and_then(|v| dwarf.attr_string(&unit, v).ok())
                        .map(|s| s.to_string_lossy().into_owned());
                    if entry.tag() == gimli::DW_TAG_structure_type {
                        current = name.filter(|n| types.contains(&n.as_str()));
                        continue;
                    }
                    if depth <= 1 && entry.tag() != gimli::DW_TAG_member {
                        current = None;
                    }
                    if let (Some(ty), gimli::DW_TAG_member, Some(member)) = (&current, entry.tag(), name) {
                        if let Some(gimli::AttributeValue::Udata(offset)) =
                            entry.attr_value(gimli::DW_AT_data_member_location)
                        {
                            out.insert((ty.clone(), member), offset);
                        }
                    }
                }
            }
            out
        }
    }
}
