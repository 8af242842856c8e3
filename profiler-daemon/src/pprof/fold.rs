//! A profile's stacks folded root first, one entry per distinct stack (`main;work;hot` and
//! its value), the input of flame graphs. Read from the decoded protobuf, so any pprof file
//! folds the same way as the ones the profiler writes.

use std::collections::{BTreeMap, HashMap};

use super::proto::{Function, Location, Profile};

/// The folded stacks of one sample type.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Folded {
    /// The sample type folded (`cpu`, `inuse_space`, ...) and its unit.
    pub sample_type: String,
    pub unit: String,
    /// Stacks root first, frames joined by `;`, with their summed positive values, sorted.
    pub stacks: Vec<(String, i64)>,
}

/// Why a profile could not be folded.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FoldError {
    #[error("the profile has no sample type {wanted:?}; it has {available}")]
    UnknownSampleType { wanted: String, available: String },
    #[error("the profile has no sample types")]
    NoSampleTypes,
}

/// Folds the values of `sample_type` (default: the profile's default sample type, else the
/// last one, as `go tool pprof` chooses). Inlined frames are frames of their own; a location
/// without symbols is its address. Samples whose value is not positive are left out.
pub fn fold(profile: &Profile, sample_type: Option<&str>) -> Result<Folded, FoldError> {
    let string = |i: i64| profile.string_table.get(i as usize).map_or("", String::as_str);
    let types: Vec<(&str, &str)> = profile.sample_type.iter().map(|t| (string(t.r#type), string(t.unit))).collect();
    let default = (profile.default_sample_type != 0).then(|| string(profile.default_sample_type));
    let index = match sample_type.or(default) {
        Some(wanted) => match types.iter().position(|(name, _)| *name == wanted) {
            Some(index) => index,
            None if sample_type.is_none() => types.len().checked_sub(1).ok_or(FoldError::NoSampleTypes)?,
            None => {
                let available = types.iter().map(|(name, _)| *name).collect::<Vec<_>>().join(", ");
                return Err(FoldError::UnknownSampleType { wanted: wanted.to_string(), available });
            }
        },
        None => types.len().checked_sub(1).ok_or(FoldError::NoSampleTypes)?,
    };
    let functions: HashMap<u64, &Function> = profile.function.iter().map(|f| (f.id, f)).collect();
    let locations: HashMap<u64, &Location> = profile.location.iter().map(|l| (l.id, l)).collect();
    let mut stacks: BTreeMap<String, i64> = BTreeMap::new();
    for sample in &profile.sample {
        let value = sample.value.get(index).copied().unwrap_or(0);
        if value <= 0 {
            continue;
        }
        let mut frames: Vec<String> = Vec::new();
        // Leaf first in the sample, innermost first in a location: reversed, root first.
        for id in sample.location_id.iter().rev() {
            let Some(location) = locations.get(id) else { continue };
            if location.line.is_empty() {
                frames.push(format!("{:#x}", location.address));
            }
            for line in location.line.iter().rev() {
                let name = functions.get(&line.function_id).map_or("", |f| string(f.name));
                frames.push(frame_name(name, location.address));
            }
        }
        if frames.is_empty() {
            frames.push("[no stack]".into());
        }
        *stacks.entry(frames.join(";")).or_default() += value;
    }
    let (name, unit) = types[index];
    Ok(Folded { sample_type: name.to_string(), unit: unit.to_string(), stacks: stacks.into_iter().collect() })
}

/// A frame as the folded format allows: no `;` (the separator), no line breaks.
fn frame_name(name: &str, address: u64) -> String {
    if name.is_empty() {
        return format!("{address:#x}");
    }
    name.chars().map(|c| if c == ';' || c.is_control() { '_' } else { c }).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pprof::proto::{Line, Sample, ValueType};

    fn profile() -> Profile {
        let strings = ["", "samples", "count", "cpu", "nanoseconds", "main", "hot", "in;lined"];
        let function = |id: u64, name: i64| Function { id, name, ..Function::default() };
        let line = |function_id| Line { function_id, line: 0 };
        let location = |id, address, lines: Vec<Line>| Location { id, address, line: lines, ..Location::default() };
        Profile {
            sample_type: vec![ValueType { r#type: 1, unit: 2 }, ValueType { r#type: 3, unit: 4 }],
            string_table: strings.iter().map(|s| s.to_string()).collect(),
            function: vec![function(1, 5), function(2, 6), function(3, 7)],
            // Location 2 is hot with in;lined inlined into it (innermost first).
            location: vec![
                location(1, 0x10, vec![line(1)]),
                location(2, 0x20, vec![line(3), line(2)]),
                location(3, 0x30, vec![]),
            ],
            sample: vec![
                Sample { location_id: vec![2, 1], value: vec![3, 30], label: vec![] },
                Sample { location_id: vec![2, 1], value: vec![1, 10], label: vec![] },
                Sample { location_id: vec![3, 1], value: vec![2, 0], label: vec![] },
            ],
            ..Profile::default()
        }
    }

    #[test]
    fn folds_root_first_with_inlined_frames_and_merges_stacks() {
        let folded = fold(&profile(), None).unwrap();
        assert_eq!((folded.sample_type.as_str(), folded.unit.as_str()), ("cpu", "nanoseconds"));
        assert_eq!(folded.stacks, [("main;hot;in_lined".to_string(), 40)], "the last type; zero left out");
        let samples = fold(&profile(), Some("samples")).unwrap();
        assert_eq!(samples.stacks, [("main;0x30".to_string(), 2), ("main;hot;in_lined".to_string(), 4)]);
        let err = fold(&profile(), Some("alloc_space")).unwrap_err();
        assert_eq!(err.to_string(), "the profile has no sample type \"alloc_space\"; it has samples, cpu");
        assert_eq!(fold(&Profile::default(), None), Err(FoldError::NoSampleTypes));
    }
}
