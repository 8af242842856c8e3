//! Joins one process's stack samples with symbols: the stage between aggregation and
//! encoding. Its input is a list of [`StackSample`]s (built per profile type by
//! [`crate::profiles`]); its output, [`ResolvedProfile`], is what the pprof encoder consumes.
//! It knows nothing of BPF maps, blazesym or protobuf.

pub mod interpreted;

use std::{
    collections::{BTreeMap, HashMap},
    path::PathBuf,
};

use profiler_common::frame::is_interpreted_word;

use crate::{
    catalog::{Catalog, KnownProcess},
    ids::{Pid, StackId},
    procs::MapEntry,
    runtimes::{NamedStacks, Readers, RuntimeFrame},
    symbolize::{Frames, NameSource, Symbolizer},
};
use interpreted::merge;

/// What names a profile's frames: the symbolizer for native code, and the interpreters'
/// readers for the frames the kernel walker puts in interpreter processes' stacks. Held
/// here, by whoever resolves, so that neither knows the other.
pub struct Namers {
    pub symbols: Symbolizer,
    /// Each interpreter process's interpreter and code objects, read from its memory and
    /// cached (see [`crate::runtimes`]).
    pub interpreters: Readers,
}

impl Namers {
    /// `symbols` with interpreter readers of its own.
    pub fn new(symbols: Symbolizer) -> Self {
        Self { symbols, interpreters: Readers::default() }
    }
}

/// The pseudo file name of kernel frames (the name perf and pprof tools use).
pub const KERNEL_MAPPING: &str = "[kernel.kallsyms]";

/// Where kernel addresses start in a profile for a viewer who may not know them: above
/// every user address, below every kernel one, and not canonical, so nothing mistakes it
/// for a real address.
pub const HIDDEN_KERNEL_BASE: u64 = 0x8000_0000_0000_0000;

/// A mapping referenced by at least one location.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MappingInfo {
    pub start: u64,
    pub limit: u64,
    pub offset: u64,
    pub path: String,
    pub build_id: Option<String>,
    /// Some location in it got a function name.
    pub has_functions: bool,
    /// Some location in it got a source line.
    pub has_lines: bool,
    /// Some location in it has inlined frames.
    pub has_inline_frames: bool,
}

/// One distinct address of the process.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LocationInfo {
    /// The address as symbolized: the sampled pc for a leaf, return address − 1 (inside the
    /// call instruction) for callers.
    pub address: u64,
    /// Index into [`ResolvedProfile::mappings`]; `None` for addresses in no known mapping.
    pub mapping: Option<usize>,
    /// Frames innermost first; empty when unresolved.
    pub frames: Frames,
}

/// A label value of a sample.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LabelValue {
    Str(String),
    /// A number and its unit (`bytes`), if it has one.
    Num(i64, Option<&'static str>),
}

/// One stack and its values, before symbolization.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StackSample {
    pub user_stack: StackId,
    pub kernel_stack: StackId,
    /// The user leaf is a return address (a stack taken on return from a probed function),
    /// so it is symbolized at the call instruction like every caller frame.
    pub user_leaf_is_return: bool,
    /// One value per sample type of the profile.
    pub values: Vec<i64>,
    /// The values as sampled, before scaling to estimates (Go's text profiles print these,
    /// and their readers scale them); empty when the values are not scaled.
    pub unscaled: Vec<i64>,
    pub labels: Vec<(&'static str, LabelValue)>,
}

/// A stack with its values.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResolvedSample {
    /// Indices into [`ResolvedProfile::locations`], leaf first (kernel, then user).
    pub locations: Vec<usize>,
    pub values: Vec<i64>,
    /// See [`StackSample::unscaled`].
    pub unscaled: Vec<i64>,
    pub labels: Vec<(&'static str, LabelValue)>,
}

