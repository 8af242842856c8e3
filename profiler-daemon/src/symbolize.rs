//! The only module that touches blazesym: turns (ELF file, file offset) pairs and kernel
//! addresses into function names, source files, lines and inlined frames.
//!
//! Symbolization never needs the process: the aggregate captured each address's mapping while
//! the process lived, so a process that has exited is symbolized from its files. Results are
//! cached per (file, offset) across processes. `blazesym::Symbolizer` is not `Send`: this
//! type lives on one thread.

use std::{
    collections::HashMap,
    ffi::OsStr,
    path::{Path, PathBuf},
};

use blazesym::{
    symbolize::{
        source::{Elf, Kernel, Source},
        CodeInfo, Input, Symbolized, Symbolizer as Blaze,
    },
    MaybeDefault,
};

/// One function frame at an address. A location with inlined calls has several frames.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Frame {
    /// Demangled function name.
    pub function: String,
    /// Source file, when debug info has it.
    pub file: Option<String>,
    /// Source line (0 when unknown).
    pub line: u32,
}

/// Symbols of one address: frames innermost first (an inlined callee before its caller); the
/// last frame is the function the address belongs to. Empty when unknown.
pub type Frames = Vec<Frame>;

/// A caching symbolizer for ELF files and the running kernel.
pub struct Symbolizer {
    blaze: Blaze,
    elf: HashMap<(PathBuf, u64), Frames>,
    kernel: HashMap<u64, Frames>,
}

impl Default for Symbolizer {
    fn default() -> Self {
        Self::new()
    }
}

impl Symbolizer {
    pub fn new() -> Self {
        let blaze = Blaze::builder()
            .enable_code_info(true)
            .enable_inlined_fns(true)
            .enable_demangling(true)
            .build();
        Self { blaze, elf: HashMap::new(), kernel: HashMap::new() }
    }

    /// Symbolizes file offsets in the ELF file at `path`; one result per offset.
    pub fn elf(&mut self, path: &Path, offsets: &[u64]) -> Vec<Frames> {
        let todo: Vec<u64> = offsets
            .iter()
            .copied()
            .filter(|&off| !self.elf.contains_key(&(path.to_path_buf(), off)))
            .collect();
        if !todo.is_empty() {
            let src = Source::Elf(Elf::new(path));
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
            let results = self.blaze.symbolize(&Source::Kernel(kernel), Input::AbsAddr(&todo));
            let frames = collect(results, todo.len());
            for (addr, frames) in todo.into_iter().zip(frames) {
                self.kernel.insert(addr, frames);
            }
        }
        addrs.iter().map(|a| self.kernel[a].clone()).collect()
    }
}

/// The file offsets of the named symbols in the ELF file at `path`, in order; `None` for a
/// name the file does not define. Aliases (glibc's `memalign` and `aligned_alloc`) come back
/// with the same offset, which is how probing one address twice is avoided.
pub fn symbol_offsets(path: &Path, names: &[&str]) -> Vec<Option<u64>> {
    use blazesym::inspect::{source::{Elf as InspectElf, Source as InspectSource}, Inspector};
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
    // blazesym lists inlined callees outermost first, each with the location inside it,
    // and gives the outer function the location of its first inlined call.
    let mut frames: Frames = sym
        .inlined
        .iter()
        .rev()
        .map(|f| frame(&f.name, f.code_info.as_ref()))
        .collect();
    frames.push(frame(&sym.name, sym.code_info.as_deref()));
    frames
}

fn frame(name: &str, code: Option<&CodeInfo<'_>>) -> Frame {
    Frame {
        function: name.to_string(),
        file: code.map(|c| display_path(c.dir.as_deref(), &c.file)),
        line: code.and_then(|c| c.line).unwrap_or(0),
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
        assert!(
            names.iter().any(|n| n.ends_with("marker_function_for_symbolizer_test")),
            "{names:?}"
        );
        assert!(build_id(&exe).is_some_and(|id| id.len() >= 16));
    }

    #[test]
    fn finds_symbol_offsets_and_aliases() {
        let libc = crate::procs::read_maps(std::process::id())
            .unwrap()
            .into_iter()
            .find(|m| m.path.contains("libc.so"))
            .expect("the test binary maps libc");
        let offsets = symbol_offsets(Path::new(&libc.path), &["malloc", "free", "no_such_symbol_here"]);
        assert!(offsets[0].is_some() && offsets[1].is_some());
        assert_ne!(offsets[0], offsets[1]);
        assert_eq!(offsets[2], None);
    }
}
