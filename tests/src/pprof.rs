//! A decoded profile seen as the tests think of it: samples with symbolized stacks (leaf
//! first), values by sample-type name, and labels by key, all strings already looked up.
//!
//! This is the only module that touches the daemon's decoder and prost types, so a change of
//! that API is a change here alone. Dangling ids (a location, function or mapping that the
//! profile references but does not contain) are profile bugs and panic with the id.

use std::collections::HashMap;
use std::path::Path;

use profiler_daemon::pprof::proto;

/// The mapping filename the profiler gives kernel frames.
pub const KERNEL_MAPPING: &str = "[kernel.kallsyms]";

/// One frame of a stack: a Location's Line, or a Location without Lines (unsymbolized).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Frame {
    /// The function's (demangled) name; empty when the location carries no line.
    pub function: String,
    /// The location's address (shared by all inlined frames of one location).
    pub address: u64,
    /// Whether the location is in the `[kernel.kallsyms]` mapping.
    pub kernel: bool,
    /// The function's file name and the line (empty and 0 when the location has none).
    pub file: String,
    pub line: i64,
    /// The file name of the location's mapping (`[python]` for Python frames); empty when
    /// it has none.
    pub mapping: String,
}

/// A sample label, string or numeric.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Label {
    pub key: String,
    pub str: Option<String>,
    pub num: Option<i64>,
    /// A numeric label's unit (`num_unit`), if it names one.
    pub num_unit: Option<String>,
}

/// One sample with its stack resolved.
#[derive(Clone, Debug)]
pub struct Sample {
    /// Leaf first: a location's inlined frames (innermost first), then its caller's, and so on.
    pub stack: Vec<Frame>,
    /// One value per `Profile::sample_types` entry.
    pub values: Vec<i64>,
    pub labels: Vec<Label>,
}

/// A whole decoded profile.
#[derive(Clone, Debug)]
pub struct Profile {
    /// (type, unit) per sample value, e.g. ("samples", "count").
    pub sample_types: Vec<(String, String)>,
    pub period_type: Option<(String, String)>,
    pub period: i64,
    /// The sample type `go tool pprof` shows by default; empty when the profile names none.
    pub default_sample_type: String,
    pub comments: Vec<String>,
    pub samples: Vec<Sample>,
}

/// Whether the profile's `name` is the function `wanted`: equal (C), or a Rust path ending in
/// `::wanted` (`cpu_split_rs::hot_a` matches `hot_a`).
pub fn name_matches(name: &str, wanted: &str) -> bool {
    name == wanted || name.strip_suffix(wanted).is_some_and(|prefix| prefix.ends_with("::"))
}

impl Profile {
    /// Decodes a gzip'd profile.proto file written by the profiler.
    pub fn decode(path: &Path) -> Self {
        let raw = profiler_daemon::pprof::decode_file(path)
            .unwrap_or_else(|e| panic!("failed to decode {}: {e:#}", path.display()));
        Self::from_proto(&raw)
    }

