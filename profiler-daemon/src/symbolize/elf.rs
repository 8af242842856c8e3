//! The symbolizer's ELF side, which runs on its offload worker (see [`crate::offload`]): it
//! opens the files processes map, so it may block on a file system that does not answer.
//!
//! A file is known by its identity as `/proc/PID/maps` gives it (device, inode), checked
//! against its size and modification time whenever it is opened again, so a binary rebuilt or
//! upgraded in place gets its own symbols, and one process's file never names another's. It
//! is opened once per request and checked on the descriptor (see [`crate::opened`]): through
//! `/proc/PID/map_files`, the mapping itself, while the process lives; by its path (with no
//! symlink followed, else inside the process's root) once it is gone. A container's library
//! is never read from the host's file that happens to have its path, and no path is looked up
//! twice. blazesym parses the open descriptor (`/proc/self/fd/N`), which its parser keeps
//! open. Once its process has exited and its path names another file, a file is named from
//! what was found while it lived.
//!
//! Each file has a blazesym parser of its own, so one file can be closed without the others:
//! a program that ran once (a script's interpreter with its debug info: 14 MiB here) gives its
//! memory back once it has been idle a while ([`ElfFiles::close_idle`]), and the files of the
//! programs running now are not parsed again for it.
//!
//! Names come from the file's separate debug file when one is found ([`super::debug_file`]:
//! by build id, then by debug link, inside the process's root), else from the file itself:
//! its DWARF, its symbol tables, or its MiniDebugInfo ([`super::minidebug`]). A debug file is
//! given to blazesym directly, with the addresses the mapped file's segments give the
//! offsets: blazesym parses the debug file only, never the mapped one, and does no lookup
//! of its own (no CRC of a file found by build id, no host path for a container's file).
//!
//! A Go binary is named from its pclntab first ([`super::go`]): Go's own names, lines and
//! inlined calls, also when it is stripped. What its table does not cover (the C code of a
//! cgo build) goes to blazesym.

use std::{
    collections::HashMap,
    os::{fd::AsRawFd, unix::fs::MetadataExt},
    time::{Duration, Instant},
};

use blazesym::symbolize::{
    source::{Elf, Source},
    Input, Symbolizer as Blaze,
};

use super::{
    collect,
    debug_file::{self, DebugFile, Wanted},
    go::GoTable,
    minidebug, new_blaze, Frames, NameSource,
};
use crate::{
    elf::{
        build_id_any, debug_info_bytes, debug_link, file_offset_to_vaddr, has_section, load_segments, raw_section,
        unreadable_compressed_sections, LoadSegment, MappedFile, MAX_INFLATED_BYTES,
    },
    ids::Pid,
    offload::Charger,
    opened::{self, OpenedFile},
    procs::{Device, MapEntry},
};

/// What to symbolize in one mapped file.
#[derive(Clone, Debug)]
pub struct ElfRequest {
    pub pid: Pid,
    pub map: MapEntry,
    /// File offsets.
    pub offsets: Vec<u64>,
}

/// The answer: one result per offset, the file's build id, and what the profile should say
/// about the file (why it has no source lines, why it was not read).
#[derive(Clone, Debug, Default)]
pub struct ElfAnswer {
    pub frames: Vec<Frames>,
    /// Where each offset's name came from ([`NameSource::Unnamed`] when nothing named it).
    pub sources: Vec<NameSource>,
    pub build_id: Option<String>,
    pub note: Option<String>,
}

/// (device, inode) as the maps file names a mapped file.
type FileKey = (Device, u64);

/// One file's findings.
#[derive(Default)]
struct FileSymbols {
    /// (size, mtime) when last opened: a file rewritten in place is read afresh.
    version: (u64, i64),
    frames: HashMap<u64, Frames>,
    /// Where each name found came from.
    sources: HashMap<u64, NameSource>,
    build_id: Option<String>,
    /// Why its debug info is not read, when it is not.
    no_debug_info: Option<String>,
    /// Its separate debug file, when one was found: blazesym parses it instead of the file.
    debug: Option<DebugFile>,
    /// The file's `PT_LOAD` segments, which turn its offsets into the debug file's addresses.
    segments: Vec<LoadSegment>,
    /// Whether blazesym reads DWARF (the debug file's, or the file's own).
    debug_syms: bool,
    /// Where blazesym's names for this file come from.
    source: NameSource,
    /// Why blazesym is not given the file at all (a MiniDebugInfo it must not inflate).
    unreadable: Option<String>,
    /// Whether `no_debug_info` was decided.
    checked: bool,
    /// The file open and parsed, with when it was last asked for addresses not yet found
    /// and the descriptor it parses (its path names that descriptor).
    parser: Option<(Blaze, Instant, OpenedFile)>,
    /// Its pclntab, when it is a Go binary.
    go: GoFile,
    /// Why its pclntab was not read, or read without inlined calls.
    go_note: Option<String>,
    /// Whether it is a Go binary named from its pclntab (kept when the table is closed).
    go_named: bool,
}

