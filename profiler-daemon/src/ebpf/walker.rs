//! The session's side of the kernel walker (see [`super::unwind`]): the rows and tables it
//! reads, the processes registered with it (deletions batched), the runtimes' process maps,
//! the execs it notes and the registrations it asks for or is told to stop asking for.

use std::os::fd::{AsFd, BorrowedFd};

use aya::maps::{Array, MapData, RingBuf};
use profiler_common::{maps, UnwindProcess, UnwindRow, UnwindTableInfo};

use super::{map_error, map_mut, missing, unwind, Result, Session, UnwindMap, UnwindView};
use crate::ids::Pid;

/// Registrations queued for deletion are deleted once this old...
pub(super) const REMOVALS_DUE_AFTER: std::time::Duration = std::time::Duration::from_millis(50);
/// ...or this many.
pub(super) const REMOVALS_DUE_AT: usize = 256;

/// The walkers' asks to register a process ([`Session::take_register_asks`]): a ring of
/// `profiler_common::RegisterAsk` records, readable (its descriptor) when one is queued.
pub struct RegisterAsks(RingBuf<MapData>);

impl RegisterAsks {
    /// Calls `each` with the bytes of every record queued, emptying the ring (the next
    /// record then makes the descriptor readable again).
    pub fn drain(&mut self, mut each: impl FnMut(&[u8])) {
        while let Some(record) = self.0.next() {
            each(&record);
        }
    }
}

impl AsFd for RegisterAsks {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.0.as_fd()
    }
}

impl Session {
    /// Copies up to one shard of unwind-table rows into shard `shard` of the row memory.
    pub fn write_unwind_shard(&mut self, shard: u16, rows: &[UnwindRow]) -> Result<()> {
        unwind::write_shard(&self.ebpf, shard, rows)
    }

    /// Points table slot `slot` at its rows (or empties it with `rows = 0`).
    pub fn set_unwind_table(&mut self, slot: u32, info: &UnwindTableInfo) -> Result<()> {
        let result = unwind::set_table(&mut self.ebpf, slot, info);
        self.unwind_changed()?;
        result
    }

    /// Gives the walker the mappings of process `pid`, whose previous entry (if any) is in map
    /// `was`. Returns which map holds it now; `None` when both are full (nothing written).
    pub fn set_unwind_process(
        &mut self,
        pid: Pid,
        process: &UnwindProcess,
        was: Option<UnwindMap>,
    ) -> Result<Option<UnwindMap>> {
        // A queued deletion of the pid's previous registration must not delete this one.
        if self.unwind_removals.iter().any(|&(queued, _)| queued == pid) {
            self.flush_unwind_removals()?;
        }
        let result = unwind::set_process(&mut self.ebpf, pid.0, process, was);
        self.unwind_changed()?;
        result
    }

    /// Gives a runtime's walker process `pid`'s entry in its map `map`, so that its stacks
    /// get that runtime's frames; `None` makes it forget one (see `crate::runtimes`). Returns
    /// false when the map is full.
    pub fn set_runtime_process<V: aya::Pod>(&mut self, map: &'static str, pid: Pid, entry: Option<&V>) -> Result<bool> {
        match entry {
            Some(entry) => unwind::set_runtime_process(&mut self.ebpf, map, pid.0, entry),
            None => unwind::remove_runtime_process::<V>(&mut self.ebpf, map, pid.0).map(|()| true),
        }
    }

    /// Makes the walker forget process `pid`, whose entry is in map `from` (a no-op if it
    /// is not there). Queued: the entry is deleted with others in one system call by
    /// [`Session::flush_unwind_removals`], when the caller finds them due, or before the
    /// pid is registered again. Until then the walker may find it, for a process that has
    /// exited; the caller flushes at once when a pid is reused.
    pub fn remove_unwind_process(&mut self, pid: Pid, from: UnwindMap) {
        self.removals_since.get_or_insert_with(std::time::Instant::now);
        self.unwind_removals.push((pid, from));
    }

