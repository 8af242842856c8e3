//! The unwind table as the kernel reads it: one 8-byte [`UnwindRow`] per address range of an
//! executable file, sorted by address, built in userspace from the file's call-frame
//! information (`.eh_frame`, `.debug_frame`). x86_64 only.
//!
//! A row holds for every address from its `pc_offset` up to the next row's. Between two
//! functions with CFI there is a [`UnwindKind::Gap`] row, so a binary search that lands on a
//! gap knows the address has no CFI. The return address is always at CFA − 8 on x86_64
//! ([`RA_CFA_OFFSET`]), so rows do not store it.

use crate::FrameKind;

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
    /// The return from a cgo call into Go's `runtime.asmcgocall`, which had switched from the
    /// goroutine's stack to the thread's system (g0) stack: the goroutine's stack pointer is
    /// `g.stack.hi − depth`, with `depth` saved at rsp + 8 · `operand` and `g` in the word
    /// after it (`src/runtime/asm_amd64.s`); a `g` of 0 (the call was made on the system
    /// stack) means the word holds the caller's stack pointer itself. The caller's rbp is
    /// unchanged. There the walk continues on the goroutine's stack, as Go's traceback does.
    GoCgoReturn = 7,
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
            7 => Self::GoCgoReturn,
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
// SAFETY: repr(C), integers and a byte array, no padding (size asserted).
unsafe impl aya::Pod for RegisterAsk {}

#[cfg(feature = "user")]
// SAFETY: repr(C), only integers, no padding bytes (size asserted above).
unsafe impl aya::Pod for UnwindRow {}

/// Rows per shard of the row array, as a shift: a shard is 4,096 rows (32 KiB). Tables occupy
/// whole shards, not necessarily adjacent, so loading and evicting never fragments the array,
/// and a small library wastes at most one partly used shard.
pub const SHARD_ROWS_SHIFT: u32 = 12;
/// Rows per shard.
pub const SHARD_ROWS: u32 = 1 << SHARD_ROWS_SHIFT;
/// Shards one table may use: 2 M rows (16 MiB), more than libLLVM's 1.3 M.
pub const MAX_TABLE_SHARDS: usize = 512;
/// Binary-search steps that cover a table of `MAX_TABLE_SHARDS · SHARD_ROWS` rows.
pub const TABLE_SEARCH_STEPS: usize = 22;
/// Executable mappings the kernel walker knows per process; further ones fall back to
/// frame pointers (counted as `NoMapping`).
pub const MAX_PROCESS_MAPPINGS: usize = 256;
/// Binary-search steps that cover `MAX_PROCESS_MAPPINGS` mappings.
pub const MAPPING_SEARCH_STEPS: usize = 9;
/// Executable mappings of a process kept in the small entries of `UNWIND_PROCESSES` (776 B
/// instead of 6 KiB): an executable, the C library, the loader, the vdso and a few dozen
/// libraries, which is most processes. Larger lists go to `UNWIND_PROCESSES_LARGE`.
pub const SMALL_PROCESS_MAPPINGS: usize = 32;
/// Binary-search steps that cover `SMALL_PROCESS_MAPPINGS` mappings.
pub const SMALL_MAPPING_SEARCH_STEPS: usize = 6;
/// `UnwindMapping::table` of a mapping whose table is not loaded (yet, or at all).
pub const NO_TABLE: u32 = u32::MAX;

/// One loaded table: where its rows are. Value of the `UNWIND_TABLES` array.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct UnwindTableInfo {
    /// File-relative virtual address that row offsets are relative to.
    pub base_address: u64,
    /// Number of rows; 0 for an unused slot.
    pub rows: u32,
    /// Load id, unique within a session and never 0 for a loaded table: the kernel walker's
    /// per-CPU row cache is keyed by it, so a slot reloaded with another file never serves
    /// the old file's rows.
    pub id: u32,
    /// Row `i` of the table is row `i mod SHARD_ROWS` of shard `shards[i / SHARD_ROWS]` of
    /// the row array.
    pub shards: [u16; MAX_TABLE_SHARDS],
}

const _: () = assert!(core::mem::size_of::<UnwindTableInfo>() == 16 + 2 * MAX_TABLE_SHARDS);

