//! The function table: which function holds a pc (binary search of the functab), and the
//! pcvalue tables of that function (`pcfile`, `pcln`, pcdata), decoded as Go's runtime does
//! (`src/runtime/symtab.go`: `findfunc`, `pcvalue`, `step`).
//!
//! Nothing is copied out of the table: a name is read (and turned into a `String`) only for
//! an address asked for.

use super::{
    c_string,
    header::{Header, Layout},
    i32_at, u32_at, u64_at,
};

/// One function's `_func` record, as far as naming needs it.
#[derive(Clone, Copy, Debug)]
pub struct Func {
    /// Offset of `_func` in the pclntab.
    at: u64,
    /// The function's entry address.
    pub entry: u64,
    name_off: i32,
    pcfile: u32,
    pcln: u32,
    npcdata: u32,
    cu_offset: u32,
    nfuncdata: u8,
}

/// The pclntab's bytes with its parsed header.
pub struct Table<'a> {
    pub bytes: &'a [u8],
    pub header: Header,
}

/// The most steps of a pcvalue table that do not advance the pc, for one lookup: Go's
/// linker writes none (a step runs to the next instruction whose value differs), so every
/// other step moves toward the pc looked up and a table cannot loop; a corrupt one that
/// stands still is cut here.
const MAX_STILL_STEPS: usize = 64;

impl Table<'_> {
    /// The function whose code holds `pc` (an address in the file's own layout), if `pc` is
    /// inside the Go text.
    pub fn find(&self, pc: u64) -> Option<Func> {
        let n = self.header.nfunc;
        // The entry after the last function is the end of the text.
        if pc < self.entry_of(0)? || pc >= self.entry_of(n)? {
            return None;
        }
        let (mut low, mut high) = (0, n);
        while high - low > 1 {
            let mid = low + (high - low) / 2;
            if self.entry_of(mid)? <= pc {
                low = mid;
            } else {
                high = mid;
            }
        }
        self.func(low)
    }

    /// The address ranges of the functions called `name` (an ABI wrapper and its assembly
    /// share one), from each entry to the next function's. Reads every name: for a lookup
    /// once per file.
    pub fn functions_named(&self, name: &str) -> Vec<std::ops::Range<u64>> {
        (0..self.header.nfunc)
            .filter_map(|index| {
                let func = self.func(index)?;
                (self.func_name(&func)? == name).then_some(func.entry..self.entry_of(index + 1)?)
            })
            .collect()
    }

    /// The entry address of functab entry `index`.
    fn entry_of(&self, index: u64) -> Option<u64> {
        let at = self.header.pcln.checked_add(index.checked_mul(self.header.layout.functab_entry())?)?;
        match self.header.layout {
            Layout::Go116 => u64_at(self.bytes, to_usize(at)?),
            _ => self.header.text_start.checked_add(u64::from(u32_at(self.bytes, to_usize(at)?)?)),
        }
    }

    fn func(&self, index: u64) -> Option<Func> {
        let layout = self.header.layout;
        let slot = to_usize(self.header.pcln.checked_add(index.checked_mul(layout.functab_entry())?)?)?;
        let (entry, func_off) = match layout {
            Layout::Go116 => (u64_at(self.bytes, slot)?, u64_at(self.bytes, slot + 8)?),
            _ => (self.entry_of(index)?, u64::from(u32_at(self.bytes, slot + 4)?)),
        };
        let at = self.header.pcln.checked_add(func_off)?;
        let base = to_usize(at)?;
        // Go 1.16 starts `_func` with a pointer-sized entry; later versions with a 32-bit one.
        let fields = if layout == Layout::Go116 { base + 8 } else { base + 4 };
        let nfuncdata = match layout {
            Layout::Go118 => 39,
            _ => 43,
        };
        Some(Func {
            at,
            entry,
            name_off: i32_at(self.bytes, fields)?,
            // After nameOff: args, deferreturn, pcsp (4 bytes each).
            pcfile: u32_at(self.bytes, fields + 16)?,
            pcln: u32_at(self.bytes, fields + 20)?,
            npcdata: u32_at(self.bytes, fields + 24)?,
            cu_offset: u32_at(self.bytes, fields + 28)?,
            nfuncdata: *self.bytes.get(base + nfuncdata)?,
        })
    }

    /// The function's name (`funcnametab`).
    pub fn name(&self, name_off: i32) -> Option<&str> {
        let at = self.header.funcname.checked_add(u64::try_from(name_off).ok()?)?;
        c_string(self.bytes, at)
    }

    /// The name of `func`.
    pub fn func_name(&self, func: &Func) -> Option<&str> {
        self.name(func.name_off)
    }

    /// The source line of `pc` in `func` (the innermost inlined position).
    pub fn line(&self, func: &Func, pc: u64) -> Option<u32> {
        self.pcvalue(func, func.pcln, pc).and_then(|line| u32::try_from(line).ok())
    }

    /// The source file of `pc` in `func`: its per-CU file index through `cutab` to `filetab`.
    pub fn file(&self, func: &Func, pc: u64) -> Option<&str> {
        let index = u32::try_from(self.pcvalue(func, func.pcfile, pc)?).ok()?;
        self.cu_file(func, index)
    }

    /// The file a per-CU file index of `func` names.
    pub fn cu_file(&self, func: &Func, index: u32) -> Option<&str> {
        if func.cu_offset == u32::MAX {
            return None;
        }
        let slot = self.header.cutab.checked_add(u64::from(func.cu_offset.checked_add(index)?) * 4)?;
        let off = u32_at(self.bytes, to_usize(slot)?)?;
        if off == u32::MAX {
            return None;
        }
        c_string(self.bytes, self.header.filetab.checked_add(u64::from(off))?)
    }

    /// The value of pcdata table `table` at `pc`, if `func` has that table.
    pub fn pcdata(&self, func: &Func, table: u32, pc: u64) -> Option<i32> {
        if table >= func.npcdata {
            return None;
        }
        let slot = func.at.checked_add(self.header.layout.func_size())?.checked_add(u64::from(table) * 4)?;
        let off = u32_at(self.bytes, to_usize(slot)?)?;
        self.pcvalue(func, off, pc)
    }

    /// Funcdata `index` of `func`: an address before 1.18, an offset from `moduledata.gofunc`
    /// from 1.18 (the caller adds it). `None` when absent.
    pub fn funcdata(&self, func: &Func, index: u8) -> Option<u64> {
        if index >= func.nfuncdata {
            return None;
        }
        let pcdata_end =
            func.at.checked_add(self.header.layout.func_size())?.checked_add(u64::from(func.npcdata) * 4)?;
        match self.header.layout {
            Layout::Go116 => {
                // Pointers, aligned to 8 (the table itself is 8-aligned).
                let start = pcdata_end.checked_add(7)? & !7;
                let value = u64_at(self.bytes, to_usize(start.checked_add(u64::from(index) * 8)?)?)?;
                (value != 0).then_some(value)
            }
            _ => {
                let value = u32_at(self.bytes, to_usize(pcdata_end.checked_add(u64::from(index) * 4)?)?)?;
                (value != u32::MAX).then_some(u64::from(value))
            }
        }
    }

    /// The value a pcvalue table (at `off` in `pctab`) gives `pc` in `func`: deltas of value
    /// (zig-zag varints) and of pc (varints, in pc quanta) from the entry on.
    fn pcvalue(&self, func: &Func, off: u32, pc: u64) -> Option<i32> {
        if off == 0 {
            return None;
        }
        let mut at = to_usize(self.header.pctab.checked_add(u64::from(off))?)?;
        let (mut cursor, mut value, mut still) = (func.entry, -1i32, 0);
        // Each step but the standing ones moves `cursor` on by a pc quantum at least, toward
        // `pc`: the loop ends.
        for first in std::iter::once(true).chain(std::iter::repeat(false)) {
            let (value_delta, n) = varint(self.bytes, at)?;
            if value_delta == 0 && !first {
                return None;
            }
            at += n;
            value = value.wrapping_add((-((value_delta & 1) as i32)) ^ ((value_delta >> 1) as i32));
            let (pc_delta, n) = varint(self.bytes, at)?;
            at += n;
            still += usize::from(pc_delta == 0);
            if still > MAX_STILL_STEPS {
                return None;
            }
            cursor = cursor.checked_add(u64::from(pc_delta) * u64::from(self.header.min_lc))?;
            if pc < cursor {
                return Some(value);
            }
        }
        None
    }
}

