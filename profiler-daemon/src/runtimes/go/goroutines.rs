//! Every goroutine of `runtime.allgs`, read from the process's memory without stopping it:
//! the slice's pointers, then each `g` (id, status, wait reason and since when, creator,
//! labels), then its stack by frame pointers (Go code on amd64 keeps them) from where it
//! stands:
//! - a goroutine off its thread (waiting, runnable) from the `sched` it saved when it was
//!   switched out (`gopark` → `mcall` saves pc, sp and bp);
//! - a running one, or one in a system call, from its thread (`m.procid`): the frames the
//!   thread dump walked from the thread's saved registers, or, for a thread on a CPU, a
//!   frame-pointer walk from the registers it saved at its last kernel entry when they lie on
//!   this goroutine's stack (stale, marked); else only the pc it entered its call at.
//!
//! The list can change while it is read (goroutines start and end): its header is read again
//! after the goroutines, and the whole read redone when it moved ([`ATTEMPTS`]); each `g` is
//! read again after its stack, and one whose status or saved registers changed is marked.

use std::collections::HashMap;

use super::{
    binary::{FunctionClass, Symbols, GLOBALS},
    labels,
    layout::{self, Layout},
    GoDump, ThreadStack,
};
use crate::runtimes::cpython::memory::{field_u32, field_u64, field_u8, ReadError, Remote};

/// Entries of `allgs` read per dump at most (Go's own profile has no cap), system and dead
/// goroutines included: a server with 100,000 goroutines has a few more `g`s than that, which
/// a cap of 100,000 cut (`bench go` found it). Each goroutine kept costs about 0.5 KiB (its
/// frames, its state; labels are shared and budgeted by [`labels::MAX_DUMP_BYTES`]), so a
/// dump holds at most about 125 MiB; 100,000 read in about half a second on a test machine.
pub const MAX_GOROUTINES: usize = 250_000;
/// Frames kept per goroutine: Go's goroutine profile keeps 32 (`runtime.StackRecord`).
pub const MAX_FRAMES: usize = 32;
/// Reads of the list per dump at most.
const ATTEMPTS: usize = 3;
/// Pointers of `allgs` read at once (a read is at most 1 MiB).
const POINTERS_PER_READ: usize = 65536;
/// Goroutines read together: their `g`s, then their stacks' first windows, then their `g`s
/// again, each in one vectored read (`Remote::read_many`), so a dump costs three syscalls
/// per batch instead of three per goroutine (at 100,000 goroutines the syscalls' fixed cost
/// was two thirds of the dump). 512 stack windows are at most 2 MiB.
const BATCH: usize = 512;
/// Bytes of a wait reason's string kept (Go's longest is 29).
const MAX_WAIT_REASON_BYTES: u64 = 64;
/// Bytes of stack read at once.
const STACK_WINDOW: u64 = 4096;

/// Where a goroutine's frames come from, as its `stack` label says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GoroutineStack {
    /// From the `sched` it saved when it was switched out.
    Saved,
    /// Its thread's frames, walked by the thread dump (the thread was off the CPU), from
    /// a system call (its pc a return address).
    Thread,
    /// Its thread's frames, walked by the thread dump, of a running goroutine whose thread
    /// the kernel had switched out (its pc exact).
    ThreadInterrupted,
    /// A frame-pointer walk from its thread's registers at its last kernel entry (the thread
    /// is on a CPU: stale).
    ThreadOnCpu,
    /// Only the pc it entered its system call at.
    SyscallPc,
    /// None could be walked (running, its thread's registers elsewhere).
    None,
}

impl GoroutineStack {
    /// Whether the leaf is the pc where the code was interrupted (not a return address).
    pub fn exact_leaf(self) -> bool {
        matches!(self, GoroutineStack::ThreadOnCpu | GoroutineStack::ThreadInterrupted)
    }