/// How many of the profile's distinct addresses could be resolved.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FrameStats {
    pub locations: u64,
    /// In a known mapping but without a symbol.
    pub unsymbolized: u64,
    /// In no mapping known for the process (JIT code, or the process was gone before its
    /// mappings could be read).
    pub unmapped: u64,
    /// Samples whose stack was never drained from the kernel (kept without that stack).
    pub missing_stacks: u64,
    /// Samples (rows, each of any number of events) whose stack the kernel refused because
    /// the process (or its uid) held its share of the stack table (kept without that stack).
    pub over_share: u64,
    /// Samples (rows) of since-start totals whose stacks the daemon's table no longer held
    /// (evicted as history, or refused while full), folded together (kept without stacks).
    pub evicted: u64,
    /// Addresses in files and JIT code by where their names came from (indexed by
    /// [`NameSource`] as `usize`; kernel addresses are not counted).
    pub by_source: [u64; NameSource::ALL.len()],
}

impl FrameStats {
    /// The per-source counts as the comment and `/status` show them.
    pub fn sources_line(&self) -> String {
        let parts: Vec<String> =
            NameSource::ALL.iter().map(|s| format!("{} {}", s.label(), self.by_source[*s as usize])).collect();
        parts.join(", ")
    }
}

/// Why a file the process controls (an executable, a library, its JIT perf map) was not
/// read, or read in part; named in the profile.
pub type Refusal = String;

/// A process's samples, symbolized, ready to encode.
#[derive(Clone, Debug, Default)]
pub struct ResolvedProfile {
    pub pid: Pid,
    pub name: String,
    pub mappings: Vec<MappingInfo>,
    pub locations: Vec<LocationInfo>,
    pub samples: Vec<ResolvedSample>,
    pub frames: FrameStats,
    /// Files of the process not read, or read in part (see [`Refusal`]); their addresses stay
    /// unnamed, or named without source lines.
    pub refused: Vec<Refusal>,
    /// Lines for the profile's comment (what became of the stacks' interpreted frames).
    pub notes: Vec<String>,
}

impl ResolvedProfile {
    /// Replaces kernel addresses by their distance from the lowest one in the profile, from
    /// [`HIDDEN_KERNEL_BASE`], as `kptr_restrict` hides them from unprivileged users: the
    /// frames keep their names and stay distinct, and the profile no longer tells where the
    /// kernel is loaded (its KASLR offset). Returns whether there were any.
    pub fn hide_kernel_addresses(&mut self) -> bool {
        let Some(kernel) = self.mappings.iter().position(|m| m.path == KERNEL_MAPPING) else { return false };
        let ours = |l: &LocationInfo| l.mapping == Some(kernel);
        let Some(lowest) = self.locations.iter().filter(|l| ours(l)).map(|l| l.address).min() else { return false };
        let mut highest = HIDDEN_KERNEL_BASE;
        for location in self.locations.iter_mut().filter(|l| ours(l)) {
            location.address = HIDDEN_KERNEL_BASE + (location.address - lowest);
            highest = highest.max(location.address);
        }
        let mapping = &mut self.mappings[kernel];
        (mapping.start, mapping.limit) = (HIDDEN_KERNEL_BASE, highest + 1);
        true
    }
}

/// Where an address lives, before symbolization.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Site {
    Kernel,
    /// Index into the process's captured mappings.
    User(usize),
    Unmapped,
}

