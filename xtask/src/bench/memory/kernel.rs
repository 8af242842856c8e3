//! The kernel's accounting of a BPF map's memory (`memlock` in fdinfo, `bytes_memlock` in
//! bpftool), as `map_mem_usage` computes it in Linux 6.x: `htab_map_mem_usage`
//! (`kernel/bpf/hashtab.c`) and `array_map_mem_usage` (`kernel/bpf/arraymap.c`). Pure, so the
//! same map can be priced at any number of possible CPUs.
//!
//! The two structs the kernel adds (`struct bpf_htab`, `struct bpf_array`) depend on the
//! kernel's configuration; they are not spelled here but found from the measured maps
//! ([`Overheads::calibrate`]), and every map measured is then checked against the formula.

/// `enum bpf_map_type` values this object uses.
const HASH: u32 = 1;
const ARRAY: u32 = 2;
const PERCPU_HASH: u32 = 5;
const PERCPU_ARRAY: u32 = 6;
const LRU_HASH: u32 = 9;
const LRU_PERCPU_HASH: u32 = 10;
/// Its memory is its pages, whatever the CPUs: the measured figure stands for every count.
const RINGBUF: u32 = 27;

const BPF_F_NO_PREALLOC: u32 = 1;
const BPF_F_MMAPABLE: u32 = 1 << 10;

/// `sizeof(struct htab_elem)` before the key: the hash node (or free-list node), the
/// per-CPU pointer (or LRU node, 24 bytes) and the hash, rounded to 8.
const HTAB_ELEM: u64 = 48;
/// `sizeof(struct bucket)`: an `hlist_nulls_head` and a 4-byte lock, padded.
const BUCKET: u64 = 16;
/// `HASHTAB_MAP_LOCK_COUNT`: per-CPU `int`s that guard against re-entry.
const LOCK_COUNT: u64 = 8;
/// `sizeof(struct llist_node)`, added per element of a map that allocates on insert.
const LLIST_NODE: u64 = 8;
const PAGE: u64 = 4096;

/// A map as `bpf_map_info` describes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shape {
    pub map_type: u32,
    pub key_size: u32,
    pub value_size: u32,
    pub max_entries: u32,
    pub flags: u32,
}

/// The kernel structs' sizes, found from measured maps.
#[derive(Clone, Copy, Debug, Default)]
pub struct Overheads {
    pub htab: u64,
    pub array: u64,
}

impl Shape {
    pub fn type_name(&self) -> &'static str {
        match self.map_type {
            HASH => "hash",
            ARRAY => "array",
            PERCPU_HASH => "percpu_hash",
            PERCPU_ARRAY => "percpu_array",
            LRU_HASH => "lru_hash",
            LRU_PERCPU_HASH => "lru_percpu_hash",
            RINGBUF => "ringbuf",
            _ => "other",
        }
    }

    fn is_hash(&self) -> bool {
        matches!(self.map_type, HASH | PERCPU_HASH | LRU_HASH | LRU_PERCPU_HASH)
    }

    fn is_percpu(&self) -> bool {
        matches!(self.map_type, PERCPU_HASH | LRU_PERCPU_HASH | PERCPU_ARRAY)
    }

    fn is_lru(&self) -> bool {
        matches!(self.map_type, LRU_HASH | LRU_PERCPU_HASH)
    }

    /// Whether the kernel allocates its entries up front (its memory does not depend on use).
    pub fn preallocated(&self) -> bool {
        !(self.is_hash() && self.flags & BPF_F_NO_PREALLOC != 0)
    }

    /// Whether [`Self::bytes`] knows this map type.
    pub fn known(&self) -> bool {
        self.is_hash() || matches!(self.map_type, ARRAY | PERCPU_ARRAY)
    }

    /// The kernel's figure for this map with `cpus` possible CPUs and `entries` entries in
    /// use (only maps that allocate on insert depend on it; others have `max_entries`).
    pub fn bytes(&self, overheads: Overheads, cpus: u64, entries: u64) -> u64 {
        if self.is_hash() {
            overheads.htab + self.hash_bytes(cpus, entries)
        } else {
            self.array_bytes(overheads.array, cpus)
        }
    }

    fn hash_bytes(&self, cpus: u64, entries: u64) -> u64 {
        let value = round8(self.value_size);
        let percpu = self.is_percpu();
        let elem = HTAB_ELEM + round8(self.key_size) + if percpu { 8 } else { value };
        let buckets = u64::from(self.max_entries).next_power_of_two();
        let mut usage = BUCKET * buckets + 4 * cpus * LOCK_COUNT;
        if self.preallocated() {
            let extra = if !percpu && !self.is_lru() { cpus } else { 0 };
            usage += elem * (u64::from(self.max_entries) + extra);
            if percpu {
                usage += value * cpus * u64::from(self.max_entries);
            } else if !self.is_lru() {
                usage += 8 * cpus;
            }
        } else {
            usage += (elem + LLIST_NODE) * entries;
            if percpu {
                usage += (LLIST_NODE + 8) * entries + value * cpus * entries;
            }
        }
        usage
    }

    fn array_bytes(&self, header: u64, cpus: u64) -> u64 {
        let (elem, entries) = (round8(self.value_size), u64::from(self.max_entries));
        if self.is_percpu() {
            header + entries * 8 + entries * elem * cpus
        } else if self.flags & BPF_F_MMAPABLE != 0 {
            page_align(header) + page_align(entries * elem)
        } else {
            header + entries * elem
        }
    }
}

