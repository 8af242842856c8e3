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
        // An entry past the file, or a parent pc before the entry: the frames found so far
        // and the function's own (at the innermost line known) are still right.
        let Some((name_off, parent_pc)) = entry(tree, table.header.layout, index) else { break };
        let Some(parent) = u64::try_from(parent_pc).ok().and_then(|pc| func.entry.checked_add(pc)) else { break };
        frames.push(frame(table.name(name_off).unwrap_or("?"), at));
        at = parent;
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
    use crate::symbolize::go::table::Table;

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

    /// A one-function pclntab as Go's linker lays it out for `layout`: `main.outer` at
    /// 0x401000..0x401040 (file `/src/a.go`; line 10, then 20 inside `main.inl` inlined at
    /// 0x10..0x20, then 11, the call site), with its inline tree; returns it and the tree.
    fn one_function_table(layout: Layout) -> (Vec<u8>, Vec<u8>) {
        let offsets = [0x100, 0x140, 0x160, 0x180, 0x200];
        let mut t = crate::symbolize::go::header::tests::written(layout, 1, 0x401000, offsets, 0x300);
        let put = |t: &mut Vec<u8>, at: usize, bytes: &[u8]| t[at..at + bytes.len()].copy_from_slice(bytes);
        put(&mut t, 0x100, b"\0main.outer\0main.inl\0");
        put(&mut t, 0x140, &0u32.to_le_bytes()); // cutab[0]: filetab offset 0
        put(&mut t, 0x160, b"/src/a.go\0");
        // pctab: file index 0 throughout (at 1); lines 10, 20, 11 (at 4); inline index -1, 0,
        // -1 (at 11). Values are zig-zag deltas from -1, pcs deltas from the entry.
        put(&mut t, 0x181, &[2, 0x40, 0]);
        put(&mut t, 0x184, &[22, 0x10, 20, 0x10, 17, 0x20, 0]);
        put(&mut t, 0x18b, &[0, 0x10, 2, 0x10, 1, 0x20, 0]);
        let (func, pcdata_at) = match layout {
            Layout::Go116 => {
                put(&mut t, 0x200, &0x401000u64.to_le_bytes());
                put(&mut t, 0x208, &0x20u64.to_le_bytes());
                put(&mut t, 0x210, &0x401040u64.to_le_bytes());
                put(&mut t, 0x220, &0x401000u64.to_le_bytes());
                (0x228, 0x220 + 44)
            }
            _ => {
                put(&mut t, 0x200, &0u32.to_le_bytes());
                put(&mut t, 0x204, &0x20u32.to_le_bytes());
                put(&mut t, 0x208, &0x40u32.to_le_bytes());
                (0x224, 0x220 + layout.func_size() as usize)
            }
        };
        // nameOff, args, deferreturn, pcsp, pcfile, pcln, npcdata, cuOffset.
        for (index, value) in [1u32, 0, 0, 0, 1, 4, 3, 0].into_iter().enumerate() {
            put(&mut t, func + 4 * index, &value.to_le_bytes());
        }
        t[0x220 + if layout == Layout::Go118 { 39 } else { 43 }] = 4; // nfuncdata
        for (index, value) in [0u32, 0, 11].into_iter().enumerate() {
            put(&mut t, pcdata_at + 4 * index, &value.to_le_bytes());
        }
        let funcdata_at = pcdata_at + 12;
        match layout {
            Layout::Go116 => put(&mut t, funcdata_at + 24, &0x500000u64.to_le_bytes()),
            _ => {
                put(&mut t, funcdata_at, &[0xff; 12]);
                put(&mut t, funcdata_at + 12, &0x80u32.to_le_bytes());
            }
        }
        let tree = match layout {
            // funcID, pad, nameOff 12 (main.inl), parentPc 0x30, startLine.
            Layout::Go120 => [0, 0, 0, 0, 12, 0, 0, 0, 0x30, 0, 0, 0, 5, 0, 0, 0].to_vec(),
            // parent -1, funcID, pad, file 0, line 11, func_ 12, parentPc 0x30.
            _ => [0xff, 0xff, 0, 0, 0, 0, 0, 0, 11, 0, 0, 0, 12, 0, 0, 0, 0x30, 0, 0, 0].to_vec(),
        };
        (t, tree)
    }

    #[test]
    fn each_layout_names_functions_lines_and_inlined_calls() {
        for layout in [Layout::Go116, Layout::Go118, Layout::Go120] {
            let (bytes, tree) = one_function_table(layout);
            let header = crate::symbolize::go::header::parse(&bytes).unwrap();
            let table = Table { bytes: &bytes, header };
            assert!(table.find(0x400fff).is_none() && table.find(0x401040).is_none(), "{layout:?}");
            let func = table.find(0x401018).unwrap();
            let tree_at = if layout == Layout::Go116 { 0x500000 } else { 0x80 };
            assert_eq!(table.funcdata(&func, FUNCDATA_INL_TREE), Some(tree_at), "{layout:?}");
            let frame = |function: &str, line, offset| Frame {
                function: function.to_string(),
                file: Some("/src/a.go".to_string()),
                line,
                offset,
            };
            let at = |pc| frames(&table, &func, pc, Some(&tree)).unwrap();
            assert_eq!(at(0x401008), [frame("main.outer", 10, 8)], "{layout:?}");
            assert_eq!(at(0x401018), [frame("main.inl", 20, 0x18), frame("main.outer", 11, 0x18)], "{layout:?}");
            assert_eq!(at(0x40103f), [frame("main.outer", 11, 0x3f)], "{layout:?}");
            // Without its tree, the function's own name with the innermost line.
            assert_eq!(frames(&table, &func, 0x401018, None).unwrap(), [frame("main.outer", 20, 0x18)]);
        }
    }
}
