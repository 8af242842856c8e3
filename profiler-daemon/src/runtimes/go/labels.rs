//! A goroutine's pprof labels, read from its `g.labels`, in the representation its version's
//! [`LabelsRepr`] says:
//! - before Go 1.24 a pointer to a `runtime/pprof.labelMap`, a `map[string]string`, whose
//!   `hmap` and buckets are read here (`src/runtime/map.go`: the bucket is 8 top hashes, 8
//!   keys, 8 values, an overflow pointer);
//! - from Go 1.24 a pointer to a `labelMap{LabelSet{list []label}}`: a slice header (data,
//!   len, cap) of `{key, value string}` pairs, sorted by key (`src/runtime/pprof/label.go`).
//!
//! Bounded the same for both: [`MAX_LABELS`] per goroutine, [`MAX_STRING_BYTES`] per key or value, buckets and
//! overflow chains by [`MAX_BUCKET_BITS`] and [`MAX_OVERFLOW`], and [`MAX_DUMP_BYTES`] of keys
//! and values per dump, charged before they are read; what is cut is counted. Goroutines
//! started under one `pprof.Do` share one map: [`LabelReader`] reads each map once.

use std::{collections::HashMap, sync::Arc};

use super::layout::LabelsRepr;
use crate::runtimes::cpython::memory::{field_u64, field_u8, ReadError, Remote};

/// A goroutine's labels, sorted by key, shared by the goroutines that share the map.
pub type Labels = Arc<[(String, String)]>;

/// Bytes of keys and values read per dump at most (a process's own labels; a hostile one
/// could otherwise make 100,000 goroutines × 64 labels × 2 KiB).
pub const MAX_DUMP_BYTES: u64 = 8 << 20;

/// One dump's reading of label maps: each map once, within [`MAX_DUMP_BYTES`].
pub struct LabelReader {
    repr: LabelsRepr,
    by_pointer: HashMap<u64, Option<Labels>>,
    budget: u64,
    /// Labels, or parts of them, cut by the bounds (or unreadable).
    pub cut: u64,
}

impl LabelReader {
    /// A reader of labels laid out as `repr` says.
    pub fn new(repr: LabelsRepr) -> Self {
        LabelReader { repr, by_pointer: HashMap::new(), budget: MAX_DUMP_BYTES, cut: 0 }
    }

    /// The labels at `labels` (`g.labels`); `None` when the goroutine has none.
    pub fn read(&mut self, remote: &Remote, labels: u64) -> Option<Labels> {
        if let Some(known) = self.by_pointer.get(&labels) {
            return known.clone();
        }
        let read = match self.repr {
            LabelsRepr::Map => read_map(remote, labels, &mut self.budget, &mut self.cut),
            LabelsRepr::List => read_list(remote, labels, &mut self.budget, &mut self.cut),
        };
        let read = match read {
            Ok(pairs) => pairs.map(Labels::from),
            Err(_) => {
                self.cut += 1;
                None
            }
        };
        self.by_pointer.insert(labels, read.clone());
        read
    }
}

/// Labels kept per goroutine (Go's own profiles keep every label; a goroutine has a few).
pub const MAX_LABELS: usize = 64;
/// Bytes kept of a key or value.
pub const MAX_STRING_BYTES: u64 = 1024;
/// `hmap.B` read at most: 2^6 buckets of 8 hold more than [`MAX_LABELS`].
const MAX_BUCKET_BITS: u8 = 6;
/// Overflow buckets followed per bucket.
const MAX_OVERFLOW: usize = 8;

const HMAP_BYTES: usize = 48;
const HMAP_B: u64 = 9;
const HMAP_BUCKETS: u64 = 16;
const HMAP_OLDBUCKETS: u64 = 24;
const BUCKET_SLOTS: usize = 8;
const STRING_BYTES: u64 = 16;
/// A slice header: data, len, cap.
const SLICE_BYTES: usize = 24;
/// A `runtime/pprof.label`: key and value strings.
const LABEL_BYTES: u64 = 2 * STRING_BYTES;
const BUCKET_KEYS: u64 = 8;
const BUCKET_VALUES: u64 = BUCKET_KEYS + BUCKET_SLOTS as u64 * STRING_BYTES;
const BUCKET_OVERFLOW: u64 = BUCKET_VALUES + BUCKET_SLOTS as u64 * STRING_BYTES;
const BUCKET_BYTES: usize = BUCKET_OVERFLOW as usize + 8;
/// Top hashes below this mark an empty or evacuated slot (`minTopHash`).
const MIN_TOP_HASH: u8 = 5;

