//! Just enough ELF to find a section by name: the 64-bit little-endian x86_64 header, the
//! section header table and its string table. Sections are borrowed from the file's bytes,
//! except compressed ones (`SHF_COMPRESSED`, zlib), which are inflated into an owned buffer.
//! Also [`MappedFile`], how both readers of ELF files (the unwind tables and the symbolizer)
//! see a file without reading it all.
//!
//! A floor below `unwind` and `symbolize`: it knows files and bytes, not what they are for.

mod mapped;

use std::borrow::Cow;
use std::io::Read;

pub use mapped::MappedFile;

/// Why an ELF file's headers or sections could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ElfError {
    #[error("not an ELF file")]
    NotElf,
    #[error(
        "unsupported ELF file (class {class}, data {data}, machine {machine}): only 64-bit \
         little-endian x86_64 files are unwound"
    )]
    UnsupportedElf { class: u8, data: u8, machine: u16 },
    #[error("ELF file is truncated or its headers point outside it")]
    Truncated,
    #[error("unsupported section compression type {0}")]
    UnsupportedCompression(u32),
    #[error("failed to inflate a compressed section")]
    Inflate(#[source] std::io::Error),
    /// A cap that bounds what one (possibly hostile) file can cost to read.
    #[error("{what} is {size}, over the cap of {cap}")]
    OverCap { what: &'static str, size: u64, cap: u64 },
}

const ELF_MAGIC: &[u8; 4] = b"\x7fELF";
const ELFCLASS64: u8 = 2;
const ELFDATA2LSB: u8 = 1;
const EM_X86_64: u16 = 62;
const SHT_NOBITS: u32 = 8;
const SHF_EXECINSTR: u64 = 0x4;
const SHF_COMPRESSED: u64 = 0x800;
const ELFCOMPRESS_ZLIB: u32 = 1;
const SHN_XINDEX: u16 = 0xffff;
const SECTION_HEADER_LEN: usize = 64;
const COMPRESSION_HEADER_LEN: usize = 24;
const MAX_PREALLOCATED_BYTES: usize = 64 << 20;
/// The largest section inflated: a compressed `.debug_frame` of the largest libraries is a
/// few tens of MiB; a zlib stream can claim (and expand to) far more than it holds.
pub const MAX_INFLATED_BYTES: u64 = 256 << 20;

/// One section header, with the fields the table builder uses.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Section {
    /// Virtual address when loaded (0 for sections that are not).
    pub addr: u64,
    offset: u64,
    /// Size in the file (compressed size for compressed sections).
    size: u64,
    kind: u32,
    flags: u64,
    name: u32,
    /// `sh_link`: for a symbol table, its string table's index.
    link: u32,
}

impl Section {
    /// The address range the section occupies when loaded.
    pub fn address_range(&self) -> std::ops::Range<u64> {
        self.addr..self.addr.saturating_add(self.size)
    }
}

/// One `PT_LOAD` program header: which file bytes are mapped at which virtual address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LoadSegment {
    pub file_offset: u64,
    pub vaddr: u64,
    pub file_size: u64,
    /// `PF_X`: mapped executable.
    pub executable: bool,
}

const PT_LOAD: u32 = 1;
const PF_X: u32 = 1;
const PROGRAM_HEADER_LEN: usize = 56;

/// The program headers of an ELF file (each [`PROGRAM_HEADER_LEN`] bytes), in order.
fn program_headers(bytes: &[u8]) -> Result<Vec<&[u8]>, ElfError> {
    if bytes.len() < 64 || &bytes[..4] != ELF_MAGIC || bytes[4] != ELFCLASS64 || bytes[5] != ELFDATA2LSB {
        return Err(ElfError::NotElf);
    }
    let phoff = u64_at(bytes, 0x20)?;
    let entry_len = u64::from(u16_at(bytes, 0x36)?);
    let count = u64::from(u16_at(bytes, 0x38)?);
    if entry_len < PROGRAM_HEADER_LEN as u64 {
        return Err(ElfError::Truncated);
    }
    (0..count)
        .map(|index| {
            let start =
                index.checked_mul(entry_len).and_then(|off| off.checked_add(phoff)).ok_or(ElfError::Truncated)?;
            file_range(bytes, start, PROGRAM_HEADER_LEN as u64)
        })
        .collect()
}

