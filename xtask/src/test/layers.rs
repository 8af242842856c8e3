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

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fmt;
use std::path::Path;

use anyhow::{bail, Context, Result};

/// The crates checked, by their source directory under the workspace root.
pub const CRATES: [&str; 3] = ["profiler-daemon/src", "profiler-ebpf/src", "xtask/src"];

/// The node for the crate root file.
const ROOT: &str = "crate";

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

/// Where an arrow was first seen, for the message.
#[derive(Clone, Debug)]
struct Site {
    file: String,
    line: usize,
}

/// Top-level modules and the arrows between them.
#[derive(Debug, Default)]
struct Graph {
    nodes: BTreeSet<String>,
    arrows: BTreeMap<String, BTreeMap<String, Site>>,
}

/// One cycle, as the arrows that make it, and every module of its knot (all the modules that
/// reach one another).
struct Cycle {
    arrows: Vec<(String, String, Site)>,
    knot: Vec<String>,
}

impl fmt::Display for Cycle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Some((first, _, _)) = self.arrows.first() else { return Ok(()) };
        write!(f, "{first}")?;
        for (_, to, site) in &self.arrows {
            write!(f, " -> {to} ({}:{})", site.file, site.line)?;
        }
        if self.knot.len() > self.arrows.len() {
            write!(f, "; its knot: {}", self.knot.join(", "))?;
        }
        Ok(())
    }
}

impl Graph {
    /// The graph of one crate's files (paths relative to its `src`).
    fn from_files(files: &[(String, String)]) -> Graph {
        let root_file = ["lib.rs", "main.rs"].into_iter().find(|root| files.iter().any(|(path, _)| path == root));
        let in_crate = |path: &str| {
            let module = module_path(path);
            (module.is_empty() && Some(path) == root_file) || (!module.is_empty() && !path.starts_with("bin/"))
        };
        let scanned: Vec<(&String, Vec<String>, Scan)> = files
            .iter()
            .filter(|(path, _)| in_crate(path))
            .map(|(path, text)| {
                let module = module_path(path);
                let scan = scan(&blank(text), &module);
                (path, module, scan)
            })
            .collect();
        let test_modules: Vec<Vec<String>> = scanned
            .iter()
            .flat_map(|(_, module, scan)| {
                scan.test_mods.iter().map(|name| [module.clone(), vec![name.clone()]].concat())
            })
            .collect();
        let scanned: Vec<_> = scanned
            .into_iter()
            .filter(|(_, module, _)| !test_modules.iter().any(|test| module.starts_with(test)))
            .collect();
        let mut graph = Graph::default();
        for (_, module, _) in &scanned {
            graph.nodes.insert(module.first().cloned().unwrap_or_else(|| ROOT.to_string()));
        }
        let imports = files
            .iter()
            .find(|(path, _)| Some(path.as_str()) == root_file)
            .map(|(_, text)| root_imports(&blank(text), &graph.nodes))
            .unwrap_or_default();
        let mut reexports = BTreeMap::new();
        for (line, module, names) in imports {
            for name in names {
                reexports.entry(name).or_insert_with(|| module.clone());
            }
            let site = Site { file: root_file.unwrap_or_default().to_string(), line };
            graph.arrows.entry(ROOT.to_string()).or_default().entry(module).or_insert(site);
        }
        for (path, module, scan) in scanned {
            let from = module.first().cloned().unwrap_or_else(|| ROOT.to_string());
            for (line, target) in scan.references {
                let to = match target {
                    Target::Module(name) if graph.nodes.contains(&name) => name,
                    Target::Module(name) => reexports.get(&name).cloned().unwrap_or_else(|| ROOT.to_string()),
                    Target::Root => ROOT.to_string(),
                };
                if to != from {
                    let site = Site { file: path.clone(), line };
                    graph.arrows.entry(from.clone()).or_default().entry(to).or_insert(site);
                }
            }
        }
        graph
    }

