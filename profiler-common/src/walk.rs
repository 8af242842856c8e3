//! One step of the user-stack walk, from a frame's registers to its caller's: the arithmetic
//! of an [`UnwindRow`] (CFA from rsp or rbp, the saved rbp, PLT entries, signal frames, the
//! end of the stack), the frame-pointer step and the leaf guess. Shared by the userspace
//! walker of thread dumps (`profiler-daemon/src/thread_dump/walk.rs`), which is also the host
//! twin that tests these rules, and written to the kernel walker's semantics
//! (`profiler-ebpf/src/user_stack.rs`), which finds rows the same way and applies them in
//! the same order. How a row is found, and how stack memory is read, is each walker's own.
//!
//! No allocation, no panics, no loops: everything here must also pass the BPF verifier.

use crate::{
    unwind::{sigframe, UnwindKind},
    Unsupported, UnwindCounter, UnwindRow,
};

/// How far above the first stack pointer a frame may lie: the default 8 MiB main-thread
/// stack limit. Frames beyond it are garbage, not frames.
pub const MAX_STACK_SPAN: u64 = 8 << 20;

/// The lowest kernel address on x86_64; user addresses are below it.
pub const USER_ADDR_LIMIT: u64 = 0x0000_8000_0000_0000;

/// The registers of the frame being unwound.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Regs {
    pub pc: u64,
    pub sp: u64,
    pub bp: u64,
    /// Frames lie in `[sp, stack_top)`.
    pub stack_top: u64,
    /// 1 when `pc` is exact (the interrupted pc, or restored from a signal frame), 0 when it
    /// is a return address (looked up at pc − 1, inside the call).
    pub exact: u32,
    pub _pad: u32,
}

impl Regs {
    /// The registers of an interrupted (or blocked) thread, as saved by the kernel.
    pub fn interrupted(pc: u64, sp: u64, bp: u64) -> Self {
        Regs { pc, sp, bp, stack_top: sp.saturating_add(MAX_STACK_SPAN), exact: 1, _pad: 0 }
    }

    /// The address to look a row up at: inside the call instruction for a return address
    /// (a call to a `noreturn` function may be the last instruction of its function).
    pub fn lookup_pc(&self) -> u64 {
        self.pc.wrapping_sub((self.exact == 0) as u64)
    }
}

/// What a walker reads: the thread's stack, and whether an address is code.
pub trait Memory {
    /// The user word at `addr`, or `None` when it cannot be read. `sp` is the current
    /// frame's stack pointer (a walker reading ahead in windows does not read below it).
    fn read_word(&mut self, addr: u64, sp: u64) -> Option<u64>;
    /// Whether `addr` lies in one of the process's executable mappings.
    fn is_code(&mut self, addr: u64) -> bool;
}

/// The outcome of one step, with the counter it charges (an index into the
/// `UNWIND_COUNTERS` array: an [`UnwindCounter`], or `Unsupported0` plus a reason).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// Moved to the caller's frame.
    Stepped(u32),
    /// The walk ends here (successfully for [`UnwindCounter::EndOfStack`]); `None`: ends
    /// without a count (a frame-pointer chain that leaves the stack).
    Ended(Option<u32>),
    /// The row does not describe the frame: step with [`fallback_step`], counting this.
    Fallback(UnwindCounter),
}