/// The `PT_LOAD` segments of an ELF file, from its program header table.
pub fn load_segments(bytes: &[u8]) -> Result<Vec<LoadSegment>, ElfError> {
    let mut segments = Vec::new();
    for header in program_headers(bytes)? {
        if u32_at(header, 0)? == PT_LOAD {
            segments.push(LoadSegment {
                file_offset: u64_at(header, 8)?,
                vaddr: u64_at(header, 16)?,
                file_size: u64_at(header, 32)?,
                executable: u32_at(header, 4)? & PF_X != 0,
            });
        }
    }
    Ok(segments)
}

const PT_TLS: u32 = 7;

/// The `PT_TLS` program header's memory size and alignment (the thread-local block of the
/// executable), if the file has one.
pub fn tls_segment(bytes: &[u8]) -> Result<Option<(u64, u64)>, ElfError> {
    for header in program_headers(bytes)? {
        if u32_at(header, 0)? == PT_TLS {
            return Ok(Some((u64_at(header, 40)?, u64_at(header, 48)?)));
        }
    }
    Ok(None)
}

const PT_NOTE: u32 = 4;
const NT_GNU_BUILD_ID: u32 = 3;

/// The GNU build id of an ELF file, as lowercase hex, from its `PT_NOTE` segments (present in
/// every loaded image, even one stripped of its section headers).
pub fn build_id(bytes: &[u8]) -> Option<String> {
    for header in program_headers(bytes).ok()? {
        if u32_at(header, 0).ok()? != PT_NOTE {
            continue;
        }
        let notes = file_range(bytes, u64_at(header, 8).ok()?, u64_at(header, 32).ok()?).ok()?;
        if let Some(id) = gnu_build_id(notes) {
            return Some(id.iter().map(|b| format!("{b:02x}")).collect());
        }
    }
    None
}

/// The descriptor of the `NT_GNU_BUILD_ID` note among `notes` (`Elf64_Nhdr`s, each name and
/// descriptor padded to 4 bytes).
fn gnu_build_id(mut notes: &[u8]) -> Option<&[u8]> {
    let pad = |n: usize| n.checked_add(3).map(|n| n & !3);
    while notes.len() >= 12 {
        let (name_len, desc_len, kind) =
            (u32_at(notes, 0).ok()? as usize, u32_at(notes, 4).ok()? as usize, u32_at(notes, 8).ok()?);
        let desc_at = 12usize.checked_add(pad(name_len)?)?;
        let end = desc_at.checked_add(pad(desc_len)?)?;
        let name = notes.get(12..12 + name_len)?;
        let desc = notes.get(desc_at..desc_at.checked_add(desc_len)?)?;
        if kind == NT_GNU_BUILD_ID && name == b"GNU\0" {
            return Some(desc);
        }
        notes = notes.get(end..)?;
    }
    None
}

/// The GNU build id of an ELF file from its program headers or, in a separate debug file
/// whose program headers may point at nothing, its `.note.gnu.build-id` section.
pub fn build_id_any(bytes: &[u8]) -> Option<String> {
    build_id(bytes).or_else(|| {
        let elf = Elf::parse(bytes).ok()?;
        let notes = elf.data(&elf.section(".note.gnu.build-id")?).ok()?;
        gnu_build_id(&notes).map(|id| id.iter().map(|b| format!("{b:02x}")).collect())
    })
}

/// The virtual address (in the file's own layout) of the byte at `file_offset`, from the
/// `PT_LOAD` segment that maps it.
pub fn file_offset_to_vaddr(segments: &[LoadSegment], file_offset: u64) -> Option<u64> {
    let segment =
        segments.iter().find(|s| file_offset >= s.file_offset && file_offset - s.file_offset < s.file_size.max(1))?;
    Some(file_offset - segment.file_offset + segment.vaddr)
}

/// A file's `.gnu_debuglink`: the debug file's name (no directory) and the CRC-32 of its
/// whole contents. `None` without one, or with a name that is empty, holds a `/` or is `.`
/// or `..` (a name must not lead out of the directories it is looked for in).
pub fn debug_link(bytes: &[u8]) -> Option<(String, u32)> {
    let elf = Elf::parse(bytes).ok()?;
    let data = elf.data(&elf.section(".gnu_debuglink")?).ok()?;
    let len = data.iter().position(|&b| b == 0)?;
    let name = std::str::from_utf8(&data[..len]).ok()?;
    if name.is_empty() || name.contains('/') || name == "." || name == ".." {
        return None;
    }
    let crc_at = (len + 1).checked_add(3)? & !3;
    let crc = u32_at(&data, crc_at).ok()?;
    Some((name.to_string(), crc))
}