/// The labels at `labels` (`g.labels`): `None` when the goroutine has none (a nil pointer),
/// else the pairs sorted by key. `budget`: bytes of strings left to read; `cut` counts what
/// the bounds left out.
pub fn read_map(
    remote: &Remote,
    labels: u64,
    budget: &mut u64,
    cut: &mut u64,
) -> Result<Option<Vec<(String, String)>>, ReadError> {
    if labels == 0 {
        return Ok(None);
    }
    let hmap = remote.u64(labels)?;
    let mut pairs: Vec<(String, String)> = Vec::new();
    if hmap != 0 {
        let header = remote.bytes(hmap, HMAP_BYTES)?;
        let bits = field_u8(&header, HMAP_B);
        if bits > MAX_BUCKET_BITS {
            *cut += 1;
            return Ok(Some(pairs));
        }
        // A map being grown has entries in its old buckets not yet moved (top hash ≥ 5).
        for (base, count) in [
            (field_u64(&header, HMAP_BUCKETS), 1u64 << bits),
            (field_u64(&header, HMAP_OLDBUCKETS), 1u64 << bits.saturating_sub(1)),
        ] {
            if base == 0 {
                continue;
            }
            for index in 0..count {
                read_chain(remote, base + index * BUCKET_BYTES as u64, &mut pairs, budget, cut)?;
            }
        }
    }
    pairs.sort();
    pairs.dedup_by(|a, b| a.0 == b.0);
    Ok(Some(pairs))
}

/// The labels at `labels` (`g.labels`) of Go 1.24 on: `None` for a nil pointer, else the
/// slice's pairs (at most [`MAX_LABELS`], the rest counted in `cut`), sorted by key.
pub fn read_list(
    remote: &Remote,
    labels: u64,
    budget: &mut u64,
    cut: &mut u64,
) -> Result<Option<Vec<(String, String)>>, ReadError> {
    if labels == 0 {
        return Ok(None);
    }
    let header = remote.bytes(labels, SLICE_BYTES)?;
    let (data, len) = (field_u64(&header, 0), field_u64(&header, 8));
    let kept = len.min(MAX_LABELS as u64);
    *cut += len - kept;
    let mut pairs = Vec::with_capacity(kept as usize);
    if kept > 0 {
        let items = remote.bytes(data, kept as usize * LABEL_BYTES as usize)?;
        for at in (0..kept).map(|i| i * LABEL_BYTES) {
            let key = string(remote, &items, at, budget, cut)?;
            let value = string(remote, &items, at + STRING_BYTES, budget, cut)?;
            pairs.push((key, value));
        }
    }
    // Sorted by Go already; sorted again so a torn read cannot give an unsorted set.
    pairs.sort();
    Ok(Some(pairs))
}

/// One bucket and its overflow buckets.
fn read_chain(
    remote: &Remote,
    mut bucket: u64,
    pairs: &mut Vec<(String, String)>,
    budget: &mut u64,
    cut: &mut u64,
) -> Result<(), ReadError> {
    for _ in 0..=MAX_OVERFLOW {
        if bucket == 0 {
            return Ok(());
        }
        let bytes = remote.bytes(bucket, BUCKET_BYTES)?;
        for slot in 0..BUCKET_SLOTS {
            if bytes[slot] < MIN_TOP_HASH {
                continue;
            }
            if pairs.len() >= MAX_LABELS {
                *cut += 1;
                continue;
            }
            let at = |base: u64| base + slot as u64 * STRING_BYTES;
            let key = string(remote, &bytes, at(BUCKET_KEYS), budget, cut)?;
            let value = string(remote, &bytes, at(BUCKET_VALUES), budget, cut)?;
            pairs.push((key, value));
        }
        bucket = field_u64(&bytes, BUCKET_OVERFLOW);
    }
    if bucket != 0 {
        *cut += 1;
    }
    Ok(())
}

/// The Go string whose header (data, len) is at `at` of `bytes`, cut to [`MAX_STRING_BYTES`]
/// and to what is left of `budget` (charged before reading).
fn string(remote: &Remote, bytes: &[u8], at: u64, budget: &mut u64, cut: &mut u64) -> Result<String, ReadError> {
    let (data, len) = (field_u64(bytes, at), field_u64(bytes, at + 8));
    let kept = len.min(MAX_STRING_BYTES).min(*budget);
    if kept < len {
        *cut += 1;
    }
    *budget -= kept;
    let text = remote.bytes(data, kept as usize)?;
    Ok(String::from_utf8_lossy(&text).into_owned())
}

/// Go's `labelMap.String()`: `{"k":"v", "k2":"v2"}`, sorted, strings quoted as `%q` does.
pub fn go_string(pairs: &[(String, String)]) -> String {
    let mut items: Vec<String> = pairs.iter().map(|(k, v)| format!("{}:{}", quote(k), quote(v))).collect();
    items.sort();
    format!("{{{}}}", items.join(", "))
}

