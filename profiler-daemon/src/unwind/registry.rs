//! Which unwind tables are loaded, and where: slots of the kernel's table array and shards of
//! its row array. Tables are shared by file (build id), reference-counted by the process
//! mappings that use them, and evicted least recently used first once unreferenced, when a
//! new table needs their room. Pure bookkeeping; `Unwinder` copies the rows and writes maps.

use std::{collections::HashMap, time::Duration};

use profiler_common::unwind::{MAX_TABLE_SHARDS, SHARD_ROWS};

/// What identifies a file's contents: `build-id:<hex>`, or `file:<dev>:<inode>:<size>:<mtime>`
/// for files without a build id.
pub type FileKey = String;

/// One loaded table.
#[derive(Debug, Clone)]
pub struct Loaded {
    /// Slot in `UNWIND_TABLES`.
    pub slot: u32,
    /// Shards of `UNWIND_ROWS` holding its rows, in order.
    pub shards: Vec<u16>,
    pub rows: u32,
    /// A path it was read from, for reports.
    pub name: String,
    pub build_duration: Duration,
    /// Process mappings using it.
    refs: u32,
    /// Logical time of the last use, for LRU eviction.
    last_used: u64,
}

impl Loaded {
    /// Bytes of row memory it occupies (whole shards).
    pub fn bytes(&self) -> u64 {
        self.shards.len() as u64 * u64::from(SHARD_ROWS) * 8
    }
}

/// Room for a new table: its slot and shards, and the slots of tables evicted to make it
/// (which must be emptied in the kernel before the shards are overwritten).
#[derive(Debug, PartialEq, Eq)]
pub struct Reservation {
    pub slot: u32,
    pub shards: Vec<u16>,
    pub evicted_slots: Vec<u32>,
}

/// Why a table cannot be loaded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NoRoom {
    /// Larger than one table may be, or than the whole budget: it never will fit.
    TooLarge,
    /// Tables in use hold the memory now.
    BudgetFull,
}

/// The loaded tables and the free room.
#[derive(Debug)]
pub struct Registry {
    total_shards: u32,
    free_shards: Vec<u16>,
    free_slots: Vec<u32>,
    loaded: HashMap<FileKey, Loaded>,
    clock: u64,
    /// Tables evicted so far.
    pub evictions: u64,
}

impl Registry {
    /// A registry over `total_shards` shards and `slots` table slots, all free.
    pub fn new(total_shards: u32, slots: u32) -> Self {
        let total_shards = total_shards.min(u32::from(u16::MAX) + 1);
        Self {
            total_shards,
            // Popped from the end: hand out low indices first.
            free_shards: (0..total_shards).rev().map(|s| s as u16).collect(),
            free_slots: (0..slots).rev().collect(),
            loaded: HashMap::new(),
            clock: 0,
            evictions: 0,
        }
    }

    /// The slot of the loaded table for `key`, marking it used.
    pub fn get(&mut self, key: &str) -> Option<u32> {
        self.clock += 1;
        let loaded = self.loaded.get_mut(key)?;
        loaded.last_used = self.clock;
        Some(loaded.slot)
    }

    /// Whether a table of `rows` rows would find room now (free, or held by unreferenced
    /// tables): a table that did not fit is not built again until one would.
    pub fn has_room_for(&self, rows: u32) -> bool {
        let need = rows.div_ceil(SHARD_ROWS).max(1) as usize;
        let (spare_shards, spare_slots) = self
            .loaded
            .values()
            .filter(|t| t.refs == 0)
            .fold((self.free_shards.len(), self.free_slots.len()), |(shards, slots), t| {
                (shards + t.shards.len(), slots + 1)
            });
        spare_shards >= need && spare_slots > 0
    }

    /// Finds room for a table of `rows` rows, evicting unreferenced tables (least recently
    /// used first) as needed.
    pub fn reserve(&mut self, rows: u32) -> Result<Reservation, NoRoom> {
        let need = rows.div_ceil(SHARD_ROWS).max(1) as usize;
        if need > MAX_TABLE_SHARDS || need > self.total_shards as usize {
            return Err(NoRoom::TooLarge);
        }
        // Check before evicting anything, so a failed reservation changes nothing.
        if !self.has_room_for(rows) {
            return Err(NoRoom::BudgetFull);
        }
        let mut evicted_slots = Vec::new();
        while self.free_shards.len() < need || self.free_slots.is_empty() {
            let victim = self
                .loaded
                .iter()
                .filter(|(_, t)| t.refs == 0)
                .min_by_key(|(_, t)| t.last_used)
                .map(|(key, _)| key.clone());
            let Some(victim) = victim else { return Err(NoRoom::BudgetFull) };
            let table = self.loaded.remove(&victim).expect("victim is loaded");
            self.free_shards.extend(table.shards);
            self.free_slots.push(table.slot);
            evicted_slots.push(table.slot);
            self.evictions += 1;
        }
        let slot = self.free_slots.pop().expect("checked above");
        let shards = self.free_shards.split_off(self.free_shards.len() - need);
        Ok(Reservation { slot, shards, evicted_slots })
    }

