//! Thread dumps: where every thread of a process is now, without stopping it (no ptrace, no
//! signal). The kernel's task iterator gives each thread's saved user registers and kernel
//! stack ([`Session::thread_records`]); the user stack is walked here ([`walk`]) with the
//! kernel walker's own tables; `/proc` adds the name, state and wait channel ([`procfs`]).
//!
//! A blocked thread's registers and stack do not change while it stays blocked. One that
//! runs between the read of its registers and the read of its stack could yield a mix of
//! two moments, so the iterator is read again after the walks: a thread whose context
//! switches, registers or CPU changed is walked again from the new record, a few times at
//! most, then kept and marked. A thread on a CPU has stale saved registers: it is reported
//! as running, without a walked stack (the profile kind adds its latest CPU sample's).
//! The walk needs only what [`DumpJob::prepare`] takes from the session (the process's
//! unwind view, a duplicate of the iterator program's descriptor, the runtime's reading), so
//! the daemon runs it off the collector thread ([`DumpJob::run`]).
//! In a Go process, the goroutines are read after the threads' walks
//! ([`crate::runtimes::go::read`]), with what the walks found of each thread for the
//! goroutines running on them; the dump keeps both ([`ThreadDump::go`]).
//! What this module does not own: turning a dump into a profile (`profiles::threads`).

pub mod procfs;
mod syscalls;
mod walk;

use std::{
    collections::BTreeMap,
    time::{Duration, Instant, SystemTime},
};

use profiler_common::{stack::stack_hash, walk::Regs, ThreadRecord};
pub use walk::WalkCounts;

use crate::{
    ebpf::{self, Session, ThreadIterator, UnwindView},
    ids::{Pid, StackId, Tid},
    runtimes::{
        go::{GoRead, ThreadStack},
        DumpRead, DumpReader, DumpSummary, RuntimeFrame,
    },
};

/// Reads of the iterator per dump at most: one, then one check per walk round.
const ATTEMPTS: usize = 3;
/// Threads walked per dump at most, the lowest thread ids (the main thread's first): each
/// costs stack reads and a walk, up to [`ATTEMPTS`] times (10,000 threads took 0.6 s). The rest are counted in [`ThreadDump::left_out`].
pub const MAX_THREADS_WALKED: usize = 1000;

/// Where a thread's user stack comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StackSource {
    /// Walked from the registers it saved, and it did not run meanwhile.
    Walked,
    /// Walked, but the thread kept running between reads: frames may mix two moments.
    Moving,
    /// On a CPU in every read: its saved registers are stale, so no stack was walked.
    Running,
    /// No user registers (the thread had not entered the kernel from user mode).
    None,
}

/// One thread of a dump.
#[derive(Clone, Debug)]
pub struct DumpedThread {
    pub tid: Tid,
    pub facts: procfs::ThreadFacts,
    /// The system call it is in (number), if any.
    pub syscall: Option<i64>,
    /// User frames, leaf first: the saved pc (a syscall's return point), then return
    /// addresses. Empty unless [`StackSource::Walked`] or [`StackSource::Moving`].
    pub user: Vec<u64>,
    /// The walk stopped at the depth limit.
    pub truncated: bool,
    /// Kernel frames, leaf first.
    pub kernel: Vec<u64>,
    pub source: StackSource,
    /// The interpreted frames it is in, leaf first, when the process runs an interpreter the
    /// profiler reads and the thread was walked (see [`crate::runtimes`]); they take the
    /// place of the interpreter loop's native frames when the dump is rendered.
    pub interpreted: Vec<RuntimeFrame>,
}

impl DumpedThread {
    /// The system call's name (or its number), if the thread is in one.
    pub fn syscall_name(&self) -> Option<String> {
        self.syscall.map(|n| syscalls::name(n).map_or_else(|| format!("syscall_{n}"), str::to_string))
    }
}

