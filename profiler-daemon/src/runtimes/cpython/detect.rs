//! Whether a process runs CPython, which version, and where its runtime state is: the
//! executable or a mapped `libpython3.X.so*` that exports `_PyRuntime` (a static build
//! exports it from the executable, a shared one from the library).
//!
//! Addresses come from the file's symbol table ([`symbolize::symbol_addresses`]) and the
//! process's mappings: the executable mapping that holds `_PyEval_EvalFrameDefault`'s file
//! offset gives the load bias, which places `_PyRuntime`, `Py_Version` and `PyCode_Type`
//! (data, whose mappings the catalogue does not keep). The version is `Py_Version` (a
//! `uint32` hex version, exported since 3.11), else the library's name.

use std::path::Path;

use super::{
    memory::Remote,
    offsets::{self, Offsets},
    ReadFailure,
};
use crate::{
    ids::Pid,
    opened::OpenedFile,
    procs::MapEntry,
    symbolize::{self, SymbolAddress},
};

/// A CPython interpreter found in a process.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Interpreter {
    /// (major, minor).
    pub version: (u8, u8),
    /// The file that exports `_PyRuntime`.
    pub path: String,
    /// `_PyRuntime`'s address in the process.
    pub runtime: u64,
    /// `PyCode_Type`'s address, when exported: a code object's type pointer must equal it.
    pub code_type: Option<u64>,
    pub offsets: Offsets,
}

/// What detection found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Detection {
    /// No mapped file exports `_PyRuntime`.
    NotPython,
    /// CPython of a version (or build) the reader does not know: native frames only, and why.
    Unsupported(String),
    Python(Box<Interpreter>),
}

const SYMBOLS: [&str; 4] = ["_PyRuntime", "_PyEval_EvalFrameDefault", "Py_Version", "PyCode_Type"];

/// Looks for CPython in `maps` (the process's executable mappings) and `exe`, reading each
/// candidate file as `open` opens it (once, checked: see [`crate::opened`]; the caller
/// decides where that may block).
pub fn detect(
    pid: Pid,
    maps: &[MapEntry],
    exe: Option<&Path>,
    open: &dyn Fn(&MapEntry) -> Option<OpenedFile>,
) -> Result<Detection, ReadFailure> {
    let remote = Remote { pid };
    let mut seen = Vec::new();
    let mut unopened = None;
    for map in maps.iter().filter(|m| !m.unmapped && m.is_file()) {
        if seen.contains(&(map.device, map.inode)) || !candidate(map, exe) {
            continue;
        }
        seen.push((map.device, map.inode));
        let Some(file) = open(map) else {
            unopened = Some(map.path.to_string());
            continue;
        };
        let found = symbolize::symbol_addresses(&file.fd_path(), &SYMBOLS);
        let (Some(runtime), Some(eval)) = (found[0], found[1]) else { continue };
        return interpreter(&remote, maps, map, runtime, eval, found[2], found[3]).map(|found| match found {
            Ok(interpreter) => Detection::Python(Box::new(interpreter)),
            Err(why) => Detection::Unsupported(why),
        });
    }
    match unopened {
        Some(path) => Err(ReadFailure::Unopened(path)),
        None => Ok(Detection::NotPython),
    }
}

/// The executable, or a file named like CPython's library or interpreter (checking every
/// mapped library's symbols would read every file of every process dumped).
fn candidate(map: &MapEntry, exe: Option<&Path>) -> bool {
    let name = map.path.rsplit('/').next().unwrap_or("");
    exe.is_some_and(|e| e.as_os_str() == &*map.path) || name.starts_with("libpython") || name.starts_with("python")
}

fn interpreter(
    remote: &Remote,
    maps: &[MapEntry],
    map: &MapEntry,
    runtime: SymbolAddress,
    eval: SymbolAddress,
    version: Option<SymbolAddress>,
    code_type: Option<SymbolAddress>,
) -> Result<Result<Interpreter, String>, ReadFailure> {
    let Some(bias) = load_bias(maps, map, eval) else {
        return Ok(Err(format!("{}: _PyEval_EvalFrameDefault is in no executable mapping", map.path)));
    };
    let at = |s: SymbolAddress| s.vaddr.wrapping_add(bias);
    let version = match version {
        Some(v) => {
            let hex = remote.u32(at(v))?;
            ((hex >> 24) as u8, (hex >> 16) as u8)
        }
        None => match version_from_name(&map.path) {
            Some(v) => v,
            None => return Ok(Err(format!("{}: CPython of unknown version (no Py_Version)", map.path))),
        },
    };
    let runtime = at(runtime);
    let offsets = match version {
        (3, 11) => offsets::V3_11,
        (3, 12) => offsets::V3_12,
        (3, 13) => match Offsets::from_debug_offsets(remote, runtime) {
            Ok(offsets) => offsets,
            Err(ReadFailure::Layout(why)) => return Ok(Err(format!("{}: {why}", map.path))),
            Err(err) => return Err(err),
        },
        (major, minor) => {
            return Ok(Err(format!("{}: CPython {major}.{minor} (the reader knows 3.11, 3.12 and 3.13)", map.path)))
        }
    };
    Ok(Ok(Interpreter { version, path: map.path.to_string(), runtime, code_type: code_type.map(at), offsets }))
}

/// Runtime address minus the file's own virtual address, from the executable mapping of
/// `map`'s file that holds `symbol`'s file offset.
fn load_bias(maps: &[MapEntry], map: &MapEntry, symbol: SymbolAddress) -> Option<u64> {
    let offset = symbol.file_offset?;
    let text = maps.iter().find(|m| {
        (m.device, m.inode) == (map.device, map.inode) && (m.offset..m.offset + (m.end - m.start)).contains(&offset)
    })?;
    Some((text.start + (offset - text.offset)).wrapping_sub(symbol.vaddr))
}

/// `libpython3.12.so.1.0` → (3, 12).
fn version_from_name(path: &str) -> Option<(u8, u8)> {
    let name = path.rsplit('/').next()?;
    let rest = name.strip_prefix("libpython").or_else(|| name.strip_prefix("python"))?;
    let mut parts = rest.split(|c: char| !c.is_ascii_digit());
    Some((parts.next()?.parse().ok()?, parts.next()?.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_from_names() {
        assert_eq!(version_from_name("/usr/lib/libpython3.12.so.1.0"), Some((3, 12)));
        assert_eq!(version_from_name("/usr/bin/python3.11"), Some((3, 11)));
        assert_eq!(version_from_name("/usr/lib/libpython3.so"), None);
        assert_eq!(version_from_name("/usr/bin/perl"), None);
    }
}
