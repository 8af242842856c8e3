//! The kind of a stack frame, and the record of an interpreted one: what a walk of an
//! interpreter's own frame chain yields per frame, before it is named.
//!
//! A native frame is an address; an interpreted frame is the interpreter's object for the
//! function (CPython's code object) and where in it the frame is (the instruction offset).
//! Today only the thread dump's userspace reader of CPython frames produces
//! [`InterpretedFrame`]s; the kernel walker for CPU samples is meant to emit the same record
//! (hence its place in the ABI crate, `repr(C)` and size-asserted), and a later runtime adds
//! a [`FrameKind`], not a new layout.

/// What a frame is.
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FrameKind {
    /// A machine address: an instruction pointer or a return address.
    Native = 0,
    /// A CPython `_PyInterpreterFrame`: a code object and an instruction offset.
    Python = 1,
}

/// One interpreted frame, as walked from the interpreter's frame chain.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct InterpretedFrame {
    /// The function's object in the process (CPython: the `PyCodeObject`'s address).
    pub code_object: u64,
    /// Offset of the current instruction in the function's code, in code units (CPython:
    /// 2-byte `_Py_CODEUNIT`s from `co_code_adaptive`).
    pub instr_offset: u32,
    /// [`FrameKind`] as its `u8`.
    pub kind: u8,
    /// [`InterpretedFrame::ENTRY`] and future flags.
    pub flags: u8,
    pub _pad: [u8; 2],
}

const _: () = assert!(core::mem::size_of::<InterpretedFrame>() == 16);

impl InterpretedFrame {
    /// The outermost frame run by one native activation of the interpreter loop (CPython's
    /// `_PyEval_EvalFrameDefault`): the loop runs this frame and every frame called from it
    /// up to the next one so marked, so the native stack's loop frames and these runs pair
    /// up in order.
    pub const ENTRY: u8 = 1;

    /// Whether [`Self::ENTRY`] is set.
    pub fn is_entry(&self) -> bool {
        self.flags & Self::ENTRY != 0
    }
}

#[cfg(feature = "user")]
// SAFETY: repr(C), only integers, padding explicit (size asserted above).
unsafe impl aya::Pod for InterpretedFrame {}

/// A Python frame as the kernel walker stores it in a user stack: one word, after the
/// native frames (leaf first among themselves), told from an address by its top bits (user
/// addresses are below 2^47, kernel ones have the top bits all set). Bits: 63..61
/// [`PYTHON_WORD_TAG`], 60 [`InterpretedFrame::ENTRY`], 59..44 the instruction offset
/// (code units, capped at [`PYTHON_MAX_INSTR_OFFSET`]), 43..0 the code object's address
/// over 8 (code objects are 8-byte aligned user memory).
pub const PYTHON_WORD_TAG: u64 = 0b110 << 61;
const WORD_TAG_MASK: u64 = 0b111 << 61;
const WORD_ENTRY: u64 = 1 << 60;
const WORD_OFFSET_SHIFT: u32 = 44;
/// The largest instruction offset a word holds: a frame further into a huge function is
/// named at this offset's line.
pub const PYTHON_MAX_INSTR_OFFSET: u32 = 0xffff;
const WORD_CODE_MASK: u64 = (1 << WORD_OFFSET_SHIFT) - 1;

/// The word for a Python frame; `None` when `code_object` cannot be a code object (not
/// 8-byte aligned, or not a user address).
#[inline(always)]
pub fn python_word(code_object: u64, instr_offset: u64, entry: bool) -> Option<u64> {
    if code_object & 7 != 0 || code_object == 0 || code_object >> 47 != 0 {
        return None;
    }
    let offset =
        if instr_offset > PYTHON_MAX_INSTR_OFFSET as u64 { PYTHON_MAX_INSTR_OFFSET as u64 } else { instr_offset };
    Some(PYTHON_WORD_TAG | (entry as u64) << 60 | offset << WORD_OFFSET_SHIFT | code_object >> 3)
}

/// Marks a Python word as its activation's entry frame (see [`InterpretedFrame::ENTRY`]).
#[inline(always)]
pub const fn python_word_entry(word: u64) -> u64 {
    word | WORD_ENTRY
}

/// Whether a user-stack word is a Python frame rather than an address.
#[inline(always)]
pub const fn is_python_word(word: u64) -> bool {
    word & WORD_TAG_MASK == PYTHON_WORD_TAG
}

/// The frame a Python word stands for; `None` for an address.
pub fn decode_python_word(word: u64) -> Option<InterpretedFrame> {
    if !is_python_word(word) {
        return None;
    }
    Some(InterpretedFrame {
        code_object: (word & WORD_CODE_MASK) << 3,
        instr_offset: ((word >> WORD_OFFSET_SHIFT) & PYTHON_MAX_INSTR_OFFSET as u64) as u32,
        kind: FrameKind::Python as u8,
        flags: if word & WORD_ENTRY != 0 { InterpretedFrame::ENTRY } else { 0 },
        _pad: [0; 2],
    })
}