/// Every thread of one process at one moment.
#[derive(Clone, Debug)]
pub struct ThreadDump {
    pub pid: Pid,
    pub taken: SystemTime,
    /// By thread id.
    pub threads: Vec<DumpedThread>,
    /// Threads that exited while the dump was taken: skipped.
    pub exited: u64,
    /// Walks redone because the thread ran while it was read.
    pub rewalked: u64,
    /// Threads the iterator saw without an id in the profiler's pid namespace: skipped.
    pub invisible: u64,
    /// Threads not walked because the dump had [`MAX_THREADS_WALKED`] already.
    pub left_out: u64,
    /// How the user stacks were walked.
    pub walk: WalkCounts,
    /// How long the dump took.
    pub duration: Duration,
    /// What reading the process's interpreted frames gave; `None` when it runs no runtime
    /// the profiler reads.
    pub runtime: Option<DumpSummary>,
    /// The key the session's programs hash stacks with ([`Session::stack_hash_key`]).
    pub stack_hash_key: u64,
    /// A Go process's goroutines, or why they were not read; `None` for a process that is
    /// not Go.
    pub go: Option<GoRead>,
}

impl ThreadDump {
    /// A dump of `pid` begun now, with no thread yet; its stack ids are hashed under
    /// `stack_hash_key` (the session's).
    pub fn begin(pid: Pid, stack_hash_key: u64) -> Self {
        ThreadDump {
            pid,
            taken: SystemTime::now(),
            threads: Vec::new(),
            exited: 0,
            rewalked: 0,
            invisible: 0,
            left_out: 0,
            walk: WalkCounts::default(),
            duration: Duration::ZERO,
            runtime: None,
            stack_hash_key,
            go: None,
        }
    }

    /// The thread's user and kernel stacks as (id, frames), keyed as the kernel keys stacks.
    pub fn stacks(&self) -> impl Iterator<Item = (StackId, &[u64])> {
        let goroutines = match &self.go {
            Some(GoRead::Read(go)) => &go.goroutines[..],
            _ => &[],
        };
        self.threads
            .iter()
            .flat_map(|t| [(self.stack_id(&t.user), &t.user[..]), (self.stack_id(&t.kernel), &t.kernel[..])])
            .chain(goroutines.iter().map(|g| (self.stack_id(&g.frames), &g.frames[..])))
    }

    /// Applies what reading the process's interpreted frames gave
    /// ([`crate::runtimes::Readers::take_back`]): only walked threads keep theirs, and a
    /// failed or cut-short reading takes every thread's away (none rather than some of them).
    pub fn apply_runtime(&mut self, mut read: DumpRead) {
        let stand = read.frames_stand();
        for thread in &mut self.threads {
            if !stand || thread.source != StackSource::Walked {
                thread.interpreted.clear();
            }
            read.count(thread.tid.0, thread.interpreted.len());
        }
        let dumped: Vec<u32> = self.threads.iter().map(|t| t.tid.0).collect();
        self.runtime = Some(read.summary(&dumped));
    }

    /// The key of a stack: the kernel's hash of its frames (see `profiler_common::stack`), so
    /// a stack walked here and the same one sampled in the kernel are one stack.
    pub fn stack_id(&self, frames: &[u64]) -> StackId {
        if frames.is_empty() {
            return StackId::NONE;
        }
        StackId(stack_hash(self.stack_hash_key, frames))
    }
}

/// A thread walked in one round, and the record it was walked from.
struct Walked {
    record: ThreadRecord,
    user: Vec<u64>,
    truncated: bool,
    source: StackSource,
    /// Its interpreted frames, read in the same round (before the round's check).
    interpreted: Vec<RuntimeFrame>,
}

/// What a dump's walk gave ([`DumpJob::run`]): the dump, and the runtime's reading back,
/// for the caller to finish.
pub type DumpOutcome<'a> = (ebpf::Result<ThreadDump>, Option<DumpReader<'a>>);

/// Why a dump's walk could not be prepared, and its runtime's reading, given back.
pub type Unprepared<'a> = Box<(ebpf::Error, Option<DumpReader<'a>>)>;

/// What one dump's walk needs, taken from the session on the thread that owns it, so that
/// the walk itself (the iterator's reads, the stacks', `/proc`'s and the interpreted frames')
/// may run on another: with a `'static` runtime's reading (or none) it is `Send`.
pub struct DumpJob<'a> {
    pid: Pid,
    view: UnwindView,
    iterator: ThreadIterator,
    stack_hash_key: u64,
    /// The process's interpreted frames, read in each round (a process that runs one).
    runtime: Option<DumpReader<'a>>,
}

