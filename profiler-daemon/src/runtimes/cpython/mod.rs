//! CPython frames: which Python functions each thread of a CPython process is in, read
//! from the interpreter's own structures in the process's memory (`process_vm_readv`: no
//! stop, no signal), named from their code objects.
//!
//! [`detect`] finds the interpreter (3.11, 3.12, 3.13; static or shared builds) and its
//! structure offsets ([`offsets`]); [`code`] names code objects, cached per (process, code
//! object) with an identity check; `resolve::interpreted` puts named frames in place of the
//! interpreter loop's native frames. The rest of the daemon reaches it only through
//! [`crate::runtimes`]. Two sources of frames:
//! - sampled profiles (cpu, heap, block, mutex, threadcreate, offcpu): [`kernel`] gives the
//!   kernel walker each CPython process's interpreter when it registers, the walker appends
//!   one word per Python frame to the stacks it takes, and [`crate::resolve`] has them named
//!   ([`PythonReader::name_stacks`], [`PythonDump::name_words`]);
//! - thread dumps: [`frames`] walks each thread state's frame chain in userspace.
//!   [`PythonReader::begin`] starts one dump's reading, which `thread_dump::take` calls in each
//!   round of its walks ([`PythonDump::read`]); [`PythonDump::finish`] gives what was read
//!   ([`PythonRead`]), which the dump applies to its threads and sums up. It reads
//!   threads the dump walked (blocked in the kernel, so their chains hold still); a thread
//!   on a CPU keeps the frames of its latest CPU sample.

pub mod code;
pub mod detect;
pub mod frames;
pub mod kernel;
pub mod linetable;
pub mod memory;
pub mod offsets;

use std::collections::HashMap;

use code::{CodeCache, CodeStats, ProcessKey, ReadBudget, DUMP_READ_BYTES};
use detect::Detection;
use memory::{ReadError, Remote};
use profiler_common::InterpretedFrame;

use crate::{
    catalog::KnownProcess,
    ids::Pid,
    offload::{Charge, Offload},
    procs::MapEntry,
};

/// Why reading a process's Python state stopped.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ReadFailure {
    #[error(transparent)]
    Read(#[from] ReadError),
    /// What was read is not what the version's layout says it should be.
    #[error("{0}")]
    Layout(String),
    /// A file that may be CPython's could not be opened (gone, or replaced since it was
    /// mapped): the process is not taken to be without Python, and is looked at again.
    #[error("{0} could not be opened to look for CPython in it")]
    Unopened(String),
    /// The dump's bytes to read for naming code objects are spent ([`DUMP_READ_BYTES`]).
    #[error("this dump's budget of {DUMP_READ_BYTES} bytes read to name code objects is spent")]
    OverBudget,
}

/// One Python frame of a thread, named.
pub type PythonFrame = super::RuntimeFrame;

/// The pseudo file name of Python frames' locations in profiles.
pub const MAPPING: &str = "[python]";

/// The label of a sample with Python frames left over (not placed).
pub const LABEL: &str = "python";

/// The interpreter loop's function: one native activation runs a run of Python frames.
pub const EVAL_FUNCTION: &str = "_PyEval_EvalFrameDefault";

/// What reading a process's Python state gave, for the profile's comment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PythonStatus {
    /// Frames were read: the interpreter's version and file.
    Read { version: (u8, u8), path: String },
    /// CPython, not readable by this reader: why.
    Unsupported(String),
    /// Reading failed part way: why (the threads keep their native frames).
    Failed(String),
    /// The process exited while it was read: no Python frames rather than half of them.
    Exited,
}

/// The Python side of one dump.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PythonSummary {
    pub status: PythonStatus,
    /// Thread states whose frames were put on a dumped thread.
    pub threads: u64,
    /// Python frames put on threads.
    pub frames: u64,
    /// Frames whose code object could not be read (named `?`).
    pub unnamed: u64,
    /// Frames left unnamed (`?`) because the dump's read budget ([`DUMP_READ_BYTES`]) was
    /// spent.
    pub over_budget: u64,
    /// Thread states of threads not walked now (on a CPU, moving, or no frames): native
    /// frames only.
    pub not_walked: u64,
    /// Thread states without a thread in the dump (exited meanwhile, or not started yet).
    pub unmatched: u64,
    /// Threads whose chain was cut (see [`frames::MAX_FRAMES`]): outermost frames missing.
    pub truncated: u64,
    pub codes: CodeStats,
}

