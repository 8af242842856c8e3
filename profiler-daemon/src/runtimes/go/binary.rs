//! What the goroutine reader needs of a Go executable's file: that it is Go and which
//! version (`.go.buildinfo`, the layout of `debug/buildinfo`), and the addresses of the
//! runtime's globals and the extents of its functions, from the ELF symbol table (`.symtab`,
//! which `-ldflags=-s` strips: then [`GoBinary::symbols`] is `None` and the caller falls back).

use crate::{
    elf::{Elf, ElfError},
    symbolize::{buildinfo_version, BUILDINFO_MAGIC},
};

/// The header's flag that the version and module strings follow it inline (Go 1.18 on).
const FLAG_INLINE_STRINGS: u8 = 2;
/// Symbols read at most: a large Go binary has ~100,000; more is a hostile table.
const MAX_SYMBOLS: usize = 2_000_000;
const SYMBOL_LEN: usize = 24;
const STT_FUNC: u8 = 2;

/// The runtime globals the reader looks up, in [`Symbols::globals`] order. `runtime.tlsg`
/// is a thread-local symbol: its value is its offset in the TLS block (see `kernel.rs`).
pub const GLOBALS: [&str; 5] =
    ["runtime.allgs", "runtime.allglen", "runtime.fingRunning", "runtime.main", "runtime.tlsg"];
/// [`GLOBALS`]' index of `runtime.tlsg`.
pub const TLSG: usize = 4;

/// The runtime's array of wait reason strings (`[...]string`, indexed by `waitReason`).
pub const WAIT_REASON_STRINGS: &str = "runtime.waitReasonStrings";

/// A Go executable, as its file says.
#[derive(Clone, Debug)]
pub struct GoBinary {
    /// `go1.19.8`, as `runtime.Version()` says it.
    pub version: String,
    /// `ET_DYN`: loaded at a bias (PIE).
    pub position_independent: bool,
    /// `None` when the file has no symbol table (`-ldflags=-s`).
    pub symbols: Option<Symbols>,
}

/// The symbols the reader uses.
#[derive(Clone, Debug, Default)]
pub struct Symbols {
    /// File virtual addresses of [`GLOBALS`], in order.
    pub globals: [Option<u64>; GLOBALS.len()],
    /// `runtime.waitReasonStrings`: its file virtual address and size (the version's wait
    /// reasons, read from the process rather than from a table when present).
    pub wait_reason_strings: Option<(u64, u64)>,
    /// Function extents `[start, end)` by start, and whether each is the runtime's own
    /// (`runtime.`: Go leaves goroutines started there out of its profile, except below).
    functions: Vec<(u64, u64, FunctionClass)>,
}

/// What Go's `isSystemGoroutine` makes of a goroutine's start function.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FunctionClass {
    User,
    /// A `runtime.` function: a system goroutine, left out.
    Runtime,
    /// `runtime.main` or `runtime.handleAsyncEvent`: the runtime's, but shown.
    RuntimeShown,
    /// `runtime.runfinq`: shown while it runs a finalizer (`runtime.fingRunning`).
    Finalizer,
}

impl Symbols {
    /// Whether `pc` (a file address) is inside a function.
    pub fn is_code(&self, pc: u64) -> bool {
        let index = self.functions.partition_point(|&(start, _, _)| start <= pc);
        index.checked_sub(1).is_some_and(|i| pc < self.functions[i].1)
    }

    /// The class of the function holding `pc`; `User` when no symbol holds it.
    pub fn class(&self, pc: u64) -> FunctionClass {
        let index = self.functions.partition_point(|&(start, _, _)| start <= pc);
        match index.checked_sub(1).map(|i| self.functions[i]) {
            Some((_, end, class)) if pc < end => class,
            _ => FunctionClass::User,
        }
    }
}

