//! CPython 3.11+'s location table (`co_linetable`, PEP 657's format): which source line an
//! instruction of a code object came from.
//!
//! The table is a sequence of entries, each covering 1 to 8 code units. An entry's first
//! byte has its high bit set; bits 3-6 are its code, bits 0-2 its length minus one. The code
//! says how the line changes: 15 no location, 14 the long form (signed varint line delta,
//! then end line, column and end column varints), 13 no column (signed varint line delta),
//! 10-12 one line with columns (delta = code - 10, two column bytes), 0-9 the short form
//! (same line, one column byte). Varints are 6 bits a byte, low first, 0x40 continuing; a
//! signed one keeps its sign in the low bit. (CPython's `Objects/locations.md`.)

/// The line of the instruction `instr_offset` (in code units from the code's start), from
/// `table` and the code's `co_firstlineno`; `None` when the table does not cover it or the
/// instruction has no location.
pub fn line_at(table: &[u8], first_line: i32, instr_offset: u32) -> Option<u32> {
    let mut reader = Reader { bytes: table, at: 0 };
    let mut line = i64::from(first_line);
    let mut unit: u64 = 0;
    let target = u64::from(instr_offset);
    while let Some(first) = reader.byte() {
        if first & 0x80 == 0 {
            return None; // lost sync: not an entry's first byte
        }
        let code = (first >> 3) & 15;
        let length = u64::from(first & 7) + 1;
        let delta = match code {
            15 => None,
            14 => {
                let delta = reader.svarint()?;
                for _ in 0..3 {
                    reader.varint()?;
                }
                Some(delta)
            }
            13 => Some(reader.svarint()?),
            10..=12 => {
                reader.byte()?;
                reader.byte()?;
                Some(i64::from(code) - 10)
            }
            _ => {
                reader.byte()?;
                Some(0)
            }
        };
        if let Some(delta) = delta {
            line += delta;
        }
        if (unit..unit + length).contains(&target) {
            return delta.and_then(|_| u32::try_from(line).ok());
        }
        unit += length;
    }
    None
}

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn byte(&mut self) -> Option<u8> {
        let b = *self.bytes.get(self.at)?;
        self.at += 1;
        Some(b)
    }

    fn varint(&mut self) -> Option<u64> {
        let mut b = self.byte()?;
        let mut value = u64::from(b & 63);
        let mut shift = 0;
        while b & 64 != 0 {
            b = self.byte()?;
            shift += 6;
            if shift > 60 {
                return None;
            }
            value |= u64::from(b & 63) << shift;
        }
        Some(value)
    }

    fn svarint(&mut self) -> Option<i64> {
        let raw = self.varint()?;
        let magnitude = (raw >> 1) as i64;
        Some(if raw & 1 != 0 { -magnitude } else { magnitude })
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// CPython 3.12.1's table for this function, defined at line 1 of a file:
    ///
    /// ```python
    /// def f(a):
    ///     x = 1
    ///     if a:
    ///         y = 2
    ///
    ///
    ///         return y
    ///     return x
    /// ```
    ///
    /// with the lines `co_positions()` gives per code unit (`None` for a unit without one).
    pub(crate) const TABLE: &[u8] =
        &[128, 0, 216, 8, 9, 128, 65, 217, 7, 8, 216, 12, 13, 136, 1, 240, 6, 0, 16, 17, 136, 8, 216, 11, 12, 128, 72];
    pub(crate) const LINES: &[Option<u32>] =
        &[Some(1), Some(2), Some(2), Some(3), Some(3), Some(4), Some(4), Some(7), Some(7), Some(8), Some(8)];

    #[test]
    fn every_unit_gets_the_line_cpython_gives_it() {
        for (unit, expected) in LINES.iter().enumerate() {
            assert_eq!(line_at(TABLE, 1, unit as u32), *expected, "code unit {unit}");
        }
        assert_eq!(line_at(TABLE, 1, LINES.len() as u32), None, "past the table");
    }

    #[test]
    fn long_form_and_negative_deltas() {
        // code 14 (long form), 2 units, line delta -3 (svarint 7), end line, col, end col;
        // then code 13 (no column), 1 unit, delta +40 (svarint 80 = 0x50 | 0x40 continue, 1).
        let table = [0x80 | (14 << 3) | 1, 7, 0, 1, 2, 0x80 | (13 << 3), 0x40 | (80 & 63), 80 >> 6];
        assert_eq!(line_at(&table, 10, 0), Some(7));
        assert_eq!(line_at(&table, 10, 1), Some(7));
        assert_eq!(line_at(&table, 10, 2), Some(47));
        assert_eq!(line_at(&table, 10, 3), None);
        // code 15: no location.
        assert_eq!(line_at(&[0x80 | (15 << 3) | 1], 10, 1), None);
        // Truncated: no panic, no line.
        assert_eq!(line_at(&[0x80 | (14 << 3)], 10, 0), None);
    }
}