/// The reader's state across dumps: what each process is, and its code objects.
pub struct PythonReader {
    detections: HashMap<(ProcessKey, u32), Detection>,
    codes: CodeCache,
    /// Where detection opens and reads the process's files: a worker thread, time-boxed (a
    /// file on a file system that stops answering never holds the caller).
    files: Offload,
}

impl Default for PythonReader {
    fn default() -> Self {
        Self { detections: HashMap::new(), codes: CodeCache::default(), files: Offload::new("offload-python", None) }
    }
}

impl PythonReader {
    /// Begins reading `process`'s Python frames for one dump; `None` when it does not run
    /// CPython (or is gone). Detection is cached per process and mappings version.
    pub fn begin(&mut self, process: &KnownProcess) -> Option<PythonDump<'_>> {
        let begun = self.prepare(process)?;
        Some(begun.dump(Codes::Lent(&mut self.codes)))
    }

    /// As [`PythonReader::begin`], for a dump read on another thread: the dump takes the
    /// code cache with it (this reader's one owner while it is away), and
    /// [`PythonReader::take_back`] returns it. A dump begun meanwhile starts from an empty
    /// cache (dumps are taken one at a time, so none is).
    pub fn begin_owned(&mut self, process: &KnownProcess) -> Option<PythonDump<'static>> {
        let begun = self.prepare(process)?;
        Some(begun.dump(Codes::Owned(Box::new(std::mem::take(&mut self.codes)))))
    }

    /// Names the Python frames of sampled stacks (`words`: per sample, leaf first, the words
    /// the kernel walker put after the native frames). Returns the frames per sample and the
    /// line for the profile's comment: what was named, or why nothing was (the process
    /// exited before its code objects were read: those samples keep their native frames,
    /// counted).
    pub fn name_stacks(&mut self, process: &KnownProcess, words: &[&[u64]]) -> (Vec<Vec<PythonFrame>>, String) {
        let with = words.iter().filter(|words| !words.is_empty()).count();
        let Some(mut reading) = self.begin(process) else {
            let note = format!(
                "python: {with} samples have Python frames the kernel walked, not named: the process exited before \
                 its code objects were read (they keep {EVAL_FUNCTION})"
            );
            return (Vec::new(), note);
        };
        let names = reading.name_words(words.iter().flat_map(|words| words.iter().copied()));
        let frames: Vec<Vec<PythonFrame>> =
            words.iter().map(|words| words.iter().filter_map(|w| names.get(w).cloned()).collect()).collect();
        let placed = frames.iter().filter(|f| !f.is_empty()).count();
        (frames, reading.sampled_note(with, placed))
    }

    /// What a dump begun with [`PythonReader::begin_owned`] read, its code cache kept again.
    pub fn take_back(&mut self, dump: PythonDump<'static>) -> PythonRead {
        let (read, codes) = dump.finish_parts();
        if let Codes::Owned(codes) = codes {
            self.codes = *codes;
        }
        read
    }

    /// Detects (or finds cached) what `process` runs, for a dump of it.
    fn prepare(&mut self, process: &KnownProcess) -> Option<Begun> {
        let info = process.info.as_ref()?;
        // The start time as `/proc` says now: the catalogue's may not be read yet (a process
        // known from events only), and a key that changes would throw the cache away.
        let start_time = crate::procs::read_start_time(process.pid.0).ok()?;
        let key: ProcessKey = (process.pid, start_time);
        self.forget_exited();
        let detection = match self.detections.get(&(key, process.maps_version)) {
            Some(known) => Ok(known.clone()),
            None => self.detect(process.pid, process.maps(), info.exe.clone())?.inspect(|found| {
                self.detections.insert((key, process.maps_version), found.clone());
            }),
        };
        let (interp, status) = match detection {
            Ok(Detection::NotPython) => return None,
            Ok(Detection::Unsupported(why)) => (None, PythonStatus::Unsupported(why)),
            Ok(Detection::Python(interp)) => {
                let status = PythonStatus::Read { version: interp.version, path: interp.path.clone() };
                (Some(interp), status)
            }
            Err(err) => (None, failure_status(&err)),
        };
        Some(Begun { pid: process.pid, key, interp, status })
    }

    /// Looks for CPython in `pid`'s files on the worker, each opened once and checked (see
    /// [`crate::opened`]); `None` when the worker gave up (a stalled file system: not cached,
    /// tried again at the next dump).
    fn detect(
        &mut self,
        pid: Pid,
        maps: &[MapEntry],
        exe: Option<std::path::PathBuf>,
    ) -> Option<Result<Detection, ReadFailure>> {
        let maps = maps.to_vec();
        let what = format!("CPython detection of pid {pid}");
        let found = self.files.call(&what, Charge::path(pid), move |state| {
            let charger = state.charger();
            detect::detect(pid, &maps, exe.as_deref(), &|map: &MapEntry| {
                crate::opened::open_on_worker(&charger, pid, map)
            })
        });
        found.inspect_err(|stall| tracing::debug!("no Python frames now: {stall}")).ok()
    }

    /// Drops what is known of processes that exited (by pid; a reused pid has another start
    /// time, so its entries would not be found anyway).
    fn forget_exited(&mut self) {
        // Once per pid: the code cache holds thousands of entries of a few processes.
        let mut alive: HashMap<Pid, bool> = HashMap::new();
        let mut live = |pid: Pid| *alive.entry(pid).or_insert_with(|| crate::procs::exists(pid.0));
        self.detections.retain(|((pid, _), _), _| live(*pid));
        self.codes.retain(|(pid, _)| live(pid));
    }
}

