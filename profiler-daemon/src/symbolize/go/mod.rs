//! Go binaries named from their pclntab (`runtime.pclntab`), the table Go's own runtime
//! names its frames with: function, file and line, and inlined calls from each function's
//! inline tree. It is in every Go binary, also one built with `-ldflags='-s -w'` (no symbol
//! table, no DWARF), and its lines are the ones Go's own profiles show, so a Go binary is
//! named from it even when it keeps its symbol table.
//!
//! Found by its section (`.gopclntab`; `.data.rel.ro.gopclntab` in a PIE build) or, in a
//! binary that has `.go.buildinfo` but no such section (external linking merges it into
//! `.data.rel.ro`), by searching the file's loaded bytes for a header that parses and whose
//! tables fit. Layouts of Go 1.16 on ([`header`]). Inline trees are addressed from
//! `moduledata.gofunc` from Go 1.18, found as the `runtime.firstmoduledata` whose first word
//! points at the pclntab; without it, frames come without their inlined callees.
//!
//! The file is mapped, never copied: a name becomes a `String` only for an address asked for.

mod buildinfo;
mod header;
mod inline;
mod table;

pub use buildinfo::{version as buildinfo_version, MAGIC as BUILDINFO_MAGIC};

use std::{fs::File, ops::Range};

use crate::{
    elf::{load_segments, Elf, ElfError, LoadSegment, MappedFile},
    symbolize::Frames,
};
use header::{Header, Layout};
use table::Table;

