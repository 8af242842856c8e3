//! The `threads` kind, Go's goroutine profile for any process: every thread at one moment
//! (`goroutine/count`), one sample per thread, labelled `tid`, `thread` (its name), `state`
//! (`R`, `S`, `D`, …), `syscall`, `wchan` and `stack` (where its user stack comes from). The
//! file is named after its kind, as every `profiles/<kind>.rs` is; the thread dump it shows
//! is taken in [`crate::thread_dump`].
//!
//! A point-in-time kind, like the heap's `inuse`: batches add nothing to it but, for each
//! thread, the stacks of its latest CPU samples (a thread on a CPU when it is dumped has
//! stale saved registers, and is shown with those instead, marked). The dump itself
//! ([`ThreadDump`], taken by `Capture::thread_dump`) is put in the counts right before they
//! are rendered ([`ThreadState::dump`]).
//!
//! In a process that runs an interpreter the profiler reads ([`crate::runtimes`]), each
//! walked thread's interpreted frames take the place of the interpreter loop's native frames
//! once the stack is symbolized ([`merge_interpreted`], by the runtime's rule in
//! [`crate::resolve::interpreted`]), under a mapping of their own.
//!
//! In a Go process whose goroutines were read ([`crate::runtimes::go`]), the samples are its
//! goroutines instead, as Go's own goroutine profile has them
//! ([`super::goroutines`]), unless the OS threads were asked for
//! ([`ThreadState::os_threads`], `?threads=os`).

use std::{
    collections::{HashMap, HashSet},
    sync::Arc,
    time::{Duration, Instant},
};

use super::{goroutines as go_profile, unwind_comment, Context, Counts, ProcessCounts};
use crate::{
    ebpf::{Batch, Counters},
    ids::{StackId, Tid},
    pprof::Shape,
    resolve::{LabelValue, ResolvedProfile, StackSample},
    runtimes::{
        go::{GoDump, GoRead},
        DumpSummary, RuntimeFrame,
    },
    thread_dump::{DumpedThread, StackSource, ThreadDump},
};

/// How long a thread's latest CPU sample stands for it when it is found running.
const CPU_SAMPLE_KEPT: Duration = Duration::from_secs(10);

/// The stacks of a thread's latest CPU samples: the most frequent of the last drained batch
/// that had any.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CpuSighting {
    pub user_stack: StackId,
    pub kernel_stack: StackId,
    /// Samples of that stack in its batch.
    pub count: u64,
    /// When the batch was drained.
    pub drained: Instant,
}

/// One process's part: its latest CPU stacks per thread, and the dump to render.
#[derive(Clone, Debug, Default)]
pub struct ThreadState {
    pub on_cpu: HashMap<Tid, CpuSighting>,
    /// Set right before rendering; never by a batch.
    pub dump: Option<Arc<ThreadDump>>,
    /// Show a Go process's OS threads, not its goroutines (set with [`Self::dump`]).
    pub os_threads: bool,
}

impl ThreadState {
    /// The goroutines to show instead of the threads: a Go process's, read, unless the OS
    /// threads were asked for.
    pub fn goroutines(&self) -> Option<&GoDump> {
        match self.dump.as_ref()?.go.as_ref()? {
            GoRead::Read(go) if !self.os_threads => Some(go),
            _ => None,
        }
    }
}

pub(super) fn count(batch: &Batch, counts: &mut Counts) {
    let now = Instant::now();
    let mut best: HashMap<(crate::ids::Pid, Tid), CpuSighting> = HashMap::new();
    for s in &batch.cpu {
        let seen = CpuSighting { user_stack: s.user_stack, kernel_stack: s.kernel_stack, count: s.count, drained: now };
        let entry = best.entry((s.pid, s.tid)).or_insert(seen);
        if s.count > entry.count {
            *entry = seen;
        }
    }
    for ((pid, tid), seen) in best {
        counts.process_mut(pid).threads.on_cpu.insert(tid, seen);
    }
    for (_, process) in counts.iter_mut() {
        process.threads.on_cpu.retain(|_, s| now.duration_since(s.drained) < CPU_SAMPLE_KEPT);
    }
}

pub(super) fn stacks(state: &ThreadState, out: &mut HashSet<StackId>) {
    out.extend(state.on_cpu.values().flat_map(|s| [s.user_stack, s.kernel_stack]));
    if let Some(dump) = &state.dump {
        out.extend(dump.stacks().map(|(id, _)| id));
    }
}

pub(super) const SHAPE: Shape = Shape {
    sample_types: &[("goroutine", "count")],
    period_type: ("goroutine", "count"),
    period: 1,
    default_sample_type: "goroutine",
};

