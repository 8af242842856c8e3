//! One CPU's side-band perf event: a software "dummy" event that counts nothing and only
//! records what perf itself needs to name samples (`perf record` opens the same): every
//! executable `mmap` (`PERF_RECORD_MMAP2`: range, file offset, device, inode, generation,
//! path), every `comm` change and `exec` (`PERF_RECORD_COMM`), and process creation and exit
//! (`PERF_RECORD_FORK`, `PERF_RECORD_EXIT`), and every new cgroup (`PERF_RECORD_CGROUP`),
//! each with its pid, tid and a `CLOCK_MONOTONIC` time. The kernel writes them into a ring buffer this module maps and reads.

use std::{
    io,
    os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd},
    ptr::NonNull,
    sync::atomic::{AtomicU64, Ordering},
};

/// Data pages of each CPU's ring (256 KiB): about 2,000 exec'd processes' worth of records
/// between two reads. Past it the kernel drops records and says how many (counted).
const DATA_PAGES: usize = 64;
const PAGE: usize = 4096;

const PERF_TYPE_SOFTWARE: u32 = 1;
const PERF_COUNT_SW_DUMMY: u64 = 9;
const PERF_SAMPLE_TID: u64 = 1 << 1;
const PERF_SAMPLE_TIME: u64 = 1 << 2;
/// The `perf_event_attr` size we fill (`PERF_ATTR_SIZE_VER7`); the rest is zero.
const ATTR_SIZE: usize = 128;

/// `perf_event_attr` bit flags (the 64-bit field at offset 40).
mod flag {
    pub const DISABLED: u64 = 1 << 0;
    pub const MMAP: u64 = 1 << 8;
    pub const COMM: u64 = 1 << 9;
    pub const TASK: u64 = 1 << 13;
    pub const WATERMARK: u64 = 1 << 14;
    pub const SAMPLE_ID_ALL: u64 = 1 << 18;
    pub const MMAP2: u64 = 1 << 23;
    pub const COMM_EXEC: u64 = 1 << 24;
    pub const USE_CLOCKID: u64 = 1 << 25;
    pub const CGROUP: u64 = 1 << 32;
}

/// `ioctl` request numbers of `PERF_EVENT_IOC_ENABLE`.
const PERF_EVENT_IOC_ENABLE: libc::c_ulong = 0x2400;
/// `perf_event_open` flag: the new descriptor is close-on-exec.
const PERF_FLAG_FD_CLOEXEC: libc::c_ulong = 1 << 3;

/// The sample fields each record ends with (`sample_id_all`): what `sample_type` asks for.
pub const SAMPLE_TYPE: u64 = PERF_SAMPLE_TID | PERF_SAMPLE_TIME;

/// A mapped ring buffer of one CPU's side-band event.
pub struct Ring {
    fd: OwnedFd,
    /// The metadata page, then `DATA_PAGES` data pages.
    base: NonNull<u8>,
    len: usize,
    /// Where records are copied when they wrap around the ring's end.
    scratch: Vec<u8>,
}

// SAFETY: the mapping is owned by this value and only read (and its tail written) through
// `&mut self`.
unsafe impl Send for Ring {}