/// Resolves `samples` of `process`, whose stacks are in `catalog`.
pub fn resolve(
    process: &KnownProcess,
    catalog: &Catalog,
    samples: Vec<StackSample>,
    namers: &mut Namers,
) -> ResolvedProfile {
    let mut table = LocationTable::default();
    let mut resolved = Vec::with_capacity(samples.len());
    // Per sample, the interpreted frames the kernel walker put after the native ones.
    let mut interpreted: Vec<&[u64]> = Vec::with_capacity(samples.len());
    let (mut missing_stacks, mut over_share, mut evicted) = (0, 0, 0);
    for sample in samples {
        if sample.user_stack == StackId::OVER_SHARE || sample.kernel_stack == StackId::OVER_SHARE {
            over_share += 1;
        }
        if sample.user_stack == StackId::EVICTED || sample.kernel_stack == StackId::EVICTED {
            evicted += 1;
        }
        let (kernel, user) = match (catalog.stack(sample.kernel_stack), catalog.stack(sample.user_stack)) {
            (Some(k), Some(u)) => (k, u),
            (k, u) => {
                missing_stacks += 1;
                (k.unwrap_or(&[]), u.unwrap_or(&[]))
            }
        };
        let mut locations = Vec::with_capacity(kernel.len() + user.len());
        for (i, &ip) in kernel.iter().enumerate() {
            locations.push(table.intern(Site::Kernel, caller_adjusted(ip, i > 0)));
        }
        let native = user.iter().position(|&w| is_interpreted_word(w)).unwrap_or(user.len());
        let (user, interpreted_words) = user.split_at(native);
        interpreted.push(interpreted_words);
        // A user leaf under a kernel stack is exact unless the profile says it is a syscall's
        // return point: after a trap (a uprobe's int3 at a function's first instruction) pc − 1
        // is in the function before.
        let leaf_returns = sample.user_leaf_is_return;
        for (i, &ip) in user.iter().enumerate() {
            let addr = caller_adjusted(ip, i > 0 || leaf_returns);
            let site = process.info.as_ref().and_then(|info| info.mapping_of(addr)).map_or(Site::Unmapped, Site::User);
            locations.push(table.intern(site, addr));
        }
        resolved.push(ResolvedSample {
            locations,
            values: sample.values,
            unscaled: sample.unscaled,
            labels: sample.labels,
        });
    }
    let maps = process.maps();
    let ns_pid = process.info.as_ref().map_or(process.pid.0, |info| info.ns_pid);
    let owner = Owner { pid: process.pid, ns_pid, info: process.info.as_ref() };
    let (mut mappings, mut locations, mut frames, refused) = table.symbolize(owner, maps, &mut namers.symbols);
    frames.missing_stacks = missing_stacks;
    frames.over_share = over_share;
    frames.evicted = evicted;
    let exe = process.info.as_ref().and_then(|i| i.exe.as_ref()).map(|p| p.display().to_string());
    main_binary_first(&mut mappings, &mut locations, exe.as_deref());
    let mut profile = ResolvedProfile {
        pid: process.pid,
        name: process.name.clone(),
        mappings,
        locations,
        samples: resolved,
        frames,
        refused,
        notes: Vec::new(),
    };
    if let Some(NamedStacks { runtime, frames, note }) = namers.interpreters.name_stacks(process, &interpreted) {
        let slices: Vec<&[RuntimeFrame]> = frames.iter().map(Vec::as_slice).collect();
        merge(&mut profile, runtime, &slices);
        profile.notes.push(note);
    } else if !profile.samples.is_empty() {
        // An interpreter the walker cannot read (another version, another build): say why
        // its stacks keep the interpreter loop's frames.
        profile.notes.extend(namers.interpreters.unsupported_note(process));
    }
    profile.samples.sort_by(|a, b| b.values.cmp(&a.values).then_with(|| a.locations.cmp(&b.locations)));
    profile
}

/// pprof tools take `mapping[0]` as the main binary (`go tool pprof` prints it as `File:`):
/// put the executable's mappings first and the kernel last, keeping the rest in order.
fn main_binary_first(mappings: &mut Vec<MappingInfo>, locations: &mut [LocationInfo], exe: Option<&str>) {
    let rank = |m: &MappingInfo| match () {
        _ if Some(m.path.as_str()) == exe => 0,
        _ if m.path == KERNEL_MAPPING => 2,
        _ => 1,
    };
    let mut order: Vec<usize> = (0..mappings.len()).collect();
    order.sort_by_key(|&i| (rank(&mappings[i]), mappings[i].start));
    let mut new_index = vec![0; mappings.len()];
    for (new, &old) in order.iter().enumerate() {
        new_index[old] = new;
    }
    for loc in locations.iter_mut() {
        loc.mapping = loc.mapping.map(|m| new_index[m]);
    }
    let mut old: Vec<Option<MappingInfo>> = std::mem::take(mappings).into_iter().map(Some).collect();
    *mappings = order.iter().map(|&i| old[i].take().expect("each index once")).collect();
}

