//! Reads of a code object from the process: its header's identity, its name and file (the
//! `str` objects), and a line from the start of its location table, each paid from the
//! dump's [`ReadBudget`] before it is made.

use super::{CodeInfo, Identity};
use crate::runtimes::cpython::{
    detect::Interpreter,
    linetable,
    memory::{field_u32, field_u64, Remote},
    offsets::OBJECT_TYPE,
    ReadFailure,
};

/// Characters of a name or path kept at most.
pub(super) const MAX_STRING_CHARS: u64 = 4096;

/// Bytes of a location table read at most.
pub(super) const MAX_LINETABLE_BYTES: u64 = 256 * 1024;

/// Bytes of one location-table entry at most: its first byte and at most four varints (the
/// long form), each of at most 11 bytes ([`linetable::line_at`] gives up on a longer one).
pub(super) const MAX_ENTRY_BYTES: u64 = 1 + 4 * 11;

/// Bytes a dump may still read to name code objects. Checked before each read; a read it
/// cannot pay for spends it all, so the rest of the dump is left unnamed, not a lucky part.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReadBudget {
    left: usize,
}

impl ReadBudget {
    pub fn new(bytes: usize) -> ReadBudget {
        ReadBudget { left: bytes }
    }

    /// Whether reads are refused from now on.
    pub fn spent(&self) -> bool {
        self.left == 0
    }

    pub(super) fn take(&mut self, len: usize) -> Result<(), ReadFailure> {
        if len > self.left {
            self.left = 0;
            return Err(ReadFailure::OverBudget);
        }
        self.left -= len;
        Ok(())
    }

    pub(super) fn bytes(&mut self, remote: &Remote, addr: u64, len: usize) -> Result<Vec<u8>, ReadFailure> {
        self.take(len)?;
        Ok(remote.bytes(addr, len)?)
    }
}

pub(super) fn identity(header: &[u8], interp: &Interpreter) -> Identity {
    let o = &interp.offsets;
    [
        field_u64(header, OBJECT_TYPE),
        field_u64(header, o.code_qualname),
        field_u64(header, o.code_filename),
        field_u64(header, o.code_linetable),
    ]
}

/// Reads what a code object says of itself, its header read already.
pub(super) fn read_code(
    remote: &Remote,
    interp: &Interpreter,
    header: &[u8],
    identity: Identity,
    reads: &mut ReadBudget,
) -> Result<CodeInfo, ReadFailure> {
    let o = &interp.offsets;
    let linetable = match identity[3] {
        0 => (0, 0),
        table => {
            reads.take(8)?;
            let size = remote.u64(table + o.bytes_size)?.min(MAX_LINETABLE_BYTES);
            (table + o.bytes_data, size)
        }
    };
    Ok(CodeInfo {
        qualname: read_str(remote, interp, identity[1], reads)?,
        filename: read_str(remote, interp, identity[2], reads)?,
        first_line: field_u32(header, o.code_firstlineno) as i32,
        linetable,
    })
}

/// The line of instruction `instr_offset` of `info`, the first line when its table has
/// none. Reads only the table's start that can hold it: instruction `n` is in one of the
/// first `n + 1` entries (each covers at least one code unit).
pub(super) fn line_of(
    remote: &Remote,
    info: &CodeInfo,
    instr_offset: u32,
    reads: &mut ReadBudget,
) -> Result<u32, ReadFailure> {
    let (addr, size) = info.linetable;
    let len = (u64::from(instr_offset) + 1).saturating_mul(MAX_ENTRY_BYTES).min(size);
    let table = if len == 0 { Vec::new() } else { reads.bytes(remote, addr, len as usize)? };
    Ok(linetable::line_at(&table, info.first_line, instr_offset).unwrap_or_else(|| info.first_line.max(0) as u32))
}

/// A `str` object: compact ASCII and compact non-ASCII (1-, 2- and 4-byte kinds) are read;
/// invalid code points become U+FFFD; longer than [`MAX_STRING_CHARS`] is cut.
pub(super) fn read_str(
    remote: &Remote,
    interp: &Interpreter,
    addr: u64,
    reads: &mut ReadBudget,
) -> Result<String, ReadFailure> {
    let o = &interp.offsets;
    if addr == 0 {
        return Ok(String::new());
    }
    let header = reads.bytes(remote, addr, o.unicode_compact_size as usize)?;
    let length = field_u64(&header, o.unicode_length).min(MAX_STRING_CHARS);
    let state = field_u32(&header, o.unicode_state);
    let (kind, compact, ascii) = ((state >> 2) & 7, (state >> 5) & 1 == 1, (state >> 6) & 1 == 1);
    if !compact {
        return Err(ReadFailure::Layout(format!("str at {addr:#x} is not compact")));
    }
    let data = addr + if ascii { o.unicode_ascii_size } else { o.unicode_compact_size };
    let bytes = reads.bytes(remote, data, (length * u64::from(kind.max(1))) as usize)?;
    let mut chars: String = match kind {
        1 => bytes.iter().map(|&b| char::from(b)).collect(),
        2 => bytes.chunks_exact(2).map(|c| code_point(u16::from_le_bytes([c[0], c[1]]).into())).collect(),
        4 => bytes.chunks_exact(4).map(|c| code_point(u32::from_le_bytes([c[0], c[1], c[2], c[3]]))).collect(),
        _ => return Err(ReadFailure::Layout(format!("str at {addr:#x} has kind {kind}"))),
    };
    chars.shrink_to_fit(); // what the cache charges for is what it holds
    Ok(chars)
}

fn code_point(c: u32) -> char {
    char::from_u32(c).unwrap_or(char::REPLACEMENT_CHARACTER)
}