impl Overheads {
    /// The struct sizes that make the formula match the most measured maps: each preallocated
    /// hash and plain array, measured at `cpus`, gives one candidate.
    pub fn calibrate(measured: &[(Shape, u64)], cpus: u64) -> Overheads {
        let zero = Overheads::default();
        let candidates = |wanted: fn(&Shape) -> bool| {
            let found: Vec<u64> = measured
                .iter()
                .filter(|(shape, _)| wanted(shape))
                .map(|(shape, memlock)| memlock.saturating_sub(shape.bytes(zero, cpus, shape.max_entries.into())))
                .collect();
            most_common(&found)
        };
        Overheads {
            htab: candidates(|s| s.is_hash() && s.preallocated()),
            array: candidates(|s| s.map_type == ARRAY && s.flags & BPF_F_MMAPABLE == 0),
        }
    }

    /// Entries in use of a map that allocates on insert, from its measured figure.
    pub fn entries_in_use(&self, shape: &Shape, memlock: u64, cpus: u64) -> u64 {
        if shape.preallocated() {
            return shape.max_entries.into();
        }
        let empty = shape.bytes(*self, cpus, 0);
        let one = shape.bytes(*self, cpus, 1) - empty;
        memlock.saturating_sub(empty) / one.max(1)
    }
}

fn most_common(values: &[u64]) -> u64 {
    let mut best = (0, 0);
    for &v in values {
        let n = values.iter().filter(|&&w| w == v).count();
        if n > best.1 {
            best = (v, n);
        }
    }
    best.0
}

fn round8(n: u32) -> u64 {
    u64::from(n).div_ceil(8) * 8
}

fn page_align(n: u64) -> u64 {
    n.div_ceil(PAGE) * PAGE
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(map_type: u32, key_size: u32, value_size: u32, max_entries: u32, flags: u32) -> Shape {
        Shape { map_type, key_size, value_size, max_entries, flags }
    }

    #[test]
    fn percpu_hash_grows_with_cpus_and_shared_hash_hardly() {
        let percpu = shape(PERCPU_HASH, 40, 8, 16_384, 0);
        let shared = shape(HASH, 40, 8, 16_384, 0);
        let o = Overheads::default();
        // 8 bytes per entry per CPU: 128 KiB more per CPU.
        assert_eq!(percpu.bytes(o, 3, 0) - percpu.bytes(o, 2, 0), 16_384 * 8 + 32);
        // One spare element, its pointer and the locks per CPU.
        assert_eq!(shared.bytes(o, 3, 0) - shared.bytes(o, 2, 0), 96 + 8 + 32);
    }

    #[test]
    fn calibration_finds_the_struct_and_entries_in_use() {
        let (htab, array, cpus) = (704, 320, 2);
        let truth = Overheads { htab, array };
        let maps = [shape(HASH, 4, 1, 4096, 0), shape(PERCPU_HASH, 24, 16, 16_384, 0), shape(ARRAY, 0, 4, 1, 0)];
        let measured: Vec<(Shape, u64)> = maps.iter().map(|s| (*s, s.bytes(truth, cpus, 0))).collect();
        let found = Overheads::calibrate(&measured, cpus);
        assert_eq!((found.htab, found.array), (htab, array));
        let lazy = shape(HASH, 8, 1032, 16_384, BPF_F_NO_PREALLOC);
        assert_eq!(found.entries_in_use(&lazy, lazy.bytes(truth, cpus, 123), cpus), 123);
    }
}
