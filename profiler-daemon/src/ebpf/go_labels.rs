//! Go's pprof labels as the sampling program stored them (`GO_LABELS`, see `profiler-ebpf`'s
//! `runtimes/go.rs`): a sample names its goroutine's label set by a [`LabelsId`], and a
//! drain reads the set's entries ([`drain`]) into the batch, as it reads its stacks. Also
//! the process entries that tell the kernel where a Go process keeps its labels.

use std::collections::HashMap as StdHashMap;

use aya::{
    maps::{HashMap, MapData},
    Ebpf,
};
use profiler_common::{
    runtimes::go::{
        maps::{GO_LABELS, GO_PROCESSES},
        GoLabels, GoProcess, LABELS_CUT_BYTES, LABELS_CUT_COUNT, LABELS_MAP_FULL, LABELS_UNREADABLE, NO_LABELS,
    },
    stack::set_key,
};

use super::{map_error, map_mut, Result, Session};
use crate::ids::Pid;

/// A sample's goroutine labels: the hash of their set in the drained batch, or one of the
/// reasons it has none.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LabelsId(pub u64);

impl LabelsId {
    /// Not a Go process, or a goroutine without labels.
    pub const NONE: LabelsId = LabelsId(NO_LABELS);

    /// Whether it names a stored set (not a reason for having none).
    pub fn is_set(self) -> bool {
        !matches!(self.0, NO_LABELS | LABELS_UNREADABLE | LABELS_MAP_FULL)
    }
}

/// One label set, decoded: (key, value) pairs sorted by key, and what the bounds cut.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RawLabels {
    pub pairs: Vec<(String, String)>,
    /// Labels left out (more than the kernel reads).
    pub cut_labels: bool,
    /// A key or value cut at its length.
    pub cut_bytes: bool,
}

impl RawLabels {
    /// The pairs of a kernel entry, sorted by key (Go's order; the map's order is its hash's).
    pub fn decode(entry: &GoLabels) -> Self {
        let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
        let mut pairs: Vec<(String, String)> = entry.pairs().map(|(k, v)| (text(k), text(v))).collect();
        pairs.sort();
        RawLabels { pairs, cut_labels: entry.cut & LABELS_CUT_COUNT != 0, cut_bytes: entry.cut & LABELS_CUT_BYTES != 0 }
    }
}

/// Reads and deletes set `set`'s label sets, as `drain_stacks` does its stacks.
pub(super) fn drain(ebpf: &mut Ebpf, set: u32) -> Result<StdHashMap<LabelsId, RawLabels>> {
    let mut sets: HashMap<&mut MapData, u64, GoLabels> = map_mut(ebpf, GO_LABELS)?;
    let keys: Vec<u64> = sets.keys().filter_map(|k| k.ok()).filter(|&key| set_key(key & !1, set) == key).collect();
    let mut out = StdHashMap::with_capacity(keys.len());
    for key in keys {
        if let Ok(entry) = sets.get(&key, 0) {
            out.insert(LabelsId(key & !1), RawLabels::decode(&entry));
        }
        match sets.remove(&key) {
            Err(aya::maps::MapError::SyscallError(err)) if err.io_error.raw_os_error() == Some(libc::ENOENT) => {}
            done => done.map_err(map_error("clear", GO_LABELS))?,
        }
    }
    Ok(out)
}

impl Session {
    /// Tells the sampling program where Go process `pid` keeps its goroutines' labels
    /// (`None`: forget it). False when its map is full.
    pub fn set_go_process(&mut self, pid: Pid, entry: Option<&GoProcess>) -> Result<bool> {
        self.set_runtime_process(GO_PROCESSES, pid, entry)
    }
}

#[cfg(test)]
mod tests {
    use profiler_common::runtimes::go::{GoLabel, GO_MAX_LABELS};

    use super::*;

    #[test]
    fn an_entry_decodes_sorted_with_its_cuts() {
        let label = |k: &str, v: &str| {
            let mut l = GoLabel { key_len: k.len() as u32, value_len: v.len() as u32, key: [0; 32], value: [0; 64] };
            l.key[..k.len()].copy_from_slice(k.as_bytes());
            l.value[..v.len()].copy_from_slice(v.as_bytes());
            l
        };
        let mut entry = GoLabels { len: 2, cut: LABELS_CUT_BYTES, labels: [label("", ""); GO_MAX_LABELS] };
        entry.labels[0] = label("handler", "b");
        entry.labels[1] = label("a", "x");
        let decoded = RawLabels::decode(&entry);
        assert_eq!(decoded.pairs, [("a".into(), "x".into()), ("handler".into(), "b".into())]);
        assert!(decoded.cut_bytes && !decoded.cut_labels);
        assert!(!LabelsId::NONE.is_set() && !LabelsId(LABELS_UNREADABLE).is_set() && LabelsId(8).is_set());
    }
}