/// One executable mapping of a process as the walker sees it. 24 bytes (a length, not an end
/// address): the process maps hold thousands of these lists, each priced full.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UnwindMapping {
    /// First address of the mapping.
    pub start: u64,
    /// Address minus bias is the file-relative virtual address the table is built in.
    pub bias: u64,
    /// Bytes mapped (a mapping of 4 GiB or more is cut to its first 4 GiB).
    pub len: u32,
    /// Slot in `UNWIND_TABLES`, or [`NO_TABLE`].
    pub table: u32,
}

const _: () = assert!(core::mem::size_of::<UnwindMapping>() == 24);

impl UnwindMapping {
    /// The mapping of `start..end`.
    pub fn new(start: u64, end: u64, bias: u64, table: u32) -> Self {
        let len = end.saturating_sub(start).min(u32::MAX as u64) as u32;
        Self { start, bias, len, table }
    }

    /// One past its last address.
    #[inline(always)]
    pub fn end(&self) -> u64 {
        self.start + self.len as u64
    }
}

/// Flag of an [`UnwindProcessOf`] entry, one per interpreted [`FrameKind`]: the process may
/// have an entry in that runtime's walker's map (see [`crate::runtimes`]). Without it the
/// walker skips that map's lookup: the walk has the process's entry in hand already, and the
/// lookup, a cold hash bucket, was 3-5% of a sample's time for the processes that run no
/// interpreter, almost all of them. Userspace sets it before it writes the runtime's entry
/// and may leave it set after removing that entry (a lookup that misses is harmless). 0 for
/// [`FrameKind::Native`].
#[inline(always)]
pub const fn process_runtime(kind: FrameKind) -> u32 {
    (1 << kind as u32) >> 1
}

/// Every runtime's [`process_runtime`] flag: what a walk assumes of a process before it has
/// read the process's entry.
pub const PROCESS_RUNTIMES: u32 = 0xff;

/// The executable mappings of one process, sorted by start, in an entry of room `N`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct UnwindProcessOf<const N: usize> {
    /// Valid entries in `mappings`.
    pub len: u32,
    /// [`process_runtime`] flags, or 0.
    pub flags: u32,
    pub mappings: [UnwindMapping; N],
}

/// A process with any number of mappings (up to the walker's limit). Value of
/// `UNWIND_PROCESSES_LARGE`, and how userspace builds every process's list.
pub type UnwindProcess = UnwindProcessOf<MAX_PROCESS_MAPPINGS>;
/// A process with at most [`SMALL_PROCESS_MAPPINGS`] mappings. Value of `UNWIND_PROCESSES`.
pub type SmallUnwindProcess = UnwindProcessOf<SMALL_PROCESS_MAPPINGS>;

const _: () = assert!(core::mem::size_of::<UnwindProcess>() == 8 + 24 * MAX_PROCESS_MAPPINGS);
const _: () = assert!(core::mem::size_of::<SmallUnwindProcess>() == 8 + 24 * SMALL_PROCESS_MAPPINGS);
// The walker masks indices with `N - 1`, and the search steps cover `N` mappings.
const _: () = assert!(MAX_PROCESS_MAPPINGS.is_power_of_two() && SMALL_PROCESS_MAPPINGS.is_power_of_two());
const _: () = assert!(1 << (MAPPING_SEARCH_STEPS - 1) >= MAX_PROCESS_MAPPINGS);
const _: () = assert!(1 << (SMALL_MAPPING_SEARCH_STEPS - 1) >= SMALL_PROCESS_MAPPINGS);

impl UnwindProcess {
    /// The same list in a small entry, if it fits one.
    pub fn small(&self) -> Option<SmallUnwindProcess> {
        let len = self.len as usize;
        if len > SMALL_PROCESS_MAPPINGS {
            return None;
        }
        let mut small = SmallUnwindProcess {
            len: self.len,
            flags: self.flags,
            mappings: [UnwindMapping::default(); SMALL_PROCESS_MAPPINGS],
        };
        small.mappings[..len].copy_from_slice(&self.mappings[..len]);
        Some(small)
    }
}

impl SmallUnwindProcess {
    /// The same list in a large entry.
    pub fn large(&self) -> UnwindProcess {
        let len = (self.len as usize).min(SMALL_PROCESS_MAPPINGS);
        let mut large = UnwindProcess {
            len: len as u32,
            flags: self.flags,
            mappings: [UnwindMapping::default(); MAX_PROCESS_MAPPINGS],
        };
        large.mappings[..len].copy_from_slice(&self.mappings[..len]);
        large
    }
}