/// Steps `regs` to the caller's frame with `row`, the row covering `regs.lookup_pc()`.
#[inline(always)]
pub fn row_step<M: Memory>(regs: &mut Regs, row: &UnwindRow, mem: &mut M) -> Step {
    let cfa = match row.kind {
        k if k == UnwindKind::CfaRsp as u8 => regs.sp.wrapping_add((row.operand as u64) << 3),
        k if k == UnwindKind::CfaRbp as u8 => regs.bp.wrapping_add((row.operand as u64) << 3),
        k if k == UnwindKind::Plt as u8 => {
            let pushed = ((regs.pc & 15) >= row.operand as u64) as u64;
            regs.sp.wrapping_add(8 + (pushed << 3))
        }
        k if k == UnwindKind::SignalFrame as u8 => return signal_frame_step(regs, mem),
        k if k == UnwindKind::EndOfStack as u8 => return Step::Ended(c(UnwindCounter::EndOfStack)),
        k if k == UnwindKind::Unsupported as u8 => return Step::Ended(Some(unsupported(row.operand))),
        k if k == UnwindKind::GoCgoReturn as u8 => return go_cgo_return_step(regs, row.operand, mem),
        _ => return Step::Fallback(UnwindCounter::NoCfi),
    };
    if cfa <= regs.sp || cfa >= regs.stack_top {
        return Step::Ended(c(UnwindCounter::BadFrame));
    }
    let Some(ra) = mem.read_word(cfa - 8, regs.sp) else {
        return Step::Ended(c(UnwindCounter::BadRead));
    };
    if row.rbp_cfa_words != 0 {
        let at = cfa.wrapping_add((row.rbp_cfa_words as i64 as u64) << 3);
        let Some(bp) = mem.read_word(at, regs.sp) else {
            return Step::Ended(c(UnwindCounter::BadRead));
        };
        regs.bp = bp;
    }
    regs.sp = cfa;
    next_pc(regs, ra, UnwindCounter::CfiFrames)
}

/// The counter of a walk stopped at unsupported CFI whose reason is `operand`.
#[inline(always)]
fn unsupported(operand: u16) -> u32 {
    UnwindCounter::Unsupported0 as u32 + (operand as u32).min(Unsupported::COUNT as u32 - 1)
}

/// The counter index of `counter`.
#[inline(always)]
const fn c(counter: UnwindCounter) -> Option<u32> {
    Some(counter as u32)
}

/// Moves to return address `ra`, counting `counter`; the end of the stack for 0, a bad
/// frame for a non-user address.
#[inline(always)]
fn next_pc(regs: &mut Regs, ra: u64, counter: UnwindCounter) -> Step {
    if ra == 0 {
        return Step::Ended(c(UnwindCounter::EndOfStack));
    }
    if ra >= USER_ADDR_LIMIT {
        return Step::Ended(c(UnwindCounter::BadFrame));
    }
    regs.pc = ra;
    regs.exact = 0;
    Step::Stepped(counter as u32)
}

/// Steps through the kernel's signal frame: the interrupted registers are saved at fixed
/// offsets from rsp, and the interrupted pc is exact.
#[inline(always)]
fn signal_frame_step<M: Memory>(regs: &mut Regs, mem: &mut M) -> Step {
    let sp = regs.sp;
    // In ascending order, so that one window read serves all three.
    let (Some(bp), Some(next_sp), Some(pc)) = (
        mem.read_word(sp + sigframe::RBP_OFFSET, sp),
        mem.read_word(sp + sigframe::RSP_OFFSET, sp),
        mem.read_word(sp + sigframe::RIP_OFFSET, sp),
    ) else {
        return Step::Ended(c(UnwindCounter::BadRead));
    };
    if pc == 0 || pc >= USER_ADDR_LIMIT || next_sp == 0 || next_sp >= USER_ADDR_LIMIT {
        return Step::Ended(c(UnwindCounter::BadFrame));
    }
    // The handler may run on an alternate stack: the interrupted stack gets its own bounds.
    regs.stack_top = next_sp.saturating_add(MAX_STACK_SPAN);
    regs.sp = next_sp;
    regs.bp = bp;
    regs.pc = pc;
    regs.exact = 1;
    Step::Stepped(UnwindCounter::SignalFrames as u32)
}

/// `g.stack.hi`'s offset in Go's `runtime.g` (the first field is `stack`, `{lo, hi}`, in
/// every version).
pub const GO_G_STACK_HI: u64 = 8;