    /// The modules by floor, bottom first: a module's floor is one above the highest of those
    /// it imports (floor 1 imports none). Only for a graph without cycles.
    fn floors(&self) -> Vec<Vec<String>> {
        let mut floor_of: BTreeMap<&str, usize> = BTreeMap::new();
        // Each pass settles every module whose imports are settled; a DAG settles in at most
        // as many passes as it has modules.
        for _ in 0..self.nodes.len() {
            for node in &self.nodes {
                let below: Option<Vec<usize>> =
                    self.successors(node).map(|(to, _)| floor_of.get(to.as_str()).copied()).collect();
                if let Some(below) = below {
                    floor_of.insert(node, below.into_iter().max().map_or(0, |top| top + 1));
                }
            }
        }
        let mut floors: Vec<Vec<String>> = Vec::new();
        for (node, floor) in floor_of {
            floors.resize_with(floors.len().max(floor + 1), Vec::new);
            floors[floor].push(node.to_string());
        }
        floors
    }

    fn arrow_count(&self) -> usize {
        self.arrows.values().map(BTreeMap::len).sum()
    }

    /// One shortest cycle per strongly connected group of two or more modules.
    fn cycles(&self) -> Vec<Cycle> {
        let mut reported: BTreeSet<String> = BTreeSet::new();
        let mut cycles = Vec::new();
        for start in &self.nodes {
            if reported.contains(start) {
                continue;
            }
            if let Some(arrows) = self.shortest_cycle(start) {
                // Everything that reaches `start` and is reached from it is the same knot.
                let knot: Vec<String> =
                    self.reachable(start).into_iter().filter(|node| self.reachable(node).contains(start)).collect();
                reported.extend(knot.iter().cloned());
                cycles.push(Cycle { arrows, knot });
            }
        }
        cycles
    }

    fn successors(&self, node: &str) -> impl Iterator<Item = (&String, &Site)> {
        self.arrows.get(node).into_iter().flatten()
    }

    fn reachable(&self, start: &str) -> BTreeSet<String> {
        let mut seen = BTreeSet::new();
        let mut todo = vec![start.to_string()];
        while let Some(node) = todo.pop() {
            for (next, _) in self.successors(&node) {
                if seen.insert(next.clone()) {
                    todo.push(next.clone());
                }
            }
        }
        seen
    }

    /// Breadth-first from `start` back to `start`.
    fn shortest_cycle(&self, start: &str) -> Option<Vec<(String, String, Site)>> {
        let mut came_from: BTreeMap<String, (String, Site)> = BTreeMap::new();
        let mut queue = VecDeque::from([start.to_string()]);
        while let Some(node) = queue.pop_front() {
            for (next, site) in self.successors(&node) {
                if next == start {
                    let mut arrows = vec![(node.clone(), next.clone(), site.clone())];
                    let mut at = node.clone();
                    while at != start {
                        let (prev, site) = came_from[&at].clone();
                        arrows.push((prev.clone(), at, site));
                        at = prev;
                    }
                    arrows.reverse();
                    return Some(arrows);
                }
                if !came_from.contains_key(next) {
                    came_from.insert(next.clone(), (node.clone(), site.clone()));
                    queue.push_back(next.clone());
                }
            }
        }
        None
    }
}

/// `a/b/c.rs` → `[a, b, c]`; `a/mod.rs` and `a.rs` → `[a]`; `lib.rs` and `main.rs` → `[]`.
fn module_path(path: &str) -> Vec<String> {
    let mut parts: Vec<String> = path.trim_end_matches(".rs").split('/').map(str::to_string).collect();
    if parts.last().is_some_and(|last| last == "mod") || (parts.len() == 1 && (parts[0] == "lib" || parts[0] == "main"))
    {
        parts.pop();
    }
    parts
}

/// What a path names: a top-level name (a module, or an item of the root), or the root itself.
#[derive(Debug, PartialEq)]
enum Target {
    Module(String),
    Root,
}

/// The root file's `use a::…` statements (its re-exports): each as (line, module `a`, the names
/// it brings in).
fn root_imports(code: &[char], modules: &BTreeSet<String>) -> Vec<(usize, String, Vec<String>)> {
    let text: String = code.iter().collect();
    let mut imports = Vec::new();
    let mut offset = 0;
    for statement in text.split(';') {
        let leading = statement.len() - statement.trim_start().len();
        let line = 1 + text[..offset + leading].matches('\n').count();
        offset += statement.len() + 1;
        let trimmed = statement.trim();
        let Some(rest) = trimmed.strip_prefix("pub use ").or_else(|| trimmed.strip_prefix("use ")) else { continue };
        let rest = rest.trim().trim_start_matches("crate::").trim_start_matches("self::");
        let Some(module) = rest.split("::").next().filter(|first| modules.contains(*first)) else { continue };
        let names = rest.split(|c: char| !is_ident(c)).filter(|name| !name.is_empty() && *name != "as");
        imports.push((line, module.to_string(), names.map(str::to_string).collect()));
    }
    imports
}

