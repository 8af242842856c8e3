//! Where CPython keeps what the reader needs, per minor version (x86_64, default build, not
//! free-threaded).
//!
//! 3.13 describes itself: `_PyRuntime` starts with `_Py_DebugOffsets` (cookie `xdebugpy`),
//! which [`Offsets::from_debug_offsets`] reads. 3.11 and 3.12 do not, so their offsets are
//! constants here, taken from the interpreters' own debug info (`gdb -batch -ex 'print
//! &((PyThreadState*)0)->native_thread_id' libpython3.12.so`) and checked end to end by the
//! thread-dump tests, which run a fixture under each version and find its functions, files
//! and lines (`tests/tests/python.rs`).

use super::memory::{field_u64, Remote};
use super::ReadFailure;

/// How a thread state leads to its current frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CurrentFrame {
    /// 3.11, 3.12: `tstate->cframe->current_frame`.
    ViaCFrame { cframe: u64, current_frame: u64 },
    /// 3.13: `tstate->current_frame`.
    Direct(u64),
}

/// How the reader tells the frames one interpreter-loop activation runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EntryMark {
    /// 3.11: the activation's first frame has `is_entry` set (a `bool` at this offset).
    IsEntry(u64),
    /// 3.12+: each activation pushes a shim frame owned by the C stack
    /// (`FRAME_OWNED_BY_CSTACK`) below its first frame.
    CStackOwner(u8),
}

/// Byte offsets of the fields read, by structure.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Offsets {
    /// `_PyRuntimeState.interpreters.head`.
    pub runtime_interpreters_head: u64,
    /// `PyInterpreterState.threads.head`.
    pub interp_threads_head: u64,
    /// `PyThreadState.next`.
    pub thread_next: u64,
    /// `PyThreadState.native_thread_id` (an `unsigned long`: the kernel's tid).
    pub thread_native_id: u64,
    pub current_frame: CurrentFrame,
    /// `_PyInterpreterFrame.previous`.
    pub frame_previous: u64,
    /// `f_code` (3.11, 3.12) or `f_executable` (3.13).
    pub frame_code: u64,
    /// `prev_instr` (3.11, 3.12: the instruction being executed) or `instr_ptr` (3.13).
    pub frame_instr: u64,
    /// `owner` (a `char`).
    pub frame_owner: u64,
    pub entry: EntryMark,
    pub code_filename: u64,
    pub code_qualname: u64,
    pub code_linetable: u64,
    /// `co_firstlineno` (an `int`).
    pub code_firstlineno: u64,
    /// `co_code_adaptive`: the instructions, inline in the code object.
    pub code_adaptive: u64,
    /// `PyBytesObject.ob_size`, `ob_sval`.
    pub bytes_size: u64,
    pub bytes_data: u64,
    /// `PyASCIIObject.length`, `.state` (a bit field: kind at bits 2-4, compact 5, ascii 6).
    pub unicode_length: u64,
    pub unicode_state: u64,
    /// `sizeof(PyASCIIObject)`: a compact ASCII string's characters follow it.
    pub unicode_ascii_size: u64,
    /// `sizeof(PyCompactUnicodeObject)`: a compact non-ASCII string's characters follow it.
    pub unicode_compact_size: u64,
}

/// `PyObject.ob_type`, the same in every version.
pub const OBJECT_TYPE: u64 = 8;

/// Bytes of a frame read at once: every field above lies within it.
pub const FRAME_READ_BYTES: usize = 0x50;

/// Bytes of a code object's header read at once (up to `co_code_adaptive`).
pub const CODE_READ_BYTES: usize = 0xd0;

/// 3.11 (checked against 3.11.7 and Debian's 3.11.2).
pub const V3_11: Offsets = Offsets {
    runtime_interpreters_head: 0x28,
    interp_threads_head: 0x10,
    thread_next: 0x8,
    thread_native_id: 0xa0,
    current_frame: CurrentFrame::ViaCFrame { cframe: 0x38, current_frame: 0x8 },
    frame_previous: 0x30,
    frame_code: 0x20,
    frame_instr: 0x38,
    frame_owner: 0x45,
    entry: EntryMark::IsEntry(0x44),
    code_filename: 0x70,
    code_qualname: 0x80,
    code_linetable: 0x88,
    code_firstlineno: 0x48,
    code_adaptive: 0xb8,
    bytes_size: 0x10,
    bytes_data: 0x20,
    unicode_length: 0x10,
    unicode_state: 0x20,
    unicode_ascii_size: 48,
    unicode_compact_size: 72,
};