/// Steps from Go's `runtime.asmcgocall` at the return from its C call, back to the goroutine
/// stack it left: `depth` at rsp + 8 · `words`, `g` after it (see
/// [`UnwindKind::GoCgoReturn`]). The goroutine's stack pointer holds asmcgocall's return
/// address into `runtime.cgocall`; rbp is still cgocall's, as asmcgocall links no frame.
#[inline(always)]
pub fn go_cgo_return_step<M: Memory>(regs: &mut Regs, words: u16, mem: &mut M) -> Step {
    let at = regs.sp.wrapping_add((words as u64) << 3);
    let (Some(depth), Some(g)) = (mem.read_word(at, regs.sp), mem.read_word(at + 8, regs.sp)) else {
        return Step::Ended(c(UnwindCounter::BadRead));
    };
    let goroutine_sp = if g == 0 {
        depth
    } else {
        let Some(hi) = mem.read_word(g.wrapping_add(GO_G_STACK_HI), regs.sp) else {
            return Step::Ended(c(UnwindCounter::BadRead));
        };
        hi.wrapping_sub(depth)
    };
    if goroutine_sp == 0 || goroutine_sp >= USER_ADDR_LIMIT || goroutine_sp & 7 != 0 {
        return Step::Ended(c(UnwindCounter::BadFrame));
    }
    let Some(ra) = mem.read_word(goroutine_sp, goroutine_sp) else {
        return Step::Ended(c(UnwindCounter::BadRead));
    };
    // A new stack: its frames get their own bounds, as a signal frame's do.
    regs.sp = goroutine_sp + 8;
    regs.stack_top = regs.sp.saturating_add(MAX_STACK_SPAN);
    next_pc(regs, ra, UnwindCounter::GoStackSwitches)
}

/// Steps from a frame no row describes (`reason`, already counted by the caller). The
/// interrupted frame (exact pc) is first tried as a leaf that has not touched the stack:
/// glibc ends `clone3`'s CFI before its `syscall` on purpose, and JIT code has none, yet
/// both return through `[rsp]`. The guess is taken only if `[rsp]` is an address in one of
/// the process's executable mappings; otherwise frame pointers.
#[inline(always)]
pub fn fallback_step<M: Memory>(regs: &mut Regs, reason: UnwindCounter, mem: &mut M) -> Step {
    if regs.exact == 1 && reason != UnwindCounter::NoProcess {
        let sp = regs.sp;
        if let Some(ra) = mem.read_word(sp, sp) {
            if ra != 0 && ra < USER_ADDR_LIMIT && mem.is_code(ra - 1) {
                regs.sp = sp + 8;
                return next_pc(regs, ra, UnwindCounter::LeafGuesses);
            }
        }
    }
    frame_pointer_step(regs, mem)
}

/// Steps with the frame record at rbp (saved rbp, then the return address), if rbp points
/// into the stack above the current frame.
#[inline(always)]
pub fn frame_pointer_step<M: Memory>(regs: &mut Regs, mem: &mut M) -> Step {
    let bp = regs.bp;
    if bp < regs.sp || bp >= regs.stack_top || bp & 7 != 0 {
        return Step::Ended(None);
    }
    let (Some(next_bp), Some(ra)) = (mem.read_word(bp, regs.sp), mem.read_word(bp + 8, regs.sp)) else {
        return Step::Ended(c(UnwindCounter::BadRead));
    };
    regs.sp = bp + 16;
    regs.bp = next_bp;
    next_pc(regs, ra, UnwindCounter::FramePointerFrames)
}

#[cfg(test)]
mod tests {
    extern crate std;
    use std::collections::BTreeMap;

    use super::*;

    /// A stack as a map of words, and one code range.
    struct Words {
        words: BTreeMap<u64, u64>,
        code: core::ops::Range<u64>,
    }

    impl Memory for Words {
        fn read_word(&mut self, addr: u64, _sp: u64) -> Option<u64> {
            self.words.get(&addr).copied()
        }
        fn is_code(&mut self, addr: u64) -> bool {
            self.code.contains(&addr)
        }
    }

    fn memory(words: &[(u64, u64)]) -> Words {
        Words { words: words.iter().copied().collect(), code: 0x1000..0x2000 }
    }

