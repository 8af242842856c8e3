//! pprof profiles translated to an OTLP `ExportProfilesServiceRequest` (opentelemetry-proto
//! `profiles/v1development`, experimental as the signal is): one dictionary shared by every
//! profile of the request (strings, functions, mappings, locations, stacks and attributes
//! each stored once), one `ResourceProfiles` per pprof file (the process, as resource
//! attributes), and one OTLP `Profile` per pprof sample type, since an OTLP profile carries a
//! single one. Samples whose value is zero for a type are left out of that type's profile.

use std::collections::HashMap;

use prost::Message;

use super::{
    otlp_proto::opentelemetry::proto::{
        collector::profiles::v1development::{ExportProfilesServiceRequest, ExportProfilesServiceResponse},
        common::v1::{any_value, AnyValue, InstrumentationScope, KeyValue},
        profiles::v1development as otlp,
        resource::v1::Resource,
    },
    proto,
};

/// A resource or sample attribute's value.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Attr {
    Str(String),
    Int(i64),
}

impl Attr {
    fn any_value(&self) -> AnyValue {
        let value = match self {
            Self::Str(s) => any_value::Value::StringValue(s.clone()),
            Self::Int(n) => any_value::Value::IntValue(*n),
        };
        AnyValue { value: Some(value) }
    }
}

/// What an OTLP collector answered, when it rejected part of a request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PartialSuccess {
    pub rejected_profiles: i64,
    pub message: String,
}

/// Reads an `ExportProfilesServiceResponse`; `None` when it reports no rejection (an empty
/// body is a full success).
pub fn partial_success(body: &[u8]) -> Option<PartialSuccess> {
    let response = ExportProfilesServiceResponse::decode(body).ok()?;
    let partial = response.partial_success?;
    (partial.rejected_profiles > 0 || !partial.error_message.is_empty())
        .then_some(PartialSuccess { rejected_profiles: partial.rejected_profiles, message: partial.error_message })
}

/// An `ExportProfilesServiceRequest` being built.
#[derive(Default)]
pub struct RequestBuilder {
    dict: Dictionary,
    resources: Vec<otlp::ResourceProfiles>,
}

impl RequestBuilder {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds one pprof profile of one process, described by `resource` attributes.
    pub fn add(&mut self, resource: &[(&str, Attr)], profile: &proto::Profile) {
        let profiles = Translation::new(&mut self.dict, profile).profiles();
        let attributes = resource.iter().map(|(key, value)| KeyValue {
            key: key.to_string(),
            value: Some(value.any_value()),
            ..Default::default()
        });
        self.resources.push(otlp::ResourceProfiles {
            resource: Some(Resource { attributes: attributes.collect(), ..Default::default() }),
            scope_profiles: vec![otlp::ScopeProfiles {
                scope: Some(InstrumentationScope {
                    name: "profiler".into(),
                    version: env!("CARGO_PKG_VERSION").into(),
                    ..Default::default()
                }),
                profiles,
                schema_url: String::new(),
            }],
            schema_url: String::new(),
        });
    }

    /// The serialized request.
    pub fn encode(self) -> Vec<u8> {
        let request =
            ExportProfilesServiceRequest { resource_profiles: self.resources, dictionary: Some(self.dict.finish()) };
        request.encode_to_vec()
    }
}

/// A location's identity: its mapping, address and (function, line) per frame.
type LocationKey = (i32, u64, Vec<(i32, i64)>);

/// The request's shared tables, each starting with its zero value as the schema requires, and
/// an index per table so that equal items are stored once.
struct Dictionary {
    tables: otlp::ProfilesDictionary,
    strings: HashMap<String, i32>,
    functions: HashMap<(i32, i32, i32, i64), i32>,
    mappings: HashMap<(u64, u64, u64, i32, Vec<i32>), i32>,
    locations: HashMap<LocationKey, i32>,
    stacks: HashMap<Vec<i32>, i32>,
    attributes: HashMap<(i32, Attr, i32), i32>,
}

