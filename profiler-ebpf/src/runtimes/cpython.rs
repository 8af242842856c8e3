//! CPython frames in user stacks: after the native walk of a thread of a process listed in
//! `PYTHON_PROCESSES`, find the thread's `PyThreadState` (the main interpreter's thread list,
//! by `native_thread_id`), then follow its `_PyInterpreterFrame` chain from the current frame
//! outwards, appending one word per Python frame (code object, instruction offset, entry
//! mark: `profiler_common::frame::interpreted_word`) to the stack. Userspace names the code
//! objects and puts each activation's frames in place of its `_PyEval_EvalFrameDefault`.
//!
//! Frames the interpreter's own tracebacks skip are skipped: 3.12+'s shim frames owned by the
//! C stack (they mark where an activation of the loop began: the frame before one is its
//! entry) and incomplete frames. The walk is one `bpf_loop` callback, a small state machine
//! (start, thread search, frames), so the cost is linear in threads searched and frames
//! walked, the verifier checks one step, and the walking programs' code after it is
//! verified once rather than once per way the walk can end.
//!
//! The walk runs in the sampled thread's own context, so its chain holds still; other
//! threads may change the thread list meanwhile, and a read that fails there ends the walk
//! and is counted. What the words point at is checked in userspace (a code object's type),
//! never trusted.

#![allow(non_upper_case_globals)]

use core::{ffi::c_void, ptr};

use aya_ebpf::{
    bindings::bpf_pidns_info,
    helpers::{
        bpf_get_current_pid_tgid, bpf_probe_read_user,
        generated::{bpf_get_ns_current_pid_tgid, bpf_loop},
    },
    macros::map,
    maps::{HashMap, PerCpuArray},
};
use profiler_common::{
    frame::{interpreted_word, word_entry},
    runtimes::cpython::{
        maps::PYTHON_PROCESSES_MAX_ENTRIES, PythonCounter, PythonProcess, PYTHON_FRAME_READ_BYTES, PYTHON_NO_CFRAME,
        PYTHON_NO_CSTACK_OWNER, PYTHON_NO_IS_ENTRY, PYTHON_OWNED_BY_GENERATOR,
    },
    FrameKind, MAX_USER_STACK_DEPTH,
};

use crate::{
    maps::{bump, SCRATCH_SLOTS},
    walk_state::push_to_walk,
};

#[map]
pub static PYTHON_PROCESSES: HashMap<u32, PythonProcess> = HashMap::with_max_entries(PYTHON_PROCESSES_MAX_ENTRIES, 0);

#[map]
pub static PYTHON_COUNTERS: PerCpuArray<u64> = PerCpuArray::with_max_entries(PythonCounter::COUNT, 0);

#[map]
pub static PYTHON_STATE: PerCpuArray<PythonWalk> = PerCpuArray::with_max_entries(SCRATCH_SLOTS, 0);

/// Thread states searched for the current thread at most: the list is newest first, and a
/// process with more Python threads than this has its oldest ones walked natively only
/// (counted as [`PythonCounter::NoThreadState`]).
const MAX_THREADS: u32 = 256;

/// Steps of the walk: the start, the thread search, the frames.
const MAX_STEPS: u32 = 1 + MAX_THREADS + MAX_USER_STACK_DEPTH as u32;

const FRAME_WORDS: usize = PYTHON_FRAME_READ_BYTES / 8;

/// Where the walk is.
const START: u32 = 0;
const SEARCH: u32 = 1;
const FRAMES: u32 = 2;

/// The walk's state, in a per-CPU map (the `bpf_loop` callback and its caller share it).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct PythonWalk {
    process: PythonProcess,
    /// The thread being walked (the kernel's id, as `native_thread_id` holds it).
    tid: u64,
    /// During the search: the next thread state to look at.
    tstate: u64,
    /// The next frame to read; 0 at the end of the chain.
    frame: u64,
    /// The last frame's word, held back until the next frame says whether it is an entry.
    pending: u64,
    tgid: u32,
    /// [`START`], [`SEARCH`] or [`FRAMES`].
    phase: u32,
    /// The frame being looked at.
    buf: [u64; FRAME_WORDS],
}

#[inline(always)]
fn count(counter: PythonCounter) {
    bump(&PYTHON_COUNTERS, counter as u32);
}

#[inline(always)]
fn read_u64(addr: u64) -> Option<u64> {
    // SAFETY: a fault-safe read of user memory.
    unsafe { bpf_probe_read_user(addr as *const u64) }.ok()
}

