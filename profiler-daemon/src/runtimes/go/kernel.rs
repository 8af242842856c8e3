//! What the CPU program is given of a Go process (`GO_PROCESSES`), to read the pprof labels
//! of the goroutine each sample interrupted: where a thread keeps its current `g` (amd64: at
//! a fixed offset from the thread's TLS base, `fsbase`), and where `g` keeps its labels
//! ([`super::layout`], by the binary's Go version, [`super::binary`]).
//!
//! Where `g` is: Go's amd64 code reads it as `runtime.tlsg`, a thread-local variable
//! (`src/runtime/go_tls.h`, `get_tls`; `src/cmd/link/internal/ld`), in the executable's TLS
//! block, which on x86-64 (TLS variant II) ends at `fsbase`: `g` is at
//! `fsbase - roundup(PT_TLS memsz, align) + tlsg's offset in the block`. Internally linked,
//! the block is `runtime.tlsg` alone: -8 (Go's own `-8(FS)`); a static pure-Go binary has no
//! TLS segment at all and sets the thread pointer itself, 8 bytes past `m.tls[0]` (also -8,
//! `runtime·settls` in `src/runtime/sys_linux_amd64.s`). Externally linked (cgo with C
//! thread-locals), the C variables share the block and the offset moves (-48 with 24 bytes
//! of C `__thread` data); the symbol table says where. A stripped binary (`-s`) has no
//! symbol for it: its block must then be `runtime.tlsg` alone (8 bytes), else it is refused.

use profiler_common::runtimes::go::{GoProcess, GO_LABELS_LIST, GO_LABELS_MAP};

use super::{binary, layout};

/// The entry for the Go executable `bytes`: `Ok(None)` when it is not Go, an error saying
/// why for a Go binary whose labels cannot be read (a version without a known layout, a TLS
/// block the reader cannot place `g` in).
pub fn entry(bytes: &[u8]) -> Result<Option<GoProcess>, String> {
    let go = match binary::read(bytes) {
        Ok(Some(go)) => go,
        // Not an ELF file the reader can parse: not one it could read labels of either.
        Ok(None) | Err(binary::BinaryError::Elf(_)) => return Ok(None),
        Err(err) => return Err(format!("Go executable whose build facts could not be read: {err}")),
    };
    let (major, minor) =
        layout::parse_version(&go.version).ok_or_else(|| format!("{}: not a release version", go.version))?;
    let layout = layout::for_version(major, minor)
        .ok_or_else(|| format!("{}: no g layout known for this version; samples carry no labels", go.version))?;
    let tls = crate::elf::tls_segment(bytes).map_err(|err| format!("{}: program headers: {err}", go.version))?;
    let tlsg = go.symbols.as_ref().and_then(|symbols| symbols.globals[binary::TLSG]);
    let g_tls_offset = g_offset(tls, tlsg).map_err(|why| format!("{}: {why}", go.version))?;
    let labels_offset =
        u32::try_from(layout.labels).map_err(|_| format!("{}: g.labels offset out of range", go.version))?;
    Ok(Some(GoProcess { g_tls_offset, labels_offset, labels_form: labels_form(layout.labels_repr) }))
}

/// `g`'s offset from `fsbase`, from the `PT_TLS` (memory size, alignment) and `runtime.tlsg`'s
/// offset in the block, if the symbol table has it.
pub fn g_offset(tls: Option<(u64, u64)>, tlsg: Option<u64>) -> Result<i64, String> {
    // No TLS segment: no libc owns the thread pointer (a static pure-Go binary); Go's own
    // `runtime·settls` points it 8 bytes past `m.tls[0]`, where g is (`sys_linux_amd64.s`).
    let Some((size, align)) = tls else { return Ok(-8) };
    let tlsg = match tlsg {
        Some(offset) => offset,
        None if size == 8 => 0,
        None => {
            return Err(format!(
                "a TLS block of {size} bytes and no symbol table (-s): where runtime.tlsg is in it is unknown"
            ))
        }
    };
    let block = size.checked_next_multiple_of(align.max(1)).filter(|&b| b <= 1 << 20 && tlsg + 8 <= b);
    let block = block.ok_or_else(|| format!("a TLS block of {size} bytes aligned to {align}: not one Go writes"))?;
    Ok(tlsg as i64 - block as i64)
}

/// The kernel's code for how `g.labels` holds the labels (the layout's: a map before Go
/// 1.24, a sorted list from it).
fn labels_form(repr: layout::LabelsRepr) -> u32 {
    match repr {
        layout::LabelsRepr::Map => GO_LABELS_MAP,
        layout::LabelsRepr::List => GO_LABELS_LIST,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn g_is_found_below_the_tls_base_as_gos_code_reads_it() {
        // Internally linked: `mov %fs:-8, %r14`.
        assert_eq!(g_offset(Some((8, 8)), Some(0)), Ok(-8));
        assert_eq!(g_offset(Some((8, 8)), None), Ok(-8), "stripped, runtime.tlsg alone");
        // Externally linked with 24 bytes of C `__thread` data after it: `mov %fs:-0x30, %r14`.
        assert_eq!(g_offset(Some((0x28, 0x10)), Some(0)), Ok(-48));
        assert_eq!(g_offset(Some((0x28, 0x10)), Some(0x20)), Ok(-16));
        assert!(g_offset(Some((0x28, 0x10)), None).unwrap_err().contains("-s"));
        assert_eq!(g_offset(None, None), Ok(-8), "static: Go's settls, g at -8(FS)");
        assert!(g_offset(Some((8, 8)), Some(64)).is_err(), "tlsg past the block");
    }

    #[test]
    fn the_labels_form_follows_the_version() {
        let form = |minor| labels_form(layout::for_version(1, minor).expect("a known version").labels_repr);
        assert_eq!(form(19), GO_LABELS_MAP);
        assert_eq!(form(23), GO_LABELS_MAP);
        assert_eq!(form(24), GO_LABELS_LIST);
    }
}
