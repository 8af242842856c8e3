//! The runtimes whose own frames the profiler reads, behind one dispatcher: a closed
//! [`Runtime`] enum, one directory per runtime (today [`cpython`]), one arm per hook here.
//! The rest of the daemon names no runtime.
//!
//! The split follows the OpenTelemetry eBPF profiler's interpreter loader, data and
//! instance:
//! - **detect** ([`candidate`], [`Runtime::find`]): from a process's mappings, cheaply by
//!   file name, then by reading the file; gives what the kernel walker needs of the process
//!   ([`Walked`]);
//! - **register and forget** ([`Walked::give`], [`Walked::forget`]): the runtime's entry in
//!   its walker's map, and the process flag ([`Walked::flag`]) that makes the native walk call
//!   it (the walk itself is `profiler-ebpf`'s `runtimes/`);
//! - **name frames** ([`Readers::name_stacks`]): the tagged words the walker put after a
//!   stack's native frames, named from the process's memory, with the rule for where they go
//!   ([`Runtime::loop_function`], used by `resolve::interpreted`);
//! - **thread dumps** ([`Readers::begin_dump`], [`DumpReader`], [`DumpRead`]): the frames of
//!   threads the dump walked, read in userspace;
//! - **status and comments** ([`status`], [`walks_comment`], [`DumpSummary::describe`]).
//!
//! Adding a runtime: a variant here, its directory beside `cpython/`, its walker in
//! `profiler-ebpf/src/runtimes/`, its ABI in `profiler-common/src/runtimes/` and its
//! [`FrameKind`] (ARCHITECTURE.md, "Adding a runtime").

pub mod cpython;
pub mod go;

use std::collections::HashMap;

use profiler_common::{unwind::process_runtime, FrameKind};

use crate::{
    catalog::KnownProcess,
    ebpf::{self, RuntimeCounters, Session},
    ids::Pid,
    opened::OpenedFile,
    procs::MapEntry,
};

/// A runtime whose frames the profiler reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Runtime {
    /// CPython 3.11 to 3.13 ([`cpython`]).
    CPython,
}

impl Runtime {
    /// Every runtime, in [`FrameKind`] order.
    pub const ALL: [Runtime; 1] = [Runtime::CPython];

    /// The kind of its frames' words.
    pub fn kind(self) -> FrameKind {
        match self {
            Runtime::CPython => FrameKind::Python,
        }
    }

    /// The runtime of a user-stack word; `None` for an address.
    pub fn of_word(word: u64) -> Option<Runtime> {
        match FrameKind::of_word(word) {
            FrameKind::Native => None,
            FrameKind::Python => Some(Runtime::CPython),
        }
    }

    /// The pseudo file name of its frames' locations in profiles.
    pub fn mapping(self) -> &'static str {
        match self {
            Runtime::CPython => cpython::MAPPING,
        }
    }

    /// The name of the language its frames are of, as comments and labels say it.
    pub fn language(self) -> &'static str {
        match self {
            Runtime::CPython => "Python",
        }
    }

    /// The label a sample gets that has frames of it left over (not placed).
    pub fn label(self) -> &'static str {
        match self {
            Runtime::CPython => cpython::LABEL,
        }
    }

    /// The interpreter loop's native function: one activation of it runs one run of the
    /// runtime's frames, which take its place in a stack.
    pub fn loop_function(self) -> &'static str {
        match self {
            Runtime::CPython => cpython::EVAL_FUNCTION,
        }
    }

    /// Whether `maps` has a file named like this runtime's: the cheap first step of
    /// detection, on the caller's thread.
    pub fn candidate(self, maps: &[MapEntry]) -> bool {
        match self {
            Runtime::CPython => cpython::kernel::candidate(maps),
        }
    }

    /// What the kernel walker needs of process `pid`, found by reading its files (`open`
    /// opens a mapping's file): `None` when it does not run this runtime, an error saying why
    /// for a build the walker cannot read.
    pub fn find(
        self,
        pid: Pid,
        maps: &[MapEntry],
        open: &dyn Fn(&MapEntry) -> Option<OpenedFile>,
    ) -> Result<Option<Walked>, String> {
        match self {
            Runtime::CPython => Ok(cpython::kernel::find(pid, maps, open)?.map(Walked::CPython)),
        }
    }
}

