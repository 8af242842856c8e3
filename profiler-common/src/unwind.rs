//! The unwind table as the kernel reads it: one 8-byte [`UnwindRow`] per address range of an
//! executable file, sorted by address, built in userspace from the file's call-frame
//! information (`.eh_frame`, `.debug_frame`). x86_64 only.
//!
//! A row holds for every address from its `pc_offset` up to the next row's. Between two
//! functions with CFI there is a [`UnwindKind::Gap`] row, so a binary search that lands on a
//! gap knows the address has no CFI. The return address is always at CFA − 8 on x86_64
//! ([`RA_CFA_OFFSET`]), so rows do not store it.

/// Where the return address is saved, relative to the CFA, in every frame a row describes.
pub const RA_CFA_OFFSET: i64 = -8;

/// Offsets into the Linux x86_64 signal frame (`struct rt_sigframe` without its popped
/// `pretcode`), relative to rsp at the signal trampoline (`__restore_rt`). They are the kernel's
/// UAPI `ucontext` → `sigcontext` layout, so they do not change between kernels.
pub mod sigframe {
    /// The interrupted rbp.
    pub const RBP_OFFSET: u64 = 120;
    /// The interrupted rsp.
    pub const RSP_OFFSET: u64 = 160;
    /// The interrupted rip (exact, not a return address: look it up without subtracting 1).
    pub const RIP_OFFSET: u64 = 168;
}

/// How to find the caller's registers at the addresses a row covers.
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum UnwindKind {
    /// No CFI covers these addresses (between functions, or past the last one).
    Gap = 0,
    /// CFA = rsp + 8 · `operand`.
    CfaRsp = 1,
    /// CFA = rbp + 8 · `operand`.
    CfaRbp = 2,
    /// A lazy-binding PLT entry: CFA = rsp + 8 + 8 · ((rip & 15) ≥ `operand`). The caller's
    /// rbp is unchanged.
    Plt = 3,
    /// The signal trampoline: the interrupted rip, rsp and rbp are at the [`sigframe`] offsets
    /// from rsp.
    SignalFrame = 4,
    /// The outermost frame (`_start`, a thread's start routine): the return address is
    /// undefined, so the walk ends here, successfully.
    EndOfStack = 5,
    /// CFI exists but cannot be expressed in a row; `operand` holds the reason, an index
    /// chosen by the table builder. The walk stops and counts it.
    Unsupported = 6,
}

impl UnwindKind {
    /// The kind stored as `byte`, or `None` for a byte no builder writes.
    pub fn from_u8(byte: u8) -> Option<Self> {
        Some(match byte {
            0 => Self::Gap,
            1 => Self::CfaRsp,
            2 => Self::CfaRbp,
            3 => Self::Plt,
            4 => Self::SignalFrame,
            5 => Self::EndOfStack,
            6 => Self::Unsupported,
            _ => return None,
        })
    }
}

/// One rule of an unwind table, in force from `pc_offset` up to the next row's `pc_offset`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct UnwindRow {
    /// First address covered, as an offset from the table's base address (a file-relative
    /// virtual address the table carries beside its rows).
    pub pc_offset: u32,
    /// Kind-dependent: the CFA offset in 8-byte words for `CfaRsp`/`CfaRbp` (x86_64 frames
    /// are whole words; words reach 512 KiB frames where bytes would stop at 64 KiB), the rip
    /// threshold for `Plt`, the reason for `Unsupported`, otherwise 0.
    pub operand: u16,
    /// Where the caller's rbp is saved, in 8-byte words from the CFA (−2 means CFA − 16).
    /// 0 means rbp is unchanged (CFA + 0 can never hold it: that is the caller's frame).
    pub rbp_cfa_words: i8,
    /// An [`UnwindKind`] as its `u8`.
    pub kind: u8,
}

const _: () = assert!(core::mem::size_of::<UnwindRow>() == 8);

#[cfg(feature = "user")]
// SAFETY: repr(C), only integers, no padding bytes (size asserted above).
unsafe impl aya::Pod for UnwindRow {}
