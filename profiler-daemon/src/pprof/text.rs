//! Go's legacy text profile format, what `?debug=1` returns: a header naming the profile,
//! then per sample its values, ` @ `, the stack's addresses (leaf first), one
//! `#\t0x<addr>\t<function>\t<file>:<line>` line per frame (inlined frames each on their own
//! line, innermost first) and a blank line.
//!
//! Values are the profile's own (already scaled by the sampling period), so this is a view
//! for people; tools should read the protobuf form.

use std::{collections::HashMap, fmt::Write};

use super::proto::{Function, Location, Profile, Sample, ValueType};

/// Renders `profile` in Go's legacy text form: the heap layout when the profile has Go's
/// heap sample types (`inuse_objects`, `inuse_space`, ...), a generic one otherwise.
pub fn legacy_text(profile: &Profile) -> String {
    let view = View::new(profile);
    let mut out = String::new();
    match HeapColumns::find(&view) {
        Some(columns) => heap(&view, columns, &mut out),
        None => generic(&view, &mut out),
    }
    out
}

/// Lookups over one profile: strings by index, locations and functions by id.
struct View<'a> {
    profile: &'a Profile,
    locations: HashMap<u64, &'a Location>,
    functions: HashMap<u64, &'a Function>,
}

impl<'a> View<'a> {
    fn new(profile: &'a Profile) -> Self {
        let locations = profile.location.iter().map(|l| (l.id, l)).collect();
        let functions = profile.function.iter().map(|f| (f.id, f)).collect();
        Self { profile, locations, functions }
    }