fn caller_adjusted(ip: u64, is_caller: bool) -> u64 {
    if is_caller {
        ip.saturating_sub(1)
    } else {
        ip
    }
}

#[derive(Default)]
struct LocationTable {
    index: HashMap<(Site, u64), usize>,
    sites: Vec<(Site, u64)>,
}

impl LocationTable {
    fn intern(&mut self, site: Site, addr: u64) -> usize {
        *self.index.entry((site, addr)).or_insert_with(|| {
            self.sites.push((site, addr));
            self.sites.len() - 1
        })
    }

    /// Symbolizes every location, grouped by site, and builds the mapping table.
    fn symbolize(
        self,
        owner: Owner<'_>,
        maps: &[MapEntry],
        sym: &mut Symbolizer,
    ) -> (Vec<MappingInfo>, Vec<LocationInfo>, FrameStats, Vec<Refusal>) {
        let mut refused = Vec::new();
        let mut by_site: BTreeMap<Site, Vec<usize>> = BTreeMap::new();
        for (idx, (site, _)) in self.sites.iter().enumerate() {
            by_site.entry(*site).or_default().push(idx);
        }
        let mut locations: Vec<LocationInfo> = self
            .sites
            .iter()
            .map(|&(_, address)| LocationInfo { address, mapping: None, frames: Vec::new() })
            .collect();
        let mut mappings = Vec::new();
        let mut by_source = [0u64; NameSource::ALL.len()];
        let mut unsymbolized = 0;
        for (site, members) in by_site {
            let addrs: Vec<u64> = members.iter().map(|&i| self.sites[i].1).collect();
            let (mapping, mut frames) = match site {
                Site::Kernel => (Some(kernel_mapping(&addrs)), sym.kernel(&addrs)),
                Site::User(m) => {
                    let (mapping, frames, sources) = user_site(owner, &maps[m], &addrs, sym, &mut refused);
                    for source in sources {
                        by_source[source as usize] += 1;
                    }
                    (mapping, frames)
                }
                Site::Unmapped => (None, vec![Vec::new(); addrs.len()]),
            };
            unsymbolized += frames.iter().filter(|f| f.is_empty()).count() as u64 * u64::from(mapping.is_some());
            let mapping_idx = mapping.map(|mut mapping| {
                mapping.has_functions = frames.iter().any(|f| !f.is_empty());
                mapping.has_lines = frames.iter().flatten().any(|f| f.line != 0);
                mapping.has_inline_frames = frames.iter().any(|f| f.len() > 1);
                if let Site::User(m) = site {
                    name_by_offset(&maps[m], &addrs, &mut frames);
                }
                mappings.push(mapping);
                mappings.len() - 1
            });
            for (&i, frames) in members.iter().zip(frames) {
                locations[i].mapping = mapping_idx;
                locations[i].frames = frames;
            }
        }
        let stats = FrameStats {
            locations: locations.len() as u64,
            unsymbolized,
            unmapped: locations.iter().filter(|l| l.mapping.is_none()).count() as u64,
            missing_stacks: 0,
            over_share: 0,
            evicted: 0,
            by_source,
        };
        refused.dedup();
        for (total, n) in sym.names_by_source.iter_mut().zip(by_source) {
            *total += n;
        }
        (mappings, locations, stats, refused)
    }
}

fn kernel_mapping(addrs: &[u64]) -> MappingInfo {
    MappingInfo {
        start: addrs.iter().copied().min().unwrap_or(0),
        limit: addrs.iter().copied().max().unwrap_or(0) + 1,
        offset: 0,
        path: KERNEL_MAPPING.to_string(),
        build_id: None,
        has_functions: false,
        has_lines: false,
        has_inline_frames: false,
    }
}

/// The process whose addresses are resolved, as files it controls are checked against.
#[derive(Clone, Copy)]
struct Owner<'a> {
    pid: Pid,
    /// The pid it knows itself by (in its pid namespace).
    ns_pid: u32,
    /// What was read of it, when it was inspected.
    info: Option<&'a crate::procs::ProcessInfo>,
}