    /// Resolves every id and string index of `raw`.
    pub fn from_proto(raw: &proto::Profile) -> Self {
        let resolver = Resolver::new(raw);
        let value_type = |vt: &proto::ValueType| (resolver.str(vt.r#type), resolver.str(vt.unit));
        Self {
            sample_types: raw.sample_type.iter().map(value_type).collect(),
            period_type: raw.period_type.as_ref().map(value_type),
            period: raw.period,
            default_sample_type: resolver.str(raw.default_sample_type),
            comments: raw.comment.iter().map(|&i| resolver.str(i)).collect(),
            samples: raw.sample.iter().map(|s| resolver.sample(s)).collect(),
        }
    }

    /// The index of the sample value of type `type_name`; panics if the profile has none.
    pub fn value_index(&self, type_name: &str) -> usize {
        self.sample_types
            .iter()
            .position(|(ty, _)| ty == type_name)
            .unwrap_or_else(|| panic!("profile has no sample type {type_name:?}: {:?}", self.sample_types))
    }

    /// The sum of value `type_name` over the samples for which `pred` holds.
    pub fn value_where(&self, type_name: &str, pred: impl Fn(&Sample) -> bool) -> i64 {
        let i = self.value_index(type_name);
        self.samples.iter().filter(|s| pred(s)).map(|s| s.values[i]).sum()
    }

    /// The sum of value `type_name` over all samples.
    pub fn total(&self, type_name: &str) -> i64 {
        self.value_where(type_name, |_| true)
    }

    /// The share (0..=1) of value `type_name` in samples for which `pred` holds; 0 if empty.
    pub fn fraction_where(&self, type_name: &str, pred: impl Fn(&Sample) -> bool) -> f64 {
        let total = self.total(type_name);
        if total == 0 {
            return 0.0;
        }
        self.value_where(type_name, pred) as f64 / total as f64
    }

    /// The share of value `type_name` in samples whose stack contains `function`.
    pub fn fraction_containing(&self, type_name: &str, function: &str) -> f64 {
        self.fraction_where(type_name, |s| s.contains(function))
    }

    /// All function names in the profile's stacks, for failure messages.
    pub fn function_names(&self) -> Vec<&str> {
        let mut names: Vec<&str> =
            self.samples.iter().flat_map(|s| s.stack.iter().map(|f| f.function.as_str())).collect();
        names.sort_unstable();
        names.dedup();
        names
    }
}

impl Sample {
    /// Whether any frame is `function` (see [`name_matches`]).
    pub fn contains(&self, function: &str) -> bool {
        self.stack.iter().any(|f| name_matches(&f.function, function))
    }

    /// Whether the stack holds `leaf_to_root` in that order (callee before caller), with any
    /// frames in between: `has_chain(&["hot_a", "work_loop", "main"])`.
    pub fn has_chain(&self, leaf_to_root: &[&str]) -> bool {
        has_chain(&self.stack, leaf_to_root)
    }

    pub fn kernel_frames(&self) -> impl Iterator<Item = &Frame> {
        self.stack.iter().filter(|f| f.kernel)
    }

    /// The frames after the kernel ones: the user stack, leaf first.
    pub fn user_frames(&self) -> &[Frame] {
        let first_user = self.stack.iter().position(|f| !f.kernel).unwrap_or(self.stack.len());
        &self.stack[first_user..]
    }

    /// The string value of label `key`, if present.
    pub fn label_str(&self, key: &str) -> Option<&str> {
        self.labels.iter().find(|l| l.key == key).and_then(|l| l.str.as_deref())
    }

    /// The numeric label `key` with its unit, if present.
    pub fn label_num_unit(&self, key: &str) -> Option<(i64, Option<&str>)> {
        self.labels.iter().find(|l| l.key == key).and_then(|l| Some((l.num?, l.num_unit.as_deref())))
    }

    /// The numeric value of label `key`, if present.
    pub fn label_num(&self, key: &str) -> Option<i64> {
        self.labels.iter().find(|l| l.key == key).and_then(|l| l.num)
    }

    /// Whether the leaf frame (the first user frame) is `function`.
    pub fn leaf_is(&self, function: &str) -> bool {
        self.user_frames().first().is_some_and(|f| name_matches(&f.function, function))
    }

    /// The stack's function names, leaf first, for failure messages.
    pub fn names(&self) -> Vec<&str> {
        self.stack.iter().map(|f| f.function.as_str()).collect()
    }
}

/// Over the profiles at `paths`: the samples taken in the program's own code (a frame of
/// `chain` is named: the leaf is known from the sampled address even when the walk fails),
/// and those whose stack holds all of `chain` (leaf to root). Samples before the program's
/// code runs (the kernel's exec, the dynamic loader) are not counted.
pub fn tally_chain(paths: &[std::path::PathBuf], chain: &[&str]) -> (i64, i64) {
    let (mut total, mut chained) = (0, 0);
    for path in paths {
        let profile = Profile::decode(path);
        let samples = profile.value_index("samples");
        for sample in &profile.samples {
            if !sample.stack.iter().any(|f| chain.iter().any(|c| f.function == *c)) {
                continue;
            }
            total += sample.values[samples];
            if sample.has_chain(chain) {
                chained += sample.values[samples];
            }
        }
    }
    (total, chained)
}

/// Whether `stack` (leaf first) holds `leaf_to_root` as a subsequence.
pub fn has_chain(stack: &[Frame], leaf_to_root: &[&str]) -> bool {
    let mut wanted = leaf_to_root.iter().peekable();
    for frame in stack {
        if wanted.peek().is_some_and(|w| name_matches(&frame.function, w)) {
            wanted.next();
        }
    }
    wanted.peek().is_none()
}

/// Lookup tables over one raw profile.
struct Resolver<'a> {
    raw: &'a proto::Profile,
    locations: HashMap<u64, &'a proto::Location>,
    functions: HashMap<u64, &'a proto::Function>,
    mappings: HashMap<u64, &'a proto::Mapping>,
    kernel_mappings: Vec<u64>,
}

impl<'a> Resolver<'a> {
    fn new(raw: &'a proto::Profile) -> Self {
        let str_at = |i: i64| raw.string_table.get(i as usize).map(String::as_str);
        Self {
            raw,
            locations: raw.location.iter().map(|l| (l.id, l)).collect(),
            functions: raw.function.iter().map(|f| (f.id, f)).collect(),
            mappings: raw.mapping.iter().map(|m| (m.id, m)).collect(),
            kernel_mappings: raw
                .mapping
                .iter()
                .filter(|m| str_at(m.filename) == Some(KERNEL_MAPPING))
                .map(|m| m.id)
                .collect(),
        }
    }

