//! Go's CPU profile: on-CPU samples of the CPU clock by (thread, user stack, kernel stack,
//! goroutine labels), `samples/count` and `cpu/nanoseconds`, period 1e9 / frequency,
//! labelled `tid` and `thread`, and in a Go process with the running goroutine's pprof
//! labels (as Go's own CPU profile has them, so `go tool pprof -tagfocus` selects by them).

use std::collections::{HashMap, HashSet};

use super::{goroutines::intern, unwind_comment, Context, Counts, Settings};
use crate::{
    catalog::Sighting,
    ebpf::{Batch, Counters, LabelsId, RawCpuSample, RawLabels},
    ids::{StackId, Tid},
    pprof::Shape,
    resolve::{LabelValue, StackSample},
};

/// A sample's user leaf is the interrupted pc itself, not a return address.
const USER_LEAF_IS_RETURN: bool = false;

/// What CPU samples are counted under inside one process.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SampleKey {
    pub tid: Tid,
    pub user_stack: StackId,
    pub kernel_stack: StackId,
    /// The goroutine's pprof labels, in [`CpuCounts::label_sets`].
    pub labels: LabelsId,
}

/// One process's CPU samples in a window.
#[derive(Clone, Debug, Default)]
pub struct CpuCounts {
    pub samples: HashMap<SampleKey, u64>,
    /// Thread id → thread name.
    pub threads: HashMap<Tid, String>,
    /// Total samples.
    pub total: u64,
    /// The label sets the samples name (a Go process's).
    pub label_sets: HashMap<LabelsId, RawLabels>,
    /// Samples whose labels the kernel cut at its bounds (more labels than it reads, or a
    /// key or value over its length).
    pub labels_cut: u64,
    /// Samples that named a label set their batch did not have (counted without labels).
    pub labels_lost: u64,
}

impl CpuCounts {
    fn add(&mut self, sample: &RawCpuSample, labels: Option<&RawLabels>) {
        self.threads.insert(sample.tid, sample.comm.clone());
        let mut key = SampleKey {
            tid: sample.tid,
            user_stack: sample.user_stack,
            kernel_stack: sample.kernel_stack,
            labels: LabelsId::NONE,
        };
        match labels {
            Some(set) => {
                key.labels = sample.labels;
                if set.cut_labels || set.cut_bytes {
                    self.labels_cut += sample.count;
                }
                self.label_sets.entry(sample.labels).or_insert_with(|| set.clone());
            }
            None if sample.labels.is_set() => self.labels_lost += sample.count,
            None => {}
        }
        *self.samples.entry(key).or_default() += sample.count;
        self.total += sample.count;
    }
}

pub(super) fn count(batch: &Batch, counts: &mut Counts) {
    for sample in &batch.cpu {
        let labels = if sample.labels.is_set() { batch.labels.get(&sample.labels) } else { None };
        counts.process_mut(sample.pid).cpu.add(sample, labels);
    }
}

pub(super) fn sightings<'a>(batch: &'a Batch, out: &mut Vec<Sighting<'a>>) {
    out.extend(batch.cpu.iter().map(|s| Sighting {
        pid: s.pid,
        user_stack: s.user_stack,
        kernel_stack: s.kernel_stack,
        user_leaf_is_return: USER_LEAF_IS_RETURN,
        main_thread_name: (s.tid.0 == s.pid.0).then_some(s.comm.as_str()),
    }));
}

pub(super) fn stacks(counts: &CpuCounts, out: &mut HashSet<StackId>) {
    out.extend(counts.samples.keys().flat_map(|k| [k.user_stack, k.kernel_stack]));
}

pub(super) fn shape(settings: &Settings) -> Shape {
    Shape {
        sample_types: &[("samples", "count"), ("cpu", "nanoseconds")],
        period_type: ("cpu", "nanoseconds"),
        period: period_ns(settings),
        default_sample_type: "cpu",
    }
}

fn period_ns(settings: &Settings) -> i64 {
    1_000_000_000 / i64::from(settings.frequency_hz.max(1))
}

pub(super) fn samples(counts: &CpuCounts, settings: &Settings) -> Vec<StackSample> {
    let period = period_ns(settings);
    counts
        .samples
        .iter()
        .map(|(key, &count)| {
            let mut labels = vec![
                ("tid", LabelValue::Num(i64::from(key.tid.0), None)),
                ("thread", LabelValue::Str(counts.threads.get(&key.tid).cloned().unwrap_or_default())),
            ];
            let pairs = counts.label_sets.get(&key.labels).map(|set| set.pairs.as_slice()).unwrap_or_default();
            labels.extend(pairs.iter().filter_map(|(k, v)| Some((intern(k)?, LabelValue::Str(v.clone())))));
            StackSample {
                user_stack: key.user_stack,
                kernel_stack: key.kernel_stack,
                user_leaf_is_return: USER_LEAF_IS_RETURN,
                values: vec![count as i64, count as i64 * period],
                unscaled: Vec::new(),
                labels,
            }
        })
        .collect()
}

