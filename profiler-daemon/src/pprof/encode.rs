//! Encodes a [`ResolvedProfile`] with a profile type's [`Shape`]: mappings, locations with
//! inlined lines, samples with labels, and comments saying what was dropped or unresolved.

use std::time::{Duration, SystemTime};

use super::{
    proto::{Label, Profile},
    FunctionKey, MappingSpec, ProfileBuilder,
};
use crate::resolve::{interpreted::is_interpreted_mapping, LabelValue, LocationInfo, ResolvedProfile};

/// The pprof header of a profile type.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Shape {
    /// `(type, unit)` per sample value.
    pub sample_types: &'static [(&'static str, &'static str)],
    pub period_type: (&'static str, &'static str),
    pub period: i64,
    pub default_sample_type: &'static str,
}

/// An encoded profile, opaque outside this module: the gzip'd protobuf is what files and
/// `debug=0` answers hold.
#[derive(Clone, Debug)]
pub struct Encoded(Profile);

impl Encoded {
    /// The serialized, gzip'd profile.
    pub fn gzip(&self) -> Vec<u8> {
        super::encode_gzip(&self.0)
    }

    /// Its stacks folded for a flame graph (see [`super::fold`]).
    pub fn fold(&self, sample_type: Option<&str>) -> Result<super::Folded, super::FoldError> {
        super::fold(&self.0, sample_type)
    }
}

/// Facts about the capture that go into the profile.
#[derive(Clone, Debug)]
pub struct ProfileMeta {
    pub start: SystemTime,
    pub duration: Duration,
    /// Lines for the profile comment (drops and caveats).
    pub comments: Vec<String>,
}

/// Encodes `resolved` with `shape` and `meta`.
pub fn encode(resolved: &ResolvedProfile, shape: &Shape, meta: &ProfileMeta) -> Encoded {
    Encoded(encode_profile(resolved, shape, meta))
}

fn encode_profile(resolved: &ResolvedProfile, shape: &Shape, meta: &ProfileMeta) -> Profile {
    let mut b = ProfileBuilder::new(shape.sample_types, shape.period_type, shape.period);
    let start = meta.start.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
    b.set_time(start.as_nanos() as i64, meta.duration.as_nanos() as i64);
    b.set_default_sample_type(shape.default_sample_type);

    let mapping_ids: Vec<u64> = resolved
        .mappings
        .iter()
        .map(|m| {
            b.add_mapping(&MappingSpec {
                start: m.start,
                limit: m.limit,
                offset: m.offset,
                file: &m.path,
                build_id: m.build_id.as_deref(),
                has_functions: m.has_functions,
                has_filenames: m.has_lines,
                has_line_numbers: m.has_lines,
                has_inline_frames: m.has_inline_frames,
            })
        })
        .collect();
    let interpreted: Vec<usize> =
        (0..resolved.mappings.len()).filter(|&m| is_interpreted_mapping(&resolved.mappings[m])).collect();
    let location_ids: Vec<u64> =
        resolved.locations.iter().map(|loc| add_location(&mut b, loc, &mapping_ids, &interpreted)).collect();
    for sample in &resolved.samples {
        let ids = sample.locations.iter().map(|&i| location_ids[i]).collect();
        let labels = sample.labels.iter().map(|(key, value)| label(&mut b, key, value)).collect();
        b.add_sample(ids, sample.values.clone(), labels);
    }
    for comment in &meta.comments {
        b.add_comment(comment);
    }
    let f = resolved.frames;
    b.add_comment(&format!(
        "frames: {} distinct addresses, {} without symbol, {} outside known mappings; {} samples whose stack was lost",
        f.locations, f.unsymbolized, f.unmapped, f.missing_stacks
    ));
    if f.by_source.iter().any(|&n| n > 0) {
        b.add_comment(&format!("frame names by source (distinct addresses): {}", f.sources_line()));
    }
    if f.evicted > 0 {
        b.add_comment(&format!(
            "{} samples (rows) without their stacks: since-start history whose stacks the daemon's table no \
             longer holds (evicted to make room for new ones, or refused while it was full), folded together \
             with their counts kept",
            f.evicted
        ));
    }
    if f.over_share > 0 {
        b.add_comment(&format!(
            "{} samples (rows) without their stacks: the process (or its uid) held its share of the kernel's \
             stack table, filled by many new stacks at once; [limits] process_share_percent and \
             uid_share_percent set the shares",
            f.over_share
        ));
    }
    for refusal in &resolved.refused {
        b.add_comment(&format!("file not fully read: {refusal}"));
    }
    b.finish()
}

fn label(b: &mut ProfileBuilder, key: &str, value: &LabelValue) -> Label {
    match value {
        LabelValue::Str(s) => b.str_label(key, s),
        LabelValue::Num(n, unit) => {
            let mut label = b.num_label(key, *n);
            if let Some(unit) = unit {
                label.num_unit = b.string(unit);
            }
            label
        }
    }
}

