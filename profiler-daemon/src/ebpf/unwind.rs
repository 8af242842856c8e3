//! The unwinder's side of the session: the row array (memory-mapped, so whole tables are
//! copied in without a syscall per row), the table and process maps, the exec tracepoint and
//! the walker's counters. What to put in them is `unwind::Unwinder`'s business. Also a
//! read-only [`UnwindView`] of one process's entries, for the thread dump's userspace walker.

use std::os::fd::{AsFd, AsRawFd};

use aya::{
    maps::{Array, HashMap, MapData, PerCpuArray},
    programs::TracePoint,
    Ebpf,
};
use profiler_common::{
    maps, programs, runtimes,
    unwind::{MAX_PROCESS_MAPPINGS, MAX_TABLE_SHARDS, NO_TABLE, SHARD_ROWS, SHARD_ROWS_SHIFT},
    FrameKind, SmallUnwindProcess, Unsupported, UnwindCounter, UnwindMapping, UnwindProcess, UnwindRow,
    UnwindTableInfo, WalkTotals, WALK_STATE_BYTES,
};

use super::{map_error, map_mut, map_ref, missing, program_error, sum_counters, sum_counters_of, Error, Result};
use crate::ids::Pid;

const EXEC_PROGRAM: &str = programs::UNWIND_EXEC;

/// Copies `rows` (at most one shard) into shard `shard` of `UNWIND_ROWS`. The shard alone is
/// mapped for the copy and unmapped after, so row memory never counts in this process's RSS
/// and a whole table costs two syscalls per 32 KiB instead of one per row.
pub(super) fn write_shard(ebpf: &Ebpf, shard: u16, rows: &[UnwindRow]) -> Result<()> {
    let map = ebpf.map(maps::UNWIND_ROWS).ok_or_else(|| missing(maps::UNWIND_ROWS))?;
    let aya::maps::Map::Array(data) = map else {
        return Err(missing(maps::UNWIND_ROWS));
    };
    let rows = &rows[..rows.len().min(SHARD_ROWS as usize)];
    let bytes = SHARD_ROWS as usize * size_of::<UnwindRow>();
    let offset = shard as i64 * bytes as i64;
    // SAFETY: a shared read-write mapping of one shard of an mmapable BPF array (shards are
    // page-aligned); the kernel keeps the memory alive while mapped.
    let ptr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            bytes,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            data.fd().as_fd().as_raw_fd(),
            offset,
        )
    };
    if ptr == libc::MAP_FAILED {
        return Err(Error::Io {
            action: format!("map shard {shard} of the BPF array {} into memory", maps::UNWIND_ROWS),
            source: std::io::Error::last_os_error(),
        });
    }
    // SAFETY: `bytes` mapped bytes, `rows` fits in them, and nothing else aliases the mapping.
    unsafe {
        std::ptr::copy_nonoverlapping(rows.as_ptr(), ptr.cast::<UnwindRow>(), rows.len());
        libc::munmap(ptr, bytes);
    }
    Ok(())
}

/// Attaches the exec program to the entries of both exec syscalls. Fails when tracefs is not
/// mounted.
pub(super) fn attach_exec(ebpf: &mut Ebpf) -> Result<()> {
    attach_to_exec_syscalls(ebpf, EXEC_PROGRAM, "sys_enter")
}

/// Attaches the exec's exit program (see `profiler-ebpf`'s `exec.rs`): from now on
/// [`take_execs`] returns only the execs that failed.
pub(super) fn attach_exec_done(ebpf: &mut Ebpf) -> Result<()> {
    attach_to_exec_syscalls(ebpf, programs::UNWIND_EXEC_DONE, "sys_exit")
}

/// Loads the tracepoint program `name` and attaches it to `{side}_execve` and
/// `{side}_execveat`.
fn attach_to_exec_syscalls(ebpf: &mut Ebpf, name: &'static str, side: &str) -> Result<()> {
    let program: &mut TracePoint =
        ebpf.program_mut(name).ok_or_else(|| missing(name))?.try_into().map_err(program_error("find", name))?;
    program.load().map_err(program_error("load", name))?;
    for syscall in ["execve", "execveat"] {
        let tracepoint = format!("{side}_{syscall}");
        if side == "sys_exit" {
            super::tracefs::check_kernel("syscalls", &tracepoint, profiler_common::tracepoint::SYSCALL_EXIT_FIELDS)?;
        }
        program
            .attach("syscalls", &tracepoint)
            .map_err(program_error(format!("attach (tracepoint syscalls:{tracepoint})"), name))?;
    }
    Ok(())
}