impl Owner<'_> {
    /// The uids a file the process wrote may be owned by: all of its uids now (a JIT that
    /// dropped privileges writes as its new uid), or as last read once it has exited.
    fn uids(&self) -> Vec<u32> {
        let Some(info) = self.info else { return Vec::new() };
        let live = crate::procs::read_credentials(self.pid.0).ok().filter(|c| c.start_time == info.start_time);
        let mut uids = live.unwrap_or(info.credentials).uids.to_vec();
        uids.sort_unstable();
        uids.dedup();
        uids
    }
}

/// Names the addresses of a file mapping that nothing named `file+0xOFFSET` (the file's
/// base name and the file offset), as the file's build id and that offset are what a backend
/// or a reader needs to name them later; the mapping keeps `has_functions` false when none
/// was really named.
fn name_by_offset(map: &MapEntry, addrs: &[u64], frames: &mut [Frames]) {
    if !map.is_file() {
        return;
    }
    let base = map.path.rsplit('/').next().unwrap_or(&map.path).trim_end_matches(" (deleted)");
    for (&addr, frames) in addrs.iter().zip(frames.iter_mut()).filter(|(_, f)| f.is_empty()) {
        frames.push(crate::symbolize::Frame {
            function: format!("{base}+{:#x}", map.file_offset(addr)),
            file: None,
            line: 0,
            offset: 0,
        });
    }
}

