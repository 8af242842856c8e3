//! The only module that touches blazesym: turns (ELF file, file offset) pairs and kernel
//! addresses into function names, source files, lines and inlined frames.
//!
//! Symbolization never needs the process: the catalogue captured each address's mapping while
//! the process lived, so a process that has exited is symbolized from what was found while it
//! lived, or from its files when they are still the same. ELF files and perf maps are files
//! processes control, so every open, stat and read of them runs on an offload worker
//! ([`crate::offload`]), time-boxed; a file that stalls is named in the profile and its
//! addresses stay unnamed. The worker owns blazesym's parsed files and the symbols found, by
//! file identity ([`elf`]); kernel symbols come from `/proc/kallsyms` on the calling thread.
//! `blazesym::Symbolizer` is not `Send`: each lives on one thread.
//!
//! The profiler's own executable is named from its symbol table only, without DWARF: its
//! ~30 MiB of debug info, paged in and parsed, would be most of the daemon's memory, and its
//! own frames need names, not source lines.

pub mod budget;
mod debug_file;
mod elf;
mod go;
mod minidebug;
mod perf_map;

use std::{collections::HashMap, ffi::OsStr, path::Path};

use crate::{
    ids::Pid,
    offload::{Charge, Offload},
    procs::MapEntry,
};

use blazesym::{
    symbolize::{source::Kernel, source::Source, CodeInfo, Input, Symbolized, Symbolizer as Blaze},
    MaybeDefault,
};
pub use budget::{resident_bytes, FilesBudget};
pub use elf::ElfAnswer;
use elf::{ElfFiles, ElfRequest};
pub use go::{buildinfo_version, functions_named as go_functions_named, BUILDINFO_MAGIC};
pub use perf_map::{perf_map_line, PERF_MAP_BUDGET_BYTES, PERF_MAP_MAX_BYTES};

/// One function frame at an address. A location with inlined calls has several frames.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Frame {
    /// Demangled function name.
    pub function: String,
    /// Source file, when debug info has it.
    pub file: Option<String>,
    /// Source line (0 when unknown).
    pub line: u32,
    /// Bytes from the start of the function the address is in (for an inlined frame, of
    /// the function it was inlined into, as Go's texts print it).
    pub offset: u64,
}

/// Where a frame's name came from, counted per profile (its comment) and in `/status`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum NameSource {
    /// The mapped file's own symbol tables (or its own DWARF).
    #[default]
    SymbolTable,
    /// A separate debug file (`/usr/lib/debug`, by build id or debug link).
    DebugFile,
    /// The file's MiniDebugInfo (`.gnu_debugdata`).
    MiniDebugInfo,
    /// A JIT's perf map.
    PerfMap,
    /// A Go binary's pclntab.
    GoPclntab,
    /// Nothing: the frame is `file+0xoffset`.
    Unnamed,
}

impl NameSource {
    /// Every source, in the order the counts are shown.
    pub const ALL: [NameSource; 6] = [
        NameSource::SymbolTable,
        NameSource::DebugFile,
        NameSource::MiniDebugInfo,
        NameSource::PerfMap,
        NameSource::GoPclntab,
        NameSource::Unnamed,
    ];

    /// Its name in the comment and in `/status`.
    pub fn label(self) -> &'static str {
        match self {
            NameSource::SymbolTable => "symbol table",
            NameSource::DebugFile => "debug file",
            NameSource::MiniDebugInfo => "MiniDebugInfo",
            NameSource::PerfMap => "perf map",
            NameSource::GoPclntab => "Go pclntab",
            NameSource::Unnamed => "unnamed",
        }
    }
}

/// Symbols of one address: frames innermost first (an inlined callee before its caller); the
/// last frame is the function the address belongs to. Empty when unknown.
pub type Frames = Vec<Frame>;