pub(super) fn set_table(ebpf: &mut Ebpf, slot: u32, info: &UnwindTableInfo) -> Result<()> {
    let mut tables: Array<&mut MapData, UnwindTableInfo> = map_mut(ebpf, maps::UNWIND_TABLES)?;
    tables.set(slot, info, 0).map_err(map_error("write", maps::UNWIND_TABLES))
}

/// Writes `process`'s list into the small map when it fits one of its entries (and the map
/// has room), else into the large map. `was`: the map its previous entry is in, if it has
/// one; when that is the other map, the entry is removed from it after the write (the walker
/// looks in the small map first, so until then it sees the previous list, never none), and
/// only then: a delete that finds nothing still costs a system call. Returns the map written,
/// or `None` when neither has room (counted by the caller; nothing is written).
pub(super) fn set_process(
    ebpf: &mut Ebpf,
    pid: u32,
    process: &UnwindProcess,
    was: Option<Where>,
) -> Result<Option<Where>> {
    if let Some(small) = process.small() {
        let mut processes: HashMap<&mut MapData, u32, SmallUnwindProcess> = map_mut(ebpf, maps::UNWIND_PROCESSES)?;
        match processes.insert(pid, small, 0) {
            Ok(()) => {
                if was == Some(Where::Large) {
                    remove_from::<UnwindProcess>(ebpf, maps::UNWIND_PROCESSES_LARGE, pid)?;
                }
                return Ok(Some(Where::Small));
            }
            // Full: the large map takes it while it has room.
            Err(e) if is_full(&e) => {}
            Err(e) => return Err(map_error("write", maps::UNWIND_PROCESSES)(e)),
        }
    }
    let mut processes: HashMap<&mut MapData, u32, UnwindProcess> = map_mut(ebpf, maps::UNWIND_PROCESSES_LARGE)?;
    match processes.insert(pid, process, 0) {
        Ok(()) => {}
        Err(e) if is_full(&e) => return Ok(None),
        Err(e) => return Err(map_error("write", maps::UNWIND_PROCESSES_LARGE)(e)),
    }
    if was == Some(Where::Small) {
        remove_from::<SmallUnwindProcess>(ebpf, maps::UNWIND_PROCESSES, pid)?;
    }
    Ok(Some(Where::Large))
}

/// Gives a runtime's walker process `pid`'s entry in its map `name` (see `profiler-ebpf`'s
/// `runtimes/`). Returns false when the map is full (nothing written; the caller counts it).
pub(super) fn set_runtime_process<V: aya::Pod>(
    ebpf: &mut Ebpf,
    name: &'static str,
    pid: u32,
    entry: &V,
) -> Result<bool> {
    let mut processes: HashMap<&mut MapData, u32, V> = map_mut(ebpf, name)?;
    match processes.insert(pid, entry, 0) {
        Ok(()) => Ok(true),
        Err(e) if is_full(&e) => Ok(false),
        Err(e) => Err(map_error("write", name)(e)),
    }
}

/// Makes a runtime's walker forget process `pid`'s entry in its map `name` (a no-op if it
/// has none there).
pub(super) fn remove_runtime_process<V: aya::Pod>(ebpf: &mut Ebpf, name: &'static str, pid: u32) -> Result<()> {
    remove_from::<V>(ebpf, name, pid)
}

/// Tells the walkers that process `pid` will not be registered, so that they stop asking for
/// it. Returns false when the map is full.
pub(super) fn decline_registration(ebpf: &mut Ebpf, pid: u32) -> Result<bool> {
    let mut declined: HashMap<&mut MapData, u32, u8> = map_mut(ebpf, maps::REGISTER_DECLINED)?;
    match declined.insert(pid, 1, 0) {
        Ok(()) => Ok(true),
        Err(e) if is_full(&e) => Ok(false),
        Err(e) => Err(map_error("write", maps::REGISTER_DECLINED)(e)),
    }
}

/// Lets process `pid`'s walks ask for its registration again (a no-op if they may).
pub(super) fn undecline_registration(ebpf: &mut Ebpf, pid: u32) -> Result<()> {
    remove_from::<u8>(ebpf, maps::REGISTER_DECLINED, pid)
}

