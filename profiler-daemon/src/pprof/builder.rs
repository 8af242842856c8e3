//! A pprof `Profile` builder: interns strings, functions, locations and mappings and hands
//! out the ids, so callers never number anything themselves.

use std::collections::HashMap;

use super::proto::{Function, Label, Line, Location, Mapping, Profile, Sample, ValueType};

/// A mapping to add (see `Mapping` in profile.proto).
#[derive(Clone, Debug, Default)]
pub struct MappingSpec<'a> {
    pub start: u64,
    pub limit: u64,
    pub offset: u64,
    pub file: &'a str,
    pub build_id: Option<&'a str>,
    pub has_functions: bool,
    pub has_filenames: bool,
    pub has_line_numbers: bool,
    pub has_inline_frames: bool,
}

/// What makes two functions the same: name and source file.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct FunctionKey {
    pub name: String,
    pub file: String,
    /// `name` is final: written with an empty system name, which pprof tools read as
    /// "already demangled", so that they do not strip it as a C++ name (an interpreted
    /// function named `<module>` would become an empty name).
    pub verbatim: bool,
}

#[derive(Default)]
pub struct ProfileBuilder {
    profile: Profile,
    strings: HashMap<String, i64>,
    functions: HashMap<FunctionKey, u64>,
}

impl ProfileBuilder {
    /// Starts a profile with its sample types (`(type, unit)` pairs) and period.
    pub fn new(sample_types: &[(&str, &str)], period_type: (&str, &str), period: i64) -> Self {
        let mut b = Self::default();
        b.profile.string_table.push(String::new());
        b.strings.insert(String::new(), 0);
        b.profile.sample_type = sample_types.iter().map(|&(t, u)| b.value_type(t, u)).collect();
        b.profile.period_type = Some(b.value_type(period_type.0, period_type.1));
        b.profile.period = period;
        b
    }

    /// The string table index of `s`, adding it once.
    pub fn string(&mut self, s: &str) -> i64 {
        if let Some(&idx) = self.strings.get(s) {
            return idx;
        }
        let idx = self.profile.string_table.len() as i64;
        self.profile.string_table.push(s.to_string());
        self.strings.insert(s.to_string(), idx);
        idx
    }

    fn value_type(&mut self, ty: &str, unit: &str) -> ValueType {
        ValueType { r#type: self.string(ty), unit: self.string(unit) }
    }

    /// Sets collection time and duration, in nanoseconds.
    pub fn set_time(&mut self, time_nanos: i64, duration_nanos: i64) {
        self.profile.time_nanos = time_nanos;
        self.profile.duration_nanos = duration_nanos;
    }

    /// Sets the sample type tools show by default.
    pub fn set_default_sample_type(&mut self, ty: &str) {
        self.profile.default_sample_type = self.string(ty);
    }

    /// Adds a free-form comment line.
    pub fn add_comment(&mut self, comment: &str) {
        let idx = self.string(comment);
        self.profile.comment.push(idx);
    }

    /// Adds a mapping and returns its id.
    pub fn add_mapping(&mut self, spec: &MappingSpec<'_>) -> u64 {
        let id = self.profile.mapping.len() as u64 + 1;
        let mapping = Mapping {
            id,
            memory_start: spec.start,
            memory_limit: spec.limit,
            file_offset: spec.offset,
            filename: self.string(spec.file),
            build_id: spec.build_id.map_or(0, |b| self.string(b)),
            has_functions: spec.has_functions,
            has_filenames: spec.has_filenames,
            has_line_numbers: spec.has_line_numbers,
            has_inline_frames: spec.has_inline_frames,
        };
        self.profile.mapping.push(mapping);
        id
    }

    /// The id of a function, adding it once.
    pub fn function(&mut self, key: FunctionKey) -> u64 {
        if let Some(&id) = self.functions.get(&key) {
            return id;
        }
        let id = self.profile.function.len() as u64 + 1;
        let name = self.string(&key.name);
        let filename = self.string(&key.file);
        let system_name = if key.verbatim { 0 } else { name };
        self.profile.function.push(Function { id, name, system_name, filename, start_line: 0 });
        self.functions.insert(key, id);
        id
    }

    /// Adds a location with its lines (innermost first, as pprof wants: the last line is the
    /// function the address belongs to) and returns its id. `mapping_id` 0 means none.
    pub fn add_location(&mut self, mapping_id: u64, address: u64, lines: &[(FunctionKey, i64)]) -> u64 {
        let id = self.profile.location.len() as u64 + 1;
        let line =
            lines.iter().map(|(key, line)| Line { function_id: self.function(key.clone()), line: *line }).collect();
        self.profile.location.push(Location { id, mapping_id, address, line, is_folded: false });
        id
    }

    /// Adds a sample: location ids leaf first, one value per sample type.
    pub fn add_sample(&mut self, location_id: Vec<u64>, value: Vec<i64>, label: Vec<Label>) {
        debug_assert_eq!(value.len(), self.profile.sample_type.len());
        self.profile.sample.push(Sample { location_id, value, label });
    }

    /// A label with a string value.
    pub fn str_label(&mut self, key: &str, value: &str) -> Label {
        Label { key: self.string(key), str: self.string(value), num: 0, num_unit: 0 }
    }

    /// A label with a numeric value.
    pub fn num_label(&mut self, key: &str, value: i64) -> Label {
        Label { key: self.string(key), str: 0, num: value, num_unit: 0 }
    }

    pub fn finish(self) -> Profile {
        self.profile
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(name: &str) -> FunctionKey {
        FunctionKey { name: name.into(), file: "a.c".into(), verbatim: false }
    }

    #[test]
    fn string_table_starts_empty_and_dedups() {
        let mut b = ProfileBuilder::new(&[("samples", "count")], ("cpu", "nanoseconds"), 10);
        assert_eq!(b.string(""), 0);
        let a = b.string("x");
        assert_eq!(b.string("x"), a);
        let p = b.finish();
        assert_eq!(p.string_table[0], "");
        assert_eq!(p.string_table.iter().filter(|s| *s == "x").count(), 1);
        assert_eq!(p.string_table[p.sample_type[0].r#type as usize], "samples");
        assert_eq!(p.string_table[p.period_type.unwrap().unit as usize], "nanoseconds");
    }

    #[test]
    fn ids_are_nonzero_unique_and_functions_dedup() {
        let mut b = ProfileBuilder::new(&[("samples", "count")], ("cpu", "nanoseconds"), 10);
        let m = b.add_mapping(&MappingSpec { file: "/bin/x", build_id: Some("ab"), ..Default::default() });
        let l1 = b.add_location(m, 0x10, &[(key("inner"), 3), (key("outer"), 7)]);
        let l2 = b.add_location(m, 0x20, &[(key("outer"), 9)]);
        b.add_sample(vec![l1, l2], vec![1], vec![]);
        let p = b.finish();
        assert_eq!((m, l1, l2), (1, 1, 2));
        assert_eq!(p.function.len(), 2, "outer interned once");
        assert!(p.function.iter().all(|f| f.id != 0));
        assert_eq!(p.location[0].line.len(), 2);
        assert_eq!(p.location[0].line[1].function_id, p.location[1].line[0].function_id);
        assert_eq!(p.string_table[p.mapping[0].build_id as usize], "ab");
    }
}