impl Default for Dictionary {
    fn default() -> Self {
        let tables = otlp::ProfilesDictionary {
            mapping_table: vec![otlp::Mapping::default()],
            location_table: vec![otlp::Location::default()],
            function_table: vec![otlp::Function::default()],
            link_table: vec![otlp::Link::default()],
            string_table: vec![String::new()],
            attribute_table: vec![otlp::KeyValueAndUnit::default()],
            stack_table: vec![otlp::Stack::default()],
        };
        Self {
            tables,
            strings: HashMap::from([(String::new(), 0)]),
            functions: HashMap::new(),
            mappings: HashMap::new(),
            locations: HashMap::new(),
            stacks: HashMap::new(),
            attributes: HashMap::new(),
        }
    }
}

/// Index of `item` in `table`, added if new.
fn intern<K: Eq + std::hash::Hash, T>(
    index: &mut HashMap<K, i32>,
    table: &mut Vec<T>,
    key: K,
    item: impl FnOnce() -> T,
) -> i32 {
    *index.entry(key).or_insert_with(|| {
        table.push(item());
        (table.len() - 1) as i32
    })
}

impl Dictionary {
    fn string(&mut self, s: &str) -> i32 {
        if let Some(&i) = self.strings.get(s) {
            return i;
        }
        self.tables.string_table.push(s.to_owned());
        let i = (self.tables.string_table.len() - 1) as i32;
        self.strings.insert(s.to_owned(), i);
        i
    }

    fn attribute(&mut self, key: &str, value: Attr, unit: &str) -> i32 {
        let (key, unit) = (self.string(key), self.string(unit));
        let item = || otlp::KeyValueAndUnit { key_strindex: key, value: Some(value.any_value()), unit_strindex: unit };
        intern(&mut self.attributes, &mut self.tables.attribute_table, (key, value.clone(), unit), item)
    }

    fn finish(self) -> otlp::ProfilesDictionary {
        self.tables
    }
}

/// One pprof profile's ids mapped into the dictionary.
struct Translation<'a> {
    dict: &'a mut Dictionary,
    profile: &'a proto::Profile,
    mappings: HashMap<u64, i32>,
    functions: HashMap<u64, i32>,
    locations: HashMap<u64, i32>,
}

impl<'a> Translation<'a> {
    fn new(dict: &'a mut Dictionary, profile: &'a proto::Profile) -> Self {
        let mut t =
            Self { dict, profile, mappings: HashMap::new(), functions: HashMap::new(), locations: HashMap::new() };
        for mapping in &profile.mapping {
            let index = t.mapping(mapping);
            t.mappings.insert(mapping.id, index);
        }
        for function in &profile.function {
            let index = t.function(function);
            t.functions.insert(function.id, index);
        }
        for location in &profile.location {
            let index = t.location(location);
            t.locations.insert(location.id, index);
        }
        t
    }