    fn row(kind: UnwindKind, operand: u16, rbp_cfa_words: i8) -> UnwindRow {
        UnwindRow { pc_offset: 0, operand, rbp_cfa_words, kind: kind as u8 }
    }

    #[test]
    fn cfa_from_rsp_reads_the_return_address_below_it() {
        let mut regs = Regs::interrupted(0x1100, 0x7000, 0x55);
        let mut mem = memory(&[(0x7010, 0x1234)]);
        // CFA = rsp + 24: return address at CFA − 8, rbp unchanged.
        assert_eq!(row_step(&mut regs, &row(UnwindKind::CfaRsp, 3, 0), &mut mem), Step::Stepped(0));
        assert_eq!((regs.pc, regs.sp, regs.bp, regs.exact), (0x1234, 0x7018, 0x55, 0));
        assert_eq!(regs.lookup_pc(), 0x1233, "a return address is looked up inside the call");
    }

    #[test]
    fn cfa_from_rbp_restores_the_saved_rbp() {
        let mut regs = Regs::interrupted(0x1100, 0x7000, 0x7020);
        let mut mem = memory(&[(0x7020, 0x7100), (0x7028, 0x1500)]);
        let step = row_step(&mut regs, &row(UnwindKind::CfaRbp, 2, -2), &mut mem);
        assert_eq!(step, Step::Stepped(UnwindCounter::CfiFrames as u32));
        assert_eq!((regs.pc, regs.sp, regs.bp), (0x1500, 0x7030, 0x7100));
    }

    #[test]
    fn plt_entries_push_or_not_by_the_pc() {
        let mut mem = memory(&[(0x7000, 0x1400), (0x7008, 0x1500)]);
        let mut before = Regs::interrupted(0x1106, 0x7000, 0);
        row_step(&mut before, &row(UnwindKind::Plt, 11, 0), &mut mem);
        assert_eq!(before.pc, 0x1400, "before the push: CFA = rsp + 8");
        let mut after = Regs::interrupted(0x110b, 0x7000, 0);
        row_step(&mut after, &row(UnwindKind::Plt, 11, 0), &mut mem);
        assert_eq!(after.pc, 0x1500, "after it: CFA = rsp + 16");
    }

    #[test]
    fn signal_frames_restore_the_interrupted_registers() {
        let sp = 0x9000;
        let mut mem = memory(&[
            (sp + sigframe::RBP_OFFSET, 0x42),
            (sp + sigframe::RSP_OFFSET, 0x8000),
            (sp + sigframe::RIP_OFFSET, 0x1777),
        ]);
        let mut regs = Regs { exact: 0, ..Regs::interrupted(0x1100, sp, 0) };
        let step = row_step(&mut regs, &row(UnwindKind::SignalFrame, 0, 0), &mut mem);
        assert_eq!(step, Step::Stepped(UnwindCounter::SignalFrames as u32));
        assert_eq!((regs.pc, regs.sp, regs.bp, regs.exact), (0x1777, 0x8000, 0x42, 1));
        assert_eq!(regs.stack_top, 0x8000 + MAX_STACK_SPAN);
    }

