//! The interpreter's threads and their frame chains: `_PyRuntime.interpreters.head`, its
//! `threads.head` list, each thread state's native thread id and current frame, then the
//! `previous` links, leaf first. Yields [`InterpretedFrame`]s (code object, instruction
//! offset, entry mark); naming them is [`super::code`]'s.
//!
//! Only the main interpreter is read (subinterpreters are rare, and their lists are more
//! of the same). Every list is capped, so a corrupt or moving chain ends the walk rather
//! than loops it.

use profiler_common::{FrameKind, InterpretedFrame};

use super::{
    detect::Interpreter,
    memory::{field_u64, field_u8, Remote},
    offsets::{CurrentFrame, EntryMark, FRAME_READ_BYTES},
    ReadFailure,
};

/// Thread states read at most.
const MAX_THREADS: usize = 4096;

/// Frames read per thread at most.
pub const MAX_FRAMES: usize = 1024;

/// Frames read per dump at most, over all threads: a process that controls its own thread
/// count and recursion depth must not make one dump read millions of objects.
pub const MAX_FRAMES_PER_DUMP: usize = 65_536;

/// `FRAME_OWNED_BY_GENERATOR`: a generator's frame is complete even before its first
/// instruction.
const FRAME_OWNED_BY_GENERATOR: u8 = 1;

/// One thread state's frames.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PyThread {
    /// The kernel's id of the thread (`native_thread_id`).
    pub tid: u32,
    /// Leaf first.
    pub frames: Vec<InterpretedFrame>,
    /// The chain was longer than [`MAX_FRAMES`], or the dump's [`MAX_FRAMES_PER_DUMP`] ran
    /// out: its outermost frames are missing.
    pub truncated: bool,
}

/// Every thread state of the main interpreter with its frames.
pub fn threads(remote: &Remote, interp: &Interpreter) -> Result<Vec<PyThread>, ReadFailure> {
    let o = &interp.offsets;
    let head = remote.u64(interp.runtime + o.runtime_interpreters_head)?;
    if head == 0 {
        return Ok(Vec::new()); // not initialized yet, or finalized
    }
    let mut tstate = remote.u64(head + o.interp_threads_head)?;
    let mut threads = Vec::new();
    let mut budget = MAX_FRAMES_PER_DUMP;
    while tstate != 0 && threads.len() < MAX_THREADS {
        let tid = remote.u64(tstate + o.thread_native_id)? as u32;
        let frame = match o.current_frame {
            CurrentFrame::ViaCFrame { cframe, current_frame } => match remote.u64(tstate + cframe)? {
                0 => 0,
                cframe => remote.u64(cframe + current_frame)?,
            },
            CurrentFrame::Direct(offset) => remote.u64(tstate + offset)?,
        };
        let (frames, truncated) = chain(remote, interp, frame, &mut budget)?;
        threads.push(PyThread { tid, frames, truncated });
        tstate = remote.u64(tstate + o.thread_next)?;
    }
    Ok(threads)
}

/// The frames from `frame` outwards. A frame the interpreter's own tracebacks skip is
/// skipped too: shims owned by the C stack (3.12+: they mark where an activation of the
/// interpreter loop began) and incomplete frames (their first instruction not reached).
fn chain(
    remote: &Remote,
    interp: &Interpreter,
    mut frame: u64,
    budget: &mut usize,
) -> Result<(Vec<InterpretedFrame>, bool), ReadFailure> {
    let o = &interp.offsets;
    let mut frames: Vec<InterpretedFrame> = Vec::new();
    let mut buf = [0u8; FRAME_READ_BYTES];
    while frame != 0 {
        if frames.len() == MAX_FRAMES || *budget == 0 {
            return Ok((frames, true));
        }
        *budget -= 1;
        remote.read(frame, &mut buf)?;
        let owner = field_u8(&buf, o.frame_owner);
        let code = field_u64(&buf, o.frame_code);
        let instr = field_u64(&buf, o.frame_instr);
        frame = field_u64(&buf, o.frame_previous);
        let entry = match o.entry {
            EntryMark::CStackOwner(cstack) if owner == cstack => {
                // The shim below an activation's first frame: that frame is its entry.
                if let Some(last) = frames.last_mut() {
                    last.flags |= InterpretedFrame::ENTRY;
                }
                continue;
            }
            EntryMark::IsEntry(offset) => field_u8(&buf, offset) != 0,
            EntryMark::CStackOwner(_) => false,
        };
        let first = code.wrapping_add(o.code_adaptive);
        if code == 0 || (instr < first && owner != FRAME_OWNED_BY_GENERATOR) {
            continue;
        }
        let instr_offset = u32::try_from(instr.saturating_sub(first) / 2).unwrap_or(u32::MAX);
        frames.push(InterpretedFrame {
            code_object: code,
            instr_offset,
            kind: FrameKind::Python as u8,
            flags: if entry { InterpretedFrame::ENTRY } else { 0 },
            _pad: [0; 2],
        });
    }
    // The outermost frame began an activation, whether or not a shim follows it.
    if let Some(last) = frames.last_mut() {
        last.flags |= InterpretedFrame::ENTRY;
    }
    Ok((frames, false))
}