fn user_site(
    owner: Owner<'_>,
    map: &MapEntry,
    addrs: &[u64],
    sym: &mut Symbolizer,
    refused: &mut Vec<Refusal>,
) -> (Option<MappingInfo>, Vec<Frames>, Vec<NameSource>) {
    let unnamed = || vec![Vec::new(); addrs.len()];
    let mut build_id = None;
    let mut sources = None;
    let frames = if map.is_file() {
        let offsets: Vec<u64> = addrs.iter().map(|&a| map.file_offset(a)).collect();
        match sym.elf(owner.pid, map, &offsets) {
            Ok(answer) => {
                refused.extend(answer.note);
                build_id = answer.build_id;
                sources = Some(answer.sources);
                answer.frames
            }
            Err(stall) => {
                refused.push(stall);
                unnamed()
            }
        }
    } else if map.inode == 0 && !map.path.starts_with('[') {
        // Anonymous executable memory is JIT code: its runtime may name it in a perf map,
        // `/tmp/perf-<pid as it knows itself>.map` in its own root, which only its owner
        // can have written (a root-owned file there is a link planted by someone else).
        let path = PathBuf::from(format!("/tmp/perf-{}.map", owner.ns_pid));
        sym.perf_map(owner.pid, &path, &owner.uids(), addrs).unwrap_or_else(|reason| {
            refused.push(reason);
            unnamed()
        })
    } else {
        unnamed()
    };
    let mapping = MappingInfo {
        start: map.start,
        limit: map.end,
        offset: map.offset,
        path: map.path.to_string(),
        build_id,
        has_functions: false,
        has_lines: false,
        has_inline_frames: false,
    };
    let sources = sources.unwrap_or_else(|| {
        let named = if map.is_file() { NameSource::SymbolTable } else { NameSource::PerfMap };
        frames.iter().map(|f| if f.is_empty() { NameSource::Unnamed } else { named }).collect()
    });
    (Some(mapping), frames, sources)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::Sighting;

    /// A catalogue holding one uninspected process (pid far above pid_max: nothing is read
    /// from /proc) and the stacks 11 (user: leaf, caller) and 12 (kernel: leaf, caller).
    fn catalog() -> (Catalog, Pid) {
        let pid = Pid(0x7fff_fff3);
        let stacks = [(StackId(11), vec![0x1000, 0x2000]), (StackId(12), vec![0xffff_0000, 0xffff_1000])].into();
        let seen = Sighting {
            pid,
            user_stack: StackId(11),
            kernel_stack: StackId(12),
            user_leaf_is_return: false,
            main_thread_name: None,
        };
        let mut catalog = Catalog::default();
        catalog.learn(&stacks, &[seen]);
        (catalog, pid)
    }

    fn addresses(samples: Vec<StackSample>) -> Vec<Vec<u64>> {
        let (catalog, pid) = catalog();
        let resolved = resolve(catalog.process(pid).unwrap(), &catalog, samples, &mut Namers::new(Symbolizer::new()));
        resolved.samples.iter().map(|s| s.locations.iter().map(|&l| resolved.locations[l].address).collect()).collect()
    }

    fn sample(user: u64, kernel: u64, user_leaf_is_return: bool) -> StackSample {
        StackSample {
            user_stack: StackId(user),
            kernel_stack: StackId(kernel),
            user_leaf_is_return,
            values: vec![1],
            unscaled: vec![],
            labels: vec![],
        }
    }

    #[test]
    fn callers_are_symbolized_at_the_call_and_leaves_where_they_are() {
        // A sampled pc is exact; every caller is a return address, looked up one byte back.
        assert_eq!(addresses(vec![sample(11, 0, false)]), [vec![0x1000, 0x1fff]]);
        // A stack taken on return from a call: its leaf is a return address too.
        assert_eq!(addresses(vec![sample(11, 0, true)]), [vec![0x0fff, 0x1fff]]);
        // Under a kernel stack, the user leaf is exact (a trap at a function's first
        // instruction must not be looked up in the function before); kernel frames first,
        // their callers adjusted.
        assert_eq!(addresses(vec![sample(11, 12, false)]), [vec![0xffff_0000, 0xffff_0fff, 0x1000, 0x1fff]]);
        // A profile taken in syscalls says its leaves are return points.
        assert_eq!(addresses(vec![sample(11, 12, true)]), [vec![0xffff_0000, 0xffff_0fff, 0x0fff, 0x1fff]]);
    }

    #[test]
    fn a_stack_refused_over_share_is_counted_apart_from_lost_ones() {
        let (catalog, pid) = catalog();
        let refused = sample(StackId::OVER_SHARE.0, 12, false);
        let resolved =
            resolve(catalog.process(pid).unwrap(), &catalog, vec![refused], &mut Namers::new(Symbolizer::new()));
        assert_eq!((resolved.frames.over_share, resolved.frames.missing_stacks), (1, 0));
        assert_eq!(resolved.samples[0].locations.len(), 2, "its kernel stack is kept");
    }

    #[test]
    fn a_stack_never_drained_is_counted_not_invented() {
        let (catalog, pid) = catalog();
        let resolved = resolve(
            catalog.process(pid).unwrap(),
            &catalog,
            vec![sample(9, 0, false)],
            &mut Namers::new(Symbolizer::new()),
        );
        assert_eq!(resolved.frames.missing_stacks, 1);
        assert!(resolved.samples[0].locations.is_empty());
        assert_eq!(resolved.frames.unmapped, 0);
    }

    fn mapping(path: &str, start: u64) -> MappingInfo {
        MappingInfo {
            start,
            limit: start + 1,
            offset: 0,
            path: path.into(),
            build_id: None,
            has_functions: false,
            has_lines: false,
            has_inline_frames: false,
        }
    }

    #[test]
    fn main_binary_mapping_comes_first_and_locations_follow() {
        let mut mappings = vec![mapping(KERNEL_MAPPING, 9), mapping("/lib/libc.so.6", 5), mapping("/bin/app", 7)];
        let loc = |m| LocationInfo { address: 0, mapping: Some(m), frames: vec![] };
        let mut locations = vec![loc(0), loc(1), loc(2)];
        main_binary_first(&mut mappings, &mut locations, Some("/bin/app"));
        let paths: Vec<_> = mappings.iter().map(|m| m.path.as_str()).collect();
        assert_eq!(paths, ["/bin/app", "/lib/libc.so.6", KERNEL_MAPPING]);
        let mapped: Vec<_> = locations.iter().map(|l| mappings[l.mapping.unwrap()].path.as_str()).collect();
        assert_eq!(mapped, [KERNEL_MAPPING, "/lib/libc.so.6", "/bin/app"]);
    }
}