/// Whether a file was looked at as a Go binary, and its mapped pclntab while it is open.
#[derive(Default)]
enum GoFile {
    /// Not looked at yet, or closed while idle.
    #[default]
    Unread,
    /// No Go binary, or one whose pclntab could not be read (see `go_note`).
    NotGo,
    /// Its table, with when it was last asked for addresses.
    Open(GoTable, Instant),
}

impl FileSymbols {
    /// Reads what the file says about its names, once per version: its build id, its debug
    /// file (found, opened and checked), its MiniDebugInfo, and whether its DWARF may be read.
    fn prepare(&mut self, opened: &OpenedFile, pid: Pid, path: &str, own_exe: bool, max_debug_info: Option<u64>) {
        let Ok(mapped) = MappedFile::map(opened.file()) else { return };
        let bytes = mapped.bytes();
        self.build_id = build_id_any(bytes);
        if own_exe {
            return;
        }
        self.segments = load_segments(bytes).unwrap_or_default();
        let link = debug_link(bytes);
        let identity = opened.file().metadata().map_or((0, 0), |m| (m.dev(), m.ino()));
        let wanted = Wanted {
            build_id: self.build_id.as_deref(),
            link: link.as_ref().map(|(name, crc)| (name.as_str(), *crc)),
            mapped_path: path,
            identity,
        };
        if let Some(found) = debug_file::find(&debug_file::root_of(pid), &wanted) {
            tracing::debug!(path, debug_file = found.path, found_by = ?found.found_by, "separate debug file found");
            let described = format!("{path} (debug file {})", found.path);
            self.no_debug_info = MappedFile::map(&found.file).ok().and_then(|debug_bytes| {
                // A distribution's debug file (libc6-dbg's) has compressed sections:
                // counting them would inflate them all once more than blazesym does.
                let trusted = found.file.metadata().is_ok_and(|m| m.uid() == 0 && m.mode() & 0o022 == 0);
                debug_info_refusal(debug_bytes.bytes(), &described, max_debug_info, trusted)
            });
            self.debug_syms = self.no_debug_info.is_none();
            self.source = NameSource::DebugFile;
            self.debug = Some(found);
            return;
        }
        if !has_section(bytes, ".symtab") {
            if let Some(section) = raw_section(bytes, ".gnu_debugdata") {
                match minidebug::check(section, minidebug::MAX_MINIDEBUG_BYTES) {
                    Ok(_) => self.source = NameSource::MiniDebugInfo,
                    Err(why) => {
                        self.unreadable = Some(format!("{path}: {why}: its functions are not named"));
                        return;
                    }
                }
            }
        }
        // Only the file's own DWARF: without it blazesym would look for the debug file
        // itself (by host paths, with a CRC), which was just done.
        self.no_debug_info = debug_info_refusal(bytes, path, max_debug_info, false);
        self.debug_syms = self.no_debug_info.is_none() && has_section(bytes, ".debug_info");
    }

    /// Names the offsets of `todo` with blazesym, from the debug file when there is one
    /// (by the addresses the file's segments give them), else from the file.
    fn name_with_blazesym(&mut self, opened: OpenedFile, todo: &[u64]) {
        if self.unreadable.is_some() {
            for &offset in todo {
                self.frames.insert(offset, Vec::new());
            }
            return;
        }
        // A parser kept from before parses the descriptor it was made with (the same
        // file: the version matched).
        let (blaze, used, parsed) = self.parser.get_or_insert_with(|| (new_blaze(), Instant::now(), opened));
        *used = Instant::now();
        let found: Vec<Frames> = match &self.debug {
            Some(debug) => {
                let mut elf = Elf::new(format!("/proc/self/fd/{}", debug.file.as_raw_fd()));
                elf.debug_syms = self.debug_syms;
                let addrs: Vec<Option<u64>> =
                    todo.iter().map(|&offset| file_offset_to_vaddr(&self.segments, offset)).collect();
                let known: Vec<u64> = addrs.iter().flatten().copied().collect();
                let results = blaze.symbolize(&Source::Elf(elf), Input::VirtOffset(&known));
                let mut named = collect(results, known.len()).into_iter();
                addrs.iter().map(|addr| addr.and_then(|_| named.next()).unwrap_or_default()).collect()
            }
            None => {
                let mut elf = Elf::new(parsed.fd_path());
                elf.debug_syms = self.debug_syms;
                collect(blaze.symbolize(&Source::Elf(elf), Input::FileOffset(todo)), todo.len())
            }
        };
        for (&offset, frames) in todo.iter().zip(found) {
            let source = if frames.is_empty() { NameSource::Unnamed } else { self.source };
            self.sources.insert(offset, source);
            self.frames.insert(offset, frames);
        }
    }

