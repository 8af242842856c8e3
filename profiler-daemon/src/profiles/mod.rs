//! What each profile kind is. One file per kind (`cpu`, `heap`, `block`, `mutex`,
//! `threadcreate`, `threads`, `offcpu`) owns its slice of a drained batch, its counts, its
//! pprof shape, its samples and values, its leaf rule, its comment, its labels and its
//! headline; the rest of the daemon reaches a kind only through the one delegating `match`
//! per hook below. [`ProfileKind`] and [`View`] (the endpoint names) are in [`kind`].
//!
//! The other files serve several kinds: [`contention`] is what block and mutex share and
//! [`primitive`] their `primitive` label; [`counts`] holds every kind's counts per process,
//! [`exited`] and [`evicted`] bound them.

mod block;
mod contention;
mod counts;
mod cpu;
mod evicted;
pub mod exited;
mod goroutines;
pub mod heap;
mod mutex;
mod offcpu;
mod primitive;
mod threadcreate;
mod threads;

use std::collections::HashSet;

pub use crate::kind::{ProfileKind, View};
pub use contention::{WaitCount, WaitCounts, WaitSite};
pub use counts::{Counts, ProcessCounts};
pub use cpu::{CpuCounts, SampleKey};
pub use heap::{HeapCount, HeapCounts, HeapSite};
pub use offcpu::OffCpuCounts;
pub use threadcreate::ThreadCounts;
pub use threads::{CpuSighting, ThreadState};

use crate::{
    catalog::Sighting,
    config::Config,
    ebpf::{Batch, Counters},
    ids::StackId,
    pprof::{Shape, TextFormat},
    resolve::{ResolvedProfile, StackSample},
};

/// Settings that shape profiles, from the configuration or the snapshot's flags (both through
/// [`Config`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Settings {
    /// CPU samples per second per CPU.
    pub frequency_hz: u32,
    /// Mean bytes between heap samples.
    pub heap_sample_bytes: u64,
    /// The off-CPU profile's rate: intervals off a CPU at least this long are always
    /// recorded, shorter ones with probability length/rate (0 or 1: every one).
    pub offcpu_rate_ns: u64,
    /// On kernels without `sched_exit_tp`: the off-CPU profile records 1 in this many context
    /// switches (1: every one).
    pub offcpu_sample_every: u32,
    /// The block profile's rate: waits at least this long are always recorded, shorter ones
    /// with probability length/rate (0 or 1: every wait).
    pub block_rate_ns: u64,
    /// The mutex profile records 1 in this many contention events, values scaled by it.
    pub mutex_fraction: u32,
}

/// The one way settings are made: from a validated [`Config`], the daemon's (its file and
/// flags) or the snapshot's (its flags over the built-in defaults), so both drivers shape
/// profiles from the same values by the same rule.
impl From<&Config> for Settings {
    fn from(config: &Config) -> Self {
        let nanos = |duration: std::time::Duration| u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX);
        Self {
            frequency_hz: config.cpu.frequency_hz,
            heap_sample_bytes: config.heap.sample_bytes,
            offcpu_rate_ns: nanos(config.offcpu.rate),
            offcpu_sample_every: config.offcpu.sample_every,
            block_rate_ns: nanos(config.contention.block_rate),
            mutex_fraction: config.contention.mutex_fraction,
        }
    }
}

/// Which capture a profile comes from, for its comment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Context {
    /// `profiler snapshot`.
    Snapshot,
    /// A daemon interval dump: values are for the interval.
    Interval,
    /// A socket query.
    Query,
}

impl Context {
    fn describe(self) -> &'static str {
        match self {
            Context::Snapshot => "snapshot",
            Context::Interval => "daemon interval dump: values are for the interval",
            Context::Query => "daemon query",
        }
    }
}

/// The kernel programs that feed a kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Source {
    /// The perf_event program on every CPU's clock.
    CpuClock,
    /// Allocator uprobes, attached to chosen processes only.
    HeapProbes,
    /// The futex syscall tracepoints (block and mutex share them).
    Futex,
    /// `task:task_newtask`.
    ThreadCreation,
    /// The task iterator of thread dumps (read on demand, attached to nothing).
    TaskIterator,
    /// The scheduler's `sched_switch` (BTF tracepoint).
    Switches,
}