    /// Whether the queued deletions should be made now (enough of them, or old enough).
    pub fn unwind_removals_due(&self) -> bool {
        self.unwind_removals.len() >= REMOVALS_DUE_AT
            || self.removals_since.is_some_and(|since| since.elapsed() >= REMOVALS_DUE_AFTER)
    }

    /// Deletes the queued registrations from the walker's maps: from both, even when the
    /// first fails (the first failure is returned).
    pub fn flush_unwind_removals(&mut self) -> Result<()> {
        self.removals_since = None;
        let queued = std::mem::take(&mut self.unwind_removals);
        let mut result = Ok(());
        for from in [UnwindMap::Small, UnwindMap::Large] {
            let pids: Vec<u32> = queued.iter().filter(|&&(_, map)| map == from).map(|&(pid, _)| pid.0).collect();
            if !pids.is_empty() {
                let removed = unwind::remove_processes(&mut self.ebpf, &pids, from);
                result = result.and(removed);
            }
        }
        if !queued.is_empty() {
            self.unwind_changed()?;
        }
        result
    }

    /// Counts a change to the walker's processes or tables, made just before, in `CONTROL`:
    /// the walkers keep mappings they found from one sample to the next only while the count
    /// is unchanged (see `profiler-ebpf`'s `user_stack::KeptMapping`). Called after every
    /// change, also one that failed part way.
    fn unwind_changed(&mut self) -> Result<()> {
        self.unwind_epoch = self.unwind_epoch.wrapping_add(1);
        let mut control: Array<&mut MapData, u32> = map_mut(&mut self.ebpf, maps::CONTROL)?;
        control.set(maps::CONTROL_UNWIND_EPOCH, self.unwind_epoch, 0).map_err(map_error("write", maps::CONTROL))
    }

    /// Processes that called `execve` since the last call, with the time of the exec
    /// (`CLOCK_MONOTONIC`); the kernel forgot their mappings then.
    pub fn take_execs(&mut self) -> Result<Vec<(Pid, u64)>> {
        unwind::take_execs(&mut self.ebpf)
    }

    /// From now on [`Session::take_execs`] lists only the execs that failed: the caller
    /// follows the successful ones from the side band. Without exec tracking, nothing to do.
    pub fn take_failed_execs_only(&mut self) -> Result<()> {
        if self.exec_tracking_error.is_some() {
            return Ok(());
        }
        unwind::attach_exec_done(&mut self.ebpf)
    }

    /// The walkers' asks to register a process they met unregistered (a ring of tgids):
    /// taken once, by the owner of the wait loop, which reads the side band at once when
    /// one comes.
    pub fn take_register_asks(&mut self) -> Result<RegisterAsks> {
        let map = self.ebpf.take_map(maps::REGISTER_ASKS).ok_or_else(|| missing(maps::REGISTER_ASKS))?;
        RingBuf::try_from(map).map(RegisterAsks).map_err(map_error("open", maps::REGISTER_ASKS))
    }

    /// Stops the walkers asking for process `pid`'s registration: the selection leaves it
    /// out. Returns false when the map is full (its walks then keep asking, through the LRU).
    pub fn decline_registration(&mut self, pid: Pid) -> Result<bool> {
        unwind::decline_registration(&mut self.ebpf, pid.0)
    }

    /// Lets process `pid`'s walks ask for its registration again (it exited, or may now be
    /// selected).
    pub fn undecline_registration(&mut self, pid: Pid) -> Result<()> {
        unwind::undecline_registration(&mut self.ebpf, pid.0)
    }

    /// Why execs are not tracked, if they are not.
    pub fn exec_tracking_error(&self) -> Option<&str> {
        self.exec_tracking_error.as_deref()
    }

    /// What the kernel walker knows of process `pid` (its mappings, their tables, the rows),
    /// for a walker in userspace that must read exactly what the kernel's reads.
    pub fn unwind_view(&self, pid: Pid) -> Result<UnwindView> {
        unwind::view(&self.ebpf, pid.0, self.unwind_rows)
    }
}