/// One sample per thread of the dump, by thread id.
pub(super) fn samples(state: &ThreadState) -> Vec<StackSample> {
    let Some(dump) = &state.dump else { return Vec::new() };
    if let Some(go) = state.goroutines() {
        return go_profile::samples(go, |frames| dump.stack_id(frames));
    }
    dump.threads.iter().map(|thread| sample(dump, thread, state.on_cpu.get(&thread.tid))).collect()
}

fn sample(dump: &ThreadDump, thread: &DumpedThread, cpu: Option<&CpuSighting>) -> StackSample {
    let (mut user_stack, mut kernel_stack) = (dump.stack_id(&thread.user), dump.stack_id(&thread.kernel));
    // A thread stopped in the kernel entered it by a syscall, mostly (eu-stack and the block
    // profile show its pc as the syscall's return point); a CPU sample's leaf is exact.
    let mut in_syscall = kernel_stack != StackId::NONE;
    let source = match (thread.source, cpu) {
        (StackSource::Running, Some(cpu)) => {
            // The saved kernel stack of a running thread is as stale as its registers.
            (user_stack, kernel_stack) = (cpu.user_stack, cpu.kernel_stack);
            in_syscall = false;
            format!("cpu sample {:.1}s before", cpu.drained.elapsed().as_secs_f64())
        }
        (StackSource::Running, None) => {
            kernel_stack = StackId::NONE;
            "running, no cpu sample".into()
        }
        (StackSource::Walked, _) => "walked".into(),
        (StackSource::Moving, _) => "walked while it ran".into(),
        (StackSource::None, _) => "no user registers".into(),
    };
    let text = |s: &str| LabelValue::Str(s.to_string());
    let mut labels = vec![
        ("tid", LabelValue::Num(i64::from(thread.tid.0), None)),
        ("thread", text(&thread.facts.name)),
        ("state", text(&thread.facts.state.to_string())),
    ];
    if let Some(name) = thread.syscall_name() {
        labels.push(("syscall", LabelValue::Str(name)));
    }
    if let Some(wchan) = &thread.facts.wchan {
        labels.push(("wchan", text(wchan)));
    }
    labels.push(("stack", LabelValue::Str(source)));
    StackSample {
        user_stack,
        kernel_stack,
        user_leaf_is_return: in_syscall,
        values: vec![1],
        unscaled: Vec::new(),
        labels,
    }
}

/// Puts each walked thread's interpreted frames in place of its interpreter loop's
/// locations (see [`crate::resolve::interpreted`]), by the sample's `tid` label.
pub(super) fn merge_interpreted(resolved: &mut ResolvedProfile, state: &ThreadState) {
    let Some(dump) = &state.dump else { return };
    if state.goroutines().is_some() {
        go_profile::take_creators(resolved);
        return;
    }
    let Some(runtime) = dump.runtime.as_ref().map(DumpSummary::runtime) else { return };
    let threads: HashMap<i64, &DumpedThread> =
        dump.threads.iter().filter(|t| !t.interpreted.is_empty()).map(|t| (i64::from(t.tid.0), t)).collect();
    if threads.is_empty() {
        return;
    }
    let per_sample: Vec<&[RuntimeFrame]> = resolved
        .samples
        .iter()
        .map(|sample| {
            let tid = sample.labels.iter().find_map(|(k, v)| match v {
                LabelValue::Num(n, _) if *k == "tid" => Some(*n),
                _ => None,
            });
            tid.and_then(|tid| threads.get(&tid)).map_or(&[][..], |t| &t.interpreted[..])
        })
        .collect();
    crate::resolve::interpreted::merge(resolved, runtime, &per_sample);
}