    pub fn describe(self) -> &'static str {
        match self {
            GoroutineStack::Saved => "saved sched",
            GoroutineStack::Thread => "its thread's walked stack",
            GoroutineStack::ThreadInterrupted => "its thread's walked stack (interrupted: exact pc)",
            GoroutineStack::ThreadOnCpu => {
                "its thread's registers at its last kernel entry (on a CPU: stale; exact pc)"
            }
            GoroutineStack::SyscallPc => "syscall pc only",
            GoroutineStack::None => "running, not walked",
        }
    }
}

/// One goroutine, read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Goroutine {
    pub goid: i64,
    /// Status without the scan bit (`layout::G_WAITING`, …).
    pub status: u32,
    /// Go's text for it: the wait reason when waiting with one, else the status's name.
    pub state: String,
    /// Whole minutes waiting (Go prints `, N minutes` from 1 on).
    pub wait_minutes: i64,
    pub locked_to_thread: bool,
    /// Return addresses, leaf first (the leaf is exact only where
    /// [`GoroutineStack::exact_leaf`] says), then `gopc` when it is not 0: the creator's pc
    /// rides with the stack to be symbolized ([`super::profile`]).
    pub frames: Vec<u64>,
    pub truncated: bool,
    pub stack: GoroutineStack,
    /// The pc of the `go` statement that started it (0 for the main goroutine).
    pub gopc: u64,
    /// Its creator's id (Go 1.21 on).
    pub parent_goid: Option<i64>,
    /// `None` without labels; else sorted by key.
    pub labels: Option<labels::Labels>,
    /// Its status or registers changed while its stack was read.
    pub moving: bool,
}

/// The globals a read needs, at their runtime addresses.
struct Globals {
    allgs: u64,
    fing_running: Option<u64>,
}

/// What every goroutine's read needs.
struct Reading<'a> {
    remote: &'a Remote,
    layout: &'a Layout,
    symbols: &'a Symbols,
    globals: Globals,
    bias: u64,
    /// Go's `nanotime` when the read began.
    now: i64,
    threads: &'a HashMap<u32, ThreadStack>,
    labels: labels::LabelReader,
    /// The process's own `waitReasonStrings`, else the layout's table.
    wait_reasons: Vec<String>,
}

/// Reads every goroutine. An error says why none could be (the process exited, the globals
/// are not where the symbols say).
pub fn read_all(
    remote: &Remote,
    layout: &Layout,
    symbols: &Symbols,
    bias: u64,
    threads: &HashMap<u32, ThreadStack>,
) -> Result<GoDump, String> {
    let at = |i: usize| symbols.globals[i].map(|a| a.wrapping_add(bias));
    let allgs = at(0).ok_or_else(|| format!("the symbol table has no {}", GLOBALS[0]))?;
    let globals = Globals { allgs, fing_running: at(2) };
    let wait_reasons = wait_reasons(remote, symbols, bias)
        .unwrap_or_else(|_| layout.wait_reasons.iter().map(|s| s.to_string()).collect());
    let mut reading = Reading {
        remote,
        layout,
        symbols,
        globals,
        bias,
        now: monotonic_ns(),
        threads,
        labels: labels::LabelReader::new(layout.labels_repr),
        wait_reasons,
    };
    let mut dump = GoDump::default();
    for attempt in 1..=ATTEMPTS {
        let (pointers, header) = list(remote, &reading.globals, &mut dump).map_err(|e| e.to_string())?;
        let mut round = GoDump { reread: dump.reread, left_out: dump.left_out, ..GoDump::default() };
        reading.labels = labels::LabelReader::new(layout.labels_repr);
        for batch in pointers.chunks(BATCH) {
            read_batch(&mut reading, batch, &mut round);
        }
        round.labels_cut = reading.labels.cut;
        let again = remote.bytes(reading.globals.allgs, 16).map_err(|e| e.to_string())?;
        dump = round;
        if again == header || attempt == ATTEMPTS {
            break;
        }
        dump.reread += 1;
    }
    Ok(dump)
}