    /// Names the offsets of `todo` its pclntab names, if it is a Go binary (read on first
    /// use); returns the rest, for blazesym.
    fn name_from_go(&mut self, opened: &OpenedFile, path: &str, todo: Vec<u64>) -> Vec<u64> {
        if matches!(self.go, GoFile::Unread) {
            self.go = match GoTable::open(opened.file()) {
                Ok(Some(table)) => {
                    if !table.expands_inlined_calls() {
                        let version = table.version.as_deref().unwrap_or("of unknown version");
                        self.go_note = Some(format!(
                            "{path}: Go binary ({version}) whose moduledata was not found: inlined calls are not \
                             expanded"
                        ));
                    }
                    self.go_named = true;
                    GoFile::Open(table, Instant::now())
                }
                Ok(None) => GoFile::NotGo,
                Err(err) => {
                    self.go_note = Some(format!("{path}: Go pclntab not read ({err}): named from its symbol table"));
                    GoFile::NotGo
                }
            };
        }
        let GoFile::Open(table, used) = &mut self.go else { return todo };
        *used = Instant::now();
        let (frames, sources) = (&mut self.frames, &mut self.sources);
        todo.into_iter()
            .filter(|&offset| match table.frames(offset) {
                Some(found) => {
                    frames.insert(offset, found);
                    sources.insert(offset, NameSource::GoPclntab);
                    false
                }
                None => true,
            })
            .collect()
    }
}

/// The worker's state: blazesym's open files and everything found so far.
#[derive(Default)]
pub struct ElfFiles {
    files: HashMap<FileKey, FileSymbols>,
    /// (device, inode) of the profiler's own executable, named from its symbol table only.
    own_exe: Option<Option<(u64, u64)>>,
    /// Files with more DWARF than this are named from their symbol tables (when set: see
    /// [`super::Symbolizer::set_max_debug_info`]).
    pub max_debug_info: Option<u64>,
}

impl ElfFiles {
    /// Symbolizes `request`: cached offsets from memory, the rest from the file, opened on
    /// this worker (a stall charged as `charger` is told: see [`opened::open_on_worker`]).
    pub fn symbolize(&mut self, request: &ElfRequest, charger: &Charger) -> ElfAnswer {
        let map = &request.map;
        let key = (map.device, map.inode);
        let opened = opened::open_on_worker(charger, request.pid, map);
        let own_exe = self.own_exe(opened.as_ref());
        let file = self.files.entry(key).or_default();
        let mut note = None;
        match &opened {
            Some(opened) if opened.version() != file.version || !file.checked => {
                *file = FileSymbols { version: opened.version(), ..FileSymbols::default() };
            }
            Some(_) => {}
            None => {
                note = Some(format!(
                    "{} (pid {}) could not be opened any more: only addresses named while it lived are named",
                    map.path, request.pid
                ))
            }
        }
        let todo: Vec<u64> = request.offsets.iter().copied().filter(|off| !file.frames.contains_key(off)).collect();
        if let Some(opened) = opened {
            if !file.checked {
                file.checked = true;
                file.prepare(&opened, request.pid, &map.path, own_exe, self.max_debug_info);
            }
            let todo = file.name_from_go(&opened, &map.path, todo);
            if !todo.is_empty() {
                file.name_with_blazesym(opened, &todo);
            }
            // A Go binary's lines come from its pclntab: its DWARF refused takes none away
            // (but from the C code of a cgo build).
            let debug_note = file.no_debug_info.clone().filter(|_| !file.go_named);
            note = note.or_else(|| file.unreadable.clone()).or_else(|| file.go_note.clone()).or(debug_note);
        }
        ElfAnswer {
            frames: request.offsets.iter().map(|off| file.frames.get(off).cloned().unwrap_or_default()).collect(),
            sources: request
                .offsets
                .iter()
                .map(|off| file.sources.get(off).copied().unwrap_or(NameSource::Unnamed))
                .collect(),
            build_id: file.build_id.clone(),
            note,
        }
    }

    /// Closes blazesym's files (their mapped pages and parsed debug info), keeping every
    /// symbol found.
    pub fn close_files(&mut self) {
        self.close_idle(Duration::ZERO);
    }