/// Every runtime walker's counters since load, summed over CPUs, by interpreted
/// [`FrameKind`] (see `profiler_common::runtimes::COUNTERS`); what each counts, its runtime
/// says (`crate::runtimes`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RuntimeCounters([[u64; runtimes::MAX_COUNTERS]; runtimes::COUNTERS.len()]);

impl RuntimeCounters {
    /// The counters of `kind`'s walker, by their index; empty for [`FrameKind::Native`].
    pub fn of(&self, kind: FrameKind) -> &[u64] {
        let Some(at) = (kind as usize).checked_sub(1) else { return &[] };
        let count = runtimes::COUNTERS.get(at).map_or(0, |&(_, count)| count as usize);
        self.0.get(at).map_or(&[][..], |counters| &counters[..count])
    }
}

pub(super) fn runtime_counters(ebpf: &Ebpf) -> Result<RuntimeCounters> {
    let mut out = RuntimeCounters::default();
    for (counters, &(name, count)) in out.0.iter_mut().zip(&runtimes::COUNTERS) {
        let sums: [u64; runtimes::MAX_COUNTERS] = sum_counters_of(ebpf, name, count)?;
        *counters = sums;
    }
    Ok(out)
}

/// Which of the two process maps holds a process's entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Where {
    /// `UNWIND_PROCESSES`: up to `SMALL_PROCESS_MAPPINGS` mappings.
    Small,
    /// `UNWIND_PROCESSES_LARGE`.
    Large,
}

/// Whether a hash map refused an insert for want of room (`E2BIG`).
fn is_full(err: &aya::maps::MapError) -> bool {
    matches!(err, aya::maps::MapError::SyscallError(e) if e.io_error.raw_os_error() == Some(libc::E2BIG))
}

/// Removes every pid of `pids` from the map `from`, in as few system calls as the kernel
/// allows (`BPF_MAP_DELETE_BATCH`: a machine running hundreds of programs a second forgets
/// hundreds of processes a second). A pid not there is skipped.
pub(super) fn remove_processes(ebpf: &mut Ebpf, pids: &[u32], from: Where) -> Result<()> {
    let name = match from {
        Where::Small => maps::UNWIND_PROCESSES,
        Where::Large => maps::UNWIND_PROCESSES_LARGE,
    };
    let map = ebpf.map(name).ok_or_else(|| missing(name))?;
    let fd = match map {
        aya::maps::Map::HashMap(data) => data.fd().as_fd().as_raw_fd(),
        _ => return Err(map_error("open", name)(aya::maps::MapError::InvalidMapType { map_type: 0 })),
    };
    let mut rest = pids;
    while !rest.is_empty() {
        match delete_batch(fd, rest) {
            Ok(()) => break,
            // Stopped at a pid not there (deleted by the exec program, or never written):
            // on with the ones after it.
            Err((done, err)) if err.raw_os_error() == Some(libc::ENOENT) => rest = &rest[done + 1..],
            // A kernel without batch deletes (before 5.6): one at a time.
            Err((0, err)) if err.raw_os_error() == Some(libc::EINVAL) => {
                for &pid in rest {
                    match from {
                        Where::Small => remove_from::<SmallUnwindProcess>(ebpf, name, pid)?,
                        Where::Large => remove_from::<UnwindProcess>(ebpf, name, pid)?,
                    }
                }
                break;
            }
            Err((_, err)) => {
                return Err(map_error("delete from", name)(aya::maps::MapError::SyscallError(aya::sys::SyscallError {
                    call: "bpf_map_delete_batch",
                    io_error: err,
                })))
            }
        }
    }
    Ok(())
}

/// `BPF_MAP_DELETE_BATCH`.
const BPF_MAP_DELETE_BATCH: libc::c_long = 27;

/// The `batch` member of `union bpf_attr` (also the live-heap map's batch lookups).
#[repr(C)]
pub(super) struct BatchAttr {
    pub in_batch: u64,
    pub out_batch: u64,
    pub keys: u64,
    pub values: u64,
    pub count: u32,
    pub map_fd: u32,
    pub elem_flags: u64,
    pub flags: u64,
}