/// A caching symbolizer for the files processes map, their JIT perf maps and the kernel.
pub struct Symbolizer {
    /// Where ELF files and perf maps are read (blazesym's parsed files live there).
    files: Offload,
    /// For the kernel, kept open: parsing `/proc/kallsyms` again costs ~100 ms, and there is
    /// one kernel.
    kernel_blaze: Blaze,
    kernel: HashMap<u64, Frames>,
    /// Names found in perf maps (JIT symbols), by (process, map) and address, and the maps
    /// refused, until [`Symbolizer::forget_perf_maps`]. Only the addresses asked for are
    /// kept, never a whole map: a map's size is its writer's choice.
    perf_maps: HashMap<(Pid, std::path::PathBuf), Result<HashMap<u64, Frames>, String>>,
    /// Perf map bytes read since the last `forget_perf_maps`.
    perf_map_bytes: u64,
    /// Perf map reads refused since start (not a regular file, not the process's, too
    /// large, over the budget, stalled).
    pub perf_maps_refused: u64,
    /// Frame names by source since start, as [`crate::resolve`] counted them per profile
    /// (indexed by [`NameSource`] as `usize`), for `/status`.
    pub names_by_source: [u64; NameSource::ALL.len()],
    /// The resident-memory budget checked after each file read, when set
    /// ([`Symbolizer::set_files_budget`]).
    files_budget: Option<FilesBudget>,
}

impl Default for Symbolizer {
    fn default() -> Self {
        Self::new()
    }
}

impl Symbolizer {
    /// A symbolizer with a worker of its own.
    pub fn new() -> Self {
        Self::with_offload(Offload::new("offload-symbols", None))
    }

    /// A symbolizer whose file work runs on `files` (a sibling of the unwinder's, so both
    /// skip a device either found stalled).
    pub fn with_offload(files: Offload) -> Self {
        Self {
            files,
            kernel_blaze: new_blaze(),
            kernel: HashMap::new(),
            perf_maps: HashMap::new(),
            perf_map_bytes: 0,
            perf_maps_refused: 0,
            names_by_source: [0; NameSource::ALL.len()],
            files_budget: None,
        }
    }

    /// Closes the ELF files blazesym holds open and parsed, keeping every symbol already
    /// found: a later address in a file opens it again. Kernel symbols stay loaded.
    /// Otherwise the mapped and parsed debug info of every file ever symbolized (those of
    /// long-gone processes too) stays in memory.
    pub fn close_files(&mut self) {
        let _ = self.files.call("closing the symbolizer's files", None, |state| state.get::<ElfFiles>().close_files());
    }

    /// Closes the ELF files not asked for new addresses for `idle` (their symbols found are
    /// kept): what a program that ran once, or a process that found all its addresses long
    /// ago, had parsed goes back to the system. Returns how many were closed.
    pub fn close_idle_files(&mut self, idle: std::time::Duration) -> usize {
        self.files
            .call("closing the symbolizer's idle files", None, move |state| state.get::<ElfFiles>().close_idle(idle))
            .unwrap_or(0)
    }

    /// Forgets every symbol found in files (memory over budget); the next profiles read
    /// what they need again.
    pub fn forget_files(&mut self) {
        let _ =
            self.files.call("dropping the symbol caches", None, |state| *state.get::<ElfFiles>() = ElfFiles::default());
    }

    /// Closes every file (keeping the symbols found) and gives freed heap back whenever this
    /// process's resident memory is past `limit` after a file was read (see [`FilesBudget`]):
    /// for a run that names many processes' files at once and keeps none for later.
    pub fn set_files_budget(&mut self, limit: u64) {
        self.files_budget = Some(FilesBudget::new(limit));
    }

    /// Names files with more than `bytes` of DWARF (`.debug_*` sections) from their symbol
    /// tables, with a note saying so: reading one file's debug info maps and parses it (50 MiB
    /// in an unstripped Rust release binary), which no files budget can close mid-read.
    pub fn set_max_debug_info(&mut self, bytes: u64) {
        let _ = self.files.call("limiting the debug info read", None, move |state| {
            state.get::<ElfFiles>().max_debug_info = Some(bytes)
        });
    }

    /// The files budget, with how often it closed the files; `None` when unset.
    pub fn files_budget(&self) -> Option<FilesBudget> {
        self.files_budget
    }

    /// Symbolizes `offsets` in the file `map` maps in process `pid` (see [`elf`] for which
    /// file that is); `Err` says why nothing could be read (a stalled device).
    pub fn elf(&mut self, pid: Pid, map: &MapEntry, offsets: &[u64]) -> Result<ElfAnswer, String> {
        let request = ElfRequest { pid, map: map.clone(), offsets: offsets.to_vec() };
        let what = format!("{} (pid {pid})", map.path);
        let answer = self
            .files
            .call(&what, Charge::file(map.device, pid), move |state| {
                let charger = state.charger();
                state.get::<ElfFiles>().symbolize(&request, &charger)
            })
            .map_err(|stall| stall.to_string());
        self.keep_files_budget();
        answer
    }

