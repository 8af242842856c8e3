//! The pclntab header (`runtime.pcHeader`) of Go 1.16 on, and where its tables lie.
//!
//! Layouts from Go's own source (`src/runtime/symtab.go`, `src/debug/gosym/pclntab.go`):
//! every field after the first 8 bytes is a pointer-sized word.
//!
//! | magic        | Go        | words after `magic, pad1, pad2, minLC, ptrSize`                     |
//! |--------------|-----------|----------------------------------------------------------------------|
//! | `0xfffffffa` | 1.16-1.17 | nfunc, nfiles, funcnameOffset, cuOffset, filetabOffset, pctabOffset, pclnOffset |
//! | `0xfffffff0` | 1.18-1.19 | nfunc, nfiles, textStart, funcnameOffset, cuOffset, filetabOffset, pctabOffset, pclnOffset |
//! | `0xfffffff1` | 1.20 on   | as 1.18                                                              |
//!
//! Offsets are from the header's start. Only 64-bit tables are read (`ptrSize` 8): the
//! profiler unwinds x86_64 only.

use super::{u32_at, u64_at, GoError};

/// Which layout of the tables a header announces.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    /// Go 1.16 and 1.17: functab entries and `_func.entry` are absolute addresses; funcdata
    /// are pointers.
    Go116,
    /// Go 1.18 and 1.19: entries are 32-bit offsets from `textStart`; funcdata are offsets
    /// from `moduledata.gofunc`.
    Go118,
    /// Go 1.20 on: as 1.18, and `_func` gained `startLine`; `inlinedCall` changed.
    Go120,
}

impl Layout {
    /// The layout a header magic announces.
    pub fn of_magic(magic: u32) -> Option<Layout> {
        match magic {
            0xffff_fffa => Some(Layout::Go116),
            0xffff_fff0 => Some(Layout::Go118),
            0xffff_fff1 => Some(Layout::Go120),
            _ => None,
        }
    }

    /// Bytes of one functab entry (`functab`: entry, funcoff).
    pub fn functab_entry(self) -> u64 {
        match self {
            Layout::Go116 => 16,
            _ => 8,
        }
    }

    /// Bytes of `_func` before its pcdata offsets.
    pub fn func_size(self) -> u64 {
        match self {
            Layout::Go116 => 44,
            Layout::Go118 => 40,
            Layout::Go120 => 44,
        }
    }
}

/// A parsed `pcHeader`: offsets are from the header's start.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    pub layout: Layout,
    /// The pc quantum (1 on x86).
    pub min_lc: u8,
    pub nfunc: u64,
    /// The address function entries count from (0 before 1.18: entries are absolute).
    pub text_start: u64,
    pub funcname: u64,
    pub cutab: u64,
    pub filetab: u64,
    pub pctab: u64,
    pub pcln: u64,
}

/// The most functions a header may claim: a table of more than this is corrupt (a large Go
/// binary has ~100k).
const MAX_FUNCS: u64 = 1 << 24;

/// Parses the header at the start of `table` (the pclntab's bytes, as long as the file
/// allows) and checks every offset it gives lies inside `table`.
pub fn parse(table: &[u8]) -> Result<Header, GoError> {
    let magic = u32_at(table, 0).ok_or(GoError::Truncated("the pclntab header"))?;
    if table.len() < 8 {
        return Err(GoError::Truncated("the pclntab header"));
    }
    let layout = Layout::of_magic(magic).ok_or(GoError::UnknownMagic(magic))?;
    let (pad, min_lc, ptr_size) = (u16::from_le_bytes([table[4], table[5]]), table[6], table[7]);
    if pad != 0 || ptr_size != 8 || !matches!(min_lc, 1 | 2 | 4) {
        return Err(GoError::BadHeader(format!(
            "pad {pad}, pc quantum {min_lc}, pointer size {ptr_size} (only 64-bit tables are read)"
        )));
    }
    let word = |index: usize| u64_at(table, 8 + 8 * index).ok_or(GoError::Truncated("the pclntab header"));
    let (nfunc, rest) = (word(0)?, if layout == Layout::Go116 { 2 } else { 3 });
    let header = Header {
        layout,
        min_lc,
        nfunc,
        text_start: if layout == Layout::Go116 { 0 } else { word(2)? },
        funcname: word(rest)?,
        cutab: word(rest + 1)?,
        filetab: word(rest + 2)?,
        pctab: word(rest + 3)?,
        pcln: word(rest + 4)?,
    };
    header.check(table.len() as u64)?;
    Ok(header)
}

