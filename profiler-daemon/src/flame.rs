//! Flame graphs: folded stacks ([`crate::pprof::fold`]) drawn as an SVG by inferno, the
//! Rust port of Brendan Gregg's flamegraph.pl. One path for `profiler flamegraph`,
//! `snapshot --flamegraph` and `/debug/pprof/flamegraph`.

use std::path::{Path, PathBuf};

use inferno::flamegraph::{self, Options};

use crate::pprof::{self, DecodeError, FoldError, Folded};

/// Why a flame graph could not be drawn.
#[derive(Debug, thiserror::Error)]
pub enum FlameError {
    #[error(transparent)]
    Decode(#[from] DecodeError),
    #[error(transparent)]
    Fold(#[from] FoldError),
    #[error("nothing to draw: no sample has a positive {0} value")]
    Empty(String),
    #[error(
        "the profile has {frames} frames, more than the {max} a flame graph is drawn from here; download the \
         profile and draw it with `profiler flamegraph FILE`"
    )]
    TooLarge { frames: usize, max: usize },
    #[error("failed to draw the flame graph")]
    Draw(#[source] std::io::Error),
    #[error("failed to write {path}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Draws `folded` as an SVG titled `title`; the frames' widths are their shares of the
/// sample type's total.
pub fn svg(folded: &Folded, title: &str) -> Result<Vec<u8>, FlameError> {
    if folded.stacks.is_empty() {
        return Err(FlameError::Empty(folded.sample_type.clone()));
    }
    let lines: Vec<String> = folded.stacks.iter().map(|(stack, value)| format!("{stack} {value}")).collect();
    let mut options = Options::default();
    options.title = title.to_string();
    options.count_name = match folded.unit.as_str() {
        "" | "count" => folded.sample_type.clone(),
        unit => unit.to_string(),
    };
    let mut out = Vec::new();
    flamegraph::from_lines(&mut options, lines.iter().map(String::as_str), &mut out).map_err(FlameError::Draw)?;
    Ok(out)
}

/// Draws a gzipped (or plain) pprof profile's `sample_type` (default: the profile's own),
/// unless its samples name more than `max_frames` frames: folding and drawing cost time and
/// memory in proportion to them (5 M frames took 2.4 s and 880 MB), so they are counted first.
pub fn svg_of_pprof(
    bytes: &[u8],
    what: &str,
    sample_type: Option<&str>,
    title: &str,
    max_frames: usize,
) -> Result<Vec<u8>, FlameError> {
    let profile = pprof::decode(bytes, what)?;
    let frames = frame_count(&profile);
    if frames > max_frames {
        return Err(FlameError::TooLarge { frames, max: max_frames });
    }
    svg(&pprof::fold(&profile, sample_type)?, title)
}

/// The frames the samples of `profile` name, inlined ones counted apart (as folded).
fn frame_count(profile: &pprof::proto::Profile) -> usize {
    let lines: std::collections::HashMap<u64, usize> =
        profile.location.iter().map(|l| (l.id, l.line.len().max(1))).collect();
    profile.sample.iter().flat_map(|s| &s.location_id).map(|id| lines.get(id).copied().unwrap_or(0)).sum()
}

/// `profiler flamegraph FILE`: draws the file's profile into `output` (default: next to it,
/// `.pb.gz` replaced by `.svg`); returns the line to print.
pub fn draw_file(file: &Path, sample_type: Option<&str>, output: Option<&Path>) -> Result<String, FlameError> {
    let profile = pprof::decode_file(file)?;
    let folded = pprof::fold(&profile, sample_type)?;
    let title = format!("{} ({})", file.display(), folded.sample_type);
    let svg = svg(&folded, &title)?;
    let output = output.map_or_else(|| svg_path(file), Path::to_path_buf);
    std::fs::write(&output, svg).map_err(|source| FlameError::Write { path: output.clone(), source })?;
    Ok(format!("wrote {} ({} of {})", output.display(), folded.sample_type, file.display()))
}

/// `cpu.pb.gz` → `cpu.svg`, in the same directory.
pub fn svg_path(file: &Path) -> PathBuf {
    let name = file.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let stem = name.strip_suffix(".pb.gz").or_else(|| name.strip_suffix(".pb")).unwrap_or(&name);
    file.with_file_name(format!("{stem}.svg"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draws_the_shares_of_the_stacks() {
        let folded = Folded {
            sample_type: "samples".into(),
            unit: "count".into(),
            stacks: vec![("main;work;hot_a".into(), 75), ("main;work;hot_b".into(), 25)],
        };
        let drawn = String::from_utf8(svg(&folded, "test").unwrap()).unwrap();
        assert!(drawn.starts_with("<?xml"), "{}", &drawn[..80]);
        for (name, share) in [("hot_a", "75.00%"), ("hot_b", "25.00%"), ("work", "100.00%")] {
            let title = drawn.split("<title>").find(|t| t.starts_with(&format!("{name} ")));
            let title = title.unwrap_or_else(|| panic!("no frame {name}"));
            assert!(title.contains(share), "{name}: {}", &title[..title.find("</title>").unwrap_or(title.len())]);
        }
        let empty = Folded { stacks: vec![], ..folded };
        assert_eq!(
            svg(&empty, "x").unwrap_err().to_string(),
            "nothing to draw: no sample has a positive samples value"
        );
    }

    #[test]
    fn profiles_over_the_frame_cap_are_refused_before_folding() {
        use pprof::proto::{Line, Location, Profile, Sample, ValueType};
        let line = Line { function_id: 1, line: 0 };
        let profile = Profile {
            sample_type: vec![ValueType { r#type: 1, unit: 2 }],
            string_table: vec![String::new(), "samples".into(), "count".into()],
            // Location 2 holds an inlined frame and its caller: two frames drawn.
            location: vec![
                Location { id: 1, address: 0x10, ..Location::default() },
                Location { id: 2, address: 0x20, line: vec![line, line], ..Location::default() },
            ],
            sample: vec![
                Sample { location_id: vec![1, 2], value: vec![3], label: vec![] },
                Sample { location_id: vec![2], value: vec![1], label: vec![] },
            ],
            ..Profile::default()
        };
        assert_eq!(frame_count(&profile), 5, "1 + 2 in the first sample, 2 in the second");
        let bytes = pprof::encode_gzip(&profile);
        assert!(svg_of_pprof(&bytes, "p", None, "t", 5).is_ok(), "at the cap it is drawn");
        let err = svg_of_pprof(&bytes, "p", None, "t", 4).unwrap_err();
        assert!(matches!(err, FlameError::TooLarge { frames: 5, max: 4 }), "{err}");
    }

    #[test]
    fn svg_goes_next_to_the_profile() {
        assert_eq!(svg_path(Path::new("/p/app-7/cpu.pb.gz")), Path::new("/p/app-7/cpu.svg"));
        assert_eq!(svg_path(Path::new("heap.pb")), Path::new("heap.svg"));
    }
}