pub(super) fn comments(context: Context, counters: &Counters, counts: &ProcessCounts) -> Vec<String> {
    let mut lines = vec![format!(
        "profiler {} threads profile: every thread of the process at one moment, read without stopping it \
         (a BPF task iterator for registers and kernel stacks, process_vm_readv for user stacks); {}",
        env!("CARGO_PKG_VERSION"),
        context.describe()
    )];
    if let Some(dump) = &counts.threads.dump {
        let running = dump.threads.iter().filter(|t| t.source == StackSource::Running).count();
        let moving = dump.threads.iter().filter(|t| t.source == StackSource::Moving).count();
        lines.push(format!(
            "{} threads in {:.1} ms; {running} on a CPU (saved registers stale: their latest CPU sample's stacks \
             if any); skipped: {} exited during the dump, {} outside the profiler's pid namespace; walks redone \
             because the thread ran meanwhile {}, still moving after the last {moving}",
            dump.threads.len(),
            dump.duration.as_secs_f64() * 1e3,
            dump.exited,
            dump.invisible,
            dump.rewalked,
        ));
        if dump.left_out > 0 {
            lines.push(format!(
                "{} threads left out: a dump walks the {} of the lowest thread ids",
                dump.left_out,
                crate::thread_dump::MAX_THREADS_WALKED
            ));
        }
        lines.push(walk_comment(dump));
        lines.extend(dump.runtime.as_ref().map(DumpSummary::describe));
        match (&dump.go, counts.threads.goroutines()) {
            (_, Some(go)) => {
                lines.push(format!("samples are goroutines, as Go's own goroutine profile: {}", go.describe()))
            }
            (Some(GoRead::Read(go)), None) => {
                lines.push(format!("samples are OS threads (threads=os); {}", go.describe()))
            }
            (Some(GoRead::Fallback(why)), _) => lines.push(why.clone()),
            _ => {}
        }
    }
    lines.push(unwind_comment(counters));
    lines
}

/// How the dump's user stacks were walked (the kernel walker's counters, for this dump).
fn walk_comment(dump: &ThreadDump) -> String {
    use profiler_common::UnwindCounter as U;
    let w = &dump.walk;
    format!(
        "this dump's user stacks: frames by unwind table {}, by frame pointer {} (no table because: process not \
         registered {}, address in no known mapping {}, file has no table loaded {}, no CFI for the address {}); \
         leaves guessed {}; signal frames {}; walks ended at the outermost frame {}, at an unreadable stack word \
         {}, at a bad frame {}",
        w.get(U::CfiFrames),
        w.get(U::FramePointerFrames),
        w.get(U::NoProcess),
        w.get(U::NoMapping),
        w.get(U::NoTable),
        w.get(U::NoCfi),
        w.get(U::LeafGuesses),
        w.get(U::SignalFrames),
        w.get(U::EndOfStack),
        w.get(U::BadRead),
        w.get(U::BadFrame),
    )
}

#[cfg(test)]
mod tests {
    use std::time::SystemTime;

    use super::*;
    use crate::{
        ebpf::RawCpuSample,
        ids::Pid,
        thread_dump::{procfs::ThreadFacts, WalkCounts},
    };

    fn thread(tid: u32, source: StackSource, user: Vec<u64>) -> DumpedThread {
        DumpedThread {
            tid: Tid(tid),
            facts: ThreadFacts { name: format!("t{tid}"), state: 'S', wchan: Some("futex_wait_queue".into()) },
            syscall: Some(202),
            user,
            truncated: false,
            kernel: vec![0xffff_ffff_8100_0000],
            source,
            interpreted: Vec::new(),
        }
    }

    fn dump(threads: Vec<DumpedThread>) -> Arc<ThreadDump> {
        Arc::new(ThreadDump {
            pid: Pid(3),
            taken: SystemTime::now(),
            threads,
            exited: 1,
            rewalked: 0,
            invisible: 0,
            left_out: 0,
            walk: WalkCounts::default(),
            duration: Duration::from_millis(2),
            runtime: None,
            stack_hash_key: 0x5eed,
            go: None,
        })
    }

    #[test]
    fn one_sample_per_thread_with_its_labels() {
        let dump = dump(vec![thread(7, StackSource::Walked, vec![1, 2])]);
        let state = ThreadState { on_cpu: HashMap::new(), dump: Some(dump.clone()), os_threads: false };
        let samples = samples(&state);
        assert_eq!(samples.len(), 1);
        let s = &samples[0];
        // The id the kernel gives the stack with the session's key.
        let id = StackId(profiler_common::stack::stack_hash(dump.stack_hash_key, &[1, 2]));
        assert_eq!((s.values.clone(), s.user_stack), (vec![1], id));
        let label = |key| s.labels.iter().find(|(k, _)| *k == key).map(|(_, v)| v.clone());
        assert_eq!(label("tid"), Some(LabelValue::Num(7, None)));
        assert_eq!(label("syscall"), Some(LabelValue::Str("futex".into())));
        assert_eq!(label("wchan"), Some(LabelValue::Str("futex_wait_queue".into())));
        assert_eq!(label("state"), Some(LabelValue::Str("S".into())));
        assert_eq!(label("stack"), Some(LabelValue::Str("walked".into())));
    }

