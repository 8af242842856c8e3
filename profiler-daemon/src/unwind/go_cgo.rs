//! The rows that carry a walk from C code called by Go back to its Go caller.
//!
//! Go calls C through `runtime.asmcgocall`, which moves from the goroutine's stack to the
//! thread's system (g0) stack and there calls the C function with `CALL AX`. Before the call
//! it saves, at fixed offsets from its new stack pointer, the goroutine's `g` and its stack
//! depth (`g.stack.hi − sp`; Go 1.19 to today: `MOVQ DI, 48(SP)` and `MOVQ DI, 40(SP)`, see
//! `src/runtime/asm_amd64.s`), or, when it was already on the system stack, a zero `g` and
//! the caller's stack pointer itself. A return address just after that `CALL` is where a
//! walk up from the C function arrives, and where no CFI describes the frame: the table gets
//! a [`Rule::GoCgoReturn`] row over each such `CALL` instead, with the offset found in the
//! code rather than assumed, so a Go release that moves the words still walks (or, if the
//! code no longer reads as expected, stops at asmcgocall as before). A `-s -w` build has no
//! symbol table: asmcgocall is found by its pclntab name instead.

use std::ops::Range;

use super::rule::Rule;
use crate::elf::Elf;

/// The names asmcgocall's assembly goes by: Go 1.17 on calls it through an ABI wrapper and
/// names the assembly `.abi0`; scanning the wrapper finds no `CALL AX` and costs nothing.
const ASMCGOCALL: [&str; 2] = ["runtime.asmcgocall.abi0", "runtime.asmcgocall"];
/// The longest function scanned: asmcgocall is about 180 bytes.
const MAX_FUNCTION_BYTES: u64 = 4096;
/// `CALL AX` (`call *%rax`).
const CALL_RAX: [u8; 2] = [0xff, 0xd0];
/// How far before the `CALL` the depth's store may be: it is a few moves before.
const STORE_WINDOW: usize = 24;

/// The cgo `CALL` instructions of the Go executable `elf` (one with a `.go.buildinfo`),
/// whose bytes are `bytes`, and the row each gets; empty for any other file. asmcgocall is
/// found by the symbol table, or in a binary without one (`-s`) by the pclntab, which names
/// the ABI wrapper and the assembly alike.
pub(crate) fn cgo_call_rows(elf: &Elf<'_>, bytes: &[u8]) -> Vec<(Range<u64>, Rule)> {
    if elf.section(".go.buildinfo").is_none() {
        return Vec::new();
    }
    let mut ranges: Vec<Range<u64>> = ASMCGOCALL.iter().filter_map(|name| elf.symbol(name)).collect();
    if ranges.is_empty() {
        ranges = crate::symbolize::go_functions_named(bytes, ASMCGOCALL[1]);
    }
    let mut rows = Vec::new();
    for range in ranges {
        if range.end <= range.start || range.end - range.start > MAX_FUNCTION_BYTES {
            continue;
        }
        let Some(code) = elf.code(range.clone()) else { continue };
        rows.extend(call_rows(code).into_iter().map(|(at, rule)| (range.start + at.start..range.start + at.end, rule)));
    }
    rows
}

/// The `CALL AX`s in `code` whose depth (or caller's sp) store was found before them, as
/// offsets into `code`.
fn call_rows(code: &[u8]) -> Vec<(Range<u64>, Rule)> {
    let mut rows = Vec::new();
    for at in 0..code.len().saturating_sub(1) {
        if code[at..at + 2] != CALL_RAX {
            continue;
        }
        let before = &code[at.saturating_sub(STORE_WINDOW)..at];
        if let Some(depth_bytes) = depth_store(before) {
            rows.push((at as u64..at as u64 + 2, Rule::GoCgoReturn { depth_bytes }));
        }
    }
    rows
}