/// Whether a file named `name` is a runtime's shared library, which every stack of a process
/// that maps it runs through.
pub fn is_library(name: &str) -> bool {
    Runtime::ALL.into_iter().any(|runtime| match runtime {
        Runtime::CPython => name.starts_with(cpython::kernel::LIBRARY_PREFIX),
    })
}

/// The first runtime whose files `maps` has (a process runs one interpreter).
pub fn candidate(maps: &[MapEntry]) -> Option<Runtime> {
    Runtime::ALL.into_iter().find(|runtime| runtime.candidate(maps))
}

/// What a runtime's kernel walker was given of one process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Walked {
    CPython(profiler_common::runtimes::cpython::PythonProcess),
}

impl Walked {
    pub fn runtime(&self) -> Runtime {
        match self {
            Walked::CPython(_) => Runtime::CPython,
        }
    }

    /// The process flag that makes the native walk call this runtime's walker.
    pub fn flag(&self) -> u32 {
        process_runtime(self.runtime().kind())
    }

    /// Writes the walker's entry for `pid`. Returns false when its map is full.
    pub fn give(&self, session: &mut Session, pid: Pid) -> ebpf::Result<bool> {
        match self {
            Walked::CPython(process) => cpython::kernel::give(session, pid, Some(process)),
        }
    }

    /// Deletes the walker's entry for `pid` (a no-op if it has none).
    pub fn forget(&self, session: &mut Session, pid: Pid) -> ebpf::Result<()> {
        match self {
            Walked::CPython(_) => cpython::kernel::give(session, pid, None).map(drop),
        }
    }
}

/// What registering processes with one runtime's walker did.
#[derive(Clone, Debug, Default)]
pub struct Registrations {
    /// Processes whose frames of this runtime the walker adds to their stacks.
    pub processes: u64,
    /// Processes not given to the walker because its map was full (native frames only;
    /// retried at their next registration).
    pub map_full: u64,
    /// Processes with a file named like the runtime's that the walker cannot read frames of
    /// (not the runtime, an unknown version or build), with the latest reason.
    pub unsupported: u64,
    pub unsupported_reason: Option<String>,
}

/// [`Registrations`] of every runtime.
#[derive(Clone, Debug, Default)]
pub struct RegistrationStats([Registrations; Runtime::ALL.len()]);

impl RegistrationStats {
    pub fn of(&self, runtime: Runtime) -> &Registrations {
        &self.0[runtime as usize]
    }

    pub fn of_mut(&mut self, runtime: Runtime) -> &mut Registrations {
        &mut self.0[runtime as usize]
    }
}

/// The `/status` fields of the runtimes' walks: one object per runtime, by its key.
pub fn status(stats: &RegistrationStats, counters: &RuntimeCounters) -> Vec<(&'static str, serde_json::Value)> {
    Runtime::ALL
        .into_iter()
        .map(|runtime| match runtime {
            Runtime::CPython => ("python", cpython::kernel::status(stats.of(runtime), counters.of(runtime.kind()))),
        })
        .collect()
}

/// What the runtimes' walks did (whole machine), for the profile's comment: a clause per
/// runtime that walked at all, each starting with `"; "`.
pub fn walks_comment(counters: &RuntimeCounters) -> String {
    Runtime::ALL
        .into_iter()
        .map(|runtime| match runtime {
            Runtime::CPython => cpython::kernel::walks_comment(counters.of(runtime.kind())),
        })
        .collect()
}

/// One interpreted frame, named.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct RuntimeFrame {
    /// The function's qualified name; `?` when its code object could not be read.
    pub qualname: String,
    pub filename: String,
    /// The line of the current instruction.
    pub line: u32,
    /// The outermost frame of one interpreter-loop activation (see
    /// [`profiler_common::InterpretedFrame::ENTRY`]).
    pub entry: bool,
}