/// What it is and what was dropped (machine-wide counts since the programs were loaded),
/// and for a Go process, what became of its goroutines' labels.
pub(super) fn comments(context: Context, counters: &Counters, counts: &CpuCounts) -> Vec<String> {
    let c = counters.cpu;
    let mut lines = vec![
        format!(
            "profiler {} cpu profile (on-CPU samples of the CPU clock); {}",
            env!("CARGO_PKG_VERSION"),
            context.describe()
        ),
        format!(
            "dropped samples (whole machine): counts map full {}; stacks without frames: stack not stored \
             (map full or kernel allocation failed) {}, user stack unreadable {}, kernel stack unreadable {}; \
             user stacks cut at {} frames {}; samples of cgroups not selected (not walked) {}; ticks of the \
             CPU clock the sampler never ran for (another BPF program or a bpf() call was running on that \
             CPU, or the timer ran late) {} of {}",
            c.counts_map_full,
            c.stacks_map_full,
            c.user_stack_failed,
            c.kernel_stack_failed,
            profiler_common::MAX_USER_STACK_DEPTH,
            c.user_stack_truncated,
            c.cgroup_filtered,
            c.ticks_missed,
            c.ticks_due
        ),
        unwind_comment(counters),
    ];
    if !counts.label_sets.is_empty() || counts.labels_lost > 0 {
        lines.push(labels_comment(&c, counts));
    }
    lines
}

/// The Go labels' line: this profile's cuts and losses, and the machine's failed reads.
fn labels_comment(c: &crate::ebpf::CpuCounters, counts: &CpuCounts) -> String {
    use profiler_common::runtimes::go::{GO_LABEL_KEY_BYTES, GO_LABEL_VALUE_BYTES, GO_MAX_LABELS};
    format!(
        "Go pprof labels of the running goroutine, read in the kernel at each sample: {} label sets; samples \
         whose labels were cut (over {} labels, keys over {} bytes or values over {}) {}; samples whose \
         label set was lost {}; whole machine: samples with labels {}, labels unreadable {}, not stored \
         (labels map full) {}",
        counts.label_sets.len(),
        GO_MAX_LABELS,
        GO_LABEL_KEY_BYTES,
        GO_LABEL_VALUE_BYTES,
        counts.labels_cut,
        counts.labels_lost,
        c.go_labels,
        c.go_labels_unreadable,
        c.go_labels_map_full,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::Pid;

    #[test]
    fn counts_per_thread_and_names_the_main_thread() {
        let sample = |tid, user, count| RawCpuSample {
            pid: Pid(10),
            tid: Tid(tid),
            comm: format!("t{tid}"),
            user_stack: StackId(user),
            kernel_stack: StackId::NONE,
            labels: LabelsId::NONE,
            count,
        };
        let batch = Batch { cpu: vec![sample(10, 7, 3), sample(11, 7, 1)], ..Batch::default() };
        let mut counts = Counts::default();
        count(&batch, &mut counts);
        count(&batch, &mut counts);
        let cpu = &counts.process(Pid(10)).unwrap().cpu;
        assert_eq!(cpu.total, 8);
        assert_eq!(cpu.threads.len(), 2);
        let key =
            SampleKey { tid: Tid(10), user_stack: StackId(7), kernel_stack: StackId::NONE, labels: LabelsId::NONE };
        assert_eq!(cpu.samples[&key], 6);
        let mut seen = Vec::new();
        sightings(&batch, &mut seen);
        assert_eq!(seen[0].main_thread_name, Some("t10"));
        assert_eq!(seen[1].main_thread_name, None, "not the main thread");
        let samples = samples(cpu, &settings());
        let s = samples.iter().find(|s| s.labels[0].1 == LabelValue::Num(10, None)).unwrap();
        assert_eq!(s.values, [6, 60_000_000], "count, and count × the 10 ms period");
    }

    /// At 100 Hz; the other kinds' settings do not matter to CPU samples.
    fn settings() -> Settings {
        Settings {
            frequency_hz: 100,
            heap_sample_bytes: 1,
            offcpu_rate_ns: 1,
            offcpu_sample_every: 1,
            block_rate_ns: 1,
            mutex_fraction: 1,
        }
    }

    /// A Go sample's label set rides on its pprof sample as string labels; one whose set
    /// the batch lacks is counted lost and kept without labels, and cuts are counted.
    #[test]
    fn go_labels_become_the_samples_string_labels() {
        let sample = |labels| RawCpuSample {
            pid: Pid(10),
            tid: Tid(11),
            comm: "w".into(),
            user_stack: StackId(7),
            kernel_stack: StackId::NONE,
            labels: LabelsId(labels),
            count: 2,
        };
        let set = RawLabels {
            pairs: vec![("handler".into(), "a".into()), ("pool".into(), "spinners".into())],
            cut_labels: false,
            cut_bytes: true,
        };
        let mut batch = Batch { cpu: vec![sample(8), sample(12), sample(0)], ..Batch::default() };
        batch.labels.insert(LabelsId(8), set);
        let mut counts = Counts::default();
        count(&batch, &mut counts);
        let cpu = &counts.process(Pid(10)).unwrap().cpu;
        assert_eq!((cpu.labels_cut, cpu.labels_lost, cpu.total), (2, 2, 6));
        let samples = samples(cpu, &settings());
        assert_eq!(samples.len(), 2, "the lost set's samples join the unlabelled ones");
        let labelled = samples.iter().find(|s| s.labels.len() == 4).expect("a labelled sample");
        assert_eq!(labelled.labels[2], ("handler", LabelValue::Str("a".into())));
        assert_eq!(labelled.labels[3], ("pool", LabelValue::Str("spinners".into())));
        assert_eq!(labelled.values[0], 2);
        let plain = samples.iter().find(|s| s.labels.len() == 2).expect("an unlabelled sample");
        assert_eq!(plain.values[0], 4);
    }
}
