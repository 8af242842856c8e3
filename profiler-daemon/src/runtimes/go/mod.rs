//! The Go runtime, read from outside: a Go process's goroutines, what
//! `pprof.Lookup("goroutine")` answers inside it, for its thread dump; and what the CPU
//! program needs to read the running goroutine's pprof labels at each sample ([`kernel`]).
//! Unlike CPython's, this reader has no kernel walker (Go code keeps frame pointers, which the
//! native walk already follows), so it is no [`super::Runtime`] variant: its hooks are the
//! thread dump's ([`crate::thread_dump::DumpJob`] calls [`read`] after walking the threads)
//! and the unwinder's registration (a Go executable's [`kernel::entry`], read with its
//! unwind table's facts, given to `GO_PROCESSES`).
//!
//! - [`binary`]: that the executable is Go (`.go.buildinfo`), its version, and the runtime's
//!   globals (`runtime.allgs`, …) from the ELF symbol table;
//! - [`layout`]: the offsets of `g`'s fields per Go version, and [`dwarf`]: the same from the
//!   binary's own DWARF, preferred when it has one;
//! - [`kernel`]: the label read's entry (`g`'s place in the thread's TLS, `g.labels`);
//! - [`goroutines`]: every `g` of `runtime.allgs`, read with `process_vm_readv` (the CPython
//!   reader's [`Remote`]), its stack walked by frame pointers from its saved `sched`, its
//!   labels from its label map.
//!
//! A process that is Go but cannot be read (no symbol table, an unknown version) gives a
//! [`GoRead::Fallback`] with the reason, and its dump stays one of OS threads.

pub mod binary;
pub mod dwarf;
pub mod goroutines;
pub mod kernel;
pub mod labels;
pub mod layout;
pub mod profile;

use std::{collections::HashMap, time::Duration};

use crate::{ids::Pid, runtimes::cpython::memory::Remote};
pub use goroutines::{Goroutine, GoroutineStack};

/// What reading a process's goroutines gave.
#[derive(Clone, Debug)]
pub enum GoRead {
    /// The process's executable is not Go.
    NotGo,
    /// Go, but its goroutines were not read: why (for the profile's comment).
    Fallback(String),
    Read(GoDump),
}

/// A Go process's goroutines at one moment.
#[derive(Clone, Debug, Default)]
pub struct GoDump {
    /// `go1.19.8`.
    pub version: String,
    /// Where the offsets came from: `its DWARF` or `the Go 1.x table`.
    pub layout_source: String,
    /// Goroutines shown, by `runtime.allgs` order.
    pub goroutines: Vec<Goroutine>,
    /// Goroutines Go's own profile leaves out too: dead or idle ones, and the runtime's own
    /// (started in a `runtime.` function).
    pub system: u64,
    /// `g`s that could not be read (freed or moved while read).
    pub unreadable: u64,
    /// Goroutines not read because the dump had [`goroutines::MAX_GOROUTINES`] already.
    pub left_out: u64,
    /// Reads of `runtime.allgs` redone because the list changed while it was read.
    pub reread: u64,
    /// Goroutines whose status or saved registers changed while their stack was read (kept,
    /// marked in their `stack` label).
    pub moving: u64,
    /// Labels (or parts of them) cut by the bounds of [`labels`].
    pub labels_cut: u64,
    /// How long reading took.
    pub duration: Duration,
}

impl GoDump {
    /// One line for the profile's comment.
    pub fn describe(&self) -> String {
        format!(
            "Go {}: {} goroutines read from runtime.allgs with process_vm_readv in {:.1} ms (not stopped; \
             offsets from {}); \
             left out as Go's own profile does: {} dead, idle or runtime goroutines; skipped: {} unreadable, \
             {} over the cap of {}; list read again because it changed {} times; {} goroutines moved while \
             read; {} labels cut; OS threads: ?threads=os",
            self.version,
            self.goroutines.len(),
            self.duration.as_secs_f64() * 1e3,
            self.layout_source,
            self.system,
            self.unreadable,
            self.left_out,
            goroutines::MAX_GOROUTINES,
            self.reread,
            self.moving,
            self.labels_cut,
        )
    }
}