/// [`PythonProcess::thread_cframe`] when the thread state holds the current frame itself
/// (3.13), with no `_PyCFrame` in between.
pub const PYTHON_NO_CFRAME: u16 = u16::MAX;
/// [`PythonProcess::frame_is_entry`] when frames have no `is_entry` flag (3.12+: the
/// activation's shim frame marks it instead).
pub const PYTHON_NO_IS_ENTRY: u16 = u16::MAX;
/// [`PythonProcess::cstack_owner`] when no frame is a C-stack shim (3.11).
pub const PYTHON_NO_CSTACK_OWNER: u8 = u8::MAX;
/// `FRAME_OWNED_BY_GENERATOR`: a generator's frame is complete before its first instruction.
pub const PYTHON_OWNED_BY_GENERATOR: u8 = 1;
/// Bytes of a `_PyInterpreterFrame` the walker reads at once: every field it needs lies
/// within them (userspace checks the offsets before it registers a process).
pub const PYTHON_FRAME_READ_BYTES: usize = 0x50;

/// What the kernel walker needs to walk a CPython process's frames: where the main
/// interpreter's thread list is, and the structure offsets of its version. Value of
/// `PYTHON_PROCESSES`, by tgid, written by userspace when it registers the process.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PythonProcess {
    /// The address of `_PyRuntime.interpreters.head` (a pointer to the main interpreter).
    pub interpreters_head: u64,
    /// `PyInterpreterState.threads.head`.
    pub interp_threads_head: u16,
    /// `PyThreadState.next`.
    pub thread_next: u16,
    /// `PyThreadState.native_thread_id`: the kernel's tid of the thread.
    pub thread_native_id: u16,
    /// `PyThreadState.cframe` (3.11, 3.12), or [`PYTHON_NO_CFRAME`].
    pub thread_cframe: u16,
    /// `_PyCFrame.current_frame` (3.11, 3.12), or `PyThreadState.current_frame` (3.13).
    pub current_frame: u16,
    /// `_PyInterpreterFrame.previous`.
    pub frame_previous: u16,
    /// `f_code` or `f_executable`.
    pub frame_code: u16,
    /// `prev_instr` or `instr_ptr`.
    pub frame_instr: u16,
    /// `owner` (a byte).
    pub frame_owner: u16,
    /// `is_entry` (a byte, 3.11), or [`PYTHON_NO_IS_ENTRY`].
    pub frame_is_entry: u16,
    /// `PyCodeObject.co_code_adaptive`: where the instructions start.
    pub code_adaptive: u16,
    /// The owner value of an activation's shim frame (3.12+), or [`PYTHON_NO_CSTACK_OWNER`].
    pub cstack_owner: u8,
    pub _pad: u8,
    /// The process's pid namespace (the kernel's `dev_t` and inode of its `ns/pid`) when it
    /// is not the profiler's: `native_thread_id` holds the thread's id there, which the
    /// walker asks the kernel for. 0 and 0: the profiler's own namespace.
    pub pidns_dev: u64,
    pub pidns_ino: u64,
}

const _: () = assert!(core::mem::size_of::<PythonProcess>() == 48);

/// Indices of the `PYTHON_COUNTERS` per-CPU array.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PythonCounter {
    /// Walks of a registered CPython process's frames.
    Walks = 0,
    /// Python frames recorded.
    Frames = 1,
    /// Walks whose thread has no thread state with a current frame in the thread list (not
    /// a Python thread, in no Python code now, or beyond the threads searched).
    NoThreadState = 2,
    /// Walks that stopped at a read of the interpreter's memory that failed.
    BadRead = 3,
    /// Walks cut at the stack's depth limit (the outermost Python frames are missing).
    Truncated = 4,
    /// Frames skipped because their code pointer cannot be a code object.
    BadCode = 5,
}

impl PythonCounter {
    pub const COUNT: u32 = 6;
}

#[cfg(feature = "user")]
// SAFETY: repr(C), only integers, padding explicit (size asserted above).
unsafe impl aya::Pod for PythonProcess {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn python_words_round_trip_and_never_look_like_addresses() {
        let word = python_word(0x7f12_3456_7890, 37, false).unwrap();
        assert!(is_python_word(word));
        let frame = decode_python_word(word).unwrap();
        assert_eq!((frame.code_object, frame.instr_offset, frame.is_entry()), (0x7f12_3456_7890, 37, false));
        assert!(decode_python_word(python_word_entry(word)).unwrap().is_entry());
        let capped = decode_python_word(python_word(0x1000, 1 << 20, true).unwrap()).unwrap();
        assert_eq!((capped.instr_offset, capped.is_entry()), (PYTHON_MAX_INSTR_OFFSET, true));
        for address in [0x40_1000, 0x7fff_ffff_fff8, 0xffff_ffff_8100_0000] {
            assert!(!is_python_word(address), "{address:#x}");
        }
        assert_eq!(python_word(0x1001, 0, false), None, "unaligned");
        assert_eq!(python_word(1 << 47, 0, false), None, "not a user address");
    }
}