/// `interpreted`: the indices of the interpreted frames' mappings, whose function names are
/// final.
fn add_location(b: &mut ProfileBuilder, loc: &LocationInfo, mapping_ids: &[u64], interpreted: &[usize]) -> u64 {
    let mapping_id = loc.mapping.map_or(0, |m| mapping_ids[m]);
    let verbatim = loc.mapping.is_some_and(|m| interpreted.contains(&m));
    let lines: Vec<(FunctionKey, i64)> = loc
        .frames
        .iter()
        .map(|f| {
            let key = FunctionKey { name: f.function.clone(), file: f.file.clone().unwrap_or_default(), verbatim };
            (key, i64::from(f.line))
        })
        .collect();
    b.add_location(mapping_id, loc.address, &lines)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        pprof::decode,
        resolve::{FrameStats, MappingInfo, ResolvedSample},
        symbolize::Frame,
    };

    fn frame(name: &str, line: u32) -> Frame {
        Frame { function: name.into(), file: Some("x.c".into()), line, offset: 0 }
    }

    fn resolved() -> ResolvedProfile {
        let mapping = MappingInfo {
            start: 0x1000,
            limit: 0x2000,
            offset: 0,
            path: "/bin/x".into(),
            build_id: Some("abcd".into()),
            has_functions: true,
            has_lines: true,
            has_inline_frames: true,
        };
        let loc = |address, frames| LocationInfo { address, mapping: Some(0), frames };
        ResolvedProfile {
            pid: crate::ids::Pid(7),
            name: "x".into(),
            mappings: vec![mapping],
            locations: vec![
                loc(0x1100, vec![frame("inlined", 3), frame("hot", 10)]),
                loc(0x1200, vec![frame("main", 20)]),
                LocationInfo { address: 0x9, mapping: None, frames: vec![] },
            ],
            samples: vec![ResolvedSample {
                locations: vec![0, 1],
                values: vec![5, 50_000_000],
                unscaled: vec![],
                labels: vec![
                    ("tid", LabelValue::Num(8, None)),
                    ("thread", LabelValue::Str("w".into())),
                    ("bytes", LabelValue::Num(64, Some("bytes"))),
                ],
            }],
            frames: FrameStats {
                locations: 3,
                unsymbolized: 0,
                unmapped: 1,
                missing_stacks: 0,
                over_share: 0,
                evicted: 0,
                by_source: Default::default(),
            },
            refused: Vec::new(),
            notes: Vec::new(),
        }
    }

    #[test]
    fn encodes_shape_samples_labels_and_comments() {
        let shape = Shape {
            sample_types: &[("samples", "count"), ("cpu", "nanoseconds")],
            period_type: ("cpu", "nanoseconds"),
            period: 10_000_000,
            default_sample_type: "cpu",
        };
        let meta = ProfileMeta {
            start: SystemTime::UNIX_EPOCH + Duration::from_secs(5),
            duration: Duration::from_secs(2),
            comments: vec!["dropped: 0".into()],
        };
        let p = decode(&encode(&resolved(), &shape, &meta).gzip(), "test").unwrap();
        let s = |i: i64| p.string_table[i as usize].as_str();
        let types: Vec<_> = p.sample_type.iter().map(|t| (s(t.r#type), s(t.unit))).collect();
        assert_eq!(types, [("samples", "count"), ("cpu", "nanoseconds")]);
        assert_eq!(s(p.default_sample_type), "cpu");
        assert_eq!(p.period, 10_000_000);
        assert_eq!(p.time_nanos, 5_000_000_000);
        assert_eq!(p.duration_nanos, 2_000_000_000);
        assert_eq!(p.sample[0].value, [5, 50_000_000]);
        let labels: Vec<_> = p.sample[0].label.iter().map(|l| (s(l.key), l.num, s(l.str), s(l.num_unit))).collect();
        assert_eq!(labels, [("tid", 8, "", ""), ("thread", 0, "w", ""), ("bytes", 64, "", "bytes")]);
        let leaf = &p.location[p.sample[0].location_id[0] as usize - 1];
        let names: Vec<_> = leaf.line.iter().map(|l| s(p.function[l.function_id as usize - 1].name)).collect();
        assert_eq!(names, ["inlined", "hot"], "innermost first");
        assert_eq!(p.location[2].mapping_id, 0, "unmapped location has no mapping");
        assert_eq!(s(p.mapping[0].build_id), "abcd");
        assert!(p.comment.iter().any(|&c| s(c).contains("1 outside known mappings")));
        assert!(p.comment.iter().any(|&c| s(c) == "dropped: 0"));
    }
}
