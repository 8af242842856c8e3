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