/// Whether the ELF file `bytes` has a section called `name` with contents in the file.
pub fn has_section(bytes: &[u8], name: &str) -> bool {
    Elf::parse(bytes).is_ok_and(|elf| elf.section(name).is_some())
}

/// The raw (not inflated) contents of the section `name` of `bytes`, if it has one.
pub fn raw_section<'a>(bytes: &'a [u8], name: &str) -> Option<&'a [u8]> {
    let elf = Elf::parse(bytes).ok()?;
    let section = elf.section(name)?;
    file_range(bytes, section.offset, section.size).ok()
}

/// The section header table of one ELF file.
pub(crate) struct Elf<'a> {
    bytes: &'a [u8],
    sections: Vec<Section>,
    names: &'a [u8],
}

impl<'a> Elf<'a> {
    /// Reads the ELF and section headers of `bytes`.
    pub fn parse(bytes: &'a [u8]) -> Result<Self, ElfError> {
        if bytes.len() < 64 || &bytes[..4] != ELF_MAGIC {
            return Err(ElfError::NotElf);
        }
        let machine = u16_at(bytes, 18)?;
        if bytes[4] != ELFCLASS64 || bytes[5] != ELFDATA2LSB || machine != EM_X86_64 {
            return Err(ElfError::UnsupportedElf { class: bytes[4], data: bytes[5], machine });
        }
        let shoff = u64_at(bytes, 0x28)?;
        let mut count = u64::from(u16_at(bytes, 0x3c)?);
        let mut names_index = u16_at(bytes, 0x3e)?;
        if shoff == 0 {
            return Ok(Elf { bytes, sections: Vec::new(), names: &[] });
        }
        // With many sections the real count and string-table index live in section 0.
        let first = section_at(bytes, shoff, 0)?;
        if count == 0 {
            count = first.size;
        }
        if names_index == SHN_XINDEX {
            names_index = u32_at(bytes, to_usize(shoff)? + 40)? as u16;
        }
        let sections = (0..count).map(|index| section_at(bytes, shoff, index)).collect::<Result<Vec<_>, _>>()?;
        let names = match sections.get(usize::from(names_index)) {
            Some(table) => file_range(bytes, table.offset, table.size)?,
            None => &[],
        };
        Ok(Elf { bytes, sections, names })
    }

    /// The header of the section called `name`, if there is one with contents in the file.
    pub fn section(&self, name: &str) -> Option<Section> {
        self.sections.iter().find(|s| s.kind != SHT_NOBITS && self.name(s) == Some(name.as_bytes())).copied()
    }

    /// The address ranges of the sections holding code (with or without contents in the file).
    pub fn executable_ranges(&self) -> Vec<std::ops::Range<u64>> {
        self.sections.iter().filter(|s| s.flags & SHF_EXECINSTR != 0).map(Section::address_range).collect()
    }

    /// The contents of `section`, inflated if it is compressed.
    pub fn data(&self, section: &Section) -> Result<Cow<'a, [u8]>, ElfError> {
        let raw = file_range(self.bytes, section.offset, section.size)?;
        if section.flags & SHF_COMPRESSED == 0 {
            return Ok(Cow::Borrowed(raw));
        }
        inflate(raw).map(Cow::Owned)
    }

    /// The address range of the `.symtab` symbol called `name` (its value and size).
    /// Reads every symbol until it is found: ask only of files known to hold it.
    pub fn symbol(&self, name: &str) -> Option<std::ops::Range<u64>> {
        const SYMBOL_LEN: usize = 24;
        let table = self.section(".symtab")?;
        let strings = self.sections.get(usize::try_from(table.link).ok()?)?;
        let strings = file_range(self.bytes, strings.offset, strings.size).ok()?;
        let symbols = file_range(self.bytes, table.offset, table.size).ok()?;
        symbols.chunks_exact(SYMBOL_LEN).find_map(|symbol| {
            let at = usize::try_from(u32_at(symbol, 0).ok()?).ok()?;
            let tail = strings.get(at..)?;
            let len = tail.iter().position(|&b| b == 0)?;
            if &tail[..len] != name.as_bytes() {
                return None;
            }
            let (value, size) = (u64_at(symbol, 8).ok()?, u64_at(symbol, 16).ok()?);
            Some(value..value.checked_add(size)?)
        })
    }

    /// The file bytes of the code at the address range `range`, if one executable section
    /// with contents holds all of it.
    pub fn code(&self, range: std::ops::Range<u64>) -> Option<&'a [u8]> {
        let section = self.sections.iter().find(|s| {
            s.kind != SHT_NOBITS
                && s.flags & SHF_EXECINSTR != 0
                && s.addr <= range.start
                && range.end <= s.addr + s.size
        })?;
        let offset = section.offset.checked_add(range.start - section.addr)?;
        file_range(self.bytes, offset, range.end - range.start).ok()
    }

    fn name(&self, section: &Section) -> Option<&'a [u8]> {
        let tail = self.names.get(to_usize(u64::from(section.name)).ok()?..)?;
        let len = tail.iter().position(|&b| b == 0)?;
        Some(&tail[..len])
    }
}

