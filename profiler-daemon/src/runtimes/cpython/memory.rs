//! Reads of another process's memory for the CPython reader: exact reads with
//! `process_vm_readv`, which neither stops nor signals the process, and errors that tell a
//! process that exited (counted, never guessed at) from an address that is not mapped.

use crate::ids::Pid;

/// Why a read failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ReadError {
    /// The process is gone (`ESRCH`).
    #[error("the process exited")]
    Exited,
    /// Part of the range is not mapped or not readable (a stale or corrupt pointer).
    #[error("cannot read {len} bytes at {addr:#x}")]
    Fault { addr: u64, len: usize },
}

/// Largest single read: every object read here is small (a header, a name, a line table is
/// capped by its reader); a bigger length is a corrupt size field.
const MAX_READ_BYTES: usize = 1 << 20;

/// One process's memory.
#[derive(Clone, Copy, Debug)]
pub struct Remote {
    pub pid: Pid,
}

impl Remote {
    /// Fills `buf` from `addr`, all or nothing.
    pub fn read(&self, addr: u64, buf: &mut [u8]) -> Result<(), ReadError> {
        let fault = ReadError::Fault { addr, len: buf.len() };
        if buf.is_empty() {
            return Ok(());
        }
        if buf.len() > MAX_READ_BYTES || addr == 0 || addr.checked_add(buf.len() as u64).is_none() {
            return Err(fault);
        }
        let local = libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: buf.len() };
        let remote = libc::iovec { iov_base: addr as *mut libc::c_void, iov_len: buf.len() };
        // SAFETY: `local` covers `buf`, writable for its length; the remote range is only
        // read by the kernel, which checks it against the target's mappings.
        let read = unsafe { libc::process_vm_readv(self.pid.0 as i32, &local, 1, &remote, 1, 0) };
        match read {
            n if n == buf.len() as isize => Ok(()),
            -1 if std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH) => Err(ReadError::Exited),
            _ => Err(fault),
        }
    }

    /// `len` bytes at `addr`.
    pub fn bytes(&self, addr: u64, len: usize) -> Result<Vec<u8>, ReadError> {
        let mut buf = vec![0; len];
        self.read(addr, &mut buf)?;
        Ok(buf)
    }

    /// A little-endian `u64` at `addr` (a pointer or a size).
    pub fn u64(&self, addr: u64) -> Result<u64, ReadError> {
        let mut buf = [0; 8];
        self.read(addr, &mut buf)?;
        Ok(u64::from_le_bytes(buf))
    }

    /// A little-endian `u32` at `addr`.
    pub fn u32(&self, addr: u64) -> Result<u32, ReadError> {
        let mut buf = [0; 4];
        self.read(addr, &mut buf)?;
        Ok(u32::from_le_bytes(buf))
    }
}

/// The little-endian `u64` at `offset` of `bytes` (a struct read whole), 0 past its end.
pub fn field_u64(bytes: &[u8], offset: u64) -> u64 {
    let at = offset as usize;
    bytes.get(at..at + 8).map_or(0, |b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
}

/// The `u32` at `offset` of `bytes`, 0 past its end.
pub fn field_u32(bytes: &[u8], offset: u64) -> u32 {
    let at = offset as usize;
    bytes.get(at..at + 4).map_or(0, |b| u32::from_le_bytes(b.try_into().expect("4 bytes")))
}

/// The byte at `offset` of `bytes`, 0 past its end.
pub fn field_u8(bytes: &[u8], offset: u64) -> u8 {
    bytes.get(offset as usize).copied().unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_whole_or_says_why() {
        let me = Remote { pid: Pid(std::process::id()) };
        let value: u64 = 0x0102_0304_0506_0708;
        assert_eq!(me.u64(&value as *const u64 as u64), Ok(value));
        assert_eq!(me.u64(0x10), Err(ReadError::Fault { addr: 0x10, len: 8 }));
        let gone = Remote { pid: Pid(0x7fff_fff0) };
        assert_eq!(gone.u64(&value as *const u64 as u64), Err(ReadError::Exited));
    }
}