/// The pointer-sized field at byte `offset` of the frame read (offsets of pointers are
/// 8-aligned; userspace checks them).
#[inline(always)]
fn word_at(buf: &[u64; FRAME_WORDS], offset: u16) -> u64 {
    // The compiler folds the bound into the byte offset, whose masked range the verifier
    // cannot narrow; a volatile read of the index keeps the check on the index itself.
    let index = offset as usize / 8;
    // SAFETY: a read of a local.
    let index = unsafe { ptr::read_volatile(&index) };
    buf.get(index).copied().unwrap_or(0)
}

/// The byte at `offset` of the frame read.
#[inline(always)]
fn byte_at(buf: &[u64; FRAME_WORDS], offset: u16) -> u8 {
    (word_at(buf, offset) >> ((offset as u64 & 7) * 8)) as u8
}

/// Drops process `tgid`'s interpreter at its exec: the new image is another program, whose
/// interpreter, if any, userspace registers anew.
#[inline(always)]
pub fn forget(tgid: u32) {
    // SAFETY: only checks for presence.
    if unsafe { PYTHON_PROCESSES.get(&tgid) }.is_some() {
        let _ = PYTHON_PROCESSES.remove(&tgid);
    }
}

/// Appends the Python frames of the current thread, if process `tgid` is a registered
/// CPython one, to the user stack being walked in scratch slot `slot`. The whole walk is one
/// `bpf_loop`: the caller's code after it is verified once, not once per way the walk can
/// end.
#[inline(always)]
pub fn walk(slot: u32, tgid: u32) {
    // Most processes are not Python: the walker calls this only when the process's unwind
    // entry may have an interpreter (or it has none), and one lookup, not a loop, tells them
    // apart. `start` looks the process up again inside the loop and copies what it needs.
    // SAFETY: only checks for presence.
    if unsafe { PYTHON_PROCESSES.get(&tgid) }.is_none() {
        return;
    }
    let Some(state) = PYTHON_STATE.get_ptr_mut(slot) else { return };
    // SAFETY: this CPU's entry for the caller's context (see `maps::Scratch`).
    unsafe {
        (*state).tgid = tgid;
        (*state).phase = START;
    }
    let ctx = (&slot as *const u32).cast_mut().cast();
    // SAFETY: the callback is a static function of this object; its context is `slot`, on
    // this stack for the whole loop.
    unsafe { bpf_loop(MAX_STEPS, step as *mut c_void, ctx, 0) };
}

/// One step of the walk: 1 stops, 0 goes on.
#[inline(never)]
extern "C" fn step(index: u64, ctx: *mut c_void) -> i64 {
    // SAFETY: `walk` passes a pointer to a `u32` on its stack.
    let slot = unsafe { *(ctx as *const u32) };
    let Some(state) = PYTHON_STATE.get_ptr_mut(slot) else { return 1 };
    // SAFETY: this CPU's entry, see `walk`.
    let state = unsafe { &mut *state };
    let go_on = match state.phase {
        START => start(state),
        SEARCH => search(state),
        _ => frame(state, slot),
    };
    if !go_on {
        return 1;
    }
    if index + 1 == MAX_STEPS as u64 && state.phase == FRAMES {
        // Out of steps with frames left: keep the frame read, as a cut chain's last.
        flush(state, slot, false);
    }
    0
}

/// Looks the process up and reads the head of its thread list.
#[inline(always)]
fn start(state: &mut PythonWalk) -> bool {
    // SAFETY: a copy is taken at once.
    let Some(process) = (unsafe { PYTHON_PROCESSES.get(&state.tgid) }) else { return false };
    count(PythonCounter::Walks);
    state.process = *process;
    let Some(tid) = thread_id(process) else {
        count(PythonCounter::NoThreadState);
        return false;
    };
    state.tid = tid;
    // Volatile: two zero stores side by side compile to a call of a byte-at-a-time `memset`.
    // SAFETY: plain writes to this CPU's walk state.
    unsafe {
        ptr::write_volatile(&mut state.frame, 0);
        ptr::write_volatile(&mut state.pending, 0);
    }
    let Some(interp) = read_u64(process.interpreters_head) else {
        count(PythonCounter::BadRead);
        return false;
    };
    if interp == 0 {
        return false; // not initialized yet, or finalized
    }
    let Some(tstate) = read_u64(interp + process.interp_threads_head as u64) else {
        count(PythonCounter::BadRead);
        return false;
    };
    state.tstate = tstate;
    state.phase = SEARCH;
    true
}

