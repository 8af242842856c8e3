//! Inlined calls, from a function's inline tree (`FUNCDATA_InlTree`) and its
//! `PCDATA_InlTreeIndex` table: at a pc inside inlined code the index names the innermost
//! inlined call; each entry names the called function and `parentPc`, an instruction of the
//! caller whose position is the call site. Go's runtime walks it the same way
//! (`src/runtime/symtab.go`, `CallersFrames`; `inlineUnwinder` from 1.21).
//!
//! `runtime.inlinedCall`, per version:
//! - 1.16-1.19 (20 bytes): `parent int16, funcID uint8, _ byte, file int32, line int32,
//!   func_ int32 (name offset), parentPc int32`;
//! - 1.20 on (16 bytes): `funcID uint8, _ [3]byte, nameOff int32, parentPc int32,
//!   startLine int32`.

use super::{
    header::Layout,
    i32_at,
    table::{Func, Table},
};
use crate::symbolize::{Frame, Frames};

/// `_PCDATA_InlTreeIndex`.
const PCDATA_INL_TREE_INDEX: u32 = 2;
/// `_FUNCDATA_InlTree`.
pub const FUNCDATA_INL_TREE: u8 = 3;
/// The deepest chain of inlined calls followed (Go's inliner nests far less; a corrupt tree
/// could loop).
const MAX_DEPTH: usize = 64;

/// The frames of `pc` in `func`, innermost first: inlined callees expanded from `tree` (the
/// file's bytes from the inline tree on, when the function has one and it was found), then
/// `func` itself. Every frame's offset is from `func`'s entry, as [`Frame::offset`] says.
pub fn frames(table: &Table<'_>, func: &Func, pc: u64, tree: Option<&[u8]>) -> Option<Frames> {
    let offset = pc - func.entry;
    let frame = |function: &str, at: u64| Frame {
        function: function.to_string(),
        file: table.file(func, at).map(str::to_string),
        line: table.line(func, at).unwrap_or(0),
        offset,
    };
    let mut frames = Vec::new();
    let mut at = pc;
    while let Some(tree) = tree {
        if frames.len() >= MAX_DEPTH {
            break;
        }
        let Some(index) = table.pcdata(func, PCDATA_INL_TREE_INDEX, at).and_then(|ix| usize::try_from(ix).ok()) else {
            break;
        };
        let (name_off, parent_pc) = entry(tree, table.header.layout, index)?;
        frames.push(frame(table.name(name_off).unwrap_or("?"), at));
        at = func.entry.checked_add(u64::try_from(parent_pc).ok()?)?;
    }
    frames.push(frame(table.func_name(func)?, at));
    Some(frames)
}

/// (name offset, parentPc) of inline tree entry `index`.
fn entry(tree: &[u8], layout: Layout, index: usize) -> Option<(i32, i32)> {
    let (size, name, parent_pc) = match layout {
        Layout::Go120 => (16, 4, 8),
        Layout::Go116 | Layout::Go118 => (20, 12, 16),
    };
    let at = index.checked_mul(size)?;
    Some((i32_at(tree, at + name)?, i32_at(tree, at + parent_pc)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inline_entries_are_read_per_version() {
        // Entry 1 of a 1.20 tree: funcID, pad, nameOff 0x30, parentPc 0x12, startLine 9.
        let mut tree = vec![0u8; 16];
        tree.extend([0, 0, 0, 0, 0x30, 0, 0, 0, 0x12, 0, 0, 0, 9, 0, 0, 0]);
        assert_eq!(entry(&tree, Layout::Go120, 1), Some((0x30, 0x12)));
        // Entry 1 of a 1.19 tree: parent -1, funcID, pad, file 2, line 40, func_ 0x50, parentPc 0x7.
        let mut old = vec![0u8; 20];
        old.extend([0xff, 0xff, 0, 0, 2, 0, 0, 0, 40, 0, 0, 0, 0x50, 0, 0, 0, 7, 0, 0, 0]);
        assert_eq!(entry(&old, Layout::Go118, 1), Some((0x50, 7)));
        assert_eq!(entry(&old, Layout::Go118, 2), None, "past the file");
    }
}
