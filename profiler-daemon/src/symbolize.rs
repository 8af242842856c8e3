//! The only module that touches blazesym: turns (ELF file, file offset) pairs and kernel
//! addresses into function names, source files, lines and inlined frames.
//!
//! Symbolization never needs the process: the aggregate captured each address's mapping while
//! the process lived, so a process that has exited is symbolized from its files. Results are
//! cached per (file, offset) across processes. `blazesym::Symbolizer` is not `Send`: this
//! type lives on one thread.
//!
//! The profiler's own executable is named from its symbol table only, without DWARF: its
//! ~30 MiB of debug info, paged in and parsed, would be most of the daemon's memory, and its
//! own frames need names, not source lines.

use std::{
    collections::HashMap,
    ffi::OsStr,
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
};

use crate::{ids::Pid, untrusted};

use blazesym::{
    symbolize::{
        source::{Elf, Kernel, Source},
        CodeInfo, Input, Symbolized, Symbolizer as Blaze,
    },
    MaybeDefault,
};

/// The largest perf map read: a JIT that names a million functions writes about 64 MiB.
pub const PERF_MAP_MAX_BYTES: u64 = 64 << 20;
/// Perf map bytes read between two [`Symbolizer::forget_perf_maps`] (one dump), across
/// processes: past it, maps are refused, so that many large maps cannot stall a dump.
pub const PERF_MAP_BUDGET_BYTES: u64 = 256 << 20;

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

/// Symbols of one address: frames innermost first (an inlined callee before its caller); the
/// last frame is the function the address belongs to. Empty when unknown.
pub type Frames = Vec<Frame>;

/// A caching symbolizer for ELF files and the running kernel.
pub struct Symbolizer {
    /// For ELF files; closed by [`Symbolizer::close_files`].
    blaze: Blaze,
    /// For the kernel, kept open: parsing `/proc/kallsyms` again costs ~100 ms, and there is
    /// one kernel.
    kernel_blaze: Blaze,
    elf: HashMap<(PathBuf, u64), Frames>,
    kernel: HashMap<u64, Frames>,
    /// Names found in perf maps (JIT symbols), by (process, map) and address, and the maps
    /// refused, until [`Symbolizer::forget_perf_maps`]. Only the addresses asked for are
    /// kept, never a whole map: a map's size is its writer's choice.
    perf_maps: HashMap<(Pid, PathBuf), Result<HashMap<u64, Frames>, String>>,
    /// Perf map bytes read since the last `forget_perf_maps`.
    perf_map_bytes: u64,
    /// Perf map reads refused since start (not a regular file, not the process's, too
    /// large, over the budget).
    pub perf_maps_refused: u64,
    /// (device, inode) of the profiler's own executable, symbolized without DWARF.
    own_exe: Option<(u64, u64)>,
    /// Build ids by path, with the identity of the file they were read from.
    build_ids: HashMap<PathBuf, (FileIdentity, Option<String>)>,
}

/// (device, inode, size, mtime): a path naming another file than before is read again.
type FileIdentity = (u64, u64, u64, i64);

fn identity(path: &Path) -> Option<FileIdentity> {
    std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino(), m.size(), m.mtime()))
}

impl Default for Symbolizer {
    fn default() -> Self {
        Self::new()
    }
}

impl Symbolizer {
    pub fn new() -> Self {
        let blaze = new_blaze();
        let own_exe = std::fs::metadata("/proc/self/exe").ok().map(|m| (m.dev(), m.ino()));
        Self {
            blaze,
            kernel_blaze: new_blaze(),
            elf: HashMap::new(),
            kernel: HashMap::new(),
            perf_maps: HashMap::new(),
            perf_map_bytes: 0,
            perf_maps_refused: 0,
            own_exe,
            build_ids: HashMap::new(),
        }
    }