/// The `g` pointers of `allgs` (at most [`MAX_GOROUTINES`], the rest counted), and the slice
/// header they were read from.
fn list(remote: &Remote, globals: &Globals, dump: &mut GoDump) -> Result<(Vec<u64>, Vec<u8>), ReadError> {
    let header = remote.bytes(globals.allgs, 16)?;
    let (base, len) = (field_u64(&header, 0), field_u64(&header, 8) as usize);
    let kept = len.min(MAX_GOROUTINES);
    dump.left_out = (len - kept) as u64;
    let mut pointers = Vec::with_capacity(kept);
    let mut index = 0;
    while index < kept {
        let n = (kept - index).min(POINTERS_PER_READ);
        let bytes = remote.bytes(base + index as u64 * 8, n * 8)?;
        pointers.extend(bytes.chunks_exact(8).map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes"))));
        index += n;
    }
    Ok((pointers, header))
}

/// Reads the goroutines at `batch` into `dump` (or counts why not): their `g`s, the first
/// window of each parked one's stack, and their `g`s again to tell which moved meanwhile.
fn read_batch(reading: &mut Reading, batch: &[u64], dump: &mut GoDump) {
    let (remote, layout) = (reading.remote, reading.layout);
    let none = || vec![None; batch.len()];
    let ranges: Vec<(u64, usize)> = batch.iter().map(|&pointer| (pointer, layout.g_read as usize)).collect();
    let gs = remote.read_many(&ranges).unwrap_or_else(|_| none());
    let windows: Vec<(u64, usize)> =
        gs.iter().map(|g| g.as_deref().map_or((0, 0), |g| saved_stack_window(layout, g))).collect();
    let mut stacks = remote.read_many(&windows).unwrap_or_else(|_| none());
    let mut read = Vec::with_capacity(batch.len());
    for ((g, stack), &(base, _)) in gs.iter().zip(stacks.iter_mut()).zip(&windows) {
        let Some(g) = g else {
            dump.unreadable += 1;
            read.push(None);
            continue;
        };
        read.push(read_one(reading, g, (base, stack.take().unwrap_or_default()), dump));
    }
    let again = remote.read_many(&ranges).unwrap_or_else(|_| none());
    for ((goroutine, g), again) in read.into_iter().zip(&gs).zip(again) {
        let (Some(mut goroutine), Some(g)) = (goroutine, g) else { continue };
        goroutine.moving = again.is_none_or(|again| moved(layout, g, &again));
        dump.moving += u64::from(goroutine.moving);
        dump.goroutines.push(goroutine);
    }
}

/// The first window of a parked goroutine's stack, from its saved sp (where its frame
/// pointer chain starts); `(0, 0)` for a running goroutine (its thread's stack is used).
fn saved_stack_window(layout: &Layout, g: &[u8]) -> (u64, usize) {
    let status = field_u32(g, layout.atomicstatus) & !layout::SCAN_BIT;
    if status == layout::G_RUNNING || status == layout::G_SYSCALL || status == layout::G_DEAD {
        return (0, 0);
    }
    let (lo, hi) = (field_u64(g, layout.stack_lo), field_u64(g, layout.stack_hi));
    let start = field_u64(g, layout.sched_sp).max(lo);
    match hi.checked_sub(start) {
        Some(len) if len > 0 => (start, len.min(STACK_WINDOW) as usize),
        _ => (0, 0),
    }
}

/// The goroutine whose `g` is `g` (`moving` is set by the caller), or `None` for a dead,
/// idle or system one (counted). `window` is its stack's first window, read already.
fn read_one(reading: &mut Reading, g: &[u8], window: (u64, Vec<u8>), dump: &mut GoDump) -> Option<Goroutine> {
    let Reading { remote, layout, symbols, bias, now, threads, .. } = *reading;
    let globals = &reading.globals;
    let status = field_u32(g, layout.atomicstatus) & !layout::SCAN_BIT;
    if status == layout::G_DEAD || status == layout::G_IDLE || system(remote, layout, symbols, globals, bias, g) {
        dump.system += 1;
        return None;
    }
    let is_code = |pc: u64| symbols.is_code(pc.wrapping_sub(bias));
    let (mut frames, truncated, stack) = walk(remote, layout, g, status, threads, &is_code, window);
    let gopc = field_u64(g, layout.gopc);
    if gopc != 0 {
        frames.push(gopc);
    }
    let labels = reading.labels.read(remote, field_u64(g, layout.labels));
    let waitsince = field_u64(g, layout.waitsince) as i64;
    let wait_minutes =
        if status == layout::G_WAITING && waitsince != 0 { (now - waitsince) / 60_000_000_000 } else { 0 };
    Some(Goroutine {
        goid: field_u64(g, layout.goid) as i64,
        status,
        state: state(&reading.wait_reasons, status, field_u8(g, layout.waitreason)),
        wait_minutes,
        locked_to_thread: field_u64(g, layout.lockedm) != 0,
        frames,
        truncated,
        stack,
        gopc,
        parent_goid: layout.parent_goid.map(|at| field_u64(g, at) as i64),
        labels,
        moving: false,
    })
}

/// Go's `isSystemGoroutine(gp, false)`: started in a `runtime.` function, except
/// `runtime.main`, and the finalizer goroutine while it runs no finalizer.
fn system(remote: &Remote, layout: &Layout, symbols: &Symbols, globals: &Globals, bias: u64, g: &[u8]) -> bool {
    match symbols.class(field_u64(g, layout.startpc).wrapping_sub(bias)) {
        FunctionClass::User | FunctionClass::RuntimeShown => false,
        FunctionClass::Runtime => true,
        FunctionClass::Finalizer => {
            let running = globals.fing_running.and_then(|at| remote.bytes(at, 1).ok()).is_some_and(|b| b[0] != 0);
            !running
        }
    }
}

/// The process's `runtime.waitReasonStrings` (at the symbol's address plus `bias`): the
/// strings its Go version prints, whatever that version. An error when the symbol table has
/// no such array or it cannot be read.
pub fn wait_reasons(remote: &Remote, symbols: &Symbols, bias: u64) -> Result<Vec<String>, String> {
    let (address, size) = symbols.wait_reason_strings.ok_or("no runtime.waitReasonStrings in the symbol table")?;
    // `waitReason` is a uint8: 256 strings at most, 16 bytes each.
    let count = (size / 16).min(256) as usize;
    let headers = remote.bytes(address.wrapping_add(bias), count * 16).map_err(|e| e.to_string())?;
    let mut strings = Vec::with_capacity(count);
    for header in headers.chunks_exact(16) {
        let (data, len) = (field_u64(header, 0), field_u64(header, 8));
        if len > MAX_WAIT_REASON_BYTES {
            return Err(format!("a wait reason of {len} bytes: not the array expected"));
        }
        let text = if len == 0 { Vec::new() } else { remote.bytes(data, len as usize).map_err(|e| e.to_string())? };
        strings.push(String::from_utf8_lossy(&text).into_owned());
    }
    Ok(strings)
}

/// Go's text for a status: the wait reason of a waiting goroutine that has one.
fn state(wait_reasons: &[String], status: u32, reason: u8) -> String {
    if status == layout::G_WAITING && reason != 0 {
        return wait_reasons.get(usize::from(reason)).map_or("unknown wait reason", String::as_str).to_string();
    }
    layout::STATUS_STRINGS.get(status as usize).copied().unwrap_or("???").to_string()
}

/// Whether a goroutine's status or saved registers differ between two reads of its `g`.
fn moved(layout: &Layout, before: &[u8], after: &[u8]) -> bool {
    [layout.atomicstatus, layout.sched_pc, layout.sched_sp, layout.sched_bp]
        .into_iter()
        .any(|at| field_u64(before, at) != field_u64(after, at))
}

/// The goroutine's frames, whether the depth cut them, and where they come from.
fn walk(
    remote: &Remote,
    layout: &Layout,
    g: &[u8],
    status: u32,
    threads: &HashMap<u32, ThreadStack>,
    is_code: &dyn Fn(u64) -> bool,
    (base, bytes): (u64, Vec<u8>),
) -> (Vec<u64>, bool, GoroutineStack) {
    let bounds = (field_u64(g, layout.stack_lo), field_u64(g, layout.stack_hi));
    if status != layout::G_RUNNING && status != layout::G_SYSCALL {
        let (pc, sp, bp) =
            (field_u64(g, layout.sched_pc), field_u64(g, layout.sched_sp), field_u64(g, layout.sched_bp));
        let window = StackWindow { base, bytes, hi: bounds.1 };
        let (frames, truncated) = frame_pointer_walk(remote, bounds, pc, sp, bp, window);
        return (frames, truncated, GoroutineStack::Saved);
    }
    let m = field_u64(g, layout.m);
    let tid = (m != 0).then(|| remote.u64(m + layout.m_procid).ok()).flatten();
    match tid.and_then(|tid| threads.get(&(tid as u32))) {
        Some(ThreadStack::Walked(frames)) if !frames.is_empty() => {
            let truncated = frames.len() > MAX_FRAMES;
            let how =
                if status == layout::G_RUNNING { GoroutineStack::ThreadInterrupted } else { GoroutineStack::Thread };
            (frames.iter().copied().take(MAX_FRAMES).collect(), truncated, how)
        }
        Some(&ThreadStack::OnCpu { pc, sp, bp }) if (bounds.0..bounds.1).contains(&sp) => {
            let (frames, truncated) = interrupted_walk(remote, bounds, pc, sp, bp, is_code);
            (frames, truncated, GoroutineStack::ThreadOnCpu)
        }
        _ if status == layout::G_SYSCALL && field_u64(g, layout.syscall_pc) != 0 => {
            (vec![field_u64(g, layout.syscall_pc)], false, GoroutineStack::SyscallPc)
        }
        _ => (Vec::new(), false, GoroutineStack::None),
    }
}

/// Frames from `pc` by the frame-pointer chain from `bp`, every frame inside the goroutine's
/// stack `[lo, hi)` and above the last: `[pc, [bp+8], [[bp]+8], …]`, at most [`MAX_FRAMES`].
fn frame_pointer_walk(
    remote: &Remote,
    (lo, hi): (u64, u64),
    pc: u64,
    sp: u64,
    mut bp: u64,
    mut window: StackWindow,
) -> (Vec<u64>, bool) {
    let mut frames = Vec::with_capacity(8);
    if pc == 0 {
        return (frames, false);
    }
    frames.push(pc);
    let mut floor = sp.max(lo);
    while bp >= floor && bp.saturating_add(16) <= hi && bp.is_multiple_of(8) {
        let (Some(next), Some(ret)) = (window.u64(remote, bp), window.u64(remote, bp + 8)) else { break };
        if ret == 0 {
            break;
        }
        if frames.len() == MAX_FRAMES {
            return (frames, true);
        }
        frames.push(ret);
        floor = bp + 16;
        bp = next;
    }
    (frames, false)
}

/// Frames from registers taken anywhere in a function (an interrupt), not at a call: a Go
/// leaf function with no frame of its own keeps its caller's frame pointer, and its return
/// address at `[sp]`. When `bp` does not point into the stack above `sp` (so no frame of this
/// goroutine is there: the goroutine's first function keeps the 0 it started with), `[sp]`
/// is taken as the return address if it is inside a function of the executable (the case a
/// frame-pointer walk cannot see otherwise; a frameless leaf whose caller has a frame loses
/// that caller, as the kernel's frame-pointer walk does).
fn interrupted_walk(
    remote: &Remote,
    bounds: (u64, u64),
    pc: u64,
    sp: u64,
    bp: u64,
    is_code: &dyn Fn(u64) -> bool,
) -> (Vec<u64>, bool) {
    if (sp..bounds.1).contains(&bp) {
        return frame_pointer_walk(remote, bounds, pc, sp, bp, StackWindow::empty(bounds.1));
    }
    match remote.u64(sp) {
        Ok(ret) if is_code(ret) => {
            let window = StackWindow::empty(bounds.1);
            let (mut rest, truncated) = frame_pointer_walk(remote, bounds, ret, sp + 8, bp, window);
            rest.insert(0, pc);
            rest.truncate(MAX_FRAMES);
            (rest, truncated)
        }
        _ => (vec![pc], false),
    }
}

/// A goroutine's stack, read a window at a time.
struct StackWindow {
    base: u64,
    bytes: Vec<u8>,
    hi: u64,
}

impl StackWindow {
    /// A window with nothing read yet, of a stack ending at `hi`.
    fn empty(hi: u64) -> StackWindow {
        StackWindow { base: 0, bytes: Vec::new(), hi }
    }

    fn u64(&mut self, remote: &Remote, at: u64) -> Option<u64> {
        if at < self.base || at + 8 > self.base + self.bytes.len() as u64 {
            let len = STACK_WINDOW.min(self.hi.checked_sub(at)?);
            self.bytes = remote.bytes(at, len as usize).ok()?;
            self.base = at;
        }
        Some(field_u64(&self.bytes, at - self.base))
    }
}

/// `CLOCK_MONOTONIC` in nanoseconds: Go's `nanotime`, which `g.waitsince` is in.
fn monotonic_ns() -> i64 {
    let mut now = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `now` is a valid timespec to write.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut now) };
    now.tv_sec * 1_000_000_000 + now.tv_nsec
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::Pid;

    #[test]
    fn a_frame_pointer_chain_is_followed_inside_the_stack_and_upwards_only() {
        // A fake stack: three frames, each [saved bp, return address], the last bp 0.
        let mut stack = vec![0u64; 64];
        let base = stack.as_ptr() as u64;
        let slot = |i: usize| base + 8 * i as u64;
        stack[4] = slot(10);
        stack[5] = 0x1111;
        stack[10] = slot(20);
        stack[11] = 0x2222;
        stack[20] = 0;
        stack[21] = 0x3333;
        let me = Remote { pid: Pid(std::process::id()) };
        let hi = base + 64 * 8;
        let (frames, truncated) = frame_pointer_walk(&me, (base, hi), 0x9999, slot(2), slot(4), StackWindow::empty(hi));
        assert_eq!(frames, [0x9999, 0x1111, 0x2222, 0x3333]);
        assert!(!truncated);
        // A chain that points downwards (a loop) stops.
        stack[10] = slot(4);
        let (frames, _) = frame_pointer_walk(&me, (base, hi), 0x9999, slot(2), slot(4), StackWindow::empty(hi));
        assert_eq!(frames, [0x9999, 0x1111, 0x2222]);
        // A frame pointer outside the goroutine's stack is not followed.
        let (frames, _) =
            frame_pointer_walk(&me, (base, slot(8)), 0x9999, slot(2), slot(10), StackWindow::empty(slot(8)));
        assert_eq!(frames, [0x9999]);
        drop(stack);
    }

    #[test]
    fn a_frameless_leaf_interrupted_returns_to_the_word_at_sp() {
        // The goroutine's first function, frameless: bp is the 0 it started with.
        let stack = [0x7777u64, 0, 0];
        let base = stack.as_ptr() as u64;
        let me = Remote { pid: Pid(std::process::id()) };
        let code = |pc: u64| pc == 0x7777;
        let (frames, _) = interrupted_walk(&me, (base, base + 24), 0x9999, base, 0, &code);
        assert_eq!(frames, [0x9999, 0x7777]);
        let (frames, _) = interrupted_walk(&me, (base, base + 24), 0x9999, base, 0, &|_| false);
        assert_eq!(frames, [0x9999], "a word that is no code address is not a frame");
    }

    #[test]
    fn states_read_as_go_prints_them() {
        let l: Vec<String> = layout::V1_19.wait_reasons.iter().map(|s| s.to_string()).collect();
        let l = &l;
        assert_eq!(state(l, layout::G_WAITING, 14), "chan receive");
        assert_eq!(state(l, layout::G_WAITING, 19), "sleep");
        assert_eq!(state(l, layout::G_WAITING, 18), "semacquire");
        assert_eq!(state(l, layout::G_WAITING, 0), "waiting");
        assert_eq!(state(l, layout::G_WAITING, 200), "unknown wait reason");
        assert_eq!(state(l, layout::G_RUNNING, 0), "running");
        assert_eq!(state(l, 1, 14), "runnable", "a reason left over from an earlier wait is not shown");
    }
}