/// What a dump of a CPython process starts from.
struct Begun {
    pid: Pid,
    key: ProcessKey,
    interp: Option<Box<detect::Interpreter>>,
    status: PythonStatus,
}

impl Begun {
    fn dump(self, codes: Codes<'_>) -> PythonDump<'_> {
        PythonDump {
            codes,
            remote: Remote { pid: self.pid },
            key: self.key,
            interp: self.interp,
            summary: summary(self.status),
            states: HashMap::new(),
            reads: ReadBudget::new(DUMP_READ_BYTES),
        }
    }
}

/// The code cache a dump names code objects with: the reader's, lent, or taken along to
/// the thread that reads (see [`PythonReader::begin_owned`]).
enum Codes<'a> {
    Lent(&'a mut CodeCache),
    Owned(Box<CodeCache>),
}

impl Codes<'_> {
    fn cache(&mut self) -> &mut CodeCache {
        match self {
            Codes::Lent(codes) => codes,
            Codes::Owned(codes) => codes,
        }
    }
}

/// One dump's reading of a CPython process: [`PythonDump::read`] once per round of the
/// dump's walks (before the round's consistency check, so that a thread that ran meanwhile
/// is read again, Python frames included), then [`PythonDump::finish`].
pub struct PythonDump<'a> {
    codes: Codes<'a>,
    remote: Remote,
    key: ProcessKey,
    /// `None` when the interpreter cannot be read (the status says why).
    interp: Option<Box<detect::Interpreter>>,
    summary: PythonSummary,
    /// The latest read's thread states, by tid.
    states: HashMap<u32, ThreadRead>,
    /// Bytes this dump may still read to name code objects (all rounds together).
    reads: ReadBudget,
}

/// What one dump's reading gave ([`PythonDump::finish`]), for the dump to apply to its
/// threads (`ThreadDump::apply_runtime`): whether the frames read stand, and the summary.
#[derive(Debug)]
pub struct PythonRead {
    summary: PythonSummary,
    /// The latest read's thread states, by tid.
    states: HashMap<u32, ThreadRead>,
}

impl PythonRead {
    /// Whether the threads keep the Python frames read. Not when the reading failed or was
    /// cut short (the process exited): none rather than some of them.
    pub fn frames_stand(&self) -> bool {
        matches!(self.summary.status, PythonStatus::Read { .. })
    }

    /// Counts one dumped thread, which keeps `frames` Python frames.
    pub fn count(&mut self, tid: u32, frames: usize) {
        let s = &mut self.summary;
        match self.states.get(&tid) {
            Some(_) if frames == 0 => s.not_walked += 1,
            Some(read) => {
                s.threads += 1;
                s.frames += frames as u64;
                s.truncated += u64::from(read.truncated);
                s.over_budget += read.over_budget;
            }
            None => {}
        }
    }

    /// The summary of the dump whose threads are `dumped` (their tids), each counted.
    pub fn summary(mut self, dumped: &[u32]) -> PythonSummary {
        self.summary.unmatched = self.states.keys().filter(|tid| !dumped.contains(tid)).count() as u64;
        self.summary
    }
}

/// What the latest read of one thread state gave.
#[derive(Clone, Copy, Debug, Default)]
struct ThreadRead {
    /// Its chain was cut: outermost frames missing.
    truncated: bool,
    /// Frames left unnamed because the dump's read budget was spent.
    over_budget: u64,
}