/// Deletes the 4-byte `keys` from the hash map `fd`; on failure, how many were deleted
/// before the key that failed, and why.
fn delete_batch(fd: std::os::fd::RawFd, keys: &[u32]) -> std::result::Result<(), (usize, std::io::Error)> {
    let mut attr = BatchAttr {
        in_batch: 0,
        out_batch: 0,
        keys: keys.as_ptr() as u64,
        values: 0,
        count: keys.len() as u32,
        map_fd: fd as u32,
        elem_flags: 0,
        flags: 0,
    };
    // SAFETY: `attr` names `count` keys of the map's key size, borrowed for the call; the
    // kernel writes back only `count`, in `attr`.
    match unsafe { super::bpf_call(BPF_MAP_DELETE_BATCH, &mut attr) } {
        Ok(_) => Ok(()),
        Err(err) => Err(((attr.count as usize).min(keys.len().saturating_sub(1)), err)),
    }
}

/// Removes `pid` from the process map `name`, of values `V`.
fn remove_from<V: aya::Pod>(ebpf: &mut Ebpf, name: &'static str, pid: u32) -> Result<()> {
    let mut processes: HashMap<&mut MapData, u32, V> = map_mut(ebpf, name)?;
    match processes.remove(&pid) {
        Ok(()) => Ok(()),
        // Already gone: the exec tracepoint deleted it, it was never written, or it is in
        // the other map.
        Err(aya::maps::MapError::ElementNotFound) => Ok(()),
        Err(aya::maps::MapError::SyscallError(e)) if e.io_error.raw_os_error() == Some(libc::ENOENT) => Ok(()),
        Err(e) => Err(map_error("delete from", name)(e)),
    }
}

/// The processes that called `execve` since the last call, each with the time
/// (`CLOCK_MONOTONIC`) of its last exec (and forgets them).
pub(super) fn take_execs(ebpf: &mut Ebpf) -> Result<Vec<(Pid, u64)>> {
    let mut execs: HashMap<&mut MapData, u32, u64> = map_mut(ebpf, maps::UNWIND_EXECS)?;
    let entries: Vec<(u32, u64)> = execs.iter().filter_map(|e| e.ok()).collect();
    for (pid, _) in &entries {
        // Gone already is fine: the next exec of the same pid inserts it again.
        let _ = execs.remove(pid);
    }
    Ok(entries.into_iter().map(|(pid, exec_ns)| (Pid(pid), exec_ns)).collect())
}

/// The walker's counters since load, summed over CPUs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UnwindCounters(pub [u64; UnwindCounter::COUNT as usize]);

impl UnwindCounters {
    pub fn get(&self, counter: UnwindCounter) -> u64 {
        self.0[counter as usize]
    }

    /// Walks stopped at unsupported CFI for `reason`.
    pub fn unsupported(&self, reason: Unsupported) -> u64 {
        self.0[UnwindCounter::unsupported(reason) as usize]
    }
}

pub(super) fn counters(ebpf: &Ebpf) -> Result<UnwindCounters> {
    let mut counters = UnwindCounters(sum_counters(ebpf, maps::UNWIND_COUNTERS)?);
    let totals = walk_totals(ebpf)?;
    counters.0[UnwindCounter::CfiFrames as usize] += totals.by_table;
    counters.0[UnwindCounter::FramePointerFrames as usize] += totals.by_frame_pointer;
    Ok(counters)
}

/// The frames the walkers stepped, summed over CPUs and contexts: each `UNWIND_STATE` entry
/// starts with its [`WalkTotals`].
fn walk_totals(ebpf: &Ebpf) -> Result<WalkTotals> {
    const WORDS: usize = WALK_STATE_BYTES / 8;
    let name = maps::UNWIND_STATE;
    let states: PerCpuArray<&MapData, [u64; WORDS]> = map_ref(ebpf, name)?;
    let mut totals = WalkTotals::default();
    for slot in 0..states.len() {
        let values = states.get(&slot, 0).map_err(map_error("read", name))?;
        for state in values.iter() {
            totals.by_table += state[0];
            totals.by_frame_pointer += state[1];
        }
    }
    Ok(totals)
}

/// What the kernel walker knows of one process, read from its maps: the process's mapping
/// list, the tables those mappings name, and the row memory (mapped read-only for the
/// view's life). A walker in userspace that reads these finds exactly the rows the kernel's
/// finds.
pub struct UnwindView {
    process: Option<Box<UnwindProcess>>,
    tables: std::collections::HashMap<u32, UnwindTableInfo>,
    rows: Option<RowMemory>,
}

impl UnwindView {
    /// The process's executable mappings, sorted by start; `None` when the walker does not
    /// know the process.
    pub fn mappings(&self) -> Option<&[UnwindMapping]> {
        let process = self.process.as_deref()?;
        Some(&process.mappings[..(process.len as usize).min(MAX_PROCESS_MAPPINGS)])
    }

