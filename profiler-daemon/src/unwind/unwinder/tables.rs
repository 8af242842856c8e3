//! A file's unwind table: built once (from the file as the process sees it), refused for
//! good when it cannot be, and loaded into the kernel's row memory when the budget has room.

use profiler_common::{
    unwind::{MAX_TABLE_SHARDS, SHARD_ROWS},
    UnwindTableInfo,
};

use super::{files::read_vdso, FileKey, Unwinder};
use crate::{
    ebpf::{Result, Session},
    elf::MappedFile,
    ids::Pid,
    opened::OpenedFile,
    procs::MapEntry,
    unwind::{registry::NoRoom, UnwindTable},
};

/// Tables from this many rows on are large enough to trim the heap after building.
const LARGE_TABLE_ROWS: usize = 64 * 1024;

impl Unwinder {
    /// The slot of the table for `key`, building and loading it if needed; `None` when the
    /// file has no usable table.
    pub(super) fn table(
        &mut self,
        session: &mut Session,
        key: &FileKey,
        pid: Pid,
        entry: &MapEntry,
    ) -> Result<Option<u32>> {
        if let Some(slot) = self.registry.get(key) {
            return Ok(Some(slot));
        }
        if self.failed.contains_key(key) {
            return Ok(None);
        }
        if self.no_room.get(key).is_some_and(|&rows| !self.registry.has_room_for(rows)) {
            self.stats.budget_full += 1;
            return Ok(None);
        }
        let Some(table) = self.build_table(key, pid, entry) else { return Ok(None) };
        self.load_table(session, key, entry, &table)
    }

    /// Builds the table of `entry`'s file; `None` when it has none (counted, and remembered
    /// as failed unless the file only stalled).
    fn build_table(&mut self, key: &FileKey, pid: Pid, entry: &MapEntry) -> Option<UnwindTable> {
        let built = if &*entry.path == "[vdso]" {
            read_vdso(pid, entry).map(|bytes| crate::unwind::build(&bytes))
        } else {
            let build = |file: &OpenedFile| {
                let mapped = MappedFile::map(file.file()).ok()?;
                Some(crate::unwind::build(mapped.bytes()))
            };
            // Stalled (`None`): no table now; a device that answers again is tried at the
            // next registration.
            self.on_file(pid, entry, build)?
        };
        let table = match built {
            Some(Ok(table)) => table,
            Some(Err(err)) => {
                tracing::debug!(file = %entry.path, error = %err, "no unwind table");
                // Refused while building, for what loading would have refused it for.
                if matches!(err, crate::unwind::BuildError::TooLarge { .. }) {
                    self.stats.too_large += 1;
                } else {
                    self.stats.build_failures += 1;
                }
                if err.is_over_budget() {
                    tracing::warn!(file = %entry.path, error = %err, "no unwind table; not read again, even after a restart");
                    self.refused.add(key, &err.to_string());
                }
                self.failed.insert(key.clone(), err.to_string());
                return None;
            }
            None => {
                self.stats.unreadable_files += 1;
                return None;
            }
        };
        self.stats.builds += 1;
        self.stats.build_time += table.stats().build_duration;
        self.trim_pending |= table.rows().len() >= LARGE_TABLE_ROWS;
        Some(table)
    }

    /// Reserves row memory for a built table and writes it for the walker: its slot, or
    /// `None` when it does not fit (too large, counted and remembered; or the budget is full
    /// now, retried when there is room).
    fn load_table(
        &mut self,
        session: &mut Session,
        key: &FileKey,
        entry: &MapEntry,
        table: &UnwindTable,
    ) -> Result<Option<u32>> {
        let rows = table.rows();
        let Ok(count) = u32::try_from(rows.len()) else {
            self.stats.too_large += 1;
            self.failed.insert(key.clone(), "too many rows".into());
            return Ok(None);
        };
        let reservation = match self.registry.reserve(count) {
            Ok(r) => r,
            Err(NoRoom::TooLarge) => {
                self.stats.too_large += 1;
                self.failed.insert(key.clone(), format!("{count} rows do not fit the unwind-table memory"));
                return Ok(None);
            }
            Err(NoRoom::BudgetFull) => {
                self.stats.budget_full += 1;
                self.no_room.insert(key.clone(), count);
                return Ok(None);
            }
        };
        let empty = UnwindTableInfo { base_address: 0, rows: 0, id: 0, shards: [0; MAX_TABLE_SHARDS] };
        for &slot in &reservation.evicted_slots {
            session.set_unwind_table(slot, &empty)?;
        }
        let mut info = empty;
        for (i, (chunk, &shard)) in rows.chunks(SHARD_ROWS as usize).zip(&reservation.shards).enumerate() {
            if let Err(err) = session.write_unwind_shard(shard, chunk) {
                self.registry.cancel(reservation);
                return Err(err);
            }
            info.shards[i] = shard;
        }
        info.base_address = table.base_address();
        info.rows = count;
        self.tables_loaded += 1;
        info.id = self.tables_loaded;
        if let Err(err) = session.set_unwind_table(reservation.slot, &info) {
            self.registry.cancel(reservation);
            return Err(err);
        }
        self.registry.insert(key.clone(), &reservation, count, entry.path.to_string(), table.stats().build_duration);
        self.no_room.remove(key);
        Ok(Some(reservation.slot))
    }
}
