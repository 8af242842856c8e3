//! The part of `[processes]` the kernel can decide: cgroup and unit matchers, turned into a
//! set of cgroup ids (a cgroup v2 directory's inode number is its id, what
//! `bpf_get_current_cgroup_id` returns) that the programs check before they walk a stack, so
//! an excluded process costs no walk. Name, executable and pid matchers are left to
//! userspace: when `include` has any of those, only the cgroup `exclude`s are applied in the
//! kernel.

use std::{collections::BTreeSet, os::unix::fs::MetadataExt, path::Path};

use crate::config::{Matcher, ProcessFacts, ProcessSelection};
use crate::ebpf::CgroupFilterMode;

/// Where the unified (v2) cgroup hierarchy is mounted: the `cgroup2` mount in
/// `/proc/self/mountinfo` (`/sys/fs/cgroup`, or `/sys/fs/cgroup/unified` on a hybrid
/// machine, whose v1 controllers are elsewhere). Its ids are the ones the kernel's programs
/// see.
pub fn cgroup2_root() -> Option<std::path::PathBuf> {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    mountinfo.lines().find_map(|line| {
        let (mount, fs) = line.split_once(" - ")?;
        if fs.split_whitespace().next() != Some("cgroup2") {
            return None;
        }
        // Field 5 is the mount point (spaces escaped as \040, which cgroup mounts never have).
        mount.split_whitespace().nth(4).map(std::path::PathBuf::from)
    })
}
/// Cgroups walked at most (a machine with more keeps the walk bounded; the rest are decided
/// in userspace only).
const MAX_CGROUPS: usize = 16_384;

/// What the kernel filters: how, and which cgroup ids.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CgroupFilter {
    pub mode: Option<CgroupFilterMode>,
    pub ids: BTreeSet<u64>,
}

impl CgroupFilter {
    /// The kernel's filter for `selection` over `cgroups` (id, path as in `/proc/PID/cgroup`).
    pub fn for_selection(selection: &ProcessSelection, cgroups: &[(u64, String)]) -> Self {
        let is_cgroup = |m: &Matcher| matches!(m, Matcher::Cgroup(_) | Matcher::Unit(_));
        let matched = |matchers: Vec<&Matcher>| -> BTreeSet<u64> {
            cgroups
                .iter()
                .filter(|(_, path)| {
                    let facts = ProcessFacts { pid: 0, name: "", exe: None, cgroup: Some(path) };
                    matchers.iter().any(|m| m.matches(&facts))
                })
                .map(|(id, _)| *id)
                .collect()
        };
        let excluded = matched(selection.exclude.iter().filter(|m| is_cgroup(m)).collect());
        if !selection.include.is_empty() && selection.include.iter().all(is_cgroup) {
            let included = matched(selection.include.iter().collect());
            let ids = included.difference(&excluded).copied().collect();
            return Self { mode: Some(CgroupFilterMode::Include), ids };
        }
        if selection.exclude.iter().any(is_cgroup) {
            return Self { mode: Some(CgroupFilterMode::Exclude), ids: excluded };
        }
        Self::default()
    }

    /// Whether `selection` has anything the kernel can filter by.
    pub fn applies(selection: &ProcessSelection) -> bool {
        let is_cgroup = |m: &Matcher| matches!(m, Matcher::Cgroup(_) | Matcher::Unit(_));
        (!selection.include.is_empty() && selection.include.iter().all(is_cgroup))
            || selection.exclude.iter().any(is_cgroup)
    }
}

/// Every cgroup under `root` (the unified hierarchy): (id, path relative to it, `/` first).
pub fn scan(root: &Path) -> Vec<(u64, String)> {
    let mut found = Vec::new();
    let mut todo = vec![(root.to_path_buf(), String::from("/"))];
    while let Some((dir, path)) = todo.pop() {
        let Ok(meta) = std::fs::metadata(&dir) else { continue };
        found.push((meta.ino(), path.clone()));
        if found.len() >= MAX_CGROUPS {
            break;
        }
        let Ok(entries) = std::fs::read_dir(&dir) else { continue };
        for entry in entries.flatten() {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                let name = entry.file_name().to_string_lossy().into_owned();
                let child = if path == "/" { format!("/{name}") } else { format!("{path}/{name}") };
                todo.push((entry.path(), child));
            }
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cgroups() -> Vec<(u64, String)> {
        [
            (1, "/"),
            (2, "/system.slice"),
            (3, "/system.slice/nginx.service"),
            (4, "/user.slice"),
            (5, "/user.slice/a.scope"),
        ]
        .into_iter()
        .map(|(id, path)| (id, path.to_string()))
        .collect()
    }

    fn selection(include: Vec<Matcher>, exclude: Vec<Matcher>) -> ProcessSelection {
        ProcessSelection { include, exclude }
    }

    #[test]
    fn cgroup_includes_become_an_include_set_minus_the_excludes() {
        let s = selection(vec![Matcher::Cgroup("/system.slice".into())], vec![Matcher::Unit("nginx.service".into())]);
        let filter = CgroupFilter::for_selection(&s, &cgroups());
        assert_eq!(filter, CgroupFilter { mode: Some(CgroupFilterMode::Include), ids: [2].into() });
        assert!(CgroupFilter::applies(&s));
    }

    #[test]
    fn a_name_include_leaves_only_the_cgroup_excludes_to_the_kernel() {
        let s = selection(vec![Matcher::Name("app".into())], vec![Matcher::Cgroup("/user.slice".into())]);
        let filter = CgroupFilter::for_selection(&s, &cgroups());
        assert_eq!(filter, CgroupFilter { mode: Some(CgroupFilterMode::Exclude), ids: [4, 5].into() });
        let none = selection(vec![Matcher::Name("app".into())], vec![]);
        assert_eq!(CgroupFilter::for_selection(&none, &cgroups()), CgroupFilter::default());
        assert!(!CgroupFilter::applies(&none));
        assert_eq!(CgroupFilter::for_selection(&ProcessSelection::default(), &cgroups()), CgroupFilter::default());
    }

    #[test]
    fn scans_this_machines_hierarchy() {
        let root = cgroup2_root().expect("a cgroup2 mount");
        let found = scan(&root);
        assert_eq!(found.first().map(|(_, p)| p.as_str()), Some("/"));
        let own = crate::procs::read_cgroup(std::process::id()).expect("this process's cgroup");
        assert!(found.iter().any(|(_, p)| *p == own), "{own} not among {} cgroups", found.len());
    }
}