    fn text(&self, index: i64) -> &'a str {
        self.profile.string_table.get(index as usize).map_or("", String::as_str)
    }

    fn mapping(&mut self, m: &proto::Mapping) -> i32 {
        let filename = self.dict.string(self.text(m.filename));
        let build_id = self.text(m.build_id);
        // The semantic convention's name for a GNU build id.
        let attributes: Vec<i32> = match build_id.is_empty() {
            true => Vec::new(),
            false => vec![self.dict.attribute("process.executable.build_id.gnu", Attr::Str(build_id.to_owned()), "")],
        };
        let key = (m.memory_start, m.memory_limit, m.file_offset, filename, attributes.clone());
        let item = || otlp::Mapping {
            memory_start: m.memory_start,
            memory_limit: m.memory_limit,
            file_offset: m.file_offset,
            filename_strindex: filename,
            attribute_indices: attributes,
        };
        intern(&mut self.dict.mappings, &mut self.dict.tables.mapping_table, key, item)
    }

    fn function(&mut self, f: &proto::Function) -> i32 {
        let name = self.dict.string(self.text(f.name));
        let system_name = self.dict.string(self.text(f.system_name));
        let filename = self.dict.string(self.text(f.filename));
        let item = || otlp::Function {
            name_strindex: name,
            system_name_strindex: system_name,
            filename_strindex: filename,
            start_line: f.start_line,
        };
        let key = (name, system_name, filename, f.start_line);
        intern(&mut self.dict.functions, &mut self.dict.tables.function_table, key, item)
    }

    fn location(&mut self, l: &proto::Location) -> i32 {
        let mapping = self.mappings.get(&l.mapping_id).copied().unwrap_or(0);
        let lines: Vec<(i32, i64)> = l
            .line
            .iter()
            .map(|line| (self.functions.get(&line.function_id).copied().unwrap_or(0), line.line))
            .collect();
        let item = || otlp::Location {
            mapping_index: mapping,
            address: l.address,
            lines: lines.iter().map(|&(function_index, line)| otlp::Line { function_index, line, column: 0 }).collect(),
            attribute_indices: Vec::new(),
        };
        let key = (mapping, l.address, lines.clone());
        intern(&mut self.dict.locations, &mut self.dict.tables.location_table, key, item)
    }

    fn stack(&mut self, location_ids: &[u64]) -> i32 {
        // Leaf first, as in pprof.
        let indices: Vec<i32> = location_ids.iter().map(|id| self.locations.get(id).copied().unwrap_or(0)).collect();
        let item = || otlp::Stack { location_indices: indices.clone() };
        intern(&mut self.dict.stacks, &mut self.dict.tables.stack_table, indices.clone(), item)
    }

    fn labels(&mut self, sample: &proto::Sample) -> Vec<i32> {
        sample
            .label
            .iter()
            .map(|label| {
                let key = self.text(label.key);
                match label.str {
                    0 => self.dict.attribute(key, Attr::Int(label.num), self.text(label.num_unit)),
                    s => self.dict.attribute(key, Attr::Str(self.text(s).to_owned()), ""),
                }
            })
            .collect()
    }

    fn value_type(&mut self, t: Option<&proto::ValueType>) -> Option<otlp::ValueType> {
        let t = t?;
        Some(otlp::ValueType {
            type_strindex: self.dict.string(self.text(t.r#type)),
            unit_strindex: self.dict.string(self.text(t.unit)),
        })
    }

    /// One OTLP profile per sample type.
    fn profiles(mut self) -> Vec<otlp::Profile> {
        let p = self.profile;
        let period_type = self.value_type(p.period_type.as_ref());
        let samples: Vec<(i32, Vec<i32>)> =
            p.sample.iter().map(|s| (self.stack(&s.location_id), self.labels(s))).collect();
        let mut profiles = Vec::with_capacity(p.sample_type.len());
        for (index, sample_type) in p.sample_type.iter().enumerate() {
            let samples = p
                .sample
                .iter()
                .zip(&samples)
                .filter_map(|(sample, (stack, attributes))| {
                    let value = sample.value.get(index).copied().filter(|&v| v != 0)?;
                    Some(otlp::Sample {
                        stack_index: *stack,
                        attribute_indices: attributes.clone(),
                        values: vec![value],
                        ..Default::default()
                    })
                })
                .collect();
            profiles.push(otlp::Profile {
                sample_type: self.value_type(Some(sample_type)),
                samples,
                time_unix_nano: p.time_nanos.max(0) as u64,
                duration_nano: p.duration_nanos.max(0) as u64,
                period_type,
                period: p.period,
                ..Default::default()
            });
        }
        profiles
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pprof::{MappingSpec, ProfileBuilder};

    /// Two samples over two stacks sharing a frame, with a string and a numeric label.
    fn profile() -> proto::Profile {
        let mut b = ProfileBuilder::new(&[("samples", "count"), ("cpu", "nanoseconds")], ("cpu", "nanoseconds"), 10);
        let mapping = b.add_mapping(&MappingSpec {
            start: 0x1000,
            limit: 0x2000,
            offset: 0,
            file: "/usr/bin/app",
            build_id: Some("abcd"),
            has_functions: true,
            has_filenames: false,
            has_line_numbers: false,
            has_inline_frames: false,
        });
        let key = |name: &str| crate::pprof::FunctionKey { name: name.into(), file: String::new(), verbatim: false };
        let main = b.add_location(mapping, 0x1100, &[(key("main"), 3)]);
        let hot = b.add_location(mapping, 0x1200, &[(key("hot"), 7)]);
        let label = b.str_label("primitive", "pthread_mutex_lock");
        b.add_sample(vec![hot, main], vec![3, 30], vec![label]);
        let bytes = b.num_label("bytes", 64);
        b.add_sample(vec![main], vec![0, 5], vec![bytes]);
        b.finish()
    }

    #[test]
    fn one_profile_per_sample_type_over_one_shared_dictionary() {
        let mut request = RequestBuilder::new();
        let resource = [("service.name", Attr::Str("app".into())), ("process.pid", Attr::Int(42))];
        request.add(&resource, &profile());
        request.add(&resource, &profile());
        let decoded = ExportProfilesServiceRequest::decode(&request.encode()[..]).unwrap();
        let dict = decoded.dictionary.unwrap();
        let string = |i: i32| dict.string_table[i as usize].as_str();
        assert_eq!(string(0), "");
        assert_eq!(dict.function_table.len(), 3, "the zero value, main and hot, stored once for both profiles");
        assert_eq!(dict.stack_table.len(), 3, "the zero value and two stacks");
        assert_eq!(decoded.resource_profiles.len(), 2);
        let attributes = &decoded.resource_profiles[0].resource.as_ref().unwrap().attributes;
        assert_eq!(attributes[1].key, "process.pid");
        assert_eq!(attributes[1].value.as_ref().unwrap().value, Some(any_value::Value::IntValue(42)));
        let profiles = &decoded.resource_profiles[0].scope_profiles[0].profiles;
        let types: Vec<&str> = profiles.iter().map(|p| string(p.sample_type.unwrap().type_strindex)).collect();
        assert_eq!(types, ["samples", "cpu"]);
        assert_eq!(profiles[0].samples.len(), 1, "a zero value is left out");
        assert_eq!(profiles[1].samples.iter().map(|s| s.values[0]).sum::<i64>(), 35);
        let hot = &profiles[1].samples[0];
        let frames: Vec<&str> = dict.stack_table[hot.stack_index as usize]
            .location_indices
            .iter()
            .map(|&l| {
                string(
                    dict.function_table[dict.location_table[l as usize].lines[0].function_index as usize].name_strindex,
                )
            })
            .collect();
        assert_eq!(frames, ["hot", "main"], "leaf first");
        let label = &dict.attribute_table[hot.attribute_indices[0] as usize];
        assert_eq!(string(label.key_strindex), "primitive");
        let mapping = &dict.mapping_table[dict.location_table[1].mapping_index as usize];
        assert_eq!(string(mapping.filename_strindex), "/usr/bin/app");
        assert_eq!(
            string(dict.attribute_table[mapping.attribute_indices[0] as usize].key_strindex),
            "process.executable.build_id.gnu"
        );
        assert_eq!(profiles[1].period, 10);
    }

    #[test]
    fn partial_success_is_read_from_the_response() {
        use super::super::otlp_proto::opentelemetry::proto::collector::profiles::v1development::ExportProfilesPartialSuccess;
        assert_eq!(partial_success(&[]), None);
        let response = ExportProfilesServiceResponse {
            partial_success: Some(ExportProfilesPartialSuccess {
                rejected_profiles: 2,
                error_message: "too old".into(),
            }),
        };
        assert_eq!(
            partial_success(&response.encode_to_vec()),
            Some(PartialSuccess { rejected_profiles: 2, message: "too old".into() })
        );
    }
}