/// One record of `REGISTER_ASKS`: a process a walker met unregistered, with the name of
/// the thread it met (`comm`, NUL-padded). The name is what userspace calls the process by
/// when it learnt nothing else of it: its fork's record was lost (a ring overflowed under a
/// storm of thread events) and it exited before `/proc` was read.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RegisterAsk {
    pub tgid: u32,
    pub _pad: u32,
    pub comm: [u8; 16],
}

const _: () = assert!(core::mem::size_of::<RegisterAsk>() == 24);

/// The first field of each `UNWIND_STATE` entry (the walker's per-CPU state of one context):
/// frames that context stepped on that CPU since load, by a table row and by frame pointers.
/// Kept there, in the cache line every walk touches anyway, rather than in
/// `UNWIND_COUNTERS`; userspace adds them to [`UnwindCounter::CfiFrames`] and
/// [`UnwindCounter::FramePointerFrames`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WalkTotals {
    pub by_table: u64,
    pub by_frame_pointer: u64,
}

/// Bytes of an `UNWIND_STATE` entry, which userspace reads as words to find the
/// [`WalkTotals`] at its start (the walker's state itself is private to the kernel side,
/// which checks this size when it builds).
pub const WALK_STATE_BYTES: usize = 424;

/// Indices into the `UNWIND_COUNTERS` per-CPU array: what happened to each user frame the
/// walker stepped from, and how walks ended.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UnwindCounter {
    /// Frames stepped with an unwind table row.
    CfiFrames = 0,
    /// Frames stepped with frame pointers (one of the fallback reasons below applied).
    FramePointerFrames = 1,
    /// Fallback: the process has no mappings loaded for the walker (not seen yet).
    NoProcess = 2,
    /// Fallback: the address is in no known executable mapping (JIT code, a new `dlopen`).
    NoMapping = 3,
    /// Fallback: the mapping's file has no table loaded (not built yet, too large, budget).
    NoTable = 4,
    /// Fallback: the table has no CFI for the address.
    NoCfi = 5,
    /// Walks stopped at a read of the user stack that failed.
    BadRead = 6,
    /// Walks stopped at a step that went nowhere (CFA at or below the stack pointer).
    BadFrame = 7,
    /// Walks that reached the outermost frame (`_start`, a thread's start).
    EndOfStack = 8,
    /// Signal frames stepped through.
    SignalFrames = 9,
    /// Interrupted frames without CFI stepped as leaves (return address at `[rsp]`, which
    /// pointed into known code): glibc's `clone3` at its syscall, JIT leaf functions.
    LeafGuesses = 10,
    /// Frames the kernel's uprobes had moved into the `[uprobes]` page, put back (see
    /// [`UprobeOffsets`]): return addresses a pending uretprobe had replaced with its
    /// trampoline, and pcs in a probed instruction's out-of-line copy.
    UprobeFrames = 11,
    /// Crossings from a cgo call's system stack back to the goroutine's stack that called it
    /// ([`UnwindKind::GoCgoReturn`]).
    GoStackSwitches = 12,
    /// Walks stopped at a row with unsupported CFI; the reason is `Unsupported0 + reason`
    /// (an [`Unsupported`] index). Last, so that a new reason renumbers no other counter.
    Unsupported0 = 13,
}

impl UnwindCounter {
    /// Number of counters (the length of the `UNWIND_COUNTERS` array).
    pub const COUNT: u32 = Self::Unsupported0 as u32 + Unsupported::COUNT as u32;

    /// The counter of walks stopped at unsupported CFI for `reason`.
    pub const fn unsupported(reason: Unsupported) -> u32 {
        Self::Unsupported0 as u32 + reason as u32
    }
}