impl Source {
    pub const ALL: [Source; 6] = [
        Source::CpuClock,
        Source::HeapProbes,
        Source::Futex,
        Source::ThreadCreation,
        Source::TaskIterator,
        Source::Switches,
    ];

    /// The sources `kinds` need, each once, in [`Source::ALL`]'s order (the order they are
    /// attached in).
    pub fn of_kinds(kinds: &[ProfileKind]) -> impl Iterator<Item = Source> + '_ {
        Self::ALL.into_iter().filter(|source| kinds.iter().any(|kind| kind.source() == *source))
    }

    /// The kernel programs this source loads, by their names in the object: the one list a
    /// driver reads them from (`profiler snapshot --bpf-stats` reports each one's cost).
    pub fn programs(self) -> &'static [&'static str] {
        use profiler_common::programs as p;
        match self {
            Self::CpuClock => &[p::CPU_SAMPLE],
            Self::HeapProbes => &p::HEAP,
            Self::Futex => &p::FUTEX,
            Self::ThreadCreation => &[p::THREAD_CREATE],
            Self::TaskIterator => &[p::THREAD_DUMP],
            Self::Switches => {
                &[p::OFFCPU_SWITCH, p::OFFCPU_SWITCH_IN, p::OFFCPU_EMPTY_SWITCH, p::OFFCPU_EMPTY_SWITCH_IN]
            }
        }
    }
}

/// The number a snapshot's summary shows for a profile: which sample value, and its name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Headline {
    pub value_index: usize,
    pub what: &'static str,
}

impl ProfileKind {
    /// The kernel programs that feed this kind.
    pub fn source(self) -> Source {
        match self {
            Self::Cpu => Source::CpuClock,
            Self::Heap => Source::HeapProbes,
            Self::Block | Self::Mutex => Source::Futex,
            Self::ThreadCreate => Source::ThreadCreation,
            Self::Threads => Source::TaskIterator,
            Self::OffCpu => Source::Switches,
        }
    }

    /// Adds this kind's part of a drained batch.
    fn count(self, batch: &Batch, counts: &mut Counts) {
        match self {
            Self::Cpu => cpu::count(batch, counts),
            Self::Heap => heap::count(batch, counts),
            Self::Block => block::count(batch, counts),
            Self::Mutex => mutex::count(batch, counts),
            Self::ThreadCreate => threadcreate::count(batch, counts),
            Self::Threads => threads::count(batch, counts),
            Self::OffCpu => offcpu::count(batch, counts),
        }
    }