impl<'a> PythonDump<'a> {
    /// The named Python frames of the threads `tids` (leaf first), read now; empty once the
    /// reading failed or the process exited (the summary says which).
    pub fn read(&mut self, tids: &[u32]) -> HashMap<u32, Vec<PythonFrame>> {
        let Some(interp) = self.interp.as_deref() else { return HashMap::new() };
        let threads = match frames::threads(&self.remote, interp) {
            Ok(threads) => threads,
            Err(err) => return self.fail(&err),
        };
        self.states = threads.iter().map(|t| (t.tid, ThreadRead { truncated: t.truncated, over_budget: 0 })).collect();
        let mut named = HashMap::new();
        for thread in threads.iter().filter(|t| tids.contains(&t.tid)) {
            let mut out = Vec::with_capacity(thread.frames.len());
            let mut over_budget = 0;
            for frame in &thread.frames {
                let code = self.codes.cache().name(
                    &self.remote,
                    interp,
                    self.key,
                    (frame.code_object, frame.instr_offset),
                    &mut self.reads,
                    &mut self.summary.codes,
                );
                out.push(match code {
                    Ok((code, line)) => named_frame(&code, line, frame),
                    Err(ReadFailure::Read(ReadError::Exited)) => return self.fail(&ReadError::Exited.into()),
                    Err(ReadFailure::OverBudget) => {
                        over_budget += 1;
                        unnamed_frame(frame)
                    }
                    Err(_) => {
                        self.summary.unnamed += 1;
                        unnamed_frame(frame)
                    }
                });
            }
            // Counted per thread, and summed in `finish` for the threads whose frames are
            // kept: a thread read again in a later round is not counted twice.
            self.states.entry(thread.tid).or_default().over_budget = over_budget;
            named.insert(thread.tid, out);
        }
        named
    }

    /// Names the Python frames of sampled stacks: the words the kernel walker stored
    /// (`profiler_common::frame::interpreted_word`), one name per distinct word. A word whose
    /// code object cannot be read is named `?` (counted); none is named once reading failed
    /// or the process exited (the summary says which).
    pub fn name_words(&mut self, words: impl IntoIterator<Item = u64>) -> HashMap<u64, PythonFrame> {
        let mut named = HashMap::new();
        let Some(interp) = self.interp.as_deref() else { return named };
        for word in words {
            let Some(frame) = profiler_common::frame::decode_word(word) else { continue };
            if frame.kind != profiler_common::FrameKind::Python as u8 {
                continue;
            }
            if named.contains_key(&word) {
                continue;
            }
            let code = self.codes.cache().name(
                &self.remote,
                interp,
                self.key,
                (frame.code_object, frame.instr_offset),
                &mut self.reads,
                &mut self.summary.codes,
            );
            let name = match code {
                Ok((code, line)) => named_frame(&code, line, &frame),
                Err(ReadFailure::Read(ReadError::Exited)) => {
                    self.fail(&ReadError::Exited.into());
                    return HashMap::new();
                }
                Err(ReadFailure::OverBudget) => {
                    self.summary.over_budget += 1;
                    unnamed_frame(&frame)
                }
                Err(_) => {
                    self.summary.unnamed += 1;
                    unnamed_frame(&frame)
                }
            };
            self.summary.frames += 1;
            named.insert(word, name);
        }
        named
    }

    /// What naming sampled stacks' Python frames gave, for the profile's comment: `samples`
    /// had Python frames, `placed` of them had them put in place.
    pub fn sampled_note(&self, samples: usize, placed: usize) -> String {
        let s = &self.summary;
        match &s.status {
            PythonStatus::Read { version: (major, minor), path } => format!(
                "python: CPython {major}.{minor} ({path}): Python frames walked in the kernel, in place of \
                 _PyEval_EvalFrameDefault in {placed} of {samples} samples with any; {} distinct frames named, {} \
                 unnamed (code object unreadable), {} unnamed past the {} MiB read for naming them; {}",
                s.frames,
                s.unnamed,
                s.over_budget,
                DUMP_READ_BYTES >> 20,
                s.codes.describe(),
            ),
            _ => format!("{} ({samples} samples keep _PyEval_EvalFrameDefault)", s.describe()),
        }
    }

    /// For a CPython this reader cannot read (another version or build), the profile's
    /// comment line saying so; `None` for one it reads.
    pub fn unsupported_note(&self) -> Option<String> {
        match self.summary.status {
            PythonStatus::Unsupported(_) => Some(self.summary.describe()),
            _ => None,
        }
    }

    fn fail(&mut self, err: &ReadFailure) -> HashMap<u32, Vec<PythonFrame>> {
        self.summary.status = failure_status(err);
        self.interp = None;
        HashMap::new()
    }

    /// What the reading gave, for the dump to apply (`ThreadDump::apply_runtime`).
    pub fn finish(self) -> PythonRead {
        self.finish_parts().0
    }