impl Ring {
    /// Opens the side-band event of `cpu` (every process on it) and maps its ring.
    pub fn open(cpu: u32) -> io::Result<Self> {
        let mut attr = [0u8; ATTR_SIZE];
        put_u32(&mut attr, 0, PERF_TYPE_SOFTWARE);
        put_u32(&mut attr, 4, ATTR_SIZE as u32);
        put_u64(&mut attr, 8, PERF_COUNT_SW_DUMMY);
        put_u64(&mut attr, 24, SAMPLE_TYPE);
        let flags = flag::DISABLED
            | flag::MMAP
            | flag::MMAP2
            | flag::COMM
            | flag::COMM_EXEC
            | flag::TASK
            | flag::SAMPLE_ID_ALL
            | flag::USE_CLOCKID
            | flag::CGROUP
            | flag::WATERMARK;
        put_u64(&mut attr, 40, flags);
        // wakeup_watermark: wake a poller as soon as a byte is written (side-band records are
        // not samples, so `wakeup_events` would not count them; the default watermark is half
        // the ring). The reader batches on its side.
        put_u32(&mut attr, 48, 1);
        // clockid (after config1, config2, branch_sample_type, sample_regs_user,
        // sample_stack_user): the daemon's own clock, so records order with its reads.
        put_u32(&mut attr, 92, libc::CLOCK_MONOTONIC as u32);
        // SAFETY: perf_event_open with a valid attr buffer of the size it declares; the result
        // is checked.
        let fd = unsafe {
            libc::syscall(
                libc::SYS_perf_event_open,
                attr.as_ptr(),
                -1 as libc::pid_t,
                cpu as libc::c_int,
                -1 as libc::c_int,
                PERF_FLAG_FD_CLOEXEC,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: the kernel returned a new descriptor, which we now own.
        let fd = unsafe { OwnedFd::from_raw_fd(fd as RawFd) };
        let len = (1 + DATA_PAGES) * PAGE;
        // SAFETY: a shared read-write mapping of the event's ring, as perf_event_open(2)
        // describes; the result is checked.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let base = NonNull::new(base.cast()).ok_or_else(|| io::Error::other("mmap returned null"))?;
        Ok(Self { fd, base, len, scratch: Vec::new() })
    }

    /// Starts recording.
    pub fn enable(&self) -> io::Result<()> {
        // SAFETY: an ioctl without argument on our own perf event descriptor.
        if unsafe { libc::ioctl(self.fd.as_raw_fd(), PERF_EVENT_IOC_ENABLE, 0) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// Whether records are waiting: two loads from the metadata page, no system call.
    pub fn has_records(&self) -> bool {
        self.head() != self.tail().load(Ordering::Acquire)
    }

    /// Calls `each` with every record written since the last call (type, misc, body after
    /// the header), then gives their space back to the kernel.
    pub fn drain(&mut self, mut each: impl FnMut(u32, u16, &[u8])) {
        let head = self.head();
        let mut tail = self.tail().load(Ordering::Relaxed);
        let size = (DATA_PAGES * PAGE) as u64;
        while tail < head {
            let header = self.copy(tail, 8);
            let kind = u32::from_ne_bytes(header[0..4].try_into().expect("4 bytes"));
            let misc = u16::from_ne_bytes(header[4..6].try_into().expect("2 bytes"));
            let len = u16::from_ne_bytes(header[6..8].try_into().expect("2 bytes")) as u64;
            if len < 8 || len > size || tail + len > head {
                // Not a record the kernel wrote: give the whole ring back rather than loop.
                tail = head;
                break;
            }
            let body = self.copy(tail + 8, (len - 8) as usize).to_vec();
            each(kind, misc, &body);
            tail += len;
        }
        // Release: the kernel may overwrite what was read only after it was read.
        self.tail().store(tail, Ordering::Release);
    }

    /// `len` bytes of the data area at ring position `at`, copied out when they wrap.
    fn copy(&mut self, at: u64, len: usize) -> &[u8] {
        let size = DATA_PAGES * PAGE;
        let start = (at % size as u64) as usize;
        // SAFETY: the data area is `size` mapped bytes after the metadata page, alive with self.
        let data = unsafe { std::slice::from_raw_parts(self.base.as_ptr().add(PAGE), size) };
        if start + len <= size {
            return &data[start..start + len];
        }
        self.scratch.clear();
        self.scratch.extend_from_slice(&data[start..]);
        self.scratch.extend_from_slice(&data[..len - (size - start)]);
        &self.scratch
    }

    /// `data_head` (metadata page offset 1024), loaded with acquire: the records before it
    /// are written.
    fn head(&self) -> u64 {
        // SAFETY: an aligned u64 inside the mapped metadata page, written by the kernel.
        let head = unsafe { &*self.base.as_ptr().add(1024).cast::<AtomicU64>() };
        head.load(Ordering::Acquire)
    }

    /// `data_tail` (offset 1032), which the reader writes.
    fn tail(&self) -> &AtomicU64 {
        // SAFETY: an aligned u64 inside the mapped metadata page.
        unsafe { &*self.base.as_ptr().add(1032).cast::<AtomicU64>() }
    }
}

impl Drop for Ring {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly what `open` mapped.
        unsafe { libc::munmap(self.base.as_ptr().cast(), self.len) };
    }
}

fn put_u32(buf: &mut [u8], at: usize, value: u32) {
    buf[at..at + 4].copy_from_slice(&value.to_ne_bytes());
}

fn put_u64(buf: &mut [u8], at: usize, value: u64) {
    buf[at..at + 8].copy_from_slice(&value.to_ne_bytes());
}