/// What a dump knows of one OS thread, for the goroutine running on it.
#[derive(Clone, Debug)]
pub enum ThreadStack {
    /// Walked from the registers it saved (it was off the CPU): its user frames, leaf first.
    Walked(Vec<u64>),
    /// On a CPU: the registers it saved at its last kernel entry (pc, sp, bp), stale.
    OnCpu { pc: u64, sp: u64, bp: u64 },
}

/// Reads the goroutines of `pid` if it runs Go. `threads`: what the dump found of each
/// thread (by id), for running goroutines and those in system calls.
pub fn read(pid: Pid, threads: &HashMap<u32, ThreadStack>) -> GoRead {
    let started = std::time::Instant::now();
    let exe = format!("/proc/{}/exe", pid.0);
    let Ok(file) = std::fs::File::open(&exe) else { return GoRead::NotGo };
    let Ok(mapped) = crate::elf::MappedFile::map(&file) else { return GoRead::NotGo };
    let go = match binary::read(mapped.bytes()) {
        Ok(Some(go)) => go,
        Ok(None) => return GoRead::NotGo,
        Err(err) => return GoRead::Fallback(format!("Go executable whose build facts could not be read: {err}")),
    };
    let version = layout::parse_version(&go.version);
    let table = version.and_then(|(major, minor)| layout::for_version(major, minor));
    let (layout, layout_source) = match (version.map(|v| dwarf::layout(mapped.bytes(), v)), table) {
        (Some(Ok(Some(found))), _) => (found, "its DWARF".to_string()),
        (read, Some(table)) => {
            let (major, minor) = version.unwrap_or_default();
            let why = match read {
                Some(Err(why)) => format!("DWARF unusable: {why}"),
                _ => "no DWARF".to_string(),
            };
            (*table, format!("the Go {major}.{minor} table ({why})"))
        }
        (Some(Err(why)), None) => {
            return GoRead::Fallback(format!(
                "{}: the goroutine reader has no table for this version (it knows Go {}) and {why}; \
                 goroutines not read, OS threads shown",
                go.version,
                layout::known_versions()
            ))
        }
        (_, None) => {
            return GoRead::Fallback(format!(
                "{}: the goroutine reader knows Go {} (and others from their DWARF, which this binary \
                 lacks); goroutines not read, OS threads shown",
                go.version,
                layout::known_versions()
            ))
        }
    };
    let Some(symbols) = &go.symbols else {
        return GoRead::Fallback(format!(
            "Go binary without symbols ({}, built with -ldflags=-s): goroutines not read, OS threads shown \
             (runtime.allgs is found by the symbol table only)",
            go.version
        ));
    };
    let bias = match load_bias(pid, mapped.bytes(), &go) {
        Some(bias) => bias,
        None => return GoRead::Fallback(format!("{}: the executable's load address was not found", go.version)),
    };
    let remote = Remote { pid };
    let mut dump = match goroutines::read_all(&remote, &layout, symbols, bias, threads) {
        Ok(dump) => dump,
        Err(why) => return GoRead::Fallback(format!("{}: goroutines not read: {why}; OS threads shown", go.version)),
    };
    dump.version = go.version;
    dump.layout_source = layout_source;
    dump.duration = started.elapsed();
    GoRead::Read(dump)
}

/// Runtime address minus file address: 0 for a fixed-address executable; for a PIE, from
/// where its executable segment is mapped.
fn load_bias(pid: Pid, bytes: &[u8], go: &binary::GoBinary) -> Option<u64> {
    if !go.position_independent {
        return Some(0);
    }
    let segment = crate::elf::load_segments(bytes).ok()?.into_iter().find(|s| s.executable)?;
    let exe = std::fs::read_link(format!("/proc/{}/exe", pid.0)).ok()?;
    let maps = crate::procs::read_maps(pid.0).ok()?;
    let map = maps.iter().find(|m| {
        *m.path == *exe.to_string_lossy() && (m.offset..m.offset + (m.end - m.start)).contains(&segment.file_offset)
    })?;
    Some((map.start + (segment.file_offset - map.offset)).wrapping_sub(segment.vaddr))
}