    /// Records a table loaded into a reservation.
    pub fn insert(&mut self, key: FileKey, reservation: &Reservation, rows: u32, name: String, build: Duration) {
        self.clock += 1;
        let loaded = Loaded {
            slot: reservation.slot,
            shards: reservation.shards.clone(),
            rows,
            name,
            build_duration: build,
            refs: 0,
            last_used: self.clock,
        };
        self.loaded.insert(key, loaded);
    }

    /// Returns an unused reservation.
    pub fn cancel(&mut self, reservation: Reservation) {
        self.free_shards.extend(reservation.shards);
        self.free_slots.push(reservation.slot);
    }

    /// One more mapping uses the table of `key`; whether it is loaded (if not, nothing is
    /// held).
    pub fn acquire(&mut self, key: &str) -> bool {
        let loaded = self.loaded.get_mut(key);
        let found = loaded.is_some();
        if let Some(t) = loaded {
            t.refs += 1;
        }
        found
    }

    /// One mapping fewer uses the table of `key`.
    pub fn release(&mut self, key: &str) {
        self.clock += 1;
        if let Some(t) = self.loaded.get_mut(key) {
            t.refs = t.refs.saturating_sub(1);
            t.last_used = self.clock;
        }
    }

    /// The loaded tables.
    pub fn tables(&self) -> impl Iterator<Item = (&FileKey, &Loaded)> {
        self.loaded.iter()
    }

    /// Bytes of row memory in use and in total.
    pub fn usage(&self) -> (u64, u64) {
        let shard_bytes = u64::from(SHARD_ROWS) * 8;
        let used = u64::from(self.total_shards) - self.free_shards.len() as u64;
        (used * shard_bytes, u64::from(self.total_shards) * shard_bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(r: &mut Registry, key: &str, rows: u32) -> Result<Reservation, NoRoom> {
        let res = r.reserve(rows)?;
        r.insert(key.into(), &res, rows, key.into(), Duration::ZERO);
        Ok(Reservation { slot: res.slot, shards: res.shards.clone(), evicted_slots: res.evicted_slots })
    }

    #[test]
    fn tables_take_whole_shards_and_free_them_when_evicted() {
        let mut r = Registry::new(4, 8);
        let a = load(&mut r, "a", SHARD_ROWS + 1).unwrap();
        assert_eq!(a.shards.len(), 2);
        assert_eq!(r.usage().0, 2 * u64::from(SHARD_ROWS) * 8);
        let b = load(&mut r, "b", 10).unwrap();
        assert_eq!(b.shards.len(), 1);
        // Needs 2 shards, 1 free: evicts the least recently used unreferenced table, "a".
        r.get("b");
        let c = load(&mut r, "c", SHARD_ROWS * 2).unwrap();
        assert_eq!(c.evicted_slots, vec![a.slot]);
        assert!(r.get("a").is_none());
        assert!(r.get("b").is_some());
        assert_eq!(r.evictions, 1);
    }

    #[test]
    fn referenced_tables_are_never_evicted() {
        let mut r = Registry::new(2, 8);
        load(&mut r, "a", SHARD_ROWS * 2).unwrap();
        r.acquire("a");
        assert_eq!(r.reserve(1), Err(NoRoom::BudgetFull));
        r.release("a");
        let res = r.reserve(1).unwrap();
        assert_eq!(res.evicted_slots.len(), 1);
    }

    #[test]
    fn too_large_is_told_apart_from_full() {
        let mut r = Registry::new(2, 8);
        assert_eq!(r.reserve(SHARD_ROWS * 3), Err(NoRoom::TooLarge));
        let mut big = Registry::new(1024, 8);
        assert_eq!(big.reserve(SHARD_ROWS * (MAX_TABLE_SHARDS as u32 + 1)), Err(NoRoom::TooLarge));
    }

    #[test]
    fn slots_run_out_like_shards() {
        let mut r = Registry::new(8, 1);
        load(&mut r, "a", 1).unwrap();
        r.acquire("a");
        assert_eq!(r.reserve(1), Err(NoRoom::BudgetFull));
        let res = r.reserve(1);
        assert!(res.is_err());
    }
}