/// The offset from rsp of the last store, in `code`, of the depth (`MOVQ DI, off(SP)` after
/// `SUBQ DX, DI`) or of the caller's sp (`MOVQ DX, off(SP)`), when `g`'s slot (`off + 8`)
/// is stored too: `MOVQ DI, off+8(SP)` or `MOVQ $0, off+8(SP)`.
fn depth_store(code: &[u8]) -> Option<u16> {
    // mov %rdi,disp8(%rsp) / mov %rdx,disp8(%rsp) / movq $0,disp8(%rsp).
    const MOV_RDI: [u8; 4] = [0x48, 0x89, 0x7c, 0x24];
    const MOV_RDX: [u8; 4] = [0x48, 0x89, 0x54, 0x24];
    const MOV_ZERO: [u8; 4] = [0x48, 0xc7, 0x44, 0x24];
    const SUB_RDX_RDI: [u8; 3] = [0x48, 0x29, 0xd7];
    let stores =
        |prefix: [u8; 4]| code.windows(5).enumerate().filter(move |(_, w)| w[..4] == prefix).map(|(at, w)| (at, w[4]));
    let depth = stores(MOV_RDI)
        .filter(|(at, _)| *at >= 3 && code[at - 3..*at] == SUB_RDX_RDI)
        .chain(stores(MOV_RDX))
        .max_by_key(|(at, _)| *at)
        .map(|(_, offset)| offset)?;
    let g_slot = depth.checked_add(8)?;
    let g_stored = stores(MOV_RDI).chain(stores(MOV_ZERO)).any(|(_, offset)| offset == g_slot);
    (depth % 8 == 0 && depth < 0x80 && g_stored).then_some(u16::from(depth))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Go 1.19's `runtime.asmcgocall.abi0` from the cgo fixture (`objdump -d`), from the
    /// first store before its system-stack `CALL AX` to its `nosave` `CALL AX`.
    const GO_1_19: &[u8] = &[
        0x48, 0x89, 0x7c, 0x24, 0x30, // mov %rdi,0x30(%rsp)      save g
        0x48, 0x8b, 0x7f, 0x08, // mov 0x8(%rdi),%rdi               g.stack.hi
        0x48, 0x29, 0xd7, // sub %rdx,%rdi
        0x48, 0x89, 0x7c, 0x24, 0x28, // mov %rdi,0x28(%rsp)      save depth
        0x48, 0x89, 0xdf, // mov %rbx,%rdi
        0x48, 0x89, 0xd9, // mov %rbx,%rcx
        0xff, 0xd0, // call *%rax                                  (offset 23)
        0x48, 0x8b, 0x7c, 0x24, 0x30, // mov 0x30(%rsp),%rdi
        0x48, 0x8b, 0x77, 0x08, // mov 0x8(%rdi),%rsi
        0x48, 0x2b, 0x74, 0x24, 0x28, // sub 0x28(%rsp),%rsi
        0x48, 0x89, 0xf4, // mov %rsi,%rsp
        0xc3, // ret
        0x48, 0xc7, 0x44, 0x24, 0x30, 0x00, 0x00, 0x00, 0x00, // movq $0x0,0x30(%rsp)
        0x48, 0x89, 0x54, 0x24, 0x28, // mov %rdx,0x28(%rsp)      save sp
        0x48, 0x89, 0xdf, // mov %rbx,%rdi
        0x48, 0x89, 0xd9, // mov %rbx,%rcx
        0xff, 0xd0, // call *%rax                                  (offset 63)
    ];

    #[test]
    fn both_calls_of_go_1_19_get_the_depth_at_40() {
        let rows = call_rows(GO_1_19);
        let expected = Rule::GoCgoReturn { depth_bytes: 40 };
        assert_eq!(rows, vec![(23..25, expected), (63..65, expected)]);
    }

    #[test]
    fn a_call_without_the_saved_words_gets_no_row() {
        // The ABI wrapper's `call rel32`, and a `CALL AX` with no depth stored before it.
        assert!(call_rows(&[0xe8, 0xe4, 0xd4, 0xff, 0xff, 0x48, 0x89, 0xdf, 0xff, 0xd0]).is_empty());
        // The depth stored, but not `g` beside it: the layout is not the one read.
        let no_g = [0x48, 0x29, 0xd7, 0x48, 0x89, 0x7c, 0x24, 0x28, 0xff, 0xd0];
        assert!(call_rows(&no_g).is_empty());
    }
}
