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

    /// The bytes of every `(addr, len)` of `ranges` (`None` for one that cannot be read),
    /// with as few `process_vm_readv` calls as the kernel allows (up to `IOV_MAX` ranges
    /// each): a reader of many small objects (a goroutine dump reads three per goroutine)
    /// pays the syscall's fixed cost (the ptrace access check, the mm lookup) once per batch
    /// instead of once per object. The kernel stops a call at the first range it cannot
    /// read; that range is `None` and the next call starts after it.
    pub fn read_many(&self, ranges: &[(u64, usize)]) -> Result<Vec<Option<Vec<u8>>>, ReadError> {
        const IOV_MAX: usize = 1024;
        let mut out: Vec<Option<Vec<u8>>> = ranges.iter().map(|&(_, len)| Some(vec![0; len])).collect();
        let valid = |&(addr, len): &(u64, usize)| {
            len > 0 && len <= MAX_READ_BYTES && addr != 0 && addr.checked_add(len as u64).is_some()
        };
        let mut start = 0;
        while start < ranges.len() {
            if !valid(&ranges[start]) {
                out[start] = if ranges[start].1 == 0 { Some(Vec::new()) } else { None };
                start += 1;
                continue;
            }
            // A run of valid ranges, at most IOV_MAX.
            let end = (start..ranges.len().min(start + IOV_MAX))
                .find(|&i| !valid(&ranges[i]))
                .unwrap_or(ranges.len().min(start + IOV_MAX));
            let local: Vec<libc::iovec> = out[start..end]
                .iter_mut()
                .map(|buf| {
                    let buf = buf.as_mut().expect("not read yet");
                    libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: buf.len() }
                })
                .collect();
            let remote: Vec<libc::iovec> = ranges[start..end]
                .iter()
                .map(|&(addr, len)| libc::iovec { iov_base: addr as *mut libc::c_void, iov_len: len })
                .collect();
            // SAFETY: each local iovec covers one of `out`'s buffers, writable for its length
            // and not moved while the call runs; the remote ranges are only read by the kernel.
            let read = unsafe {
                libc::process_vm_readv(
                    self.pid.0 as i32,
                    local.as_ptr(),
                    local.len() as libc::c_ulong,
                    remote.as_ptr(),
                    remote.len() as libc::c_ulong,
                    0,
                )
            };
            if read < 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH) {
                return Err(ReadError::Exited);
            }
            // The ranges wholly read, then the one the call stopped at (if any).
            let mut left = read.max(0) as usize;
            let mut at = start;
            while at < end && left >= ranges[at].1 {
                left -= ranges[at].1;
                at += 1;
            }
            if at < end {
                out[at] = None;
                at += 1;
            }
            start = at;
        }
        Ok(out)
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

    #[test]
    fn many_ranges_read_in_batches_and_an_unreadable_one_is_none() {
        let me = Remote { pid: Pid(std::process::id()) };
        let words: Vec<u64> = (0..3000).collect();
        let at = |i: usize| &words[i] as *const u64 as u64;
        // More ranges than one call takes, an unmapped one in the middle, an empty one.
        let mut ranges: Vec<(u64, usize)> = (0..3000).map(|i| (at(i), 8)).collect();
        ranges[1500] = (0x10, 8);
        ranges[2000] = (at(2000), 0);
        let read = me.read_many(&ranges).expect("this process is alive");
        assert_eq!(read.len(), 3000);
        for (i, bytes) in read.iter().enumerate() {
            match i {
                1500 => assert_eq!(bytes, &None, "the unmapped range"),
                2000 => assert_eq!(bytes.as_deref(), Some(&[][..])),
                _ => assert_eq!(bytes.as_deref(), Some(&(i as u64).to_le_bytes()[..]), "range {i}"),
            }
        }
        let gone = Remote { pid: Pid(0x7fff_fff0) };
        assert_eq!(gone.read_many(&ranges[..2]), Err(ReadError::Exited));
    }
}
