//! The Go version a binary was built with, from `.go.buildinfo` (Go's `src/debug/buildinfo`):
//! 16 bytes `"\xff Go buildinf:"`, pointer size, flags; from Go 1.18 (flag bit 2) the version
//! follows at byte 32 as a varint length and its bytes, before that byte 16 holds the address
//! of a Go string header (address, length) of it.

use super::u64_at;

/// The magic that opens `.go.buildinfo`.
pub const MAGIC: &[u8; 14] = b"\xff Go buildinf:";
const FLAG_INLINE_STRINGS: u8 = 2;
/// Longer than any version string (`go1.22.0 X:boringcrypto` and the like).
const MAX_VERSION: u64 = 256;

/// The version in the buildinfo at the start of `info`; `read(address, len)` gives the
/// file's bytes at a virtual address (for the format before 1.18).
pub fn version<'a>(info: &'a [u8], read: impl Fn(u64, u64) -> Option<&'a [u8]>) -> Option<String> {
    if info.get(..14)? != MAGIC || *info.get(14)? != 8 {
        return None;
    }
    let bytes = if info.get(15)? & FLAG_INLINE_STRINGS != 0 {
        let (len, n) = uvarint(info.get(32..)?)?;
        info.get(32 + n..32 + n + usize::try_from(len.min(MAX_VERSION)).ok()?)?
    } else {
        let header = read(u64_at(info, 16)?, 16)?;
        let (address, len) = (u64_at(header, 0)?, u64_at(header, 8)?);
        read(address, len.min(MAX_VERSION))?
    };
    let version = std::str::from_utf8(bytes).ok()?;
    version.starts_with("go").then(|| version.to_string())
}

fn uvarint(bytes: &[u8]) -> Option<(u64, usize)> {
    let mut value = 0u64;
    for (index, byte) in bytes.iter().take(10).enumerate() {
        value |= u64::from(byte & 0x7f) << (7 * index);
        if byte & 0x80 == 0 {
            return Some((value, index + 1));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_buildinfo_formats_give_the_version() {
        let mut new = MAGIC.to_vec();
        new.extend([8, FLAG_INLINE_STRINGS]);
        new.resize(32, 0);
        new.push(8);
        new.extend(b"go1.21.3");
        assert_eq!(version(&new, |_, _| None).as_deref(), Some("go1.21.3"));
        // Before 1.18: byte 16 points at a string header at 0x1000, whose data is at 0x2000.
        let mut old = MAGIC.to_vec();
        old.extend([8, 0]);
        old.extend(0x1000u64.to_le_bytes());
        let mut header = 0x2000u64.to_le_bytes().to_vec();
        header.extend(8u64.to_le_bytes());
        let read = |address: u64, len: u64| match address {
            0x1000 => Some(&header[..len as usize]),
            0x2000 => Some(&b"go1.16.5"[..len as usize]),
            _ => None,
        };
        assert_eq!(version(&old, read).as_deref(), Some("go1.16.5"));
        assert_eq!(version(b"\x7fELF", |_, _| None), None);
    }
}