    /// The table in slot `slot`, if a mapping of the process names it and it has rows.
    pub fn table(&self, slot: u32) -> Option<&UnwindTableInfo> {
        self.tables.get(&slot).filter(|t| t.rows > 0)
    }

    /// Row `index` of `table`, as the kernel's `row_at` finds it.
    pub fn row(&self, table: &UnwindTableInfo, index: u32) -> Option<UnwindRow> {
        let shard = *table.shards.get((index >> SHARD_ROWS_SHIFT) as usize & (MAX_TABLE_SHARDS - 1))? as u32;
        self.rows.as_ref()?.get((shard << SHARD_ROWS_SHIFT) | (index & (SHARD_ROWS - 1)))
    }
}

/// `UNWIND_ROWS` mapped read-only.
struct RowMemory {
    ptr: *const UnwindRow,
    len: usize,
}

// SAFETY: the mapping is read-only and owned by this value alone (unmapped once, at its
// drop); the kernel keeps the map's memory alive while it is mapped, whichever thread reads
// it. So a view may go to the thread that walks a dump.
unsafe impl Send for RowMemory {}

impl RowMemory {
    fn get(&self, index: u32) -> Option<UnwindRow> {
        // SAFETY: `index` is checked against the mapping's length; the kernel keeps the
        // memory alive while mapped, and a row is 8 aligned bytes of plain integers.
        ((index as usize) < self.len).then(|| unsafe { *self.ptr.add(index as usize) })
    }
}

impl Drop for RowMemory {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly what `view` mapped.
        unsafe { libc::munmap(self.ptr as *mut libc::c_void, self.len * size_of::<UnwindRow>()) };
    }
}

/// Reads what the kernel walker knows of process `pid` (`rows`: the row array's length).
pub(super) fn view(ebpf: &Ebpf, pid: u32, rows: u32) -> Result<UnwindView> {
    // The small map first, as the walker looks.
    let small: HashMap<&MapData, u32, SmallUnwindProcess> = super::map_ref(ebpf, maps::UNWIND_PROCESSES)?;
    let process = match small.get(&pid, 0) {
        Ok(process) => Some(Box::new(process.large())),
        Err(aya::maps::MapError::KeyNotFound) => {
            let large: HashMap<&MapData, u32, UnwindProcess> = super::map_ref(ebpf, maps::UNWIND_PROCESSES_LARGE)?;
            match large.get(&pid, 0) {
                Ok(process) => Some(Box::new(process)),
                Err(aya::maps::MapError::KeyNotFound) => None,
                Err(e) => return Err(map_error("read", maps::UNWIND_PROCESSES_LARGE)(e)),
            }
        }
        Err(e) => return Err(map_error("read", maps::UNWIND_PROCESSES)(e)),
    };
    let mut view = UnwindView { process, tables: Default::default(), rows: None };
    let slots: Vec<u32> = view.mappings().unwrap_or(&[]).iter().map(|m| m.table).filter(|&t| t != NO_TABLE).collect();
    if slots.is_empty() {
        return Ok(view);
    }
    let tables: Array<&MapData, UnwindTableInfo> = super::map_ref(ebpf, maps::UNWIND_TABLES)?;
    for slot in slots {
        let info = tables.get(&slot, 0).map_err(map_error("read", maps::UNWIND_TABLES))?;
        view.tables.insert(slot, info);
    }
    view.rows = Some(map_rows(ebpf, rows)?);
    Ok(view)
}

fn map_rows(ebpf: &Ebpf, rows: u32) -> Result<RowMemory> {
    let map = ebpf.map(maps::UNWIND_ROWS).ok_or_else(|| missing(maps::UNWIND_ROWS))?;
    let aya::maps::Map::Array(data) = map else {
        return Err(missing(maps::UNWIND_ROWS));
    };
    let len = rows as usize;
    // SAFETY: a shared read-only mapping of the whole mmapable BPF array.
    let ptr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len * size_of::<UnwindRow>(),
            libc::PROT_READ,
            libc::MAP_SHARED,
            data.fd().as_fd().as_raw_fd(),
            0,
        )
    };
    if ptr == libc::MAP_FAILED {
        return Err(Error::Io {
            action: format!("map the BPF array {} into memory to read it", maps::UNWIND_ROWS),
            source: std::io::Error::last_os_error(),
        });
    }
    Ok(RowMemory { ptr: ptr.cast(), len })
}