/// The bytes of DWARF (`.debug_*` sections) in `bytes`, as a reader holds them: a compressed
/// section counts what it declares it inflates to.
pub fn debug_info_bytes(bytes: &[u8]) -> Result<u64, ElfError> {
    let elf = Elf::parse(bytes)?;
    let mut total = 0u64;
    for section in elf.sections.iter().filter(|s| s.kind != SHT_NOBITS) {
        if !elf.name(section).is_some_and(|name| name.starts_with(b".debug_")) {
            continue;
        }
        let size = if section.flags & SHF_COMPRESSED != 0 {
            u64_at(file_range(bytes, section.offset, section.size)?, 8)?
        } else {
            section.size
        };
        total = total.saturating_add(size);
    }
    Ok(total)
}

/// The compressed sections (`SHF_COMPRESSED`) of `bytes` a reader that inflates a whole
/// section at once (blazesym) must not be given, each as (section name, why): those that
/// declare more than `cap` bytes, those whose stream holds more than `cap` whatever they
/// declare (found by inflating into nothing, at most `cap` + 1 bytes), and those compressed
/// in a way other than zlib (which such a reader fails on, losing the file's symbols too).
/// With `trust_declared` (a file only root can have written) the streams are not inflated
/// to be counted: that would inflate every section once more than the reader does.
pub fn unreadable_compressed_sections(
    bytes: &[u8],
    cap: u64,
    trust_declared: bool,
) -> Result<Vec<(String, String)>, ElfError> {
    let elf = Elf::parse(bytes)?;
    let mut refused = Vec::new();
    for section in elf.sections.iter().filter(|s| s.flags & SHF_COMPRESSED != 0 && s.kind != SHT_NOBITS) {
        let raw = file_range(bytes, section.offset, section.size)?;
        let why = match u32_at(raw, 0)? {
            ELFCOMPRESS_ZLIB => {
                let declared = u64_at(raw, 8)?;
                let size = if declared > cap || trust_declared { declared } else { inflated_size(raw, cap)? };
                (size > cap).then(|| format!("inflates to {size} bytes, over the {cap}-byte cap"))
            }
            kind => Some(format!("is compressed with type {kind}, not zlib")),
        };
        if let Some(why) = why {
            let name = elf.name(section).map_or_else(|| "?".into(), |n| String::from_utf8_lossy(n).into_owned());
            refused.push((name, why));
        }
    }
    Ok(refused)
}

/// What the zlib stream of a compressed section inflates to, counted up to `cap` + 1 bytes
/// without keeping any; a corrupt stream ends the count where it breaks.
fn inflated_size(raw: &[u8], cap: u64) -> Result<u64, ElfError> {
    let stream = raw.get(COMPRESSION_HEADER_LEN..).ok_or(ElfError::Truncated)?;
    let mut decoder = flate2::read::ZlibDecoder::new(stream).take(cap + 1);
    let mut inflated = 0u64;
    let mut buffer = vec![0u8; 64 << 10];
    while let Ok(n @ 1..) = decoder.read(&mut buffer) {
        inflated += n as u64;
    }
    Ok(inflated)
}