/// Go's `strconv.Quote` for the printable subset: `"`, `\` and control characters escaped.
fn quote(text: &str) -> String {
    let mut out = String::from("\"");
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            c if (c as u32) < 0x20 || c as u32 == 0x7f => out.push_str(&format!("\\x{:02x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::Pid;

    /// A `map[string]string` laid out as Go lays it out, in this process's memory.
    struct FakeMap {
        _strings: Vec<String>,
        buckets: Vec<[u8; BUCKET_BYTES]>,
        header: [u8; HMAP_BYTES],
        hmap_ptr: u64,
    }

    fn fake(pairs: &[(&str, &str)]) -> Box<FakeMap> {
        let strings: Vec<String> = pairs.iter().flat_map(|(k, v)| [k.to_string(), v.to_string()]).collect();
        let mut bucket = [0u8; BUCKET_BYTES];
        for (slot, pair) in strings.chunks(2).enumerate() {
            bucket[slot] = 0x80 + slot as u8;
            for (i, s) in pair.iter().enumerate() {
                let base = if i == 0 { BUCKET_KEYS } else { BUCKET_VALUES } as usize + slot * 16;
                bucket[base..base + 8].copy_from_slice(&(s.as_ptr() as u64).to_le_bytes());
                bucket[base + 8..base + 16].copy_from_slice(&(s.len() as u64).to_le_bytes());
            }
        }
        let mut map =
            Box::new(FakeMap { _strings: strings, buckets: vec![bucket], header: [0; HMAP_BYTES], hmap_ptr: 0 });
        let buckets = map.buckets.as_ptr() as u64;
        map.header[HMAP_BUCKETS as usize..HMAP_BUCKETS as usize + 8].copy_from_slice(&buckets.to_le_bytes());
        map.hmap_ptr = map.header.as_ptr() as u64;
        map
    }

    #[test]
    fn a_label_map_reads_back_sorted_and_prints_as_go_does() {
        let map = fake(&[("worker", "b"), ("role", "wait\"er")]);
        let me = Remote { pid: Pid(std::process::id()) };
        let (mut cut, mut budget) = (0, MAX_DUMP_BYTES);
        let pointer = &map.hmap_ptr as *const u64 as u64;
        let pairs = read_map(&me, pointer, &mut budget, &mut cut).unwrap().unwrap();
        assert_eq!(pairs, [("role".to_string(), "wait\"er".to_string()), ("worker".into(), "b".into())]);
        assert_eq!((cut, budget), (0, MAX_DUMP_BYTES - 18));
        assert_eq!(go_string(&pairs), r#"{"role":"wait\"er", "worker":"b"}"#);
        assert_eq!(read_map(&me, 0, &mut budget, &mut cut).unwrap(), None, "a nil pointer is no labels");

        // The budget is charged before reading: what it cannot pay for is cut and counted.
        let mut small = 6;
        let cut_short = read_map(&me, pointer, &mut small, &mut cut).unwrap().unwrap();
        assert_eq!(cut_short, [(String::new(), String::new()), ("worker".into(), "".into())]);
        assert_eq!((cut, small), (3, 0));

        // A shared map is read once per dump.
        let mut reader = LabelReader::new(LabelsRepr::Map);
        let first = reader.read(&me, pointer).unwrap();
        let again = reader.read(&me, pointer).unwrap();
        assert!(Arc::ptr_eq(&first, &again));
    }

    /// A `labelMap{LabelSet{list []label}}` as Go 1.24 lays it out, in this process's memory.
    fn fake_list(pairs: &[(&'static str, &'static str)]) -> (Vec<[u64; 4]>, [u64; 3]) {
        let items: Vec<[u64; 4]> =
            pairs.iter().map(|(k, v)| [k.as_ptr() as u64, k.len() as u64, v.as_ptr() as u64, v.len() as u64]).collect();
        let header = [items.as_ptr() as u64, items.len() as u64, items.len() as u64];
        (items, header)
    }

    #[test]
    fn a_label_list_reads_back_bounded_and_counted() {
        let me = Remote { pid: Pid(std::process::id()) };
        let (items, header) = fake_list(&[("handler", "checkout"), ("region", "eu")]);
        let pointer = header.as_ptr() as u64;
        let (mut cut, mut budget) = (0, MAX_DUMP_BYTES);
        let pairs = read_list(&me, pointer, &mut budget, &mut cut).unwrap().unwrap();
        assert_eq!(pairs, [("handler".to_string(), "checkout".to_string()), ("region".into(), "eu".into())]);
        assert_eq!((cut, budget), (0, MAX_DUMP_BYTES - 23));
        assert_eq!(read_list(&me, 0, &mut budget, &mut cut).unwrap(), None, "a nil pointer is no labels");

        // More than MAX_LABELS: the rest counted; a budget short of a string cuts and counts.
        let many: Vec<(&'static str, &'static str)> = (0..MAX_LABELS + 3).map(|_| ("k", "v")).collect();
        let (many_items, many_header) = fake_list(&many);
        let (mut cut, mut budget) = (0, MAX_DUMP_BYTES);
        let pairs = read_list(&me, many_header.as_ptr() as u64, &mut budget, &mut cut).unwrap().unwrap();
        assert_eq!((pairs.len(), cut), (MAX_LABELS, 3));
        let (mut cut, mut small) = (0, 9);
        let pairs = read_list(&me, pointer, &mut small, &mut cut).unwrap().unwrap();
        assert_eq!(pairs, [(String::new(), String::new()), ("handler".to_string(), "ch".to_string())]);
        assert_eq!((cut, small), (3, 0));

        // The reader of a 1.24 process reads lists, each once.
        let mut reader = LabelReader::new(LabelsRepr::List);
        let first = reader.read(&me, pointer).unwrap();
        assert!(Arc::ptr_eq(&first, &reader.read(&me, pointer).unwrap()));
        drop((items, many_items));
    }
}