impl<'a> DumpJob<'a> {
    /// Takes what the walk of `pid`'s threads needs. The process must be registered with the
    /// unwinder for its frames to be stepped with tables (otherwise with frame pointers, as
    /// the kernel would), and its tables must stay loaded until the walk ends. On failure the
    /// runtime's reading is given back.
    pub fn prepare(session: &Session, pid: Pid, runtime: Option<DumpReader<'a>>) -> Result<Self, Unprepared<'a>> {
        let parts = session.unwind_view(pid).and_then(|view| Ok((view, session.thread_iterator()?)));
        match parts {
            Ok((view, iterator)) => {
                Ok(DumpJob { pid, view, iterator, stack_hash_key: session.stack_hash_key(), runtime })
            }
            Err(err) => Err(Box::new((err, runtime))),
        }
    }

    /// The process dumped.
    pub fn pid(&self) -> Pid {
        self.pid
    }

    /// Walks every thread. With a runtime's reading, each round reads the walked threads'
    /// interpreted frames after their native stacks and before the check, so both are of
    /// the same moment. Gives the reading back for the caller to finish
    /// ([`crate::runtimes::Readers::take_back`]).
    pub fn run(mut self) -> DumpOutcome<'a> {
        let dump = self.walk();
        (dump, self.runtime)
    }

    fn walk(&mut self) -> ebpf::Result<ThreadDump> {
        let (pid, started) = (self.pid, Instant::now());
        let mut dump = ThreadDump::begin(pid, self.stack_hash_key);
        slow_down_for_tests();
        let mut records = self.iterator.read(pid)?;
        dump.invisible = records.iter().filter(|r| r.tid == 0).count() as u64;
        records.retain(|r| r.tid != 0);
        dump.left_out = keep_lowest(&mut records, MAX_THREADS_WALKED);
        let mut settled: BTreeMap<u32, Walked> = BTreeMap::new();
        for attempt in 1..=ATTEMPTS {
            let walked = self.round(&records, &mut dump.walk);
            let now: BTreeMap<u32, ThreadRecord> = self.iterator.read(pid)?.into_iter().map(|r| (r.tid, r)).collect();
            records = settle(walked, &now, attempt, &mut dump, &mut settled);
            if records.is_empty() {
                break;
            }
        }
        let stacks = thread_stacks(&settled);
        for (_, thread) in settled {
            match finish(pid, thread) {
                Some(thread) => dump.threads.push(thread),
                None => dump.exited += 1,
            }
        }
        dump.go = match crate::runtimes::go::read(pid, &stacks) {
            GoRead::NotGo => None,
            read => Some(read),
        };
        dump.duration = started.elapsed();
        Ok(dump)
    }

    /// Walks `records`' threads, then reads the interpreted frames of those walked.
    fn round(&mut self, records: &[ThreadRecord], counts: &mut WalkCounts) -> Vec<Walked> {
        let mut walked: Vec<Walked> = records.iter().map(|r| walk_one(self.pid, &self.view, r, counts)).collect();
        if let Some(runtime) = self.runtime.as_mut() {
            let tids: Vec<u32> =
                walked.iter().filter(|w| w.source == StackSource::Walked).map(|w| w.record.tid).collect();
            let mut frames = if tids.is_empty() { Default::default() } else { runtime.read(&tids) };
            for thread in &mut walked {
                thread.interpreted = frames.remove(&thread.record.tid).unwrap_or_default();
            }
        }
        walked
    }
}

/// Checks one round's walks against the records read after it (`now`): a thread that held
/// still is settled, one that moved is walked again (returned) or, at the last attempt,
/// settled as moving; one gone is counted exited.
fn settle(
    walked: Vec<Walked>,
    now: &BTreeMap<u32, ThreadRecord>,
    attempt: usize,
    dump: &mut ThreadDump,
    settled: &mut BTreeMap<u32, Walked>,
) -> Vec<ThreadRecord> {
    let mut again = Vec::new();
    for mut thread in walked {
        match now.get(&thread.record.tid) {
            None => dump.exited += 1,
            Some(check) if still(&thread.record, check) => {
                settled.insert(thread.record.tid, thread);
            }
            Some(check) if attempt < ATTEMPTS => {
                dump.rewalked += 1;
                again.push(*check);
            }
            Some(_) => {
                if thread.source == StackSource::Walked {
                    thread.source = StackSource::Moving;
                }
                settled.insert(thread.record.tid, thread);
            }
        }
    }
    again
}