    #[test]
    fn a_cgo_return_moves_to_the_goroutine_stack_by_its_saved_depth() {
        // asmcgocall on the g0 stack at 0x9000: depth at +40, g at +48; g.stack.hi = 0x5000,
        // depth 0x100, so the goroutine's sp is 0x4f00, holding the return into cgocall.
        let g = 0x3000;
        let mut mem = memory(&[(0x9028, 0x100), (0x9030, g), (g + GO_G_STACK_HI, 0x5000), (0x4f00, 0x1a00)]);
        let mut regs = Regs { exact: 0, ..Regs::interrupted(0x1100, 0x9000, 0x4f40) };
        let step = row_step(&mut regs, &row(UnwindKind::GoCgoReturn, 5, 0), &mut mem);
        assert_eq!(step, Step::Stepped(UnwindCounter::GoStackSwitches as u32));
        assert_eq!((regs.pc, regs.sp, regs.bp), (0x1a00, 0x4f08, 0x4f40), "rbp is still cgocall's");
        assert_eq!(regs.stack_top, 0x4f08 + MAX_STACK_SPAN, "the goroutine's stack gets its own bounds");
        // Called on the system stack already (no g): the word is the caller's sp itself.
        let mut mem = memory(&[(0x9028, 0x8800), (0x9030, 0), (0x8800, 0x1b00)]);
        let mut regs = Regs { exact: 0, ..Regs::interrupted(0x1100, 0x9000, 0) };
        row_step(&mut regs, &row(UnwindKind::GoCgoReturn, 5, 0), &mut mem);
        assert_eq!((regs.pc, regs.sp), (0x1b00, 0x8808));
        // An unreadable g ends the walk, counted.
        let mut mem = memory(&[(0x9028, 0x100), (0x9030, g)]);
        let mut regs = Regs::interrupted(0x1100, 0x9000, 0);
        let unread = Some(UnwindCounter::BadRead as u32);
        assert_eq!(row_step(&mut regs, &row(UnwindKind::GoCgoReturn, 5, 0), &mut mem), Step::Ended(unread));
    }

    #[test]
    fn walks_end_at_the_outermost_frame_bad_frames_and_unsupported_cfi() {
        let mut mem = memory(&[(0x7000, 0)]);
        let mut regs = Regs::interrupted(0x1100, 0x7000, 0);
        let end = Some(UnwindCounter::EndOfStack as u32);
        assert_eq!(row_step(&mut regs, &row(UnwindKind::EndOfStack, 0, 0), &mut mem), Step::Ended(end));
        // A zero return address ends the stack too.
        assert_eq!(row_step(&mut regs, &row(UnwindKind::CfaRsp, 1, 0), &mut mem), Step::Ended(end));
        let bad = Some(UnwindCounter::BadFrame as u32);
        assert_eq!(row_step(&mut regs, &row(UnwindKind::CfaRsp, 0, 0), &mut mem), Step::Ended(bad));
        let unsupported = row(UnwindKind::Unsupported, Unsupported::RbpRule as u16, 0);
        let counter = UnwindCounter::unsupported(Unsupported::RbpRule);
        assert_eq!(row_step(&mut regs, &unsupported, &mut mem), Step::Ended(Some(counter)));
        let unread = Some(UnwindCounter::BadRead as u32);
        assert_eq!(row_step(&mut regs, &row(UnwindKind::CfaRsp, 4, 0), &mut mem), Step::Ended(unread));
        assert_eq!(row_step(&mut regs, &row(UnwindKind::Gap, 0, 0), &mut mem), Step::Fallback(UnwindCounter::NoCfi));
    }

    #[test]
    fn fallback_guesses_a_leaf_then_follows_frame_pointers() {
        // [rsp] is code: a leaf that has not touched the stack.
        let mut mem = memory(&[(0x7000, 0x1800)]);
        let mut regs = Regs::interrupted(0x9999, 0x7000, 0);
        let step = fallback_step(&mut regs, UnwindCounter::NoMapping, &mut mem);
        assert_eq!(step, Step::Stepped(UnwindCounter::LeafGuesses as u32));
        assert_eq!((regs.pc, regs.sp), (0x1800, 0x7008));
        // Not exact any more: frame pointers.
        let mut mem = memory(&[(0x7100, 0x7200), (0x7108, 0x1900)]);
        let mut regs = Regs { exact: 0, ..Regs::interrupted(0x1800, 0x7008, 0x7100) };
        let step = fallback_step(&mut regs, UnwindCounter::NoTable, &mut mem);
        assert_eq!(step, Step::Stepped(UnwindCounter::FramePointerFrames as u32));
        assert_eq!((regs.pc, regs.sp, regs.bp), (0x1900, 0x7110, 0x7200));
        // rbp below the stack pointer is garbage: the walk ends without a read.
        let mut regs = Regs::interrupted(0x1800, 0x7008, 0x10);
        assert_eq!(frame_pointer_step(&mut regs, &mut mem), Step::Ended(None));
    }
}