    #[test]
    fn a_running_thread_takes_its_latest_cpu_sample() {
        let batch = Batch {
            cpu: [(StackId(10), 2), (StackId(11), 5)]
                .map(|(user, count)| RawCpuSample {
                    pid: Pid(3),
                    tid: Tid(8),
                    comm: "busy".into(),
                    user_stack: user,
                    kernel_stack: StackId::NONE,
                    labels: crate::ebpf::LabelsId::NONE,
                    count,
                })
                .to_vec(),
            ..Batch::default()
        };
        let mut counts = Counts::default();
        count(&batch, &mut counts);
        let mut state = counts.process(Pid(3)).unwrap().threads.clone();
        assert_eq!(state.on_cpu[&Tid(8)].user_stack, StackId(11), "the most frequent of the batch");
        state.dump = Some(dump(vec![thread(8, StackSource::Running, vec![]), thread(9, StackSource::Running, vec![])]));
        let samples = samples(&state);
        assert_eq!(samples[0].user_stack, StackId(11));
        assert_eq!(samples[1].user_stack, StackId::NONE, "no sample: no stack");
        assert_eq!(samples[1].kernel_stack, StackId::NONE, "a running thread's saved kernel stack is stale");
    }

    #[test]
    fn python_runs_replace_the_loop_frames_in_order_and_share_locations() {
        use crate::{
            resolve::{LocationInfo, ResolvedSample},
            runtimes::cpython::{self, PythonStatus, EVAL_FUNCTION, MAPPING as PYTHON_MAPPING},
            symbolize::Frame,
        };
        let py = |name: &str, line, entry| RuntimeFrame { qualname: name.into(), filename: "a.py".into(), line, entry };
        let mut walked = thread(7, StackSource::Walked, vec![]);
        // Leaf first: two activations, [inner] and [outer, <module>].
        walked.interpreted = vec![py("inner", 3, true), py("outer", 9, false), py("<module>", 12, true)];
        let mut other = thread(8, StackSource::Walked, vec![]);
        other.interpreted = vec![py("outer", 9, true)];
        let mut taken = Arc::try_unwrap(dump(vec![walked, other])).expect("one owner");
        let read = PythonStatus::Read { version: (3, 12), path: "python3.12".into() };
        taken.runtime = Some(DumpSummary::CPython(cpython::summary(read)));
        let state = ThreadState { on_cpu: HashMap::new(), dump: Some(Arc::new(taken)), os_threads: false };
        let native = |function: &str| LocationInfo {
            address: 0x1000,
            mapping: None,
            frames: vec![Frame { function: function.into(), file: None, line: 0, offset: 0 }],
        };
        let sample = |tid, locations| ResolvedSample {
            locations,
            values: vec![1],
            unscaled: vec![],
            labels: vec![("tid", LabelValue::Num(tid, None))],
        };
        let mut resolved = ResolvedProfile {
            locations: vec![native("read"), native(EVAL_FUNCTION), native("sorted"), native("main")],
            samples: vec![
                sample(7, vec![0, 1, 2, 1, 3]),
                sample(8, vec![0, 1, 1]),
                sample(9, vec![1]),
                sample(7, vec![0, 1, 2]),
            ],
            ..ResolvedProfile::default()
        };
        merge_interpreted(&mut resolved, &state);
        let names = |s: usize| -> Vec<String> {
            resolved.samples[s].locations.iter().map(|&l| resolved.locations[l].frames[0].function.clone()).collect()
        };
        assert_eq!(names(0), ["read", "inner", "sorted", "outer", "<module>", "main"]);
        assert_eq!(names(1), ["read", "outer", EVAL_FUNCTION], "a loop frame without a run stays native");
        let label = |s: usize| resolved.samples[s].labels.iter().find(|(k, _)| *k == "python").map(|(_, v)| v.clone());
        assert_eq!(label(1), None);
        assert_eq!(names(2), [EVAL_FUNCTION], "a thread without Python frames is untouched");
        assert_eq!(names(3), ["read", "inner", "sorted"], "a native walk cut short");
        assert_eq!(label(3), Some(LabelValue::Str("2 outer Python frames not placed".into())));
        assert_eq!(resolved.samples[0].locations[3], resolved.samples[1].locations[1], "same frame, same location");
        let python = resolved.mappings.iter().position(|m| m.path == PYTHON_MAPPING).expect("the Python mapping");
        let location = &resolved.locations[resolved.samples[0].locations[1]];
        assert_eq!(location.mapping, Some(python));
        assert_eq!((location.frames[0].file.as_deref(), location.frames[0].line), (Some("a.py"), 3));
        assert_eq!(resolved.mappings[python].limit - resolved.mappings[python].start, 3, "three distinct frames");
    }
}