    fn finish_parts(self) -> (PythonRead, Codes<'a>) {
        (PythonRead { summary: self.summary, states: self.states }, self.codes)
    }
}

/// A frame named from its code object, at `line`.
fn named_frame(code: &code::CodeInfo, line: u32, frame: &InterpretedFrame) -> PythonFrame {
    PythonFrame { qualname: code.qualname.clone(), filename: code.filename.clone(), line, entry: frame.is_entry() }
}

/// A frame whose code object was not read: `?`.
fn unnamed_frame(frame: &InterpretedFrame) -> PythonFrame {
    PythonFrame { qualname: "?".into(), filename: String::new(), line: 0, entry: frame.is_entry() }
}

/// An empty summary with `status`.
pub(crate) fn summary(status: PythonStatus) -> PythonSummary {
    PythonSummary {
        status,
        threads: 0,
        frames: 0,
        unnamed: 0,
        over_budget: 0,
        not_walked: 0,
        unmatched: 0,
        truncated: 0,
        codes: CodeStats::default(),
    }
}

fn failure_status(err: &ReadFailure) -> PythonStatus {
    match err {
        ReadFailure::Read(ReadError::Exited) => PythonStatus::Exited,
        other => PythonStatus::Failed(other.to_string()),
    }
}

impl PythonSummary {
    /// One line for the profile's comment.
    pub fn describe(&self) -> String {
        match &self.status {
            PythonStatus::Read { version: (major, minor), path } => format!(
                "python: CPython {major}.{minor} ({path}): {} threads with {} Python frames in place of \
                 _PyEval_EvalFrameDefault; {} frames unnamed (code object unreadable), {} unnamed past the {} MiB \
                 a dump reads to name them; {} threads without Python \
                 frames now (on a CPU, moving, or in no Python code); {} thread states without a dumped thread; {} chains cut at {} frames a thread \
                 or {} a dump; {}",
                self.threads,
                self.frames,
                self.unnamed,
                self.over_budget,
                DUMP_READ_BYTES >> 20,
                self.not_walked,
                self.unmatched,
                self.truncated,
                frames::MAX_FRAMES,
                frames::MAX_FRAMES_PER_DUMP,
                self.codes.describe(),
            ),
            PythonStatus::Unsupported(why) => format!("python: native frames only: {why}"),
            PythonStatus::Failed(why) => format!("python: native frames only: reading the interpreter failed: {why}"),
            PythonStatus::Exited => {
                "python: the process exited while its Python frames were read: native frames only".to_string()
            }
        }
    }
}

#[cfg(test)]
mod tests {

    use super::*;
    use crate::{
        ids::Tid,
        thread_dump::{procfs::ThreadFacts, DumpedThread, StackSource, ThreadDump},
    };

    #[test]
    fn a_process_that_exits_mid_read_gets_no_python_frames_and_says_so() {
        let gone = Pid(0x7fff_fff0);
        let mut codes = CodeCache::default();
        let interp = detect::Interpreter {
            version: (3, 12),
            path: "libpython3.12.so".into(),
            runtime: 0x1000,
            code_type: None,
            offsets: offsets::V3_12,
        };
        let mut reading = PythonDump {
            codes: Codes::Lent(&mut codes),
            remote: Remote { pid: gone },
            key: (gone, 1),
            interp: Some(Box::new(interp)),
            summary: summary(PythonStatus::Read { version: (3, 12), path: "libpython3.12.so".into() }),
            states: HashMap::new(),
            reads: ReadBudget::new(DUMP_READ_BYTES),
        };
        assert!(reading.read(&[7]).is_empty());
        let frame = PythonFrame { qualname: "f".into(), filename: "a.py".into(), line: 1, entry: true };
        let mut dump = ThreadDump {
            threads: vec![DumpedThread {
                tid: Tid(7),
                facts: ThreadFacts { name: "t".into(), state: 'S', wchan: None },
                syscall: None,
                user: vec![],
                truncated: false,
                kernel: vec![],
                source: StackSource::Walked,
                // Read in an earlier round, before the process exited.
                interpreted: vec![frame],
            }],
            ..ThreadDump::begin(gone, 0)
        };
        let read = reading.finish();
        assert!(!read.frames_stand());
        dump.apply_runtime(crate::runtimes::DumpRead::CPython(read));
        assert!(dump.threads[0].interpreted.is_empty(), "none rather than some");
        let Some(crate::runtimes::DumpSummary::CPython(summary)) = dump.runtime else { panic!("no summary") };
        assert_eq!(summary.status, PythonStatus::Exited);
        assert!(summary.describe().contains("exited"), "{}", summary.describe());
    }
}