/// Why a Go binary's pclntab could not be read.
#[derive(Debug, thiserror::Error)]
pub enum GoError {
    #[error("could not be mapped: {0}")]
    Map(#[source] std::io::Error),
    #[error("ELF headers unreadable: {0}")]
    Elf(#[from] ElfError),
    #[error("{0} is truncated or lies outside the file")]
    Truncated(&'static str),
    #[error("pclntab header magic {0:#x} is not one of Go 1.16 on (0xfffffffa, 0xfffffff0, 0xfffffff1)")]
    UnknownMagic(u32),
    #[error("pclntab header is corrupt: {0}")]
    BadHeader(String),
    #[error("has .go.buildinfo but no pclntab was found in its sections or loaded data")]
    NoTable,
}

/// One Go binary's pclntab, mapped.
pub struct GoTable {
    mapped: MappedFile,
    /// The pclntab's bytes in the file (to the end of its section or segment).
    table: Range<usize>,
    header: Header,
    segments: Vec<LoadSegment>,
    /// `moduledata.gofunc` (Go 1.18 on), the base of funcdata offsets, when found.
    gofunc: Option<u64>,
    /// The Go version from `.go.buildinfo`, when it has one.
    pub version: Option<String>,
}

/// `moduledata.gofunc`'s offset: after 6 slices, 20 words (1.18, 1.19) and, from 1.20,
/// `covctrs, ecovctrs` (`src/runtime/symtab.go`).
fn gofunc_offset(layout: Layout) -> Option<usize> {
    match layout {
        Layout::Go116 => None,
        Layout::Go118 => Some(304),
        Layout::Go120 => Some(320),
    }
}

impl GoTable {
    /// Reads the pclntab of `file`; `Ok(None)` when it is no Go binary (or no ELF file this
    /// reader knows: others name it).
    pub fn open(file: &File) -> Result<Option<GoTable>, GoError> {
        let mapped = MappedFile::map(file).map_err(GoError::Map)?;
        let bytes = mapped.bytes();
        let Ok(elf) = Elf::parse(bytes) else { return Ok(None) };
        let segments = load_segments(bytes)?;
        let info = elf.section(".go.buildinfo").and_then(|s| range_of(&segments, s.address_range(), bytes.len()));
        let Some((table, header)) = locate(bytes, &elf, &segments)? else { return Ok(None) };
        let read = |address: u64, len: u64| {
            let start = file_offset(&segments, address)?;
            bytes.get(usize::try_from(start).ok()?..usize::try_from(start.checked_add(len)?).ok()?)
        };
        let version = info.and_then(|info| buildinfo::version(&bytes[info], read));
        let table_address = vaddr(&segments, table.start as u64).ok_or(GoError::Truncated("the pclntab"))?;
        let gofunc = find_gofunc(bytes, &elf, &segments, table_address, &header);
        Ok(Some(GoTable { mapped, table, header, segments, gofunc, version }))
    }

    /// The frames of the code at file offset `offset`, innermost first; `None` when the offset is
    /// outside the Go text (a cgo binary's C code) or the table cannot name it.
    pub fn frames(&self, offset: u64) -> Option<Frames> {
        let bytes = self.mapped.bytes();
        let table = Table { bytes: &bytes[self.table.clone()], header: self.header };
        let pc = vaddr(&self.segments, offset)?;
        let func = table.find(pc)?;
        let tree = table.funcdata(&func, inline::FUNCDATA_INL_TREE).and_then(|data| {
            let address = match self.header.layout {
                Layout::Go116 => data,
                _ => self.gofunc?.checked_add(data)?,
            };
            let start = usize::try_from(file_offset(&self.segments, address)?).ok()?;
            bytes.get(start..)
        });
        inline::frames(&table, &func, pc, tree)
    }

    /// Whether inlined calls can be expanded (the inline trees were found).
    pub fn expands_inlined_calls(&self) -> bool {
        self.header.layout == Layout::Go116 || self.gofunc.is_some()
    }
}

/// The pclntab of the ELF file `bytes` (its file range and header): by its section, else,
/// in a file with `.go.buildinfo`, by searching the loaded bytes; `Ok(None)` for no Go file.
fn locate(bytes: &[u8], elf: &Elf<'_>, segments: &[LoadSegment]) -> Result<Option<(Range<usize>, Header)>, GoError> {
    let section = [".gopclntab", ".data.rel.ro.gopclntab"].iter().find_map(|name| elf.section(name));
    let table = match section {
        Some(section) => {
            range_of(segments, section.address_range(), bytes.len()).ok_or(GoError::Truncated("the pclntab"))?
        }
        None if elf.section(".go.buildinfo").is_some() => search_table(bytes, segments).ok_or(GoError::NoTable)?,
        None => return Ok(None),
    };
    let header = header::parse(&bytes[table.clone()])?;
    Ok(Some((table, header)))
}

/// The address ranges (the file's own layout) of the functions the pclntab of the Go file
/// `bytes` calls `name`, for a reader that needs a function of a binary without a symbol
/// table (`-s`); empty for no Go file or no such function.
pub fn functions_named(bytes: &[u8], name: &str) -> Vec<Range<u64>> {
    let Ok(elf) = Elf::parse(bytes) else { return Vec::new() };
    let Ok(segments) = load_segments(bytes) else { return Vec::new() };
    let Ok(Some((table, header))) = locate(bytes, &elf, &segments) else { return Vec::new() };
    Table { bytes: &bytes[table], header }.functions_named(name)
}

/// The file bytes of the address range `range`, if one segment holds all of it in the file.
fn range_of(segments: &[LoadSegment], range: Range<u64>, len: usize) -> Option<Range<usize>> {
    let start = file_offset(segments, range.start)?;
    let end = start.checked_add(range.end - range.start)?;
    let (start, end) = (usize::try_from(start).ok()?, usize::try_from(end).ok()?);
    (end <= len).then_some(start..end)
}

/// The file offset of the virtual address `address`.
fn file_offset(segments: &[LoadSegment], address: u64) -> Option<u64> {
    let segment = segments.iter().find(|s| address >= s.vaddr && address - s.vaddr < s.file_size)?;
    segment.file_offset.checked_add(address - segment.vaddr)
}

/// The virtual address (in the file's own layout) of the file offset `offset`.
fn vaddr(segments: &[LoadSegment], offset: u64) -> Option<u64> {
    let segment = segments.iter().find(|s| offset >= s.file_offset && offset - s.file_offset < s.file_size)?;
    segment.vaddr.checked_add(offset - segment.file_offset)
}

/// A pclntab in the loaded, non-executable bytes of the file, at an 8-aligned offset: the
/// first header that parses (its tables fit after it).
fn search_table(bytes: &[u8], segments: &[LoadSegment]) -> Option<Range<usize>> {
    for segment in segments.iter().filter(|s| !s.executable) {
        let start = usize::try_from(segment.file_offset).ok()?;
        let end = usize::try_from(segment.file_offset.checked_add(segment.file_size)?).ok()?.min(bytes.len());
        let found = (start..end).step_by(8).find(|&at| {
            u32_at(bytes, at).and_then(Layout::of_magic).is_some() && header::parse(&bytes[at..end]).is_ok()
        });
        if let Some(at) = found {
            return Some(at..end);
        }
    }
    None
}

/// `moduledata.gofunc`: the word at `gofunc_at` in the moduledata, the 8-aligned word
/// pointing at the pclntab followed by one pointing at its function name table (`pcHeader`,
/// then `funcnametab`'s data). Found in the loaded data, or, in a PIE built by the system
/// linker (whose pointers are relocations applied at load), in `.rela.dyn`.
fn find_gofunc(bytes: &[u8], elf: &Elf<'_>, segments: &[LoadSegment], table: u64, header: &Header) -> Option<u64> {
    let gofunc_at = gofunc_offset(header.layout)?;
    let names = table.checked_add(header.funcname)?;
    for segment in segments.iter().filter(|s| !s.executable) {
        let start = usize::try_from(segment.file_offset).ok()?;
        let end = usize::try_from(segment.file_offset.checked_add(segment.file_size)?).ok()?.min(bytes.len());
        let found = (start..end)
            .step_by(8)
            .find(|&at| u64_at(bytes, at) == Some(table) && u64_at(bytes, at + 8) == Some(names));
        if let Some(at) = found {
            return u64_at(bytes, at.checked_add(gofunc_at)?);
        }
    }
    // Its bytes as loaded (never inflated, whatever its flags claim).
    let rela = elf.section(".rela.dyn").and_then(|s| range_of(segments, s.address_range(), bytes.len()))?;
    relocated_gofunc(&bytes[rela], table, names, gofunc_at as u64)
}

/// Slots relocated to point at the pclntab that are looked at as the moduledata: one in a
/// real binary; a file with more is not searched further (each look is a pass over all).
const MAX_MODULE_CANDIDATES: usize = 8;

/// `R_X86_64_RELATIVE`: the slot at `r_offset` holds load base + `r_addend`.
const R_X86_64_RELATIVE: u64 = 8;

/// [`find_gofunc`] through the `R_X86_64_RELATIVE` relocations of `.rela.dyn` (`rela`).
fn relocated_gofunc(rela: &[u8], table: u64, names: u64, gofunc_at: u64) -> Option<u64> {
    let relative = || {
        rela.chunks_exact(24).filter_map(|entry| {
            let (slot, info, addend) = (u64_at(entry, 0)?, u64_at(entry, 8)?, u64_at(entry, 16)?);
            (info & 0xffff_ffff == R_X86_64_RELATIVE).then_some((slot, addend))
        })
    };
    let addend_at = |wanted: u64| relative().find(|&(slot, _)| slot == wanted).map(|(_, addend)| addend);
    let module = relative()
        .filter(|&(_, addend)| addend == table)
        .map(|(slot, _)| slot)
        .take(MAX_MODULE_CANDIDATES)
        .find(|&slot| slot.checked_add(8).and_then(addend_at) == Some(names))?;
    addend_at(module.checked_add(gofunc_at)?)
}

/// The NUL-terminated UTF-8 string at `at` in `bytes`.
fn c_string(bytes: &[u8], at: u64) -> Option<&str> {
    let tail = bytes.get(usize::try_from(at).ok()?..)?;
    let len = tail.iter().take(1 << 16).position(|&b| b == 0)?;
    std::str::from_utf8(&tail[..len]).ok()
}

fn u32_at(bytes: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(bytes.get(at..at.checked_add(4)?)?.try_into().ok()?))
}

fn i32_at(bytes: &[u8], at: usize) -> Option<i32> {
    u32_at(bytes, at).map(|v| v as i32)
}

fn u64_at(bytes: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(bytes.get(at..at.checked_add(8)?)?.try_into().ok()?))
}

#[cfg(test)]
mod tests;
