//! The user-stack walk of a thread dump, in userspace: from the registers a blocked thread
//! saved at its kernel entry, over its stack read with `process_vm_readv` (which neither
//! stops nor signals the process), stepping each frame with [`profiler_common::walk`]'s
//! arithmetic and the rows the kernel walker uses, found the way it finds them: the
//! process's mapping list, the mapping's table, the last row at or before the address
//! ([`UnwindView`], read from the kernel's own maps). Frame pointers where there is no row.
//!
//! It is the kernel walker's twin, so what one unwinds the other does, and a test of one
//! holds for both; unlike it, it has no verifier to please, so it is plain code.

use profiler_common::{
    walk::{fallback_step, row_step, Memory, Regs, Step},
    UnwindCounter, UnwindMapping, MAX_USER_STACK_DEPTH,
};

use crate::{ebpf::UnwindView, ids::Pid};

/// Bytes of stack read at once: frames lie close together, and one syscall costs about the
/// same for 4 KiB as for 8 bytes.
const WINDOW_BYTES: usize = 4096;

/// Bytes of the window kept below the address that caused a read.
const WINDOW_SLACK_BYTES: u64 = 32;

/// How each frame was stepped and why walks ended, indexed like the kernel's
/// `UNWIND_COUNTERS`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WalkCounts(pub [u64; UnwindCounter::COUNT as usize]);

impl WalkCounts {
    fn bump(&mut self, index: u32) {
        if let Some(slot) = self.0.get_mut(index as usize) {
            *slot += 1;
        }
    }

    /// The count of `counter`.
    pub fn get(&self, counter: UnwindCounter) -> u64 {
        self.0[counter as usize]
    }

    /// Adds `other`'s counts.
    pub fn add(&mut self, other: &WalkCounts) {
        self.0.iter_mut().zip(other.0).for_each(|(a, b)| *a += b);
    }
}

/// Walks the user stack of a thread of `pid` from its saved registers; returns the frames,
/// leaf first (the saved pc, then return addresses), and whether the depth limit cut it.
pub fn walk(pid: Pid, view: &UnwindView, regs: Regs, counts: &mut WalkCounts) -> (Vec<u64>, bool) {
    let mut memory = ProcessMemory::new(pid, view);
    let mut regs = regs;
    let mut frames = Vec::with_capacity(32);
    while frames.len() < MAX_USER_STACK_DEPTH {
        frames.push(regs.pc);
        let step = match find_row(view, &regs) {
            Ok(row) => row_step(&mut regs, &row, &mut memory),
            Err(reason) => Step::Fallback(reason),
        };
        let step = match step {
            Step::Fallback(reason) => {
                counts.bump(reason as u32);
                fallback_step(&mut regs, reason, &mut memory)
            }
            step => step,
        };
        match step {
            Step::Stepped(counter) => counts.bump(counter),
            Step::Ended(counter) => {
                counter.into_iter().for_each(|c| counts.bump(c));
                return (frames, false);
            }
            Step::Fallback(_) => unreachable!("fallback_step never falls back"),
        }
    }
    (frames, true)
}