    fn str(&self, index: i64) -> String {
        usize::try_from(index)
            .ok()
            .and_then(|i| self.raw.string_table.get(i))
            .unwrap_or_else(|| panic!("string index {index} is outside the string table"))
            .clone()
    }

    fn sample(&self, sample: &proto::Sample) -> Sample {
        Sample {
            stack: sample.location_id.iter().flat_map(|&id| self.frames(id)).collect(),
            values: sample.value.clone(),
            labels: sample.label.iter().map(|l| self.label(l)).collect(),
        }
    }

    /// A location's frames, innermost inlined function first (pprof puts the outermost last).
    fn frames(&self, location_id: u64) -> Vec<Frame> {
        let location = self
            .locations
            .get(&location_id)
            .unwrap_or_else(|| panic!("sample references missing location {location_id}"));
        let kernel = self.kernel_mappings.contains(&location.mapping_id);
        let mapping = self.mappings.get(&location.mapping_id).map(|m| self.str(m.filename)).unwrap_or_default();
        let frame = |function: String, file: String, line: i64| Frame {
            function,
            address: location.address,
            kernel,
            file,
            line,
            mapping: mapping.clone(),
        };
        if location.line.is_empty() {
            return vec![frame(String::new(), String::new(), 0)];
        }
        location
            .line
            .iter()
            .map(|line| {
                let function = self.function(line.function_id);
                frame(self.str(function.name), self.str(function.filename), line.line)
            })
            .collect()
    }

    fn function(&self, function_id: u64) -> &'a proto::Function {
        self.functions
            .get(&function_id)
            .copied()
            .unwrap_or_else(|| panic!("line references missing function {function_id}"))
    }

    fn label(&self, label: &proto::Label) -> Label {
        Label {
            key: self.str(label.key),
            str: (label.str != 0).then(|| self.str(label.str)),
            num: (label.str == 0).then_some(label.num),
            num_unit: (label.num_unit != 0).then(|| self.str(label.num_unit)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A profile with one sample: kernel `read_zero` → user `hot_a` (with `spin` inlined into
    /// it) → `main`.
    fn tiny() -> proto::Profile {
        let strings = ["", "samples", "count", "[kernel.kallsyms]", "read_zero", "spin", "hot_a", "main", "tid"];
        proto::Profile {
            string_table: strings.iter().map(|s| s.to_string()).collect(),
            sample_type: vec![proto::ValueType { r#type: 1, unit: 2 }],
            mapping: vec![proto::Mapping { id: 1, filename: 3, ..Default::default() }],
            function: (4..=7).map(|i| proto::Function { id: i as u64, name: i, ..Default::default() }).collect(),
            location: vec![
                proto::Location { id: 10, mapping_id: 1, line: vec![line(4)], ..Default::default() },
                proto::Location { id: 11, mapping_id: 0, line: vec![line(5), line(6)], ..Default::default() },
                proto::Location { id: 12, mapping_id: 0, line: vec![line(7)], ..Default::default() },
            ],
            sample: vec![proto::Sample {
                location_id: vec![10, 11, 12],
                value: vec![3],
                label: vec![proto::Label { key: 8, num: 42, ..Default::default() }],
            }],
            ..Default::default()
        }
    }

    fn line(function_id: u64) -> proto::Line {
        proto::Line { function_id, line: 0 }
    }

    #[test]
    fn stacks_are_leaf_first_with_inlined_frames_innermost_first() {
        let profile = Profile::from_proto(&tiny());
        let sample = &profile.samples[0];
        assert_eq!(sample.names(), ["read_zero", "spin", "hot_a", "main"]);
        assert_eq!(sample.kernel_frames().count(), 1);
        assert_eq!(sample.user_frames().len(), 3);
        assert_eq!(sample.label_num("tid"), Some(42));
        assert_eq!(profile.total("samples"), 3);
    }

    #[test]
    fn chains_are_subsequences_in_callee_to_caller_order() {
        let sample = &Profile::from_proto(&tiny()).samples[0];
        assert!(sample.has_chain(&["spin", "main"]));
        assert!(sample.has_chain(&["read_zero", "hot_a", "main"]));
        assert!(!sample.has_chain(&["main", "hot_a"]));
        assert!(!sample.has_chain(&["hot_b"]));
    }

    #[test]
    fn rust_paths_match_by_last_segment_only() {
        assert!(name_matches("cpu_split_rs::hot_a", "hot_a"));
        assert!(name_matches("hot_a", "hot_a"));
        assert!(!name_matches("not_hot_a", "hot_a"));
        assert!(!name_matches("cpu_split_rs::hot_a::h0123456789abcdef", "hot_a"));
    }
}
