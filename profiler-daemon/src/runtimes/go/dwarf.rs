//! A Go binary's own [`Layout`], from its DWARF, when it has one (built without `-w`): the
//! offsets of `runtime.g`, `gobuf`, `stack` and `m`'s fields as the compiler laid them out,
//! whatever the version, and the labels' form from whether `runtime/pprof.labelMap` is a
//! struct (Go 1.24's `labelMap{LabelSet}`) or a map. Preferred to the per-version tables of
//! [`super::layout`], which stay for binaries without DWARF; a version with no table is read
//! this way too.
//!
//! Only the compile units of the packages `runtime` and `runtime/pprof` are walked (Go emits
//! one unit a package), so a large binary costs what its runtime's types cost.

use std::collections::HashMap;

use gimli::{AttributeValue, EndianSlice, LittleEndian};

use super::layout::{self, LabelsRepr, Layout};
use crate::elf::Elf;

/// The structs read, and the units they are in.
const STRUCTS: [&str; 5] = ["runtime.g", "runtime.gobuf", "runtime.stack", "runtime.m", "runtime/pprof.labelMap"];
const UNITS: [&str; 2] = ["runtime", "runtime/pprof"];
/// Bytes of DWARF sections read at most (inflated); a Go binary's are a few MiB.
const MAX_SECTION_BYTES: usize = 256 << 20;

/// `(struct, member) → offset` of [`STRUCTS`]' members.
pub type Members = HashMap<(String, String), u64>;

/// The layout the DWARF of the ELF file `bytes` gives; `Ok(None)` when it has no DWARF, an
/// error naming what is missing or unreadable. `version`: the binary's Go version, for the
/// wait reason table (the strings are read from the process first) and for the labels' form
/// when `runtime/pprof` is not linked in (then no goroutine has labels).
pub fn layout(bytes: &[u8], version: (u32, u32)) -> Result<Option<Layout>, String> {
    let Some(members) = members(bytes)? else { return Ok(None) };
    let get = |ty: &str, name: &str| members.get(&(ty.to_string(), name.to_string())).copied();
    let field = |ty: &str, name: &str| get(ty, name).ok_or_else(|| format!("no {ty}.{name} in its DWARF"));
    let stack = field("runtime.g", "stack")?;
    let sched = field("runtime.g", "sched")?;
    let g = |name: &str| field("runtime.g", name);
    let labels = g("labels")?;
    let list = get("runtime/pprof.labelMap", "LabelSet").is_some() || version >= (1, 24);
    let found = Layout {
        stack_lo: stack + field("runtime.stack", "lo")?,
        stack_hi: stack + field("runtime.stack", "hi")?,
        m: g("m")?,
        sched_sp: sched + field("runtime.gobuf", "sp")?,
        sched_pc: sched + field("runtime.gobuf", "pc")?,
        sched_bp: sched + field("runtime.gobuf", "bp")?,
        syscall_sp: g("syscallsp")?,
        syscall_pc: g("syscallpc")?,
        atomicstatus: g("atomicstatus")?,
        goid: g("goid")?,
        waitsince: g("waitsince")?,
        waitreason: g("waitreason")?,
        lockedm: g("lockedm")?,
        gopc: g("gopc")?,
        startpc: g("startpc")?,
        labels,
        labels_repr: if list { LabelsRepr::List } else { LabelsRepr::Map },
        parent_goid: get("runtime.g", "parentGoid"),
        g_read: 0,
        m_procid: field("runtime.m", "procid")?,
        m_curg: field("runtime.m", "curg")?,
        wait_reasons: layout::for_version(version.0, version.1).map_or(&[], |l| l.wait_reasons),
    };
    let last = [found.stack_hi, found.sched_bp, found.syscall_pc, found.atomicstatus, found.goid, found.waitsince]
        .into_iter()
        .chain([found.lockedm, found.gopc, found.startpc, found.labels, found.parent_goid.unwrap_or(0)])
        .max()
        .unwrap_or(0);
    Ok(Some(Layout { g_read: last + 8, ..found }))
}

/// The members of [`STRUCTS`]; `Ok(None)` without a `.debug_info` section.
pub fn members(bytes: &[u8]) -> Result<Option<Members>, String> {
    let elf = Elf::parse(bytes).map_err(|e| e.to_string())?;
    if elf.section(".debug_info").is_none() {
        return Ok(None);
    }
    let mut sections = Vec::new();
    let load = |id: gimli::SectionId| -> Result<Vec<u8>, String> {
        let Some(section) = elf.section(id.name()) else { return Ok(Vec::new()) };
        let data = elf.data(&section).map_err(|e| format!("{}: {e}", id.name()))?;
        if data.len() > MAX_SECTION_BYTES {
            return Err(format!("{} is over {MAX_SECTION_BYTES} bytes", id.name()));
        }
        Ok(data.into_owned())
    };
    // A unit's parse reads its line program header and string forms too.
    for id in [
        gimli::SectionId::DebugInfo,
        gimli::SectionId::DebugAbbrev,
        gimli::SectionId::DebugStr,
        gimli::SectionId::DebugLine,
        gimli::SectionId::DebugLineStr,
        gimli::SectionId::DebugStrOffsets,
        gimli::SectionId::DebugAddr,
        gimli::SectionId::DebugRanges,
        gimli::SectionId::DebugRngLists,
    ] {
        sections.push((id, load(id)?));
    }
    let dwarf = gimli::Dwarf::load(|id| -> Result<EndianSlice<'_, LittleEndian>, gimli::Error> {
        let data = sections.iter().find(|(s, _)| *s == id).map_or(&[][..], |(_, d)| d.as_slice());
        Ok(EndianSlice::new(data, LittleEndian))
    })
    .map_err(|e| e.to_string())?;
    read_members(&dwarf).map(Some).map_err(|e| format!("its DWARF: {e}"))
}

fn read_members(dwarf: &gimli::Dwarf<EndianSlice<'_, LittleEndian>>) -> Result<Members, gimli::Error> {
    let mut out = Members::new();
    let mut units = dwarf.units();
    while let Some(header) = units.next()? {
        let unit = dwarf.unit(header)?;
        let mut entries = unit.entries();
        let name = |entry: &gimli::DebuggingInformationEntry<_>| {
            entry
                .attr_value(gimli::DW_AT_name)
                .and_then(|v| dwarf.attr_string(&unit, v).ok())
                .map(|s| s.to_string_lossy().into_owned())
        };
        let Some(root) = entries.next_dfs()? else { continue };
        if !name(root).is_some_and(|n| UNITS.contains(&n.as_str())) {
            continue;
        }
        let mut current: Option<String> = None;
        while let Some(entry) = entries.next_dfs()? {
            let tag = entry.tag();
            if tag == gimli::DW_TAG_structure_type {
                current = name(entry).filter(|n| STRUCTS.contains(&n.as_str()));
                continue;
            }
            if tag != gimli::DW_TAG_member {
                current = None;
                continue;
            }
            let (Some(ty), Some(member)) = (&current, name(entry)) else { continue };
            if let Some(AttributeValue::Udata(offset)) = entry.attr_value(gimli::DW_AT_data_member_location) {
                out.insert((ty.clone(), member), offset);
            }
        }
    }
    Ok(out)
}
