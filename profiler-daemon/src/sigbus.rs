//! Surviving files truncated under our mappings. blazesym and the unwind-table builder map
//! ELF files read-only; if someone truncates a file while it is mapped (its owner may: a
//! user's own binary or library), touching a page past the new end raises `SIGBUS`, which
//! would kill the daemon. The handler installed here replaces the faulting page with a page
//! of zeros and lets the read go on: the parser sees zeros where the file ended, which it
//! treats as any other malformed input (an error, an unsymbolized frame), and the event is
//! counted in `/status`.
//!
//! Only faults on a nonexistent page of a mapping (`BUS_ADRERR`, the truncated-file case)
//! are handled; any other `SIGBUS` is re-raised with the default action.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};

/// Pages replaced with zeros since start.
static RECOVERED: AtomicU64 = AtomicU64::new(0);
/// The page size, read at install (sysconf is not for signal handlers).
static PAGE: AtomicUsize = AtomicUsize::new(4096);

/// Installs the handler for the whole process. Idempotent.
pub fn install() -> std::io::Result<()> {
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if page > 0 {
        PAGE.store(page as usize, Relaxed);
    }
    // SAFETY: a zeroed sigaction is valid; the handler is async-signal-safe (atomics and
    // mmap only) and has the SA_SIGINFO signature.
    unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = handle as *const () as usize;
        action.sa_flags = libc::SA_SIGINFO | libc::SA_NODEFER;
        libc::sigemptyset(&mut action.sa_mask);
        if libc::sigaction(libc::SIGBUS, &action, std::ptr::null_mut()) != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Pages of truncated files read as zeros since start.
pub fn recovered() -> u64 {
    RECOVERED.load(Relaxed)
}

extern "C" fn handle(signal: libc::c_int, info: *mut libc::siginfo_t, _context: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo for a SA_SIGINFO handler.
    let (code, addr) = unsafe { ((*info).si_code, (*info).si_addr() as usize) };
    if code == libc::BUS_ADRERR && addr != 0 {
        let page = addr & !(PAGE.load(Relaxed) - 1);
        // SAFETY: replaces one page of a mapping that exists (the kernel faulted in it) with
        // a private zero page; the read that faulted is retried and succeeds.
        let mapped = unsafe {
            libc::mmap(
                page as *mut libc::c_void,
                PAGE.load(Relaxed),
                libc::PROT_READ,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                -1,
                0,
            )
        };
        if mapped != libc::MAP_FAILED {
            RECOVERED.fetch_add(1, Relaxed);
            return;
        }
    }
    // Not ours to fix: die as the default action would.
    // SAFETY: signal and raise are async-signal-safe.
    unsafe {
        libc::signal(signal, libc::SIG_DFL);
        libc::raise(signal);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;

    #[test]
    fn a_file_truncated_under_its_mapping_reads_as_zeros() {
        install().unwrap();
        let path = std::env::temp_dir().join(format!("profiler-sigbus-{}", std::process::id()));
        let len = 1 << 20;
        std::fs::write(&path, vec![0xabu8; len]).unwrap();
        let file = std::fs::File::open(&path).unwrap();
        // SAFETY: a private read-only mapping of the whole file, unmapped below.
        let ptr =
            unsafe { libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ, libc::MAP_PRIVATE, file.as_raw_fd(), 0) };
        assert_ne!(ptr, libc::MAP_FAILED);
        // SAFETY: `len` mapped bytes, alive until the munmap below.
        let bytes = unsafe { std::slice::from_raw_parts(ptr.cast::<u8>(), len) };
        assert_eq!(bytes[4096], 0xab);
        std::fs::OpenOptions::new().write(true).open(&path).unwrap().set_len(8192).unwrap();
        let before = recovered();
        // Past the new end: without the handler, SIGBUS ends the test process here.
        let tail: u64 = bytes[512 << 10..].iter().map(|&b| u64::from(b)).sum();
        assert_eq!(tail, 0, "the pages past the end read as zeros");
        assert_eq!(bytes[4096], 0xab, "the pages before it are the file's");
        assert!(recovered() >= before + 128, "{} pages recovered", recovered() - before);
        // SAFETY: unmaps what was mapped above; `bytes` is not used after.
        unsafe { libc::munmap(ptr, len) };
        std::fs::remove_file(&path).unwrap();
    }
}
