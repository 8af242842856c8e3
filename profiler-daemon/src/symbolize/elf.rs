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
//! A Go binary is named from its pclntab first ([`super::go`]): Go's own names, lines and
//! inlined calls, also when it is stripped. What its table does not cover (the C code of a
//! cgo build) goes to blazesym.

use std::{
    collections::HashMap,
    os::unix::fs::MetadataExt,
    time::{Duration, Instant},
};

use blazesym::symbolize::{
    source::{Elf, Source},
    Input, Symbolizer as Blaze,
};

use super::{collect, go::GoTable, new_blaze, Frames};
use crate::{
    elf::{debug_info_bytes, links_debug_file, unreadable_compressed_sections, MappedFile, MAX_INFLATED_BYTES},
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
    build_id: Option<String>,
    /// Why its debug info is not read, when it is not.
    no_debug_info: Option<String>,
    /// Its separate debug file is not looked for: a file root does not own that names one
    /// (blazesym looks for it by the mapped path, a path its owner controls).
    no_debug_link: bool,
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
        let frames = &mut self.frames;
        todo.into_iter()
            .filter(|&offset| match table.frames(offset) {
                Some(found) => {
                    frames.insert(offset, found);
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
                file.no_debug_info =
                    if own_exe { None } else { debug_info_refusal(&opened, &map.path, self.max_debug_info) };
                file.no_debug_link = !owned_by_root(&opened) && names_debug_file(&opened);
                file.build_id = super::build_id(&opened.fd_path());
            }
            let todo = file.name_from_go(&opened, &map.path, todo);
            if !todo.is_empty() {
                let debug_syms = !own_exe && file.no_debug_info.is_none() && !file.no_debug_link;
                // A parser kept from before parses the descriptor it was made with (the same
                // file: the version matched).
                let (blaze, used, parsed) = file.parser.get_or_insert_with(|| (new_blaze(), Instant::now(), opened));
                *used = Instant::now();
                let mut elf = Elf::new(parsed.fd_path());
                elf.debug_syms = debug_syms;
                let results = blaze.symbolize(&Source::Elf(elf), Input::FileOffset(&todo));
                for (offset, frames) in todo.iter().zip(collect(results, todo.len())) {
                    file.frames.insert(*offset, frames);
                }
            }
            // A Go binary's lines come from its pclntab: its DWARF refused takes none away
            // (but from the C code of a cgo build).
            let debug_note = file.no_debug_info.clone().filter(|_| !file.go_named);
            note = note.or_else(|| file.go_note.clone()).or(debug_note);
        }
        ElfAnswer {
            frames: request.offsets.iter().map(|off| file.frames.get(off).cloned().unwrap_or_default()).collect(),
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

fn owned_by_root(opened: &OpenedFile) -> bool {
    opened.file().metadata().is_ok_and(|m| m.uid() == 0)
}

/// Whether `opened` names a separate debug file (see [`FileSymbols::no_debug_link`]).
fn names_debug_file(opened: &OpenedFile) -> bool {
    MappedFile::map(opened.file()).is_ok_and(|mapped| links_debug_file(mapped.bytes()))
}

/// Why the debug info of `opened` (mapped at `path`) must not be read, if it must not:
/// blazesym inflates a compressed debug section whole, and a file any user can write may
/// declare (or hold) gigabytes, or use a compression it cannot read (and then names
/// nothing). Such a file is named from its symbol table, and so is one with more DWARF than
/// `max_debug_info`, when set.
fn debug_info_refusal(opened: &OpenedFile, path: &str, max_debug_info: Option<u64>) -> Option<String> {
    let mapped = MappedFile::map(opened.file()).ok()?;
    // A section past the inflate cap first: it is the reason that names the section.
    if let Some((name, why)) = unreadable_compressed_sections(mapped.bytes(), MAX_INFLATED_BYTES).ok()?.first() {
        return Some(format!(
            "{path}: compressed section {name} {why}: named from its symbol table, without source lines"
        ));
    }
    let cap = max_debug_info?;
    let bytes = debug_info_bytes(mapped.bytes()).ok()?;
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