impl Header {
    fn check(&self, len: u64) -> Result<(), GoError> {
        if self.nfunc == 0 || self.nfunc > MAX_FUNCS {
            return Err(GoError::BadHeader(format!("{} functions", self.nfunc)));
        }
        let functab_end =
            (self.nfunc + 1).checked_mul(self.layout.functab_entry()).and_then(|n| n.checked_add(self.pcln));
        let inside = [self.funcname, self.cutab, self.filetab, self.pctab, self.pcln].iter().all(|&off| off < len);
        if !inside || functab_end.is_none_or(|end| end > len) {
            return Err(GoError::BadHeader(format!("a table lies outside the {len} bytes after the header")));
        }
        Ok(())
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A header as Go's linker writes it for `layout` (`cmd/link/internal/ld/pcln.go`,
    /// `writePcHeader`), with tables at the given offsets, zero-filled to `len` bytes.
    pub(crate) fn written(layout: Layout, nfunc: u64, text_start: u64, offsets: [u64; 5], len: usize) -> Vec<u8> {
        let magic: u32 = match layout {
            Layout::Go116 => 0xffff_fffa,
            Layout::Go118 => 0xffff_fff0,
            Layout::Go120 => 0xffff_fff1,
        };
        let mut bytes = magic.to_le_bytes().to_vec();
        bytes.extend([0, 0, 1, 8]);
        let mut words = vec![nfunc, 7];
        if layout != Layout::Go116 {
            words.push(text_start);
        }
        words.extend(offsets);
        for word in words {
            bytes.extend(word.to_le_bytes());
        }
        bytes.resize(len, 0);
        bytes
    }

    #[test]
    fn each_documented_layout_is_read_from_its_magic() {
        let offsets = [0x60, 0x100, 0x200, 0x300, 0x400];
        for (layout, text) in [(Layout::Go116, 0), (Layout::Go118, 0x401000), (Layout::Go120, 0x402000)] {
            let table = written(layout, 3, text, offsets, 0x500);
            let header = parse(&table).unwrap();
            assert_eq!(header.layout, layout);
            assert_eq!((header.nfunc, header.text_start, header.min_lc), (3, text, 1), "{layout:?}");
            assert_eq!(
                [header.funcname, header.cutab, header.filetab, header.pctab, header.pcln],
                offsets,
                "{layout:?}: the offsets follow textStart only from 1.18"
            );
        }
    }

    #[test]
    fn headers_that_point_outside_or_are_not_go_are_refused() {
        let offsets = [0x60, 0x100, 0x200, 0x300, 0x400];
        // The functab (4 entries of 8 bytes at 0x400) needs 0x420 bytes.
        assert!(parse(&written(Layout::Go120, 3, 0, offsets, 0x410)).is_err());
        assert!(parse(&written(Layout::Go120, 3, 0, offsets, 0x420)).is_ok());
        let mut other = written(Layout::Go118, 3, 0, offsets, 0x500);
        other[0] = 0xfb; // Go 1.2's magic: 0xfffffffb
        assert!(matches!(parse(&other), Err(GoError::UnknownMagic(0xffff_fffb))));
        let mut narrow = written(Layout::Go118, 3, 0, offsets, 0x500);
        narrow[7] = 4;
        assert!(matches!(parse(&narrow), Err(GoError::BadHeader(_))));
        assert!(parse(&written(Layout::Go118, 0, 0, offsets, 0x500)).is_err(), "no functions");
        assert!(parse(&[0xf1, 0xff]).is_err());
    }
}
