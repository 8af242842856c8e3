//! A file mapped read-only into memory: building a table reads only the headers and the CFI
//! sections, so a 150 MiB library costs its `.eh_frame`'s pages, not a 150 MiB buffer.

use std::{fs::File, io, os::fd::AsRawFd, ptr::NonNull};

pub struct MappedFile {
    ptr: NonNull<u8>,
    len: usize,
}

impl MappedFile {
    /// Maps all of `file` (an empty file maps to an empty slice).
    pub fn map(file: &File) -> io::Result<Self> {
        let len = usize::try_from(file.metadata()?.len()).map_err(|_| io::Error::other("file too large"))?;
        if len == 0 {
            return Ok(Self { ptr: NonNull::dangling(), len: 0 });
        }
        // SAFETY: a private read-only mapping of `len` bytes of an open file. A file truncated
        // while mapped faults on access past its end: `crate::sigbus` turns those pages into
        // zeros, which the table builder reads as malformed CFI.
        let ptr =
            unsafe { libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ, libc::MAP_PRIVATE, file.as_raw_fd(), 0) };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let ptr = NonNull::new(ptr.cast()).ok_or_else(|| io::Error::other("mmap returned null"))?;
        Ok(Self { ptr, len })
    }

    pub fn bytes(&self) -> &[u8] {
        // SAFETY: `len` mapped bytes that live as long as `self`.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for MappedFile {
    fn drop(&mut self) {
        if self.len > 0 {
            // SAFETY: unmaps exactly what `map` mapped.
            unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
        }
    }
}