    /// A string by table index; a bad index (a malformed profile) reads as empty.
    fn string(&self, index: i64) -> &'a str {
        usize::try_from(index).ok().and_then(|i| self.profile.string_table.get(i)).map_or("", String::as_str)
    }

    fn value_type(&self, ty: &ValueType) -> String {
        format!("{}/{}", self.string(ty.r#type), self.string(ty.unit))
    }

    fn column(&self, name: &str) -> Option<usize> {
        self.profile.sample_type.iter().position(|t| self.string(t.r#type) == name)
    }

    fn address(&self, location_id: u64) -> u64 {
        self.locations.get(&location_id).map_or(0, |l| l.address)
    }

    /// ` @ 0x.. 0x..`, the frame lines and the blank line that ends a sample.
    fn stack(&self, sample: &Sample, out: &mut String) {
        out.push_str(" @");
        for &id in &sample.location_id {
            let _ = write!(out, " {:#x}", self.address(id));
        }
        out.push('\n');
        for location in sample.location_id.iter().filter_map(|id| self.locations.get(id)) {
            self.frames(location, out);
        }
        out.push('\n');
    }

    fn frames(&self, location: &Location, out: &mut String) {
        if location.line.is_empty() {
            // Go prints an unsymbolized frame as its address alone.
            let _ = writeln!(out, "#\t{:#x}", location.address);
        }
        for line in &location.line {
            let function = self.functions.get(&line.function_id);
            let name = function.map_or("", |f| self.string(f.name));
            let _ = write!(out, "#\t{:#x}\t{name}", location.address);
            match function.map(|f| self.string(f.filename)).filter(|file| !file.is_empty()) {
                Some(file) => {
                    let _ = writeln!(out, "\t{file}:{}", line.line);
                }
                None => out.push('\n'),
            }
        }
    }
}

/// Where Go's four heap values sit in `sample.value`.
#[derive(Clone, Copy)]
struct HeapColumns {
    inuse_objects: usize,
    inuse_space: usize,
    alloc_objects: Option<usize>,
    alloc_space: Option<usize>,
}

impl HeapColumns {
    fn find(view: &View<'_>) -> Option<Self> {
        Some(Self {
            inuse_objects: view.column("inuse_objects")?,
            inuse_space: view.column("inuse_space")?,
            alloc_objects: view.column("alloc_objects"),
            alloc_space: view.column("alloc_space"),
        })
    }

    /// `[inuse_objects, inuse_space, alloc_objects, alloc_space]`; missing columns are 0.
    fn values(self, sample: &Sample) -> [i64; 4] {
        let at = |i: Option<usize>| i.and_then(|i| sample.value.get(i).copied()).unwrap_or(0);
        [at(Some(self.inuse_objects)), at(Some(self.inuse_space)), at(self.alloc_objects), at(self.alloc_space)]
    }
}

/// `heap profile: 4: 2048 [9: 4096] @ heap/1048576`, then `4: 2048 [9: 4096] @ 0x..` per sample.
fn heap(view: &View<'_>, columns: HeapColumns, out: &mut String) {
    let samples = &view.profile.sample;
    let mut total = [0i64; 4];
    for values in samples.iter().map(|s| columns.values(s)) {
        total.iter_mut().zip(values).for_each(|(t, v)| *t = t.saturating_add(v));
    }
    // Go writes twice the sampling rate here and its parser halves it again.
    let period = view.profile.period.saturating_mul(2);
    let [io, ib, ao, ab] = total;
    let _ = writeln!(out, "heap profile: {io}: {ib} [{ao}: {ab}] @ heap/{period}");
    for sample in samples {
        let [io, ib, ao, ab] = columns.values(sample);
        let _ = write!(out, "{io}: {ib} [{ao}: {ab}]");
        view.stack(sample, out);
    }
}

/// `--- cpu: samples/count cpu/nanoseconds`, then `3 30000000 @ 0x..` per sample.
fn generic(view: &View<'_>, out: &mut String) {
    let profile = view.profile;
    let period_type = profile.period_type.as_ref().map(|t| view.string(t.r#type)).unwrap_or_default();
    let first_type = profile.sample_type.first().map(|t| view.string(t.r#type)).unwrap_or_default();
    let name = if period_type.is_empty() { first_type } else { period_type };
    let types: Vec<String> = profile.sample_type.iter().map(|t| view.value_type(t)).collect();
    let _ = writeln!(out, "--- {name}: {}", types.join(" "));
    if profile.period != 0 {
        let _ = writeln!(out, "sampling period={}", profile.period);
    }
    for sample in &profile.sample {
        let values: Vec<String> = sample.value.iter().map(i64::to_string).collect();
        out.push_str(&values.join(" "));
        view.stack(sample, out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pprof::{decode, encode_gzip, FunctionKey, MappingSpec, ProfileBuilder};

    fn key(name: &str, file: &str) -> FunctionKey {
        FunctionKey { name: name.into(), file: file.into() }
    }

    /// Two stacks sharing `main`; the leaf of the first has an inlined frame.
    fn add_stacks(b: &mut ProfileBuilder, values: [Vec<i64>; 2]) {
        let m = b.add_mapping(&MappingSpec { start: 0x1000, limit: 0x9000, file: "/bin/app", ..Default::default() });
        let leaf = b.add_location(m, 0x1100, &[(key("inlined", "a.c"), 3), (key("hot", "a.c"), 10)]);
        let main = b.add_location(m, 0x1200, &[(key("main", "main.c"), 20)]);
        let raw = b.add_location(0, 0xdead, &[]);
        let [first, second] = values;
        b.add_sample(vec![leaf, main], first, vec![]);
        b.add_sample(vec![raw, main], second, vec![]);
    }

    #[test]
    fn heap_profiles_use_gos_heap_layout() {
        let types = [
            ("alloc_objects", "count"),
            ("alloc_space", "bytes"),
            ("inuse_objects", "count"),
            ("inuse_space", "bytes"),
        ];
        let mut b = ProfileBuilder::new(&types, ("space", "bytes"), 524288);
        add_stacks(&mut b, [vec![9, 4096, 4, 2048], vec![1, 100, 0, 0]]);
        let expected = "\
heap profile: 4: 2048 [10: 4196] @ heap/1048576
4: 2048 [9: 4096] @ 0x1100 0x1200
#\t0x1100\tinlined\ta.c:3
#\t0x1100\thot\ta.c:10
#\t0x1200\tmain\tmain.c:20

0: 0 [1: 100] @ 0xdead 0x1200
#\t0xdead
#\t0x1200\tmain\tmain.c:20

";
        assert_eq!(legacy_text(&b.finish()), expected);
    }

    #[test]
    fn other_profiles_use_the_generic_layout() {
        let mut b = ProfileBuilder::new(&[("samples", "count"), ("cpu", "nanoseconds")], ("cpu", "nanoseconds"), 10);
        add_stacks(&mut b, [vec![3, 30], vec![1, 10]]);
        // Through the wire format, as the server renders decoded profiles.
        let profile = decode(&encode_gzip(&b.finish()), "test").unwrap();
        let text = legacy_text(&profile);
        let head = "--- cpu: samples/count cpu/nanoseconds\nsampling period=10\n3 30 @ 0x1100 0x1200\n#\t0x1100\tinlined\ta.c:3\n";
        assert!(text.starts_with(head), "{text}");
        assert!(text.ends_with("1 10 @ 0xdead 0x1200\n#\t0xdead\n#\t0x1200\tmain\tmain.c:20\n\n"), "{text}");
    }

    #[test]
    fn malformed_profiles_do_not_panic() {
        let mut profile = Profile::default();
        profile.sample.push(Sample { location_id: vec![99], value: vec![1], label: vec![] });
        profile.sample_type.push(ValueType { r#type: 42, unit: -1 });
        assert_eq!(legacy_text(&profile), "--- : /\n1 @ 0x0\n\n");
    }
}