/// The current thread's id as the interpreter knows it (`native_thread_id`: its id in the
/// process's own pid namespace); `None` if the kernel cannot say.
#[inline(always)]
fn thread_id(process: &PythonProcess) -> Option<u64> {
    if process.pidns_ino == 0 {
        return Some(bpf_get_current_pid_tgid() & 0xffff_ffff);
    }
    let mut ns = bpf_pidns_info { pid: 0, tgid: 0 };
    let size = core::mem::size_of::<bpf_pidns_info>() as u32;
    // SAFETY: `ns` is a writable struct of `size` bytes on this program's stack.
    let found = unsafe { bpf_get_ns_current_pid_tgid(process.pidns_dev, process.pidns_ino, &mut ns, size) };
    (found == 0).then_some(u64::from(ns.pid))
}

/// One thread state of the search. A state of the thread with no current frame is passed
/// over: while a thread starts another, CPython links the new thread's state (3.11: marked
/// with the creator's id until the new thread runs) at the head of the list.
#[inline(always)]
fn search(state: &mut PythonWalk) -> bool {
    let tstate = state.tstate;
    if tstate == 0 {
        count(PythonCounter::NoThreadState);
        return false;
    }
    let p = &state.process;
    let Some(tid) = read_u64(tstate + p.thread_native_id as u64) else {
        count(PythonCounter::BadRead);
        return false;
    };
    if tid & 0xffff_ffff == state.tid {
        let frame = if p.thread_cframe == PYTHON_NO_CFRAME {
            read_u64(tstate + p.current_frame as u64)
        } else {
            match read_u64(tstate + p.thread_cframe as u64) {
                Some(0) => Some(0),
                Some(cframe) => read_u64(cframe + p.current_frame as u64),
                None => None,
            }
        };
        match frame {
            Some(0) => {}
            Some(frame) => {
                state.frame = frame;
                state.phase = FRAMES;
                return true;
            }
            None => {
                count(PythonCounter::BadRead);
                return false;
            }
        }
    }
    let Some(next) = read_u64(tstate + p.thread_next as u64) else {
        count(PythonCounter::BadRead);
        return false;
    };
    state.tstate = next;
    true
}

/// One frame of the chain.
#[inline(always)]
fn frame(state: &mut PythonWalk, slot: u32) -> bool {
    let frame = state.frame;
    if frame == 0 {
        // The outermost frame began an activation, whether or not a shim follows it.
        flush(state, slot, true);
        return false;
    }
    // SAFETY: a fault-safe read of user memory into map memory of that size.
    let read = unsafe {
        aya_ebpf::helpers::generated::bpf_probe_read_user(
            state.buf.as_mut_ptr().cast(),
            PYTHON_FRAME_READ_BYTES as u32,
            frame as *const c_void,
        )
    };
    if read != 0 {
        count(PythonCounter::BadRead);
        flush(state, slot, false);
        return false;
    }
    let p = state.process;
    let owner = byte_at(&state.buf, p.frame_owner);
    let code = word_at(&state.buf, p.frame_code);
    let instr = word_at(&state.buf, p.frame_instr);
    state.frame = word_at(&state.buf, p.frame_previous);
    if p.cstack_owner != PYTHON_NO_CSTACK_OWNER && owner == p.cstack_owner {
        // The shim below an activation's first frame: that frame is its entry.
        if state.pending != 0 {
            state.pending = word_entry(state.pending);
        }
        return true;
    }
    let first = code.wrapping_add(p.code_adaptive as u64);
    if code == 0 || (instr < first && owner != PYTHON_OWNED_BY_GENERATOR) {
        return true; // incomplete: its first instruction not reached
    }
    let entry = p.frame_is_entry != PYTHON_NO_IS_ENTRY && byte_at(&state.buf, p.frame_is_entry) != 0;
    let Some(word) = interpreted_word(FrameKind::Python, code, instr.saturating_sub(first) / 2, entry) else {
        count(PythonCounter::BadCode);
        return true;
    };
    let pending = state.pending;
    state.pending = word;
    if pending != 0 {
        if !push_to_walk(slot, pending) {
            count(PythonCounter::Truncated);
            state.pending = 0;
            return false;
        }
        count(PythonCounter::Frames);
    }
    true
}

/// Pushes the frame held back, marked as an entry if `outermost`.
#[inline(always)]
fn flush(state: &mut PythonWalk, slot: u32, outermost: bool) {
    let pending = state.pending;
    state.pending = 0;
    if pending == 0 {
        return;
    }
    let word = if outermost { word_entry(pending) } else { pending };
    if push_to_walk(slot, word) {
        count(PythonCounter::Frames);
    } else {
        count(PythonCounter::Truncated);
    }
}