    /// Closes the ELF files blazesym holds open and parsed, keeping every symbol already
    /// found: a later address in a file opens it again. Kernel symbols stay loaded.
    /// Otherwise the mapped and parsed debug info of every file ever symbolized (those of
    /// long-gone processes too) stays in memory.
    pub fn close_files(&mut self) {
        self.blaze = new_blaze();
    }

    /// The build id of the ELF file at `path` ([`build_id`]), read once per file: every
    /// profile names it for each of its mappings, and reading it maps and parses the file.
    pub fn build_id(&mut self, path: &Path) -> Option<String> {
        let id = identity(path)?;
        match self.build_ids.get(path) {
            Some((seen, build_id)) if *seen == id => build_id.clone(),
            _ => {
                let build_id = build_id(path);
                self.build_ids.insert(path.to_path_buf(), (id, build_id.clone()));
                build_id
            }
        }
    }

    /// Whether `path` is the profiler's own executable (however the path reaches it).
    fn is_own_exe(&self, path: &Path) -> bool {
        self.own_exe.is_some() && std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino())) == self.own_exe
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

    /// Streams the perf map for the names of `wanted` (sorted, distinct); a later line wins
    /// for an address two lines cover (a JIT reusing memory appends the new symbol).
    fn read_perf_map(
        &mut self,
        pid: Pid,
        path: &Path,
        owners: &[u32],
        wanted: &[u64],
    ) -> Result<Vec<(u64, Frames)>, String> {
        let refused = |what: &dyn std::fmt::Display| format!("{} of pid {pid} {what}", path.display());
        if self.perf_map_bytes >= PERF_MAP_BUDGET_BYTES {
            return Err(refused(&format!(
                "was not read: this dump already read {PERF_MAP_BUDGET_BYTES} bytes of perf maps"
            )));
        }
        let file = match untrusted::open_owned(pid, path, owners, PERF_MAP_MAX_BYTES) {
            Ok(file) => file,
            Err(untrusted::Refused::Open(err)) if err.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(err) => return Err(refused(&crate::error::chain(&err))),
        };
        let mut names: HashMap<u64, (u64, String)> = HashMap::new();
        let mut reader = std::io::BufReader::new(std::io::Read::take(file, PERF_MAP_MAX_BYTES + 1));
        let mut line = Vec::new();
        let mut read = 0u64;
        loop {
            line.clear();
            match std::io::BufRead::read_until(&mut reader, b'\n', &mut line) {
                Ok(0) => break,
                Ok(n) => read += n as u64,
                Err(err) => return Err(refused(&format!("could not be read: {err}"))),
            }
            let text = String::from_utf8_lossy(&line);
            let Some((start, end, name)) = perf_map_line(&text) else { continue };
            let first = wanted.partition_point(|&a| a < start);
            for &addr in wanted[first..].iter().take_while(|&&a| a < end) {
                names.insert(addr, (addr - start, name.to_string()));
            }
        }
        self.perf_map_bytes += read;
        if read > PERF_MAP_MAX_BYTES {
            return Err(refused(&format!("grew past the {PERF_MAP_MAX_BYTES}-byte cap while it was read")));
        }
        Ok(names
            .into_iter()
            .map(|(addr, (offset, function))| (addr, vec![Frame { function, file: None, line: 0, offset }]))
            .collect())
    }

    /// Forgets parsed perf maps (they grow while their JIT runs).
    pub fn forget_perf_maps(&mut self) {
        self.perf_maps.clear();
        self.perf_map_bytes = 0;
    }

    /// Symbolizes file offsets in the ELF file at `path`; one result per offset.
    pub fn elf(&mut self, path: &Path, offsets: &[u64]) -> Vec<Frames> {
        let todo: Vec<u64> =
            offsets.iter().copied().filter(|&off| !self.elf.contains_key(&(path.to_path_buf(), off))).collect();
        if !todo.is_empty() {
            let mut elf = Elf::new(path);
            elf.debug_syms = !self.is_own_exe(path);
            let src = Source::Elf(elf);
            let results = self.blaze.symbolize(&src, Input::FileOffset(&todo));
            let frames = collect(results, todo.len());
            for (off, frames) in todo.into_iter().zip(frames) {
                self.elf.insert((path.to_path_buf(), off), frames);
            }
        }
        offsets.iter().map(|&off| self.elf[&(path.to_path_buf(), off)].clone()).collect()
    }

    /// Symbolizes kernel addresses with `/proc/kallsyms`; one result per address.
    pub fn kernel(&mut self, addrs: &[u64]) -> Vec<Frames> {
        let todo: Vec<u64> = addrs.iter().copied().filter(|a| !self.kernel.contains_key(a)).collect();
        if !todo.is_empty() {
            // kallsyms only: vmlinux discovery probes many paths and DWARF-parses a huge file.
            let kernel = Kernel {
                kallsyms: MaybeDefault::Default,
                vmlinux: MaybeDefault::None,
                kaslr_offset: Some(0),
                debug_syms: false,
                ..Kernel::default()
            };
            let results = self.kernel_blaze.symbolize(&Source::Kernel(kernel), Input::AbsAddr(&todo));
            let frames = collect(results, todo.len());
            for (addr, frames) in todo.into_iter().zip(frames) {
                self.kernel.insert(addr, frames);
            }
        }
        addrs.iter().map(|a| self.kernel[a].clone()).collect()
    }
}