    /// Closes the files when the budget says so.
    fn keep_files_budget(&mut self) {
        let Some(budget) = self.files_budget else { return };
        if !resident_bytes().is_some_and(|resident| budget.due(resident)) {
            return;
        }
        self.close_files();
        // SAFETY: malloc_trim only releases free heap memory.
        unsafe { libc::malloc_trim(0) };
        if let (Some(budget), Some(resident)) = (&mut self.files_budget, resident_bytes()) {
            budget.closed(resident);
        }
    }

    /// Names JIT code addresses of process `pid` with its perf map at `path` as the process
    /// sees it (`/tmp/perf-PID.map`, the format JITs write for perf), read inside its root as
    /// a file any user controls is (see [`crate::untrusted`]): a regular file owned by one of
    /// `owners`, at most [`PERF_MAP_MAX_BYTES`], streamed line by line keeping only the lines
    /// that name `addrs`. One result per address, empty when not found; `Err` names why the
    /// map was refused (a missing map is no refusal). Answers hold until
    /// [`Symbolizer::forget_perf_maps`]: JITs append, and a dump reads after the samples.
    pub fn perf_map(&mut self, pid: Pid, path: &Path, owners: &[u32], addrs: &[u64]) -> Result<Vec<Frames>, String> {
        let key = (pid, path.to_path_buf());
        let known = match self.perf_maps.get(&key) {
            Some(Err(reason)) => return Err(reason.clone()),
            Some(Ok(known)) => known,
            None => &HashMap::new(),
        };
        let mut missing: Vec<u64> = addrs.iter().copied().filter(|a| !known.contains_key(a)).collect();
        missing.sort_unstable();
        missing.dedup();
        if !missing.is_empty() {
            match self.read_perf_map(pid, path, owners, &missing) {
                Ok(found) => {
                    if let Ok(known) = self.perf_maps.entry(key.clone()).or_insert_with(|| Ok(HashMap::new())) {
                        known.extend(found);
                        // What the map does not name stays unnamed until the next dump.
                        for &addr in &missing {
                            known.entry(addr).or_default();
                        }
                    }
                }
                Err(reason) => {
                    self.perf_maps_refused += 1;
                    // Not a warning: it recurs every dump, and the profile and /status carry it.
                    tracing::debug!("perf map not read: {reason}");
                    self.perf_maps.insert(key, Err(reason.clone()));
                    return Err(reason);
                }
            }
        }
        let known = match self.perf_maps.get(&key) {
            Some(Ok(known)) => known,
            _ => return Ok(vec![Vec::new(); addrs.len()]),
        };
        Ok(addrs.iter().map(|a| known.get(a).cloned().unwrap_or_default()).collect())
    }

    /// Reads the perf map on the worker, within what is left of this dump's budget.
    fn read_perf_map(
        &mut self,
        pid: Pid,
        path: &Path,
        owners: &[u32],
        wanted: &[u64],
    ) -> Result<Vec<(u64, Frames)>, String> {
        if self.perf_map_bytes >= PERF_MAP_BUDGET_BYTES {
            return Err(format!(
                "{} of pid {pid} was not read: this dump already read {PERF_MAP_BUDGET_BYTES} bytes of perf maps",
                path.display()
            ));
        }
        let (path, owners, wanted) = (path.to_path_buf(), owners.to_vec(), wanted.to_vec());
        let what = format!("{} of pid {pid}", path.display());
        let (found, read) = self
            .files
            .call(&what, Charge::perf_map(pid), move |_| perf_map::read(pid, &path, &owners, &wanted))
            .map_err(|stall| stall.to_string())??;
        self.perf_map_bytes += read;
        Ok(found)
    }

    /// Forgets parsed perf maps (they grow while their JIT runs).
    pub fn forget_perf_maps(&mut self) {
        self.perf_maps.clear();
        self.perf_map_bytes = 0;
    }

    /// What the file workers did (shared with the unwinder's, for `/status`).
    pub fn offload_stats(&self) -> crate::offload::OffloadStats {
        self.files.stats()
    }

