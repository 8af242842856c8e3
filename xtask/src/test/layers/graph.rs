//! The module graph of one crate: its top-level modules, the arrows between them (each with
//! the line it was first seen at), its cycles and, for a graph without one, its floors.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fmt;

use super::{
    source::{blank, module_path, root_imports, scan, Scan, Target},
    ROOT,
};

/// Where an arrow was first seen, for the message.
#[derive(Clone, Debug)]
pub(super) struct Site {
    pub(super) file: String,
    pub(super) line: usize,
}

/// Top-level modules and the arrows between them.
#[derive(Debug, Default)]
pub(super) struct Graph {
    pub(super) nodes: BTreeSet<String>,
    pub(super) arrows: BTreeMap<String, BTreeMap<String, Site>>,
}

/// One cycle, as the arrows that make it, and every module of its knot (all the modules that
/// reach one another).
pub(super) struct Cycle {
    pub(super) arrows: Vec<(String, String, Site)>,
    pub(super) knot: Vec<String>,
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
    pub(super) fn from_files(files: &[(String, String)]) -> Graph {
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
    pub(super) fn floors(&self) -> Vec<Vec<String>> {
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

    pub(super) fn arrow_count(&self) -> usize {
        self.arrows.values().map(BTreeMap::len).sum()
    }

    /// One shortest cycle per strongly connected group of two or more modules.
    pub(super) fn cycles(&self) -> Vec<Cycle> {
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