/// Inflates an `SHF_COMPRESSED` section: an `Elf64_Chdr`, then a zlib stream.
fn inflate(raw: &[u8]) -> Result<Vec<u8>, ElfError> {
    let kind = u32_at(raw, 0)?;
    if kind != ELFCOMPRESS_ZLIB {
        return Err(ElfError::UnsupportedCompression(kind));
    }
    let size = u64_at(raw, 8)?;
    if size > MAX_INFLATED_BYTES {
        return Err(ElfError::OverCap { what: "a compressed section's size", size, cap: MAX_INFLATED_BYTES });
    }
    let stream = raw.get(COMPRESSION_HEADER_LEN..).ok_or(ElfError::Truncated)?;
    // The declared size bounds the output, so a corrupt header cannot make it grow forever.
    let mut out = Vec::with_capacity(to_usize(size)?.min(MAX_PREALLOCATED_BYTES));
    flate2::read::ZlibDecoder::new(stream).take(size).read_to_end(&mut out).map_err(ElfError::Inflate)?;
    Ok(out)
}

fn section_at(bytes: &[u8], shoff: u64, index: u64) -> Result<Section, ElfError> {
    let start = index
        .checked_mul(SECTION_HEADER_LEN as u64)
        .and_then(|off| off.checked_add(shoff))
        .ok_or(ElfError::Truncated)?;
    let header = file_range(bytes, start, SECTION_HEADER_LEN as u64)?;
    Ok(Section {
        name: u32_at(header, 0)?,
        kind: u32_at(header, 4)?,
        flags: u64_at(header, 8)?,
        addr: u64_at(header, 16)?,
        offset: u64_at(header, 24)?,
        size: u64_at(header, 32)?,
        link: u32_at(header, 40)?,
    })
}

fn file_range(bytes: &[u8], offset: u64, len: u64) -> Result<&[u8], ElfError> {
    let start = to_usize(offset)?;
    let end = start.checked_add(to_usize(len)?).ok_or(ElfError::Truncated)?;
    bytes.get(start..end).ok_or(ElfError::Truncated)
}

fn to_usize(value: u64) -> Result<usize, ElfError> {
    usize::try_from(value).map_err(|_| ElfError::Truncated)
}

fn u16_at(bytes: &[u8], at: usize) -> Result<u16, ElfError> {
    Ok(u16::from_le_bytes(array_at(bytes, at)?))
}

fn u32_at(bytes: &[u8], at: usize) -> Result<u32, ElfError> {
    Ok(u32::from_le_bytes(array_at(bytes, at)?))
}

fn u64_at(bytes: &[u8], at: usize) -> Result<u64, ElfError> {
    Ok(u64::from_le_bytes(array_at(bytes, at)?))
}