    /// Parses `/proc/kallsyms` now rather than at the first kernel address (60-160 ms on a
    /// 2-CPU VM): a driver that must not stall later, while it follows new processes, pays
    /// it before it starts.
    pub fn load_kernel_symbols(&mut self) {
        // Address 0 is in no kernel symbol: nothing is cached for it, the file is parsed.
        let _ = self.kernel_blaze.symbolize(&Source::Kernel(kernel_source()), Input::AbsAddr(&[0]));
    }

    /// Symbolizes kernel addresses with `/proc/kallsyms`; one result per address.
    pub fn kernel(&mut self, addrs: &[u64]) -> Vec<Frames> {
        let todo: Vec<u64> = addrs.iter().copied().filter(|a| !self.kernel.contains_key(a)).collect();
        if !todo.is_empty() {
            let results = self.kernel_blaze.symbolize(&Source::Kernel(kernel_source()), Input::AbsAddr(&todo));
            let frames = collect(results, todo.len());
            for (addr, frames) in todo.into_iter().zip(frames) {
                self.kernel.insert(addr, frames);
            }
        }
        addrs.iter().map(|a| self.kernel[a].clone()).collect()
    }
}

/// The kernel as blazesym reads it: kallsyms only (vmlinux discovery probes many paths and
/// DWARF-parses a huge file).
fn kernel_source() -> Kernel {
    Kernel {
        kallsyms: MaybeDefault::Default,
        vmlinux: MaybeDefault::None,
        kaslr_offset: Some(0),
        debug_syms: false,
        ..Kernel::default()
    }
}

fn new_blaze() -> Blaze {
    Blaze::builder().enable_code_info(true).enable_inlined_fns(true).enable_demangling(true).build()
}

/// The file offsets of the named symbols in the ELF file at `path`, in order; `None` for a
/// name the file does not define. Aliases (glibc's `memalign` and `aligned_alloc`) come back
/// with the same offset, which is how probing one address twice is avoided.
pub fn symbol_offsets(path: &Path, names: &[&str]) -> Vec<Option<u64>> {
    use blazesym::inspect::{
        source::{Elf as InspectElf, Source as InspectSource},
        Inspector,
    };
    let mut elf = InspectElf::new(path);
    // The dynamic symbol table names every exported function; skip DWARF.
    elf.debug_syms = false;
    match Inspector::new().lookup(&InspectSource::Elf(elf), names) {
        Ok(found) => found.iter().map(|syms| syms.iter().find_map(|s| s.file_offset)).collect(),
        Err(err) => {
            tracing::debug!(path = %path.display(), error = %err, "symbol lookup failed");
            vec![None; names.len()]
        }
    }
}

/// Where a symbol of an ELF file lies: its virtual address in the file's own layout, its
/// size when the table gives one, and its file offset.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SymbolAddress {
    pub vaddr: u64,
    pub size: Option<u64>,
    pub file_offset: Option<u64>,
}

/// The named symbols (functions or variables) of the ELF file at `path`, in order; `None`
/// for a name the file does not define. From the symbol tables only (no DWARF).
pub fn symbol_addresses(path: &Path, names: &[&str]) -> Vec<Option<SymbolAddress>> {
    use blazesym::inspect::{
        source::{Elf as InspectElf, Source as InspectSource},
        Inspector,
    };
    let mut elf = InspectElf::new(path);
    elf.debug_syms = false;
    match Inspector::new().lookup(&InspectSource::Elf(elf), names) {
        Ok(found) => found
            .iter()
            .map(|syms| {
                syms.first().map(|s| SymbolAddress {
                    vaddr: s.addr,
                    size: s.size.map(|n| n as u64),
                    file_offset: s.file_offset,
                })
            })
            .collect(),
        Err(err) => {
            tracing::debug!(path = %path.display(), error = %err, "symbol lookup failed");
            vec![None; names.len()]
        }
    }
}

/// The GNU build id of an ELF file, as lowercase hex.
pub fn build_id(path: &Path) -> Option<String> {
    let id = blazesym::helper::read_elf_build_id(path).ok()??;
    Some(id.iter().map(|b| format!("{b:02x}")).collect())
}