/// The row for `regs`'s frame, or why there is none (the kernel walker's `find_row`).
fn find_row(view: &UnwindView, regs: &Regs) -> Result<profiler_common::UnwindRow, UnwindCounter> {
    let pc = regs.lookup_pc();
    let mapping = find_mapping(view, pc)?;
    let table = view.table(mapping.table).ok_or(UnwindCounter::NoTable)?;
    let offset = pc.wrapping_sub(mapping.bias).wrapping_sub(table.base_address);
    let offset = u32::try_from(offset).map_err(|_| UnwindCounter::NoCfi)?;
    // The last row with pc_offset <= offset.
    let (mut lo, mut hi) = (0, table.rows);
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        let row = view.row(table, mid).ok_or(UnwindCounter::NoTable)?;
        if row.pc_offset <= offset {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    if lo == 0 {
        return Err(UnwindCounter::NoCfi);
    }
    view.row(table, lo - 1).ok_or(UnwindCounter::NoTable)
}

/// The mapping holding `pc` in the process's list.
fn find_mapping(view: &UnwindView, pc: u64) -> Result<UnwindMapping, UnwindCounter> {
    let mappings = view.mappings().ok_or(UnwindCounter::NoProcess)?;
    let index = mappings.partition_point(|m| m.start <= pc);
    let mapping = index.checked_sub(1).map(|i| mappings[i]).ok_or(UnwindCounter::NoMapping)?;
    if pc >= mapping.end() {
        return Err(UnwindCounter::NoMapping);
    }
    Ok(mapping)
}

/// The thread's stack as read with `process_vm_readv`, a window at a time.
struct ProcessMemory<'a> {
    pid: Pid,
    view: &'a UnwindView,
    base: u64,
    window: Vec<u8>,
}

impl<'a> ProcessMemory<'a> {
    fn new(pid: Pid, view: &'a UnwindView) -> Self {
        Self { pid, view, base: 0, window: Vec::new() }
    }

    /// Reads up to `WINDOW_BYTES` around `addr`: a few words below it (a caller's rbp is
    /// saved below its return address, and read after it) but never below the stack
    /// pointer `sp`, where the stack's mapping may end. A short read keeps what could be read.
    fn fill(&mut self, addr: u64, sp: u64) -> bool {
        let base = addr - (addr.saturating_sub(sp).min(WINDOW_SLACK_BYTES) & !7);
        self.window.resize(WINDOW_BYTES, 0);
        let len = read_process(self.pid, base, &mut self.window);
        self.window.truncate(len);
        self.base = base;
        addr + 8 <= base + len as u64
    }
}

impl Memory for ProcessMemory<'_> {
    fn read_word(&mut self, addr: u64, sp: u64) -> Option<u64> {
        let inside = |m: &Self| addr >= m.base && addr + 8 <= m.base + m.window.len() as u64;
        if !inside(self) && !self.fill(addr, sp) {
            return None;
        }
        let at = (addr - self.base) as usize;
        Some(u64::from_le_bytes(self.window[at..at + 8].try_into().ok()?))
    }

    fn is_code(&mut self, addr: u64) -> bool {
        find_mapping(self.view, addr).is_ok()
    }
}

/// Copies `buf.len()` bytes at `addr` of process `pid`; returns how many were read (a
/// read stops at the first page that is not mapped).
fn read_process(pid: Pid, addr: u64, buf: &mut [u8]) -> usize {
    let local = libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: buf.len() };
    // Split at the page boundary after `addr`: the kernel stops a remote read at the first
    // iovec it cannot complete, so the first page's bytes survive an unmapped second page.
    const PAGE: u64 = 4096;
    let first = ((addr | (PAGE - 1)) + 1 - addr).min(buf.len() as u64) as usize;
    let remote = [
        libc::iovec { iov_base: addr as *mut libc::c_void, iov_len: first },
        libc::iovec { iov_base: (addr + first as u64) as *mut libc::c_void, iov_len: buf.len() - first },
    ];
    // SAFETY: `local` covers `buf`, writable for its length; remote addresses are only read
    // by the kernel, which checks them against the target's mappings.
    let read = unsafe { libc::process_vm_readv(pid.0 as i32, &local, 1, remote.as_ptr(), 2, 0) };
    read.max(0) as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_our_own_stack_and_stops_at_unmapped_memory() {
        let pid = Pid(std::process::id());
        let value: u64 = 0x1122_3344_5566_7788;
        let mut buf = [0u8; 8];
        assert_eq!(read_process(pid, &value as *const u64 as u64, &mut buf), 8);
        assert_eq!(u64::from_le_bytes(buf), value);
        assert_eq!(read_process(pid, 0x10, &mut buf), 0, "page zero is never mapped");
    }
}