/// 3.12 (checked against 3.12.1).
pub const V3_12: Offsets = Offsets {
    runtime_interpreters_head: 0x28,
    interp_threads_head: 0x48,
    thread_next: 0x8,
    thread_native_id: 0x90,
    current_frame: CurrentFrame::ViaCFrame { cframe: 0x38, current_frame: 0x0 },
    frame_previous: 0x8,
    frame_code: 0x0,
    frame_instr: 0x38,
    frame_owner: 0x46,
    entry: EntryMark::CStackOwner(FRAME_OWNED_BY_CSTACK),
    code_filename: 0x70,
    code_qualname: 0x80,
    code_linetable: 0x88,
    code_firstlineno: 0x44,
    code_adaptive: 0xc0,
    bytes_size: 0x10,
    bytes_data: 0x20,
    unicode_length: 0x10,
    unicode_state: 0x20,
    unicode_ascii_size: 40,
    unicode_compact_size: 56,
};

/// `FRAME_OWNED_BY_CSTACK` (3.12, 3.13).
const FRAME_OWNED_BY_CSTACK: u8 = 3;

/// `_Py_DebugOffsets`'s cookie.
const DEBUG_COOKIE: &[u8; 8] = b"xdebugpy";

/// Bytes of `_Py_DebugOffsets` read (3.13.0's size; the fields read lie below 0x240).
const DEBUG_OFFSETS_BYTES: usize = 584;

impl Offsets {
    /// The offsets 3.13 publishes at the start of `_PyRuntime` (at `runtime`), after
    /// checking the cookie, that the version is 3.13 and that the build is not
    /// free-threaded (whose objects have another header).
    pub fn from_debug_offsets(remote: &Remote, runtime: u64) -> Result<Offsets, ReadFailure> {
        let d = remote.bytes(runtime, DEBUG_OFFSETS_BYTES)?;
        if &d[..8] != DEBUG_COOKIE {
            return Err(ReadFailure::Layout(format!("no _Py_DebugOffsets cookie at _PyRuntime ({runtime:#x})")));
        }
        let version = field_u64(&d, 8);
        if version >> 16 != 0x030d {
            return Err(ReadFailure::Layout(format!("_Py_DebugOffsets of version {version:#x}, not 3.13")));
        }
        if field_u64(&d, 16) != 0 {
            return Err(ReadFailure::Layout("a free-threaded build (its objects differ): not supported".into()));
        }
        let at = |offset: u64| field_u64(&d, offset);
        let ascii_size = at(560);
        Ok(Offsets {
            runtime_interpreters_head: at(40),
            interp_threads_head: at(72),
            thread_next: at(168),
            thread_native_id: at(200),
            current_frame: CurrentFrame::Direct(at(184)),
            frame_previous: at(232),
            frame_code: at(240),
            frame_instr: at(248),
            frame_owner: at(264),
            entry: EntryMark::CStackOwner(FRAME_OWNED_BY_CSTACK),
            code_filename: at(280),
            code_qualname: at(296),
            code_linetable: at(304),
            code_firstlineno: at(312),
            code_adaptive: at(344),
            bytes_size: at(520),
            bytes_data: at(528),
            unicode_length: at(552),
            unicode_state: at(544),
            unicode_ascii_size: ascii_size,
            // PyCompactUnicodeObject adds utf8_length and utf8 to PyASCIIObject.
            unicode_compact_size: ascii_size + 16,
        })
        .and_then(Offsets::checked)
    }

    /// Refuses offsets that would read outside the fixed-size reads above (a corrupt or
    /// unexpected `_Py_DebugOffsets`).
    fn checked(self) -> Result<Offsets, ReadFailure> {
        let frame = [self.frame_previous, self.frame_code, self.frame_instr, self.frame_owner];
        let code = [self.code_filename, self.code_qualname, self.code_linetable, self.code_firstlineno];
        let fits = frame.iter().all(|&o| o + 8 <= FRAME_READ_BYTES as u64)
            && code.iter().all(|&o| o + 8 <= CODE_READ_BYTES as u64)
            && self.code_adaptive <= 0x1000
            && self.unicode_compact_size <= 0x100;
        if fits {
            Ok(self)
        } else {
            Err(ReadFailure::Layout(format!("_Py_DebugOffsets out of the expected ranges: {self:?}")))
        }
    }
}
