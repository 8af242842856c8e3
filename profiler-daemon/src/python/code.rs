//! Names for code objects: qualified name, file and first line from a `PyCodeObject`, and
//! the current line from its location table ([`super::linetable`]).
//!
//! A code object is read once per (process, address) and cached with what identifies it:
//! its type pointer and the addresses of its name, file and table objects, re-read (one
//! small read) at every use. A code object freed and another allocated at its address
//! differs in those, and is read afresh rather than named after the old one.

use std::{collections::HashMap, sync::Arc};

use super::{
    detect::Interpreter,
    linetable,
    memory::{field_u32, field_u64, Remote},
    offsets::{CODE_READ_BYTES, OBJECT_TYPE},
    ReadFailure,
};
use crate::ids::Pid;

/// Characters of a name or path kept at most.
const MAX_STRING_CHARS: u64 = 4096;

/// Code objects cached at most (all processes): past it the cache starts over, so a
/// process that makes code objects without end costs reads, not memory.
const MAX_CACHED: usize = 65_536;

/// Bytes of a location table read at most.
const MAX_LINETABLE_BYTES: u64 = 256 * 1024;

/// What a code object says of itself.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CodeInfo {
    /// `co_qualname`: `Class.method`, `outer.<locals>.inner`, `<module>`.
    pub qualname: String,
    /// `co_filename`, as the interpreter was given it.
    pub filename: String,
    pub first_line: i32,
    linetable: Vec<u8>,
}

impl CodeInfo {
    /// The line of instruction `instr_offset`; the first line when the table has none.
    pub fn line(&self, instr_offset: u32) -> u32 {
        linetable::line_at(&self.linetable, self.first_line, instr_offset)
            .unwrap_or_else(|| self.first_line.max(0) as u32)
    }
}

/// The fields that tell one code object from another at the same address.
type Identity = [u64; 4];

/// The process a cache entry belongs to: its pid and start time.
pub type ProcessKey = (Pid, u64);

/// Code objects read so far, by (process, address).
#[derive(Default)]
pub struct CodeCache {
    entries: HashMap<(ProcessKey, u64), (Identity, Arc<CodeInfo>)>,
}

/// What a look-up cost.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CodeStats {
    /// Found in the cache, identity unchanged.
    pub cached: u64,
    /// Read from the process.
    pub read: u64,
    /// Cached under the same address, but another object now: read again.
    pub replaced: u64,
}

impl CodeCache {
    /// The code object at `addr` of `process`.
    pub fn get(
        &mut self,
        remote: &Remote,
        interp: &Interpreter,
        process: ProcessKey,
        addr: u64,
        stats: &mut CodeStats,
    ) -> Result<Arc<CodeInfo>, ReadFailure> {
        let o = &interp.offsets;
        let header = remote.bytes(addr, CODE_READ_BYTES)?;
        let identity = [
            field_u64(&header, OBJECT_TYPE),
            field_u64(&header, o.code_qualname),
            field_u64(&header, o.code_filename),
            field_u64(&header, o.code_linetable),
        ];
        if let Some(expected) = interp.code_type {
            if identity[0] != expected {
                return Err(ReadFailure::Layout(format!("{addr:#x} is not a code object")));
            }
        }
        match self.entries.get(&(process, addr)) {
            Some((known, info)) if *known == identity => {
                stats.cached += 1;
                return Ok(info.clone());
            }
            Some(_) => stats.replaced += 1,
            None => {}
        }
        let info = Arc::new(CodeInfo {
            qualname: read_str(remote, interp, identity[1])?,
            filename: read_str(remote, interp, identity[2])?,
            first_line: field_u32(&header, o.code_firstlineno) as i32,
            linetable: read_bytes(remote, interp, identity[3])?,
        });
        stats.read += 1;
        if self.entries.len() >= MAX_CACHED {
            self.entries.clear();
        }
        self.entries.insert((process, addr), (identity, info.clone()));
        Ok(info)
    }

    /// Forgets the code objects of processes not in `live`.
    pub fn retain(&mut self, mut live: impl FnMut(ProcessKey) -> bool) {
        self.entries.retain(|(process, _), _| live(*process));
    }
}

/// A `str` object: compact ASCII and compact non-ASCII (1-, 2- and 4-byte kinds) are read;
/// invalid code points become U+FFFD; longer than [`MAX_STRING_CHARS`] is cut.
fn read_str(remote: &Remote, interp: &Interpreter, addr: u64) -> Result<String, ReadFailure> {
    let o = &interp.offsets;
    if addr == 0 {
        return Ok(String::new());
    }
    let header = remote.bytes(addr, o.unicode_compact_size as usize)?;
    let length = field_u64(&header, o.unicode_length).min(MAX_STRING_CHARS);
    let state = field_u32(&header, o.unicode_state);
    let (kind, compact, ascii) = ((state >> 2) & 7, (state >> 5) & 1 == 1, (state >> 6) & 1 == 1);
    if !compact {
        return Err(ReadFailure::Layout(format!("str at {addr:#x} is not compact")));
    }
    let data = addr + if ascii { o.unicode_ascii_size } else { o.unicode_compact_size };
    let bytes = remote.bytes(data, (length * u64::from(kind.max(1))) as usize)?;
    let chars: String = match kind {
        1 => bytes.iter().map(|&b| char::from(b)).collect(),
        2 => bytes.chunks_exact(2).map(|c| code_point(u16::from_le_bytes([c[0], c[1]]).into())).collect(),
        4 => bytes.chunks_exact(4).map(|c| code_point(u32::from_le_bytes([c[0], c[1], c[2], c[3]]))).collect(),
        _ => return Err(ReadFailure::Layout(format!("str at {addr:#x} has kind {kind}"))),
    };
    Ok(chars)
}