/// A test hook: `PROFILER_TEST_DUMP_DELAY_MS` makes every dump's walk that much slower, so
/// that an end-to-end test can show what the daemon does while a dump is slow (as one of a
/// process with many threads or a deep interpreted program is on a loaded machine).
fn slow_down_for_tests() {
    let delay = std::env::var("PROFILER_TEST_DUMP_DELAY_MS").ok().and_then(|ms| ms.parse().ok());
    if let Some(ms) = delay {
        std::thread::sleep(Duration::from_millis(ms));
    }
}

/// Keeps the `max` records of the lowest thread ids; returns how many were dropped.
fn keep_lowest(records: &mut Vec<ThreadRecord>, max: usize) -> u64 {
    let dropped = records.len().saturating_sub(max);
    if dropped > 0 {
        records.sort_unstable_by_key(|r| r.tid);
        records.truncate(max);
    }
    dropped as u64
}

/// Whether a thread stayed where it was between two records: off the CPU, without a context
/// switch, with the same saved registers.
fn still(before: &ThreadRecord, after: &ThreadRecord) -> bool {
    before.on_cpu == 0
        && after.on_cpu == 0
        && before.switches == after.switches
        && (before.ip, before.sp, before.bp) == (after.ip, after.sp, after.bp)
}

fn walk_one(pid: Pid, view: &UnwindView, record: &ThreadRecord, counts: &mut WalkCounts) -> Walked {
    let (user, truncated, source) = if record.on_cpu != 0 {
        (Vec::new(), false, StackSource::Running)
    } else if record.regs_valid == 0 || record.ip == 0 || record.ip >= profiler_common::walk::USER_ADDR_LIMIT {
        (Vec::new(), false, StackSource::None)
    } else {
        let (frames, truncated) = walk::walk(pid, view, Regs::interrupted(record.ip, record.sp, record.bp), counts);
        (frames, truncated, StackSource::Walked)
    };
    Walked { record: *record, user, truncated, source, interpreted: Vec::new() }
}

/// What the walks found of each thread, for the goroutines running on them: the frames of
/// a walked thread, the saved registers of one on a CPU.
fn thread_stacks(settled: &BTreeMap<u32, Walked>) -> std::collections::HashMap<u32, ThreadStack> {
    settled
        .iter()
        .filter_map(|(&tid, thread)| match thread.source {
            StackSource::Walked | StackSource::Moving if !thread.user.is_empty() => {
                Some((tid, ThreadStack::Walked(thread.user.clone())))
            }
            StackSource::Running if thread.record.regs_valid != 0 => {
                let r = &thread.record;
                Some((tid, ThreadStack::OnCpu { pc: r.ip, sp: r.sp, bp: r.bp }))
            }
            _ => None,
        })
        .collect()
}

/// Adds what `/proc` says; `None` when the thread is gone.
fn finish(pid: Pid, thread: Walked) -> Option<DumpedThread> {
    let tid = Tid(thread.record.tid);
    let facts = procfs::read(pid, tid).ok()?;
    let syscall = (thread.record.syscall >= 0 && thread.record.on_cpu == 0).then_some(thread.record.syscall);
    Some(DumpedThread {
        tid,
        facts,
        syscall,
        user: thread.user,
        truncated: thread.truncated,
        kernel: thread.record.kernel_frames().to_vec(),
        source: thread.source,
        interpreted: thread.interpreted,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(tid: u32) -> ThreadRecord {
        // SAFETY: `ThreadRecord` is plain integers; all zeros is a valid value.
        ThreadRecord { tid, ..unsafe { std::mem::zeroed() } }
    }

    #[test]
    fn a_dump_walks_the_lowest_thread_ids_up_to_the_cap() {
        let mut records: Vec<ThreadRecord> = [9, 3, 7, 1, 5].into_iter().map(record).collect();
        assert_eq!(keep_lowest(&mut records, 3), 2);
        assert_eq!(records.iter().map(|r| r.tid).collect::<Vec<_>>(), [1, 3, 5]);
        let mut few: Vec<ThreadRecord> = [4, 2].into_iter().map(record).collect();
        assert_eq!(keep_lowest(&mut few, 3), 0);
        assert_eq!(few.iter().map(|r| r.tid).collect::<Vec<_>>(), [4, 2], "untouched under the cap");
    }
}