    /// The processes and stacks this kind's part of a batch names.
    fn sightings<'a>(self, batch: &'a Batch, out: &mut Vec<Sighting<'a>>) {
        match self {
            Self::Cpu => cpu::sightings(batch, out),
            Self::Heap => heap::sightings(batch, out),
            Self::Block => block::sightings(batch, out),
            Self::Mutex => mutex::sightings(batch, out),
            Self::ThreadCreate => threadcreate::sightings(batch, out),
            Self::OffCpu => offcpu::sightings(batch, out),
            // Its stacks are the CPU samples' (already named) and the dump's (learned when
            // it is taken).
            Self::Threads => {}
        }
    }

    /// The stacks this kind's counts reference.
    fn stacks(self, counts: &ProcessCounts, out: &mut HashSet<StackId>) {
        match self {
            Self::Cpu => cpu::stacks(&counts.cpu, out),
            Self::Heap => heap::stacks(&counts.heap, out),
            Self::Block => block::stacks(counts, out),
            Self::Mutex => mutex::stacks(counts, out),
            Self::ThreadCreate => threadcreate::stacks(&counts.threadcreate, out),
            Self::Threads => threads::stacks(&counts.threads, out),
            Self::OffCpu => offcpu::stacks(&counts.offcpu, out),
        }
    }

    /// Events of this kind in `counts`: CPU samples, sampled allocations, waits, threads
    /// created, threads dumped.
    pub fn events(self, counts: &ProcessCounts) -> u64 {
        match self {
            Self::Cpu => counts.cpu.total,
            Self::Heap => counts.heap.samples(),
            Self::Block => counts.block.waits(),
            Self::Mutex => counts.mutex.waits(),
            Self::ThreadCreate => counts.threadcreate.total(),
            Self::Threads => match counts.threads.goroutines() {
                Some(go) => go.goroutines.len() as u64,
                None => counts.threads.dump.as_ref().map_or(0, |d| d.threads.len() as u64),
            },
            Self::OffCpu => counts.offcpu.switches(),
        }
    }

    /// The pprof header: sample types and period.
    pub fn shape(self, settings: &Settings) -> Shape {
        match self {
            Self::Cpu => cpu::shape(settings),
            Self::Heap => heap::shape(settings),
            Self::Block | Self::Mutex => contention::SHAPE,
            Self::ThreadCreate => threadcreate::SHAPE,
            Self::Threads => threads::SHAPE,
            Self::OffCpu => offcpu::shape(settings),
        }
    }

    /// The samples of one process, with their values and labels, before symbolization.
    pub fn samples(self, counts: &ProcessCounts, settings: &Settings) -> Vec<StackSample> {
        match self {
            Self::Cpu => cpu::samples(&counts.cpu, settings),
            Self::Heap => heap::samples(&counts.heap, settings),
            Self::Block => counts.block.samples(1),
            Self::Mutex => counts.mutex.samples(settings.mutex_fraction),
            Self::ThreadCreate => threadcreate::samples(&counts.threadcreate),
            Self::Threads => threads::samples(&counts.threads),
            Self::OffCpu => offcpu::samples(&counts.offcpu, settings),
        }
    }

    /// What needs the symbolized frames: labels (block and mutex: `primitive`), the mutex
    /// profile's locks-only rule, and the thread dump's interpreted frames in place of the
    /// interpreter loop's native ones. Returns comment lines on what it left out.
    pub fn label(self, resolved: &mut ResolvedProfile, counts: &ProcessCounts) -> Vec<String> {
        match self {
            Self::Block => contention::label(resolved),
            Self::Mutex => return vec![contention::label_locks_only(resolved)],
            Self::Threads => threads::merge_interpreted(resolved, &counts.threads),
            Self::Cpu | Self::Heap | Self::ThreadCreate | Self::OffCpu => {}
        }
        Vec::new()
    }

    /// The profile comment: what a sample is and what was dropped.
    pub fn comments(
        self,
        context: Context,
        counters: &Counters,
        settings: &Settings,
        counts: &ProcessCounts,
    ) -> Vec<String> {
        match self {
            Self::Cpu => cpu::comments(context, counters, &counts.cpu),
            Self::Heap => heap::comments(context, counters, settings),
            Self::Block => block::comments(context, counters, settings),
            Self::Mutex => mutex::comments(context, counters, settings),
            Self::ThreadCreate => threadcreate::comments(context, counters),
            Self::Threads => threads::comments(context, counters, counts),
            Self::OffCpu => offcpu::comments(context, counters, settings),
        }
    }

    /// Go's text layout for the kind's `debug=1` answer (`debug=2`: the thread dump's
    /// per-thread layout, which only [`ProfileKind::Threads`] has).
    pub fn text_format(self, settings: &Settings, debug: u8) -> TextFormat {
        match self {
            // Go serves no text form of CPU profiles; ours lists the samples.
            Self::Cpu => TextFormat::Generic { name: "cpu", sample_types: cpu::shape(settings).sample_types },
            Self::Heap => TextFormat::Heap { rate: settings.heap_sample_bytes },
            Self::Block => TextFormat::Contention { mutex_period: None },
            Self::Mutex => TextFormat::Contention { mutex_period: Some(i64::from(settings.mutex_fraction.max(1))) },
            Self::ThreadCreate => TextFormat::Count { name: "threadcreate" },
            Self::Threads if debug >= 2 => TextFormat::Threads,
            Self::Threads => TextFormat::Count { name: "threads" },
            Self::OffCpu => TextFormat::Generic { name: "offcpu", sample_types: offcpu::SAMPLE_TYPES },
        }
    }

    /// What a snapshot's summary shows: CPU samples, live bytes, delay, threads.
    pub fn headline(self) -> Headline {
        match self {
            Self::Cpu => Headline { value_index: 0, what: "samples" },
            Self::Heap => Headline { value_index: 3, what: "inuse bytes" },
            Self::Block | Self::Mutex => Headline { value_index: 1, what: "delay ns" },
            Self::ThreadCreate => Headline { value_index: 0, what: "threads" },
            Self::Threads => Headline { value_index: 0, what: "threads" },
            Self::OffCpu => Headline { value_index: 1, what: "off-CPU ns" },
        }
    }
}