/// The runtimes' readers of process memory, kept across profiles or dumps (what each
/// process runs, its code objects).
#[derive(Default)]
pub struct Readers {
    cpython: cpython::PythonReader,
}

/// The interpreted frames of sampled stacks, named ([`Readers::name_stacks`]).
pub struct NamedStacks {
    pub runtime: Runtime,
    /// Per sample, leaf first; empty where none was named.
    pub frames: Vec<Vec<RuntimeFrame>>,
    /// The line for the profile's comment.
    pub note: String,
}

impl Readers {
    /// Names the interpreted words of `process`'s sampled stacks (`words`: per sample, leaf
    /// first); `None` when no sample has any.
    pub fn name_stacks(&mut self, process: &KnownProcess, words: &[&[u64]]) -> Option<NamedStacks> {
        let runtime = words.iter().flat_map(|w| w.iter()).find_map(|&word| Runtime::of_word(word))?;
        let (frames, note) = match runtime {
            Runtime::CPython => self.cpython.name_stacks(process, words),
        };
        Some(NamedStacks { runtime, frames, note })
    }

    /// For a process whose files are named like a runtime's that its walker cannot read
    /// (another version, another build), the profile's comment line saying why its stacks
    /// keep the interpreter loop's frames.
    pub fn unsupported_note(&mut self, process: &KnownProcess) -> Option<String> {
        match candidate(process.maps())? {
            Runtime::CPython => self.cpython.begin(process).and_then(|reading| reading.unsupported_note()),
        }
    }

    /// Begins reading `process`'s interpreted frames for one thread dump, read on another
    /// thread; `None` when it runs no runtime (or is gone). Give it back with
    /// [`Readers::take_back`].
    pub fn begin_dump(&mut self, process: &KnownProcess) -> Option<DumpReader<'static>> {
        self.cpython.begin_owned(process).map(DumpReader::CPython)
    }

    /// What a dump begun with [`Readers::begin_dump`] read; its caches are kept again.
    pub fn take_back(&mut self, reader: DumpReader<'static>) -> DumpRead {
        match reader {
            DumpReader::CPython(dump) => DumpRead::CPython(self.cpython.take_back(dump)),
        }
    }
}

/// One thread dump's reading of a runtime's frames.
pub enum DumpReader<'a> {
    CPython(cpython::PythonDump<'a>),
}

impl DumpReader<'_> {
    /// The named frames of the threads `tids` (leaf first), read now; empty once the reading
    /// failed or the process exited.
    pub fn read(&mut self, tids: &[u32]) -> HashMap<u32, Vec<RuntimeFrame>> {
        match self {
            DumpReader::CPython(dump) => dump.read(tids),
        }
    }
}

/// What one dump's reading gave, for the dump to apply to its threads.
#[derive(Debug)]
pub enum DumpRead {
    CPython(cpython::PythonRead),
}

impl DumpRead {
    /// Whether the threads keep the frames read (not when the reading failed or was cut
    /// short: none rather than some of them).
    pub fn frames_stand(&self) -> bool {
        match self {
            DumpRead::CPython(read) => read.frames_stand(),
        }
    }

    /// Counts one dumped thread, which keeps `frames` interpreted frames.
    pub fn count(&mut self, tid: u32, frames: usize) {
        match self {
            DumpRead::CPython(read) => read.count(tid, frames),
        }
    }

    /// The summary of the dump whose threads are `dumped` (their tids), each counted.
    pub fn summary(self, dumped: &[u32]) -> DumpSummary {
        match self {
            DumpRead::CPython(read) => DumpSummary::CPython(read.summary(dumped)),
        }
    }
}

/// The runtime's side of one thread dump.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DumpSummary {
    CPython(cpython::PythonSummary),
}

impl DumpSummary {
    pub fn runtime(&self) -> Runtime {
        match self {
            DumpSummary::CPython(_) => Runtime::CPython,
        }
    }

    /// One line for the profile's comment.
    pub fn describe(&self) -> String {
        match self {
            DumpSummary::CPython(summary) => summary.describe(),
        }
    }
}