fn code_point(c: u32) -> char {
    char::from_u32(c).unwrap_or(char::REPLACEMENT_CHARACTER)
}

/// A `bytes` object's contents, at most [`MAX_LINETABLE_BYTES`].
fn read_bytes(remote: &Remote, interp: &Interpreter, addr: u64) -> Result<Vec<u8>, ReadFailure> {
    let o = &interp.offsets;
    if addr == 0 {
        return Ok(Vec::new());
    }
    let size = remote.u64(addr + o.bytes_size)?.min(MAX_LINETABLE_BYTES);
    Ok(remote.bytes(addr + o.bytes_data, size as usize)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::python::offsets::V3_12;

    /// A 3.12 `str` object in our own memory: header, then the characters.
    fn str_object(kind: u32, ascii: bool, length: u64, data: &[u8]) -> Vec<u8> {
        let o = &V3_12;
        let header = if ascii { o.unicode_ascii_size } else { o.unicode_compact_size } as usize;
        let mut buf = vec![0u8; header + data.len()];
        buf[o.unicode_length as usize..][..8].copy_from_slice(&length.to_le_bytes());
        let state = (kind << 2) | (1 << 5) | (u32::from(ascii) << 6);
        buf[o.unicode_state as usize..][..4].copy_from_slice(&state.to_le_bytes());
        buf[header..].copy_from_slice(data);
        buf
    }

    fn bytes_object(data: &[u8]) -> Vec<u8> {
        let mut buf = vec![0u8; V3_12.bytes_data as usize + data.len()];
        buf[V3_12.bytes_size as usize..][..8].copy_from_slice(&(data.len() as u64).to_le_bytes());
        buf[V3_12.bytes_data as usize..].copy_from_slice(data);
        buf
    }

    fn interp(code_type: u64) -> Interpreter {
        Interpreter {
            version: (3, 12),
            path: "libpython3.12.so".into(),
            runtime: 0,
            code_type: Some(code_type),
            offsets: V3_12,
        }
    }

    fn addr(buf: &[u8]) -> u64 {
        buf.as_ptr() as u64
    }

    #[test]
    fn strings_of_every_compact_kind() {
        let me = Remote { pid: Pid(std::process::id()) };
        let interp = interp(0);
        let ascii = str_object(1, true, 5, b"hello");
        assert_eq!(read_str(&me, &interp, addr(&ascii)).unwrap(), "hello");
        let latin1 = str_object(1, false, 3, &[b'c', 0xe9, b'!']);
        assert_eq!(read_str(&me, &interp, addr(&latin1)).unwrap(), "cé!");
        let ucs2 = str_object(2, false, 2, &[0x3b, 0x04, 0xd8, 0x00]); // U+043B, U+00D8
        assert_eq!(read_str(&me, &interp, addr(&ucs2)).unwrap(), "лØ");
        let ucs4 = str_object(4, false, 2, &[0x00, 0xf6, 0x01, 0x00, 0x00, 0xd8, 0x00, 0x00]);
        assert_eq!(read_str(&me, &interp, addr(&ucs4)).unwrap(), "😀\u{fffd}", "a lone surrogate is replaced");
        let mut legacy = str_object(1, true, 1, b"x");
        legacy[V3_12.unicode_state as usize] &= !(1 << 5);
        assert!(read_str(&me, &interp, addr(&legacy)).is_err(), "not compact: refused, not misread");
    }

    #[test]
    fn a_code_object_is_read_once_and_read_again_when_its_address_holds_another() {
        let me = Remote { pid: Pid(std::process::id()) };
        let code_type = 0x5555_0000_u64;
        let (name, other, file) =
            (str_object(1, true, 1, b"f"), str_object(1, true, 1, b"g"), str_object(1, true, 4, b"a.py"));
        let table = bytes_object(&[0x80 | (13 << 3), 2 << 1]); // one unit, line + 2
        let mut code = vec![0u8; CODE_READ_BYTES];
        let put = |code: &mut [u8], offset: u64, value: u64| {
            code[offset as usize..][..8].copy_from_slice(&value.to_le_bytes());
        };
        put(&mut code, OBJECT_TYPE, code_type);
        put(&mut code, V3_12.code_qualname, addr(&name));
        put(&mut code, V3_12.code_filename, addr(&file));
        put(&mut code, V3_12.code_linetable, addr(&table));
        code[V3_12.code_firstlineno as usize..][..4].copy_from_slice(&10u32.to_le_bytes());
        let (interp, process) = (interp(code_type), (me.pid, 1));
        let (mut cache, mut stats) = (CodeCache::default(), CodeStats::default());
        let info = cache.get(&me, &interp, process, addr(&code), &mut stats).unwrap();
        assert_eq!((info.qualname.as_str(), info.filename.as_str(), info.line(0)), ("f", "a.py", 12));
        cache.get(&me, &interp, process, addr(&code), &mut stats).unwrap();
        assert_eq!(stats, CodeStats { cached: 1, read: 1, replaced: 0 });
        // Freed, and another code object at the same address.
        put(&mut code, V3_12.code_qualname, addr(&other));
        let info = cache.get(&me, &interp, process, addr(&code), &mut stats).unwrap();
        assert_eq!(info.qualname, "g");
        assert_eq!(stats, CodeStats { cached: 1, read: 2, replaced: 1 });
        // Not a code object any more.
        put(&mut code, OBJECT_TYPE, 0x1234);
        assert!(cache.get(&me, &interp, process, addr(&code), &mut stats).is_err());
    }
}