    /// Closes the files not asked for new addresses for `idle`, keeping their symbols found.
    /// Returns how many were closed.
    pub fn close_idle(&mut self, idle: Duration) -> usize {
        let mut closed = 0;
        for file in self.files.values_mut() {
            if file.parser.as_ref().is_some_and(|(_, used, _)| used.elapsed() >= idle) {
                file.parser = None;
                closed += 1;
            }
            if matches!(&file.go, GoFile::Open(_, used) if used.elapsed() >= idle) {
                file.go = GoFile::Unread;
                closed += 1;
            }
        }
        closed
    }

    /// How many files are open and parsed.
    #[cfg(test)]
    fn open_files(&self) -> usize {
        self.files.values().filter(|file| file.parser.is_some()).count()
    }

    fn own_exe(&mut self, opened: Option<&OpenedFile>) -> bool {
        let own =
            *self.own_exe.get_or_insert_with(|| std::fs::metadata("/proc/self/exe").ok().map(|m| (m.dev(), m.ino())));
        match (own, opened) {
            (Some(own), Some(opened)) => opened.file().metadata().is_ok_and(|m| (m.dev(), m.ino()) == own),
            _ => false,
        }
    }
}

/// Why the debug info of the ELF file `bytes` (named `path`) must not be read, if it must not:
/// blazesym inflates a compressed debug section whole, and a file any user can write may
/// declare (or hold) gigabytes, or use a compression it cannot read (and then names
/// nothing). Such a file is named from its symbol table, and so is one with more DWARF than
/// `max_debug_info`, when set.
/// A file only root can have written (`trusted`) is judged by the sizes its sections declare.
fn debug_info_refusal(bytes: &[u8], path: &str, max_debug_info: Option<u64>, trusted: bool) -> Option<String> {
    // A section past the inflate cap first: it is the reason that names the section.
    if let Some((name, why)) = unreadable_compressed_sections(bytes, MAX_INFLATED_BYTES, trusted).ok()?.first() {
        return Some(format!(
            "{path}: compressed section {name} {why}: named from its symbol table, without source lines"
        ));
    }
    let cap = max_debug_info?;
    let bytes = debug_info_bytes(bytes).ok()?;
    (bytes > cap).then(|| {
        format!(
            "{path}: {} MiB of debug info, over the {} MiB one file may use here: named from its symbol table, \
             without source lines",
            bytes >> 20,
            cap >> 20
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn own_mapping_of(addr: u64) -> MapEntry {
        let maps = crate::procs::read_maps(std::process::id()).unwrap();
        maps.into_iter().find(|m| m.contains(addr)).unwrap()
    }

    #[inline(never)]
    fn marker_for_elf_files_test() -> u64 {
        std::hint::black_box(7)
    }

    #[test]
    fn a_file_is_found_by_its_identity_and_named_once() {
        let addr = marker_for_elf_files_test as fn() -> u64 as usize as u64;
        let map = own_mapping_of(addr);
        let pid = Pid(std::process::id());
        let charger = Charger::default();
        let mut files = ElfFiles::default();
        let request = ElfRequest { pid, map: map.clone(), offsets: vec![map.file_offset(addr)] };
        let answer = files.symbolize(&request, &charger);
        assert!(answer.frames[0].iter().any(|f| f.function.ends_with("marker_for_elf_files_test")), "{answer:?}");
        assert!(answer.build_id.is_some());
        assert_eq!(files.open_files(), 1);
        assert_eq!(files.close_idle(Duration::from_secs(3600)), 0, "used just now");
        assert_eq!(files.open_files(), 1);
        assert_eq!(files.close_idle(Duration::ZERO), 1);
        assert_eq!(files.open_files(), 0);
        assert_eq!(files.symbolize(&request, &charger).frames, answer.frames, "kept after closing");
        assert_eq!(files.open_files(), 0, "a known offset needs no parser");
        // A new offset opens the file again.
        let other = ElfRequest { offsets: vec![map.file_offset(addr) + 1], ..request.clone() };
        assert!(!files.symbolize(&other, &charger).frames[0].is_empty());
        assert_eq!(files.open_files(), 1);
        files.close_files();
        assert_eq!(files.open_files(), 0);
        assert_eq!(files.symbolize(&request, &charger).frames, answer.frames, "kept after closing");
        // Another file at the mapped path (a container's file of the same name): not used.
        let elsewhere = MapEntry { inode: map.inode + 1, ..map.clone() };
        assert!(opened::open_by_path(Pid(0x7fff_fff0), &elsewhere).is_err());
    }
}