fn collect(results: blazesym::Result<Vec<Symbolized<'_>>>, len: usize) -> Vec<Frames> {
    match results {
        Ok(syms) => syms.into_iter().map(frames_of).collect(),
        Err(err) => {
            // Counted in the profile comment as addresses without symbol.
            tracing::debug!(error = %err, "symbolization failed; frames stay unresolved");
            vec![Vec::new(); len]
        }
    }
}

fn frames_of(sym: Symbolized<'_>) -> Frames {
    let Symbolized::Sym(sym) = sym else { return Vec::new() };
    let offset = sym.offset as u64;
    // blazesym lists inlined callees outermost first, each with the location inside it,
    // and gives the outer function the location of its first inlined call.
    let mut frames: Frames = sym.inlined.iter().rev().map(|f| frame(&f.name, f.code_info.as_ref(), offset)).collect();
    frames.push(frame(&sym.name, sym.code_info.as_deref(), offset));
    frames
}

fn frame(name: &str, code: Option<&CodeInfo<'_>>, offset: u64) -> Frame {
    Frame {
        function: name.to_string(),
        file: code.map(|c| display_path(c.dir.as_deref(), &c.file)),
        line: code.and_then(|c| c.line).unwrap_or(0),
        offset,
    }
}

fn display_path(dir: Option<&Path>, file: &OsStr) -> String {
    match dir {
        Some(dir) if !dir.as_os_str().is_empty() => dir.join(file).display().to_string(),
        _ => Path::new(file).display().to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::procs::read_maps;

    /// The mapping of this test process whose path contains `name`.
    fn mapping(name: &str) -> MapEntry {
        let maps = read_maps(std::process::id()).unwrap();
        maps.into_iter().find(|m| m.path.contains(name)).unwrap_or_else(|| panic!("the test binary maps no {name}"))
    }

    fn me() -> Pid {
        Pid(std::process::id())
    }

    #[inline(never)]
    fn marker_function_for_symbolizer_test() -> u64 {
        std::hint::black_box(42)
    }

    #[test]
    fn symbolizes_own_function_by_file_offset_on_the_worker() {
        let addr = marker_function_for_symbolizer_test as fn() -> u64 as usize as u64;
        let maps = read_maps(std::process::id()).unwrap();
        let map = maps.iter().find(|m| m.contains(addr)).unwrap();
        let answer = Symbolizer::new().elf(me(), map, &[map.file_offset(addr)]).unwrap();
        let names: Vec<_> = answer.frames[0].iter().map(|f| f.function.as_str()).collect();
        assert!(names.iter().any(|n| n.ends_with("marker_function_for_symbolizer_test")), "{names:?}");
        // The test binary is the running executable: symbol table only, no source lines.
        assert!(answer.frames[0].iter().all(|f| f.file.is_none() && f.line == 0), "{:?}", answer.frames[0]);
        assert_eq!(answer.build_id, build_id(Path::new(&*map.path)));
        assert!(answer.build_id.is_some_and(|id| id.len() >= 16));
    }

    #[test]
    fn closing_files_keeps_the_symbols_found_and_reopens_for_new_addresses() {
        let libc = mapping("libc.so");
        let offsets = symbol_offsets(Path::new(&*libc.path), &["malloc", "free"]);
        let (malloc, free) = (offsets[0].unwrap(), offsets[1].unwrap());
        let mut sym = Symbolizer::new();
        let before = sym.elf(me(), &libc, &[malloc]).unwrap().frames;
        assert!(!before[0].is_empty());
        sym.close_files();
        assert_eq!(sym.elf(me(), &libc, &[malloc]).unwrap().frames, before);
        let after = sym.elf(me(), &libc, &[free]).unwrap().frames;
        let names: Vec<String> = after[0].iter().map(|f| f.function.clone()).collect();
        assert!(names.iter().any(|n| n.contains("free")), "{names:?}");
        sym.forget_files();
        assert_eq!(sym.elf(me(), &libc, &[malloc]).unwrap().frames, before, "read again");
        assert_eq!(sym.offload_stats().jobs, 6);
    }

    #[test]
    fn finds_symbol_offsets_and_aliases() {
        let offsets = symbol_offsets(Path::new(&*mapping("libc.so").path), &["malloc", "free", "no_such_symbol_here"]);
        assert!(offsets[0].is_some() && offsets[1].is_some());
        assert_ne!(offsets[0], offsets[1]);
        assert_eq!(offsets[2], None);
    }
}