/// Every process and stack a drained batch names, over all kinds: what the catalogue learns
/// and what the daemon symbolizes ahead of its dump.
pub fn sightings(batch: &Batch) -> Vec<Sighting<'_>> {
    let mut out = Vec::new();
    for kind in ProfileKind::ALL {
        kind.sightings(batch, &mut out);
    }
    out
}

/// What the user-stack walker did (whole machine, since load): frames stepped with unwind
/// tables and with frame pointers, why frame pointers had to be used, and why walks stopped.
fn unwind_comment(counters: &Counters) -> String {
    use profiler_common::{Unsupported, UnwindCounter as U};
    let u = counters.unwind;
    let unsupported: Vec<String> = Unsupported::ALL
        .into_iter()
        .filter(|&r| u.unsupported(r) > 0)
        .map(|r| format!("{} {}", r.name(), u.unsupported(r)))
        .collect();
    format!(
        "user stack unwinding (whole machine): frames by unwind table {}, by frame pointer {} \
         (no table because: process not registered yet {}, address in no known mapping {}, \
         file has no table loaded {}, no CFI for the address {}); interrupted frames without CFI \
         stepped as leaves {}; signal frames {}; frames restored from uprobes {}; cgo calls crossed \
         back to their goroutine's stack {}; walks ended at the outermost frame {}, at an unreadable stack word {}, at a bad frame {}, at unsupported CFI {}",
        u.get(U::CfiFrames),
        u.get(U::FramePointerFrames),
        u.get(U::NoProcess),
        u.get(U::NoMapping),
        u.get(U::NoTable),
        u.get(U::NoCfi),
        u.get(U::LeafGuesses),
        u.get(U::SignalFrames),
        u.get(U::UprobeFrames),
        u.get(U::GoStackSwitches),
        u.get(U::EndOfStack),
        u.get(U::BadRead),
        u.get(U::BadFrame),
        if unsupported.is_empty() { "0".to_string() } else { unsupported.join(", ") },
    ) + &crate::runtimes::walks_comment(&counters.runtimes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        ebpf::{RawCpuSample, RawHeapTotals, RawOffCpu, RawThreadCount, RawWaitTotals},
        ids::{Pid, Tid},
    };

    fn batch() -> Batch {
        let wait = RawWaitTotals {
            pid: Pid(4),
            op: 0,
            outcome: 0,
            stack: StackId(15),
            count: profiler_common::WAIT_COUNT_ONE,
            delay_ns: 9,
        };
        Batch {
            cpu: vec![RawCpuSample {
                pid: Pid(1),
                tid: Tid(1),
                comm: "c".into(),
                user_stack: StackId(10),
                kernel_stack: StackId(12),
                labels: crate::ebpf::LabelsId::NONE,
                count: 1,
            }],
            heap: vec![RawHeapTotals { pid: Pid(3), stack: StackId(14), size: 8, count: 1, bytes: 8 }],
            block: vec![wait],
            mutex: vec![RawWaitTotals { stack: StackId(16), ..wait }],
            threadcreate: vec![RawThreadCount { pid: Pid(5), stack: StackId(17), count: 1 }],
            offcpu: vec![RawOffCpu {
                pid: Pid(6),
                tid: Tid(6),
                comm: "o".into(),
                state: profiler_common::OffCpuState::Blocked,
                user_stack: StackId(18),
                kernel_stack: StackId(19),
                switches: profiler_common::sampling::WEIGHT_ONE,
                off_cpu_ns: 5,
            }],
            ..Batch::default()
        }
    }

    /// 99 Hz and every event recorded (no scaling).
    fn unit_settings() -> Settings {
        Settings {
            frequency_hz: 99,
            heap_sample_bytes: 1,
            offcpu_rate_ns: 1,
            offcpu_sample_every: 1,
            block_rate_ns: 1,
            mutex_fraction: 1,
        }
    }

    #[test]
    fn every_kind_counts_its_part_and_names_its_stacks() {
        let batch = batch();
        let mut counts = Counts::default();
        counts.add(&batch);
        let settings = unit_settings();
        for (kind, pid) in [
            (ProfileKind::Cpu, 1),
            (ProfileKind::Heap, 3),
            (ProfileKind::Block, 4),
            (ProfileKind::Mutex, 4),
            (ProfileKind::ThreadCreate, 5),
            (ProfileKind::OffCpu, 6),
        ] {
            let process = counts.process(Pid(pid)).unwrap();
            assert_eq!(kind.events(process), 1, "{kind}");
            let samples = kind.samples(process, &settings);
            assert_eq!(samples.len(), 1, "{kind}");
            assert_eq!(samples[0].values.len(), kind.shape(&settings).sample_types.len(), "{kind}");
        }
        let mut stacks = HashSet::new();
        counts.stacks(&mut stacks);
        let expected: HashSet<StackId> = [10, 12, 14, 15, 16, 17, 18, 19].into_iter().map(StackId).collect();
        assert_eq!(stacks, expected);
    }

    #[test]
    fn sightings_follow_the_samples_leaf_rule() {
        let batch = batch();
        let mut counts = Counts::default();
        counts.add(&batch);
        let seen = sightings(&batch);
        assert_eq!(seen.len(), 6);
        let settings = unit_settings();
        for s in &seen {
            let process = counts.process(s.pid).unwrap();
            let sample = ProfileKind::ALL
                .into_iter()
                .flat_map(|k| k.samples(process, &settings))
                .find(|x| x.user_stack == s.user_stack)
                .unwrap();
            assert_eq!(sample.user_leaf_is_return, s.user_leaf_is_return, "{s:?}");
            assert_eq!(sample.kernel_stack, s.kernel_stack);
        }
    }

    #[test]
    fn every_program_of_the_object_belongs_to_one_source_but_the_unwinders() {
        use profiler_common::programs;
        let mut owned: Vec<&str> = Source::ALL.into_iter().flat_map(Source::programs).copied().collect();
        let count = owned.len();
        owned.sort_unstable();
        owned.dedup();
        assert_eq!(owned.len(), count, "a program listed under two sources");
        let mut rest: Vec<&str> = programs::ALL.into_iter().filter(|p| !owned.contains(p)).collect();
        rest.sort_unstable();
        // The exec programs are the walker's, loaded whatever the kinds.
        assert_eq!(rest, [programs::UNWIND_EXEC, programs::UNWIND_EXEC_DONE]);
        assert!(owned.iter().all(|p| programs::ALL.contains(p)), "a program the object does not have");
    }

    #[test]
    fn sources_of_kinds_come_once_each_in_attach_order() {
        let kinds = [ProfileKind::Mutex, ProfileKind::Cpu, ProfileKind::Block, ProfileKind::OffCpu];
        let sources: Vec<Source> = Source::of_kinds(&kinds).collect();
        assert_eq!(sources, [Source::CpuClock, Source::Futex, Source::Switches]);
        assert_eq!(Source::of_kinds(&ProfileKind::ALL).count(), Source::ALL.len(), "every source feeds a kind");
    }
}