fn new_blaze() -> Blaze {
    Blaze::builder().enable_code_info(true).enable_inlined_fns(true).enable_demangling(true).build()
}

/// One line of a perf map, `START SIZE NAME` with hex numbers (with or without `0x`), as
/// (start, end, name); `None` for a line that is not one, or a range past the end of the
/// address space.
pub(crate) fn perf_map_line(line: &str) -> Option<(u64, u64, &str)> {
    let hex = |s: &str| u64::from_str_radix(s.trim_start_matches("0x"), 16).ok();
    let mut parts = line.splitn(3, ' ');
    let start = hex(parts.next()?)?;
    let size = hex(parts.next()?)?;
    let name = parts.next()?.trim();
    let end = start.checked_add(size)?;
    (size > 0 && !name.is_empty()).then_some((start, end, name))
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

/// The GNU build id of an ELF file, as lowercase hex.
pub fn build_id(path: &Path) -> Option<String> {
    let id = blazesym::helper::read_elf_build_id(path).ok()??;
    Some(id.iter().map(|b| format!("{b:02x}")).collect())
}

#[cfg(test)]
mod perf_map_tests {
    use super::*;

    #[test]
    fn perf_maps_parse_and_look_up() {
        let map = "7f0000001000 40 jit_spin\n0x7f0000002000 0x10 LazyCompile:*foo bar.js:1\nbad line\n7f0000001000 20 jit_spin_v2\n";
        let dir = std::env::temp_dir().join(format!("perf-map-test-{}", std::process::id()));
        std::fs::write(&dir, map).unwrap();
        let mut sym = Symbolizer::new();
        let (me, uid) = (Pid(std::process::id()), std::fs::metadata(&dir).unwrap().uid());
        let addrs = [0x7f0000001010, 0x7f0000001030, 0x7f0000002004, 0x7f0000001040, 0x10];
        let frames = sym.perf_map(me, &dir, &[uid], &addrs).unwrap();
        let names: Vec<&str> = frames.iter().map(|f| f.first().map_or("", |f| f.function.as_str())).collect();
        assert_eq!(names, ["jit_spin_v2", "jit_spin", "LazyCompile:*foo bar.js:1", "", ""], "the later line wins");
        assert_eq!(frames[0][0].offset, 0x10);
        // Not the process's own file: refused, with the reason, once per read.
        let refused = sym.perf_map(me, &dir, &[uid + 1], &[0x7f0000001010]);
        assert!(refused.is_ok(), "the first answer is cached until the maps are forgotten");
        sym.forget_perf_maps();
        let refused = sym.perf_map(me, &dir, &[uid + 1], &[0x7f0000001010]).unwrap_err();
        assert!(refused.contains("owned by uid"), "{refused}");
        assert_eq!(sym.perf_maps_refused, 1);
        let missing = sym.perf_map(me, Path::new("/nonexistent/perf-1.map"), &[uid], &[1]).unwrap();
        assert!(missing[0].is_empty(), "no map is no refusal");
        std::fs::remove_file(&dir).unwrap();
    }
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

    /// The file this test process maps whose path contains `name`.
    fn mapped_file(name: &str) -> PathBuf {
        let maps = crate::procs::read_maps(std::process::id()).unwrap();
        let map = maps.iter().find(|m| m.path.contains(name));
        PathBuf::from(&map.unwrap_or_else(|| panic!("the test binary maps no {name}")).path)
    }

    #[inline(never)]
    fn marker_function_for_symbolizer_test() -> u64 {
        std::hint::black_box(42)
    }

    #[test]
    fn symbolizes_own_function_by_file_offset() {
        let addr = marker_function_for_symbolizer_test as fn() -> u64 as usize as u64;
        let info = crate::procs::read_process(std::process::id()).unwrap();
        let map = &info.maps[info.mapping_of(addr).unwrap()];
        let exe = PathBuf::from(&map.path);
        let frames = Symbolizer::new().elf(&exe, &[map.file_offset(addr)]);
        let names: Vec<_> = frames[0].iter().map(|f| f.function.as_str()).collect();
        assert!(names.iter().any(|n| n.ends_with("marker_function_for_symbolizer_test")), "{names:?}");
        // The test binary is the running executable: symbol table only, no source lines.
        assert!(frames[0].iter().all(|f| f.file.is_none() && f.line == 0), "{:?}", frames[0]);
        assert!(build_id(&exe).is_some_and(|id| id.len() >= 16));
        let mut sym = Symbolizer::new();
        assert_eq!(sym.build_id(&exe), build_id(&exe));
        assert_eq!(sym.build_id(&exe), build_id(&exe), "from the cache");
    }

    #[test]
    fn closing_files_keeps_the_symbols_found_and_reopens_for_new_addresses() {
        let libc = mapped_file("libc.so");
        let path = libc.as_path();
        let offsets = symbol_offsets(path, &["malloc", "free"]);
        let (malloc, free) = (offsets[0].unwrap(), offsets[1].unwrap());
        let mut sym = Symbolizer::new();
        let before = sym.elf(path, &[malloc]);
        assert!(!before[0].is_empty());
        sym.close_files();
        assert_eq!(sym.elf(path, &[malloc]), before);
        let names: Vec<String> = sym.elf(path, &[free])[0].iter().map(|f| f.function.clone()).collect();
        assert!(names.iter().any(|n| n.contains("free")), "{names:?}");
    }

    #[test]
    fn cached_build_ids_follow_a_path_to_its_new_file() {
        let (libc, ld) = (mapped_file("libc.so"), mapped_file("ld-linux"));
        let dir = std::env::temp_dir().join(format!("profiler-build-id-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("lib.so");
        let mut sym = Symbolizer::new();
        std::fs::copy(&libc, &path).unwrap();
        assert_eq!(sym.build_id(&path), build_id(&libc));
        // Replaced the way package managers do: a new file renamed over the old name.
        std::fs::copy(&ld, dir.join("new.so")).unwrap();
        std::fs::rename(dir.join("new.so"), &path).unwrap();
        assert_eq!(sym.build_id(&path), build_id(&ld));
        assert_ne!(build_id(&libc), build_id(&ld));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn finds_symbol_offsets_and_aliases() {
        let offsets = symbol_offsets(&mapped_file("libc.so"), &["malloc", "free", "no_such_symbol_here"]);
        assert!(offsets[0].is_some() && offsets[1].is_some());
        assert_ne!(offsets[0], offsets[1]);
        assert_eq!(offsets[2], None);
    }
}