/// Why a file's Go facts could not be read.
#[derive(Debug, thiserror::Error)]
pub enum BinaryError {
    #[error(transparent)]
    Elf(#[from] ElfError),
    #[error("its .go.buildinfo has no Go build header")]
    NoHeader,
    #[error("its .go.buildinfo is of a Go before 1.18 (version behind pointers), which the reader does not know")]
    OldHeader,
}

/// The Go facts of the ELF file `bytes`; `Ok(None)` when it is not Go (no `.go.buildinfo`).
pub fn read(bytes: &[u8]) -> Result<Option<GoBinary>, BinaryError> {
    let elf = Elf::parse(bytes)?;
    let Some(section) = elf.section(".go.buildinfo") else { return Ok(None) };
    let data = elf.data(&section)?;
    let version = build_version(&data)?;
    let position_independent = bytes.get(16..18) == Some(&[3, 0][..]);
    let symbols = symbols(&elf)?;
    Ok(Some(GoBinary { version, position_independent, symbols }))
}

/// The Go version in a `.go.buildinfo` section's contents, read by the symbolizer's reader of
/// the same header. Before Go 1.18 the version sits behind pointers into the file, which
/// this reader does not follow (no layout before 1.19 is known to it anyway).
pub fn build_version(data: &[u8]) -> Result<String, BinaryError> {
    if let Some(version) = buildinfo_version(data, |_, _| None) {
        return Ok(version);
    }
    match data.get(15) {
        Some(flags) if data.len() >= 32 && data.starts_with(BUILDINFO_MAGIC) && flags & FLAG_INLINE_STRINGS == 0 => {
            Err(BinaryError::OldHeader)
        }
        _ => Err(BinaryError::NoHeader),
    }
}

/// The globals and function extents of `.symtab`; `None` without one.
fn symbols(elf: &Elf) -> Result<Option<Symbols>, ElfError> {
    let (Some(table), Some(strings)) = (elf.section(".symtab"), elf.section(".strtab")) else { return Ok(None) };
    let (table, strings) = (elf.data(&table)?, elf.data(&strings)?);
    let count = table.len() / SYMBOL_LEN;
    if count > MAX_SYMBOLS {
        return Err(ElfError::OverCap { what: "the symbol table", size: count as u64, cap: MAX_SYMBOLS as u64 });
    }
    let mut found = Symbols::default();
    for entry in table.chunks_exact(SYMBOL_LEN) {
        let name_at = u32::from_le_bytes(entry[0..4].try_into().expect("4 bytes")) as usize;
        let value = u64::from_le_bytes(entry[8..16].try_into().expect("8 bytes"));
        let size = u64::from_le_bytes(entry[16..24].try_into().expect("8 bytes"));
        let Some(name) = strings.get(name_at..).and_then(|tail| tail.split(|&b| b == 0).next()) else { continue };
        if let Some(i) = GLOBALS.iter().position(|g| g.as_bytes() == name) {
            found.globals[i] = Some(value);
        }
        if name == WAIT_REASON_STRINGS.as_bytes() {
            found.wait_reason_strings = Some((value, size));
        }
        if entry[4] & 0xf == STT_FUNC && value != 0 {
            found.functions.push((value, value.saturating_add(size.max(1)), classify(name)));
        }
    }
    found.functions.sort_unstable_by_key(|&(start, _, _)| start);
    Ok(Some(found))
}

fn classify(name: &[u8]) -> FunctionClass {
    match name {
        b"runtime.main" | b"runtime.handleAsyncEvent" => FunctionClass::RuntimeShown,
        b"runtime.runfinq" => FunctionClass::Finalizer,
        name if name.starts_with(b"runtime.") => FunctionClass::Runtime,
        _ => FunctionClass::User,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(flags: u8, tail: &[u8]) -> Vec<u8> {
        let mut data = BUILDINFO_MAGIC.to_vec();
        data.extend([8, flags]);
        data.resize(32, 0);
        data.extend(tail);
        data
    }

    #[test]
    fn the_version_is_the_first_inline_string() {
        let data = header(FLAG_INLINE_STRINGS, b"\x08go1.19.8\x03mod");
        assert_eq!(build_version(&data).unwrap(), "go1.19.8");
        assert!(matches!(build_version(&header(0, &[0; 16])), Err(BinaryError::OldHeader)));
        assert!(matches!(build_version(b"not go"), Err(BinaryError::NoHeader)));
        let long = header(FLAG_INLINE_STRINGS, b"\xff\x01");
        assert!(matches!(build_version(&long), Err(BinaryError::NoHeader)), "a length over the cap");
    }

    #[test]
    fn start_functions_are_classed_as_gos_is_system_goroutine_does() {
        let symbols = Symbols {
            globals: Default::default(),
            wait_reason_strings: None,
            functions: vec![
                (0x100, 0x120, classify(b"main.worker")),
                (0x200, 0x240, classify(b"runtime.bgsweep")),
                (0x300, 0x340, classify(b"runtime.main")),
                (0x400, 0x440, classify(b"runtime.runfinq")),
            ],
        };
        assert_eq!(symbols.class(0x110), FunctionClass::User);
        assert_eq!(symbols.class(0x200), FunctionClass::Runtime);
        assert_eq!(symbols.class(0x300), FunctionClass::RuntimeShown);
        assert_eq!(symbols.class(0x43f), FunctionClass::Finalizer);
        assert_eq!(symbols.class(0x240), FunctionClass::User, "past every extent");
        assert!(symbols.is_code(0x43f) && !symbols.is_code(0x240) && !symbols.is_code(0x50));
    }
}