fn array_at<const N: usize>(bytes: &[u8], at: usize) -> Result<[u8; N], ElfError> {
    let end = at.checked_add(N).ok_or(ElfError::Truncated)?;
    let slice = bytes.get(at..end).ok_or(ElfError::Truncated)?;
    Ok(slice.try_into().expect("slice has N bytes"))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// An `Elf64_Chdr` declaring `size` bytes, then `stream`.
    fn compressed(size: u64, stream: &[u8]) -> Vec<u8> {
        let mut raw = Vec::new();
        raw.extend(ELFCOMPRESS_ZLIB.to_le_bytes());
        raw.extend(0u32.to_le_bytes());
        raw.extend(size.to_le_bytes());
        raw.extend(1u64.to_le_bytes());
        assert_eq!(raw.len(), COMPRESSION_HEADER_LEN);
        raw.extend(stream);
        raw
    }

    #[test]
    fn inflating_is_capped_by_the_declared_size_and_the_cap() {
        use std::io::Write;
        let mut zlib = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::best());
        zlib.write_all(&vec![0u8; 1 << 20]).unwrap();
        let stream = zlib.finish().unwrap();
        assert_eq!(inflate(&compressed(1 << 20, &stream)).unwrap().len(), 1 << 20);
        assert_eq!(inflate(&compressed(1000, &stream)).unwrap().len(), 1000, "the declared size bounds it");
        let bomb = inflate(&compressed(MAX_INFLATED_BYTES + 1, &stream)).unwrap_err();
        assert!(matches!(bomb, ElfError::OverCap { .. }), "{bomb}");
    }

    #[test]
    fn debug_info_counts_debug_sections_only_and_compressed_ones_inflated() {
        assert_eq!(debug_info_bytes(&elf_with_section(".debug_line", 0, &[0; 300])).unwrap(), 300);
        assert_eq!(debug_info_bytes(&elf_with_section(".text", 0, &[0; 300])).unwrap(), 0);
        let declared = compressed(5000, &[0; 10]);
        assert_eq!(debug_info_bytes(&elf_with_section(".debug_info", SHF_COMPRESSED, &declared)).unwrap(), 5000);
        assert!(debug_info_bytes(b"not an elf").is_err());
    }

    /// A minimal ELF file with one compressed section `.debug_x` holding `raw`.
    fn elf_with_compressed_section(raw: &[u8]) -> Vec<u8> {
        elf_with_section(".debug_x", SHF_COMPRESSED, raw)
    }

    /// A minimal x86_64 ELF file with one section `name` (with `flags`) holding `raw`.
    pub(crate) fn elf_with_section(name: &str, flags: u64, raw: &[u8]) -> Vec<u8> {
        let names = [b"\0", name.as_bytes(), b"\0.shstrtab\0"].concat();
        let mut bytes = vec![0u8; 64];
        bytes[..4].copy_from_slice(ELF_MAGIC);
        (bytes[4], bytes[5]) = (ELFCLASS64, ELFDATA2LSB);
        bytes[18..20].copy_from_slice(&EM_X86_64.to_le_bytes());
        let data_at = bytes.len() as u64;
        bytes.extend(raw);
        let names_at = bytes.len() as u64;
        bytes.extend(&names);
        let shoff = bytes.len() as u64;
        let header = |name: u32, kind: u32, flags: u64, offset: u64, size: u64| {
            let mut h = vec![0u8; SECTION_HEADER_LEN];
            h[0..4].copy_from_slice(&name.to_le_bytes());
            h[4..8].copy_from_slice(&kind.to_le_bytes());
            h[8..16].copy_from_slice(&flags.to_le_bytes());
            h[24..32].copy_from_slice(&offset.to_le_bytes());
            h[32..40].copy_from_slice(&size.to_le_bytes());
            h
        };
        bytes.extend(header(0, 0, 0, 0, 0));
        bytes.extend(header(1, 1, flags, data_at, raw.len() as u64));
        bytes.extend(header(name.len() as u32 + 2, 3, 0, names_at, names.len() as u64));
        bytes[0x28..0x30].copy_from_slice(&shoff.to_le_bytes());
        bytes[0x3c..0x3e].copy_from_slice(&3u16.to_le_bytes());
        bytes[0x3e..0x40].copy_from_slice(&2u16.to_le_bytes());
        bytes
    }

    #[test]
    fn sections_that_would_inflate_past_the_cap_are_found_however_they_lie() {
        use std::io::Write;
        let mut zlib = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::best());
        zlib.write_all(&vec![0u8; 1 << 20]).unwrap();
        let stream = zlib.finish().unwrap();
        let refused =
            |raw: &[u8], cap| unreadable_compressed_sections(&elf_with_compressed_section(raw), cap, false).unwrap();
        assert_eq!(refused(&compressed(1 << 20, &stream), 1 << 20), vec![]);
        let over = |size: u64, cap: u64| {
            vec![(".debug_x".to_string(), format!("inflates to {size} bytes, over the {cap}-byte cap"))]
        };
        assert_eq!(refused(&compressed(1 << 30, &stream), 1 << 20), over(1 << 30, 1 << 20));
        // Declares 1 KiB, holds 1 MiB: a reader trusting the stream would inflate it all.
        assert_eq!(refused(&compressed(1024, &stream), 4096), over(4097, 4096));
        // A file only root can have written is judged by what it declares, not inflated.
        let trusted = |raw: &[u8], cap| unreadable_compressed_sections(&elf_with_compressed_section(raw), cap, true);
        assert_eq!(trusted(&compressed(1024, &stream), 4096).unwrap(), vec![]);
        assert_eq!(trusted(&compressed(1 << 30, &stream), 1 << 20).unwrap(), over(1 << 30, 1 << 20));
        // Not zlib (here: zeros where the header is): the reader would fail on the file.
        let mut unknown = compressed(1024, &stream);
        unknown[..4].copy_from_slice(&0u32.to_le_bytes());
        let other = vec![(".debug_x".to_string(), "is compressed with type 0, not zlib".to_string())];
        assert_eq!(refused(&unknown, 4096), other);
    }
}