/// An unsigned LEB128 varint of at most 32 bits at `at`, with its length.
fn varint(bytes: &[u8], at: usize) -> Option<(u32, usize)> {
    let mut value = 0u32;
    for (index, shift) in (0..5).zip((0..35).step_by(7)) {
        let byte = *bytes.get(at + index)?;
        value |= u32::from(byte & 0x7f).checked_shl(shift)?;
        if byte & 0x80 == 0 {
            return Some((value, index + 1));
        }
    }
    None
}

fn to_usize(value: u64) -> Option<usize> {
    usize::try_from(value).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pcvalue_table_that_stands_still_is_cut() {
        let offsets = [0x60, 0x100, 0x200, 0x300, 0x400];
        let mut bytes = crate::symbolize::go::header::tests::written(Layout::Go120, 1, 0x1000, offsets, 0x100_000);
        // From pctab offset 1: value +1, then (value +1, pc +0) forever.
        let mut at = 0x301;
        while at + 2 < bytes.len() {
            bytes[at..at + 2].copy_from_slice(&[2, 0]);
            at += 2;
        }
        let header = crate::symbolize::go::header::parse(&bytes).unwrap();
        let table = Table { bytes: &bytes, header };
        let func =
            Func { at: 0, entry: 0x1000, name_off: 0, pcfile: 0, pcln: 1, npcdata: 0, cu_offset: 0, nfuncdata: 0 };
        assert_eq!(table.line(&func, 0x1000), None);
        // The same table moving on by one byte a step ends where it should.
        bytes[0x301..0x307].copy_from_slice(&[2, 1, 2, 1, 2, 1]);
        let table = Table { bytes: &bytes, header };
        assert_eq!(table.line(&func, 0x1000), Some(0));
        assert_eq!(table.line(&func, 0x1001), Some(1));
    }

    #[test]
    fn varints_are_little_endian_groups_of_seven_bits() {
        assert_eq!(varint(&[0x05], 0), Some((5, 1)));
        assert_eq!(varint(&[0x80 | 0x2c, 0x02], 0), Some((300, 2)));
        assert_eq!(varint(&[0x80, 0x80], 0), None, "runs off the end");
    }
}