fn is_ident(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// The code with comments and the contents of string and char literals turned into spaces
/// (newlines kept, so line numbers stay right).
fn blank(text: &str) -> Vec<char> {
    let mut out: Vec<char> = text.chars().collect();
    let mut i = 0;
    while i < out.len() {
        let start = i;
        i = match (out[i], out.get(i + 1).copied()) {
            ('/', Some('/')) => out[i..].iter().position(|&c| c == '\n').map_or(out.len(), |n| i + n),
            ('/', Some('*')) => block_comment_end(&out, i),
            ('"', _) => string_end(&out, i + 1, None),
            ('r', Some('"' | '#'))
                if i == 0 || !is_ident(out[i - 1]) || (out[i - 1] == 'b' && (i < 2 || !is_ident(out[i - 2]))) =>
            {
                let hashes = out[i + 1..].iter().take_while(|&&c| c == '#').count();
                if out.get(i + 1 + hashes) == Some(&'"') {
                    string_end(&out, i + 2 + hashes, Some(hashes))
                } else {
                    i + 1
                }
            }
            ('\'', Some('\\')) => out[i + 3..].iter().position(|&c| c == '\'').map_or(out.len(), |n| i + 4 + n),
            ('\'', Some(_)) if out.get(i + 2) == Some(&'\'') => i + 3,
            _ => {
                i += 1;
                continue;
            }
        };
        i = i.min(out.len());
        for c in &mut out[start..i] {
            if *c != '\n' {
                *c = ' ';
            }
        }
    }
    out
}

/// The index after a (nested) block comment that opens at `i`.
fn block_comment_end(code: &[char], mut i: usize) -> usize {
    let mut depth = 0;
    while i < code.len() {
        match (code[i], code.get(i + 1).copied()) {
            ('/', Some('*')) => (depth, i) = (depth + 1, i + 2),
            ('*', Some('/')) => {
                (depth, i) = (depth - 1, i + 2);
                if depth == 0 {
                    return i;
                }
            }
            _ => i += 1,
        }
    }
    code.len()
}

/// The index after a string whose contents start at `i`; `raw` is the number of `#` of a raw
/// string (no escapes), `None` for a plain one.
fn string_end(code: &[char], mut i: usize, raw: Option<usize>) -> usize {
    let hashes = raw.unwrap_or(0);
    while i < code.len() {
        match code[i] {
            '\\' if raw.is_none() => i += 2,
            '"' if code[i + 1..].iter().take(hashes).filter(|&&c| c == '#').count() == hashes => return i + 1 + hashes,
            _ => i += 1,
        }
    }
    code.len()
}

/// What a file's code says about the graph.
#[derive(Debug, Default)]
struct Scan {
    /// Every `crate::…` and `super::…` path that leaves the file's top-level module, as
    /// (line, target).
    references: Vec<(usize, Target)>,
    /// The children declared as `#[cfg(test)] mod x;`, whose files are test code.
    test_mods: Vec<String>,
}

/// Scans blanked code; `module` is the file's module path, and inline `mod x { … }` blocks
/// deepen it. `#[cfg(test)]` items are skipped.
fn scan(code: &[char], module: &[String]) -> Scan {
    const CFG_TEST: &str = "#[cfg(test)]";
    let mut found = Scan::default();
    let mut line = 1;
    let mut depth = 0usize;
    let mut inline_mods: Vec<usize> = Vec::new();
    let mut i = 0;
    while i < code.len() {
        match code[i] {
            '\n' => line += 1,
            '{' => depth += 1,
            '}' => {
                depth = depth.saturating_sub(1);
                if inline_mods.last() == Some(&depth) {
                    inline_mods.pop();
                }
            }
            '#' if code[i..].iter().take(CFG_TEST.len()).copied().eq(CFG_TEST.chars()) => {
                let start = skip_space(code, i + CFG_TEST.len());
                let end = item_end(code, start);
                if word_at(code, start) == "mod" && code.get(end - 1) == Some(&';') {
                    found.test_mods.push(word_at(code, skip_space(code, start + 3)));
                }
                line += code[i..end].iter().filter(|&&c| c == '\n').count();
                i = end;
                continue;
            }
            c if is_ident(c) && (i == 0 || !is_ident(code[i - 1])) => {
                let word = word_at(code, i);
                let after = i + word.len();
                if word == "mod" && opens_inline_mod(code, after) {
                    inline_mods.push(depth);
                } else if word == "crate" || word == "super" {
                    let module_depth = module.len() + inline_mods.len();
                    let targets = path_targets(code, i, module_depth);
                    found.references.extend(targets.into_iter().map(|target| (line, target)));
                }
                i = after;
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    found
}

/// The index after the item that starts at `i`: after its first `;` outside brackets, or after
/// its first `{…}` block (further attributes before it are part of it).
fn item_end(code: &[char], mut i: usize) -> usize {
    let mut depth = 0usize;
    while i < code.len() {
        match code[i] {
            '(' | '[' => depth += 1,
            ')' | ']' => depth = depth.saturating_sub(1),
            '{' => depth += 1,
            '}' => {
                depth = depth.saturating_sub(1);
                if depth == 0 {
                    return i + 1;
                }
            }
            ';' if depth == 0 => return i + 1,
            _ => {}
        }
        i += 1;
    }
    code.len()
}

fn word_at(code: &[char], i: usize) -> String {
    code[i..].iter().take_while(|&&c| is_ident(c)).collect()
}

fn skip_space(code: &[char], mut i: usize) -> usize {
    while code.get(i).is_some_and(|c| c.is_whitespace()) {
        i += 1;
    }
    i
}

/// After `mod`: a name and then `{` (not `;`).
fn opens_inline_mod(code: &[char], i: usize) -> bool {
    let i = skip_space(code, i);
    let name = word_at(code, i);
    !name.is_empty() && code.get(skip_space(code, i + name.len())) == Some(&'{')
}

/// The top-level targets of a path starting at `i` (`crate::a`, `super::super::b`,
/// `crate::{a, b::c}`), or none when the path stays inside the file's top-level module.
fn path_targets(code: &[char], mut i: usize, module_depth: usize) -> Vec<Target> {
    let mut supers = 0;
    loop {
        let word = word_at(code, i);
        let after = skip_space(code, i + word.len());
        let has_sep = code.get(after) == Some(&':') && code.get(after + 1) == Some(&':');
        match word.as_str() {
            "super" => supers += 1,
            "crate" if supers == 0 => supers = usize::MAX,
            _ => break,
        }
        if !has_sep {
            // `use super::{self}` style ends here: the path names a module, not inside ours.
            return if supers == usize::MAX || supers >= module_depth { vec![Target::Root] } else { Vec::new() };
        }
        i = skip_space(code, after + 2);
    }
    if supers != usize::MAX && supers < module_depth {
        return Vec::new();
    }
    if code.get(i) == Some(&'{') {
        return group_heads(code, i).into_iter().map(name_target).collect();
    }
    let word = word_at(code, i);
    vec![if word.is_empty() { Target::Root } else { name_target(word) }]
}

fn name_target(word: String) -> Target {
    if word == "self" || word == "super" {
        Target::Root
    } else {
        Target::Module(word)
    }
}

/// The first name of each item of the `{…}` group that opens at `i`.
fn group_heads(code: &[char], mut i: usize) -> Vec<String> {
    let mut heads = Vec::new();
    let mut depth = 0;
    let mut expect_head = false;
    while i < code.len() {
        match code[i] {
            '{' => {
                depth += 1;
                expect_head = depth == 1;
            }
            '}' => {
                depth -= 1;
                if depth == 0 {
                    break;
                }
            }
            ',' if depth == 1 => expect_head = true,
            c if expect_head && is_ident(c) => {
                let word = word_at(code, i);
                i += word.len();
                heads.push(word);
                expect_head = false;
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    heads
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files(list: &[(&str, &str)]) -> Vec<(String, String)> {
        list.iter().map(|(path, text)| (path.to_string(), text.to_string())).collect()
    }

    fn arrows(graph: &Graph) -> Vec<String> {
        graph.arrows.iter().flat_map(|(from, tos)| tos.keys().map(move |to| format!("{from}->{to}"))).collect()
    }

    #[test]
    fn a_planted_cycle_is_found_and_named_with_its_lines() {
        let crate_files = files(&[
            ("lib.rs", "pub mod config;\npub mod profiles;\npub mod catalog;\npub mod units;\n"),
            ("config.rs", "//! Config.\n\npub use crate::profiles::Kind;\nuse crate::units::Bytes;\n"),
            ("profiles/mod.rs", "mod kind;\npub use kind::Kind;\nuse crate::catalog::Catalog;\n"),
            ("profiles/kind.rs", "pub enum Kind {}\n"),
            ("catalog/mod.rs", "mod events;\n"),
            ("catalog/events.rs", "fn f() {\n    let _ = super::super::config::load();\n}\n"),
            ("units.rs", "pub struct Bytes;\n"),
        ]);
        let graph = Graph::from_files(&crate_files);
        let cycles = graph.cycles();
        assert_eq!(cycles.len(), 1, "{:?}", arrows(&graph));
        assert_eq!(
            cycles[0].to_string(),
            "catalog -> config (catalog/events.rs:2) -> profiles (config.rs:3) -> catalog (profiles/mod.rs:3)"
        );
    }

    #[test]
    fn cutting_the_planted_arrow_leaves_no_cycle() {
        let crate_files = files(&[
            ("lib.rs", "pub mod config;\npub mod profiles;\npub mod catalog;\n"),
            ("config.rs", "use crate::profiles::Kind;\n"),
            ("profiles/mod.rs", "use crate::catalog::Catalog;\n"),
            ("catalog/mod.rs", "// was: use crate::config::load;\nconst DOC: &str = \"crate::config\";\n"),
        ]);
        let graph = Graph::from_files(&crate_files);
        assert!(graph.cycles().is_empty(), "{:?}", arrows(&graph));
        assert_eq!(arrows(&graph), ["config->profiles", "profiles->catalog"]);
        assert_eq!(graph.floors(), [vec!["catalog", "crate"], vec!["profiles"], vec!["config"]]);
    }

    #[test]
    fn groups_inline_test_modules_super_and_root_reexports_resolve_to_modules() {
        let crate_files = files(&[
            ("lib.rs", "pub mod a;\npub mod b;\npub mod c;\npub mod error;\npub use error::{Error, Result};\n"),
            ("a.rs", "use crate::{b::X, c};\nfn f() -> crate::Result<()> { Ok(()) }\n#[cfg(test)]\nmod tests {\n    use super::*;\n}\n"),
            ("b/mod.rs", "mod inner;\n"),
            ("b/inner.rs", "use super::Thing;\nuse super::super::c::Y;\nlet s = r#\"crate::a\"#; let q = '\"'; // crate::a\n"),
            ("c.rs", "/* crate::a /* nested */ crate::a */ fn g<'a>(x: &'a str) {}\n"),
            ("error.rs", ""),
        ]);
        let graph = Graph::from_files(&crate_files);
        assert_eq!(arrows(&graph), ["a->b", "a->c", "a->error", "b->c", "crate->error"]);
        assert!(graph.cycles().is_empty());
    }

    #[test]
    fn test_code_may_reach_up_production_code_may_not() {
        let crate_files = files(&[
            ("lib.rs", "pub mod api;\npub mod client;\n#[cfg(test)]\nmod properties;\n"),
            ("client/mod.rs", "use crate::api::MAX;\n"),
            (
                "api/mod.rs",
                "pub const MAX: u64 = 1;\n#[cfg(test)]\nmod tests;\n#[cfg(test)]\nuse crate::client::get;\n",
            ),
            ("api/tests/mod.rs", "use crate::client::get;\n"),
            ("properties.rs", "use crate::client::get;\n"),
            ("api/server.rs", "#[cfg(test)]\nfn helper() { crate::client::get(); }\nfn serve() {}\n"),
        ]);
        let graph = Graph::from_files(&crate_files);
        assert_eq!(arrows(&graph), ["client->api"]);
        let with_production_arrow =
            [crate_files, files(&[("api/page.rs", "fn f() {}\nuse crate::client::get;\n")])].concat();
        let cycles = Graph::from_files(&with_production_arrow).cycles();
        assert_eq!(cycles.len(), 1);
        assert_eq!(cycles[0].to_string(), "api -> client (api/page.rs:2) -> api (client/mod.rs:1)");
    }

    #[test]
    fn the_workspace_has_no_module_cycle() {
        let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("xtask sits in the workspace");
        if let Err(err) = check(workspace) {
            panic!("{err:#}");
        }
    }
}
