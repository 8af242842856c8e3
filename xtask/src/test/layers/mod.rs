//! The layering check: a crate's top-level modules must import one another without a cycle.
//!
//! ARCHITECTURE.md promises floors (vocabulary at the bottom, drivers at the top) whose imports
//! only run downwards. That holds only while someone checks it, so `cargo xtask test` runs this
//! before anything else (it builds nothing), and `cargo test -p xtask` runs it on the tree.
//!
//! It reads the source, not the compiler: every `crate::a…` (or `$crate::a…`) and `super::…`
//! path in code (comments and string literals are blanked first, so doc links do not count) is
//! an arrow from the file's top-level module to `a`. All files under `src/a/` and `src/a.rs`
//! are module `a`; the crate root (`lib.rs`, else `main.rs`) is `crate`, and a root item
//! reached as `crate::Name` counts as the module the root re-exports it from. Cycles inside
//! one top-level module (`mod.rs` and its children) are allowed. Items under `#[cfg(test)]`
//! (and the files of a `#[cfg(test)] mod x;`) are left out: a test may reach up, as the API's
//! tests talk through the real client.
//!
//! The check is here; [`graph`] owns the module graph and its cycles and floors, [`source`]
//! the reading of a file's text into the paths it names, [`limits`] the size limits on
//! production files and functions, checked in the same pass.

mod graph;
mod limits;
mod source;
#[cfg(test)]
mod tests;

use std::path::Path;

use anyhow::{bail, Context, Result};

use self::graph::Graph;

/// The crates checked, by their source directory under the workspace root.
pub const CRATES: [&str; 3] = ["profiler-daemon/src", "profiler-ebpf/src", "xtask/src"];

/// The crates whose sizes are limited ([`limits`]): every crate with production code.
pub const LIMITED: [&str; 4] = ["profiler-daemon/src", "profiler-common/src", "profiler-ebpf/src", "xtask/src"];

/// The node for the crate root file.
pub(super) const ROOT: &str = "crate";

/// Checks every crate in [`CRATES`]; fails naming each cycle with the line of each arrow.
pub fn check(workspace: &Path) -> Result<()> {
    let mut failures = Vec::new();
    for dir in CRATES {
        let files = read_sources(&workspace.join(dir)).with_context(|| format!("failed to read {dir}"))?;
        let graph = Graph::from_files(&files);
        let cycles = graph.cycles();
        if cycles.is_empty() {
            println!(
                "{dir}: {} modules, {} arrows, no cycle; floors from the bottom:",
                graph.nodes.len(),
                graph.arrow_count()
            );
            for (floor, modules) in graph.floors().iter().enumerate() {
                println!("  {:>2}  {}", floor + 1, modules.join(" "));
            }
        }
        failures.extend(cycles.iter().map(|cycle| format!("{dir}: {cycle}")));
    }
    if !failures.is_empty() {
        bail!(
            "module cycles (ARCHITECTURE.md, \"Layers\"):\n  {}\nmove the shared item to the lower module, or pass it in",
            failures.join("\n  ")
        );
    }
    check_limits(workspace)
}

/// Fails naming every production function over [`limits::MAX_FN_LINES`] lines and file over
/// [`limits::MAX_FILE_LINES`] without its reason.
fn check_limits(workspace: &Path) -> Result<()> {
    let mut failures = Vec::new();
    for dir in LIMITED {
        let files = read_sources(&workspace.join(dir)).with_context(|| format!("failed to read {dir}"))?;
        failures.extend(files.iter().flat_map(|(path, text)| limits::violations(&format!("{dir}/{path}"), text)));
    }
    if !failures.is_empty() {
        bail!("size limits (ARCHITECTURE.md, \"Layers\"):\n  {}", failures.join("\n  "));
    }
    println!(
        "sizes: no production function over {} lines, no file over {} without its reason",
        limits::MAX_FN_LINES,
        limits::MAX_FILE_LINES
    );
    Ok(())
}

/// Every `.rs` file under `src`, as (path relative to `src`, text), in a stable order.
fn read_sources(src: &Path) -> Result<Vec<(String, String)>> {
    let mut files = Vec::new();
    let mut dirs = vec![src.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).with_context(|| format!("failed to list {}", dir.display()))? {
            let path = entry?.path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|ext| ext == "rs") {
                let text =
                    std::fs::read_to_string(&path).with_context(|| format!("failed to read {}", path.display()))?;
                let rel = path.strip_prefix(src).expect("walked from src").to_string_lossy().replace('\\', "/");
                files.push((rel, text));
            }
        }
    }
    files.sort();
    Ok(files)
}
