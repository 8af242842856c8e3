//! The kind of a stack frame, and the record of an interpreted one: what a walk of an
//! interpreter's own frame chain yields per frame, before it is named.
//!
//! A native frame is an address; an interpreted frame is the interpreter's object for the
//! function (a code object) and where in it the frame is (the instruction offset). The
//! kernel walkers store an interpreted frame in a user stack as one word tagged with its
//! [`FrameKind`] ([`interpreted_word`]); userspace decodes it to an [`InterpretedFrame`]
//! ([`decode_word`]) and hands it to its runtime to name. [`FrameKind`] is the closed set of
//! runtimes: a new runtime adds a variant and its tag here, and its own structures under
//! [`crate::runtimes`], not a new layout.

/// What a frame is.
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FrameKind {
    /// A machine address: an instruction pointer or a return address.
    Native = 0,
    /// A CPython `_PyInterpreterFrame`: a code object and an instruction offset
    /// ([`crate::runtimes::cpython`]).
    Python = 1,
}

impl FrameKind {
    /// The tag (bits 63..61) of this kind's frame words; 0 for an address.
    const fn word_tag(self) -> u64 {
        match self {
            FrameKind::Native => 0,
            FrameKind::Python => 0b110 << 61,
        }
    }

    /// The kind of a user-stack word: [`FrameKind::Native`] for an address.
    #[inline(always)]
    pub const fn of_word(word: u64) -> FrameKind {
        if word & WORD_TAG_MASK == FrameKind::Python.word_tag() {
            FrameKind::Python
        } else {
            FrameKind::Native
        }
    }
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

/// An interpreted frame as a kernel walker stores it in a user stack: one word, after the
/// native frames (leaf first among themselves), told from an address by its top bits (user
/// addresses are below 2^47, kernel ones have the top bits all set). Bits: 63..61 the
/// [`FrameKind`]'s tag, 60 [`InterpretedFrame::ENTRY`], 59..44 the instruction offset (code
/// units, capped at [`MAX_INSTR_OFFSET`]), 43..0 the code object's address over 8 (code
/// objects are 8-byte aligned user memory).
const WORD_TAG_MASK: u64 = 0b111 << 61;
const WORD_ENTRY: u64 = 1 << 60;
const WORD_OFFSET_SHIFT: u32 = 44;
/// The largest instruction offset a word holds: a frame further into a huge function is
/// named at this offset's line.
pub const MAX_INSTR_OFFSET: u32 = 0xffff;
const WORD_CODE_MASK: u64 = (1 << WORD_OFFSET_SHIFT) - 1;

/// The word for an interpreted frame of `kind`; `None` when `code_object` cannot be a code
/// object (not 8-byte aligned, or not a user address), or `kind` is not interpreted.
#[inline(always)]
pub fn interpreted_word(kind: FrameKind, code_object: u64, instr_offset: u64, entry: bool) -> Option<u64> {
    let tag = kind.word_tag();
    if tag == 0 || code_object & 7 != 0 || code_object == 0 || code_object >> 47 != 0 {
        return None;
    }
    let offset = if instr_offset > MAX_INSTR_OFFSET as u64 { MAX_INSTR_OFFSET as u64 } else { instr_offset };
    Some(tag | (entry as u64) << 60 | offset << WORD_OFFSET_SHIFT | code_object >> 3)
}

/// Marks an interpreted word as its activation's entry frame (see [`InterpretedFrame::ENTRY`]).
#[inline(always)]
pub const fn word_entry(word: u64) -> u64 {
    word | WORD_ENTRY
}

/// Whether a user-stack word is an interpreted frame rather than an address.
#[inline(always)]
pub const fn is_interpreted_word(word: u64) -> bool {
    !matches!(FrameKind::of_word(word), FrameKind::Native)
}

/// The frame an interpreted word stands for; `None` for an address.
pub fn decode_word(word: u64) -> Option<InterpretedFrame> {
    let kind = FrameKind::of_word(word);
    if matches!(kind, FrameKind::Native) {
        return None;
    }
    Some(InterpretedFrame {
        code_object: (word & WORD_CODE_MASK) << 3,
        instr_offset: ((word >> WORD_OFFSET_SHIFT) & MAX_INSTR_OFFSET as u64) as u32,
        kind: kind as u8,
        flags: if word & WORD_ENTRY != 0 { InterpretedFrame::ENTRY } else { 0 },
        _pad: [0; 2],
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interpreted_words_round_trip_and_never_look_like_addresses() {
        let kind = FrameKind::Python;
        let word = interpreted_word(kind, 0x7f12_3456_7890, 37, false).unwrap();
        assert!(is_interpreted_word(word));
        assert_eq!(FrameKind::of_word(word), kind);
        let frame = decode_word(word).unwrap();
        assert_eq!(
            (frame.code_object, frame.instr_offset, frame.is_entry(), frame.kind),
            (0x7f12_3456_7890, 37, false, kind as u8)
        );
        assert!(decode_word(word_entry(word)).unwrap().is_entry());
        let capped = decode_word(interpreted_word(kind, 0x1000, 1 << 20, true).unwrap()).unwrap();
        assert_eq!((capped.instr_offset, capped.is_entry()), (MAX_INSTR_OFFSET, true));
        for address in [0x40_1000, 0x7fff_ffff_fff8, 0xffff_ffff_8100_0000] {
            assert!(!is_interpreted_word(address), "{address:#x}");
            assert_eq!(FrameKind::of_word(address), FrameKind::Native);
        }
        assert_eq!(interpreted_word(kind, 0x1001, 0, false), None, "unaligned");
        assert_eq!(interpreted_word(kind, 1 << 47, 0, false), None, "not a user address");
        assert_eq!(interpreted_word(FrameKind::Native, 0x1000, 0, false), None, "an address has no word");
    }
}
