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

/// Draws a gzipped (or plain) pprof profile's `sample_type` (default: the profile's own).
pub fn svg_of_pprof(bytes: &[u8], what: &str, sample_type: Option<&str>, title: &str) -> Result<Vec<u8>, FlameError> {
    let profile = pprof::decode(bytes, what)?;
    svg(&pprof::fold(&profile, sample_type)?, title)
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
    fn svg_goes_next_to_the_profile() {
        assert_eq!(svg_path(Path::new("/p/app-7/cpu.pb.gz")), Path::new("/p/app-7/cpu.svg"));
        assert_eq!(svg_path(Path::new("heap.pb")), Path::new("heap.svg"));
    }
}