/// Why a CFI row could not be expressed. The index is stored in the row's operand (kind
/// [`UnwindKind::Unsupported`]), so the kernel counts stopped walks per reason
/// ([`UnwindCounter::Unsupported0`] + index): both sides read this one definition.
#[repr(u16)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Unsupported {
    /// The CFA is based on a register other than rsp or rbp (hand-written assembly, stack
    /// realignment through r10).
    CfaRegister = 0,
    /// The CFA offset is negative, not a multiple of 8, or above the largest a row holds.
    CfaOffset = 1,
    /// The CFA is a DWARF expression other than the PLT and signal-frame ones.
    CfaExpression = 2,
    /// The return address is not at CFA − 8.
    ReturnAddress = 3,
    /// rbp is restored by a rule other than "unchanged" or "saved at CFA + n".
    RbpRule = 4,
    /// rbp is saved at an offset that is positive, not a multiple of 8, or below −1024.
    RbpOffset = 5,
    /// The FDE could not be parsed or its CFI program failed to evaluate.
    BadCfi = 6,
}

impl Unsupported {
    /// Number of reasons.
    pub const COUNT: usize = 7;
    /// All reasons, in index order.
    pub const ALL: [Unsupported; Self::COUNT] = [
        Unsupported::CfaRegister,
        Unsupported::CfaOffset,
        Unsupported::CfaExpression,
        Unsupported::ReturnAddress,
        Unsupported::RbpRule,
        Unsupported::RbpOffset,
        Unsupported::BadCfi,
    ];

    /// A short name for reports.
    pub fn name(self) -> &'static str {
        match self {
            Unsupported::CfaRegister => "cfa_register",
            Unsupported::CfaOffset => "cfa_offset",
            Unsupported::CfaExpression => "cfa_expression",
            Unsupported::ReturnAddress => "return_address",
            Unsupported::RbpRule => "rbp_rule",
            Unsupported::RbpOffset => "rbp_offset",
            Unsupported::BadCfi => "bad_cfi",
        }
    }

    /// The reason a row's operand names; `None` for an index no builder writes.
    pub fn from_index(index: u16) -> Option<Unsupported> {
        Self::ALL.get(usize::from(index)).copied()
    }
}

#[cfg(feature = "user")]
// SAFETY: repr(C), only integers, padding explicit (sizes asserted above).
unsafe impl aya::Pod for UnwindTableInfo {}
#[cfg(feature = "user")]
// SAFETY: as above.
unsafe impl aya::Pod for UnwindMapping {}
#[cfg(feature = "user")]
// SAFETY: as above.
unsafe impl<const N: usize> aya::Pod for UnwindProcessOf<N> {}

/// Where the kernel keeps what its uprobes moved (from the running kernel's BTF, set at load
/// time; `task_utask` 0 when the kernel has no uprobes or the fields were not found).
///
/// Two things a walk meets in the process's `[uprobes]` page, which no file maps:
/// - A uretprobe replaces its function's return address on the user stack with the address
///   of a trampoline at the page's start (`current->mm->uprobes_state.xol_area->vaddr`), and
///   remembers the original in a `struct return_instance` on
///   `current->utask->return_instances` (newest first), with the stack address it replaced
///   (`stack`). A walk that reads the trampoline takes the original from the instance for
///   that slot; without it, a CPU sample inside a probed `malloc` showed the trampoline in
///   place of `malloc`'s caller.
/// - A uprobe on an instruction the kernel cannot emulate (glibc's `free` starts with a
///   `test`) executes a copy of it in a slot of the page (`utask->xol_vaddr`), single-stepped:
///   a sample there is at the probed address `utask->vaddr` plus the same distance.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UprobeOffsets {
    /// `task_struct.utask` (`struct uprobe_task *`).
    pub task_utask: u32,
    /// `uprobe_task.return_instances` (`struct return_instance *`).
    pub utask_return_instances: u32,
    /// `uprobe_task.xol_vaddr` and `.vaddr`: the slot being single-stepped and the probed
    /// address it stands for.
    pub utask_xol_vaddr: u32,
    pub utask_vaddr: u32,
    /// `return_instance.stack`, `.orig_ret_vaddr` and `.next`.
    pub instance_stack: u32,
    pub instance_return_address: u32,
    pub instance_next: u32,
    /// `task_struct.mm`.
    pub task_mm: u32,
    /// `mm_struct.uprobes_state.xol_area` (`struct xol_area *`), one offset from the mm.
    pub mm_xol_area: u32,
    /// `xol_area.vaddr`: the trampoline's address.
    pub xol_vaddr: u32,
}

const _: () = assert!(core::mem::size_of::<UprobeOffsets>() == 40);

#[cfg(feature = "user")]
// SAFETY: repr(C), only u32 fields, no padding (size asserted above).
unsafe impl aya::Pod for UprobeOffsets {}
