//! Go's pprof labels at a sample: for a thread of a process listed in `GO_PROCESSES`, read
//! the current goroutine (`g`, which Go keeps in the thread's TLS: at `fsbase + offset`), its
//! `g.labels`, and the labels there (a `map[string]string` before Go 1.24, a sorted list
//! from 1.24), into this CPU's scratch entry; store the set in `GO_LABELS` under its hash (in
//! the set's half of the keys, as stacks are), and give the sample that hash.
//!
//! It is two global functions ([`profiler_go_read_labels`], [`profiler_go_store_labels`]),
//! called by the sampling program after its stacks and not from inside their walk: the
//! walk's call chain already uses most of the 512 bytes of BPF stack, and a global function
//! is verified once, whatever its callers' paths. Their scratch lives in a per-CPU map, not
//! on the stack, and the count of labels found is kept there too, so that the verifier sees
//! one unknown number rather than following each count on its own path.
//!
//! Bounds (see `profiler_common::runtimes::go`): [`GO_MAX_LABELS`] labels, keys and values
//! cut at their lengths, [`MAX_BUCKET_READS`] bucket reads of a map (its buckets and their
//! overflow chains); what is left out is marked in the entry. The read is of the sampled
//! thread's own memory in its own context; a fault gives `LABELS_UNREADABLE`.

#![allow(non_upper_case_globals)]

use core::{ffi::c_void, ptr};

use aya_ebpf::{
    bindings::BPF_NOEXIST,
    helpers::{
        bpf_get_current_task, bpf_probe_read_kernel, bpf_probe_read_user, generated::bpf_probe_read_user as read_raw,
    },
    macros::map,
    maps::{HashMap, PerCpuArray},
    Global,
};
use profiler_common::{
    runtimes::go::{
        maps::{GO_LABELS_MAX_ENTRIES, GO_PROCESSES_MAX_ENTRIES},
        GoLabels, GoProcess, GO_LABELS_LIST, GO_LABELS_WORDS, GO_LABEL_KEY_BYTES, GO_LABEL_VALUE_BYTES, GO_MAX_LABELS,
        LABELS_CUT_BYTES, LABELS_CUT_COUNT, LABELS_MAP_FULL, LABELS_UNREADABLE, NO_LABELS,
    },
    stack::{finish_hash, hash_frame, hash_start, set_key},
};

use crate::maps::{Scratch, SCRATCH_SLOTS, STACK_HASH_KEY};

/// `task_struct.thread.fsbase`'s offset (set at load from the kernel's BTF; 0: unknown, and
/// no labels are read).
#[unsafe(no_mangle)]
pub static TASK_FSBASE: Global<u32> = Global::new(0);

#[map]
pub static GO_PROCESSES: HashMap<u32, GoProcess> = HashMap::with_max_entries(GO_PROCESSES_MAX_ENTRIES, 0);

#[map]
pub static GO_LABELS: HashMap<u64, GoLabels> =
    HashMap::with_max_entries(GO_LABELS_MAX_ENTRIES, aya_ebpf::bindings::BPF_F_NO_PREALLOC);

#[map]
pub static GO_LABEL_SCRATCH: PerCpuArray<LabelRead> = PerCpuArray::with_max_entries(SCRATCH_SLOTS, 0);

/// `-EEXIST`: the insert found the entry there already.
const EEXIST: i64 = -17;

/// Bucket reads of a label map at most (buckets and overflow buckets together): a map of
/// up to 8 labels is one bucket.
const MAX_BUCKET_READS: u32 = 4;
/// A map bucket of `map[string]string`: 8 top hashes, 8 keys, 8 values (strings: pointer and
/// length), an overflow pointer (`src/runtime/map.go`, `bmap`).
const BUCKET_WORDS: usize = 1 + 8 * 2 + 8 * 2 + 1;
/// `hmap.B`, `hmap.buckets`, `hmap.oldbuckets` (`src/runtime/map.go`, `hmap`; `count` is at 0).
const HMAP_B: usize = 9;
const HMAP_BUCKETS_WORD: usize = 2;
const HMAP_OLDBUCKETS_WORD: usize = 3;
/// Top hashes below this mark an empty or evacuated slot (`minTopHash`).
const MIN_TOP_HASH: u64 = 5;
/// A list element (Go 1.24's `label`: key and value strings).
const LIST_LABEL_WORDS: usize = 4;

/// The read's scratch, per CPU and [`Scratch`] slot.
#[repr(C)]
pub struct LabelRead {
    /// The bucket (or the list's elements) read.
    bucket: [u64; BUCKET_WORDS],
    /// Found labels' strings: key pointer, key length, value pointer, value length each.
    strings: [u64; GO_MAX_LABELS * LIST_LABEL_WORDS],
    /// Labels in `strings`.
    found: u64,
    labels: GoLabels,
}

#[inline(always)]
fn read_u64(addr: u64) -> Option<u64> {
    // SAFETY: a fault-safe read of user memory.
    unsafe { bpf_probe_read_user(addr as *const u64) }.ok()
}

/// Fault-safe copy of `len` bytes (at most `N`) of user memory at `from` into `to`.
#[inline(always)]
fn read_bytes<const N: usize>(to: &mut [u8; N], from: u64, len: u64) -> bool {
    let len = if len > N as u64 { N as u32 } else { len as u32 };
    // SAFETY: `to` is `N` bytes of map memory and `len <= N`.
    unsafe { read_raw(to.as_mut_ptr().cast(), len, from as *const c_void) == 0 }
}

/// Forgets process `tgid` at its exec: the new image, if Go, registers anew.
#[inline(always)]
pub fn forget(tgid: u32) {
    // SAFETY: only checks for presence.
    if unsafe { GO_PROCESSES.get(&tgid) }.is_some() {
        let _ = GO_PROCESSES.remove(&tgid);
    }
}

/// The label hash of the current thread's goroutine (see [`profiler_go_read_labels`] and
/// [`profiler_go_store_labels`]) if process `tgid` is a registered Go process, else
/// `NO_LABELS` at the cost of one lookup.
#[inline(always)]
pub fn labels(set: u32, slot: Scratch, tgid: u32) -> u64 {
    // SAFETY: only checks for presence.
    if unsafe { GO_PROCESSES.get(&tgid) }.is_none() {
        return NO_LABELS;
    }
    match profiler_go_read_labels(slot as u32, tgid) {
        READ_FOUND => profiler_go_store_labels(set, slot as u32),
        READ_UNREADABLE => LABELS_UNREADABLE,
        _ => NO_LABELS,
    }
}

/// [`profiler_go_read_labels`]: the goroutine has no labels (or the thread no goroutine).
const READ_NONE: u32 = 0;
/// [`profiler_go_read_labels`]: a read faulted.
const READ_UNREADABLE: u32 = 1;
/// [`profiler_go_read_labels`]: labels found, their strings in the scratch entry.
const READ_FOUND: u32 = 2;

/// Finds the labels of the goroutine on the current thread of Go process `tgid`: their
/// strings' addresses and lengths into this CPU's scratch entry for `slot`, with their
/// number. One of `READ_*`. A global function, verified once: its result is one unknown
/// number to the caller, so the store after it is verified once too, not once per count.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn profiler_go_read_labels(slot: u32, tgid: u32) -> u32 {
    // SAFETY: the entry is copied out at once.
    let Some(process) = (unsafe { GO_PROCESSES.get(&tgid) }).copied() else { return READ_NONE };
    let Some(read) = GO_LABEL_SCRATCH.get_ptr_mut(slot) else { return READ_NONE };
    // SAFETY: this CPU's scratch for the caller's context (see `Scratch`).
    let read = unsafe { &mut *read };
    let Some(pointer) = label_pointer(&process) else { return READ_UNREADABLE };
    if pointer == 0 {
        return READ_NONE;
    }
    clear(&mut read.labels);
    set_found(read, 0);
    let ok = if process.labels_form == GO_LABELS_LIST { list(read, pointer) } else { map(read, pointer) };
    if !ok {
        return READ_UNREADABLE;
    }
    if found(read) == 0 {
        READ_NONE
    } else {
        READ_FOUND
    }
}

/// Copies the strings [`profiler_go_read_labels`] found into the entry, and stores it in map
/// set `set`'s half of `GO_LABELS` (once: an entry already there is left). Returns its
/// hash (even, the set bit clear), or `LABELS_MAP_FULL`.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn profiler_go_store_labels(set: u32, slot: u32) -> u64 {
    let Some(read) = GO_LABEL_SCRATCH.get_ptr_mut(slot) else { return NO_LABELS };
    // SAFETY: this CPU's scratch for the caller's context (see `Scratch`).
    let read = unsafe { &mut *read };
    copy_strings(read);
    let hash = hash_labels(&read.labels);
    match GO_LABELS.insert(&set_key(hash, set), &read.labels, BPF_NOEXIST as u64) {
        Ok(()) => hash,
        // Already stored by an earlier sample with the same labels.
        Err(err) if i64::from(err) == EEXIST => hash,
        Err(_) => LABELS_MAP_FULL,
    }
}

/// The number of labels found so far, read from map memory: to the verifier an unknown
/// number, so that the walk's paths do not multiply by every count they could have.
#[inline(always)]
fn found(read: &LabelRead) -> u64 {
    // SAFETY: a read of map memory.
    unsafe { ptr::read_volatile(&read.found) }
}

#[inline(always)]
fn set_found(read: &mut LabelRead, found: u64) {
    // SAFETY: a write of map memory.
    unsafe { ptr::write_volatile(&mut read.found, found) };
}

/// `g.labels` of the thread's current `g`: `Some(0)` when it has no labels (or the thread
/// no goroutine: a thread of C code in a cgo process).
#[inline(always)]
fn label_pointer(process: &GoProcess) -> Option<u64> {
    let offset = TASK_FSBASE.load();
    if offset == 0 {
        return Some(0);
    }
    // SAFETY: a plain helper; the task is read only through fault-safe reads.
    let task = unsafe { bpf_get_current_task() };
    // SAFETY: a fault-safe read of kernel memory.
    let fsbase = unsafe { bpf_probe_read_kernel((task + u64::from(offset)) as *const u64) }.ok()?;
    if fsbase == 0 {
        return Some(0);
    }
    let g = read_u64(fsbase.wrapping_add(process.g_tls_offset as u64))?;
    if g == 0 {
        return Some(0);
    }
    // `g.labels` points at the `labelMap` (a map header pointer, or the list's struct).
    read_u64(g + u64::from(process.labels_offset))
}

/// Zeroes the entry word by word (no `memset` call in a BPF program): unused labels hash as
/// zeros.
#[inline(always)]
fn clear(labels: &mut GoLabels) {
    let words = (labels as *mut GoLabels).cast::<u64>();
    for i in 0..GO_LABELS_WORDS {
        // SAFETY: within the entry, 8-aligned (its size is a multiple of 8).
        unsafe { ptr::write_volatile(words.add(i), 0) };
    }
}

/// The strings of a Go 1.24+ `labelMap{list []label}` at `list` (its slice header first):
/// labels found, into `read.strings`. False when a read faulted.
#[inline(always)]
fn list(read: &mut LabelRead, list: u64) -> bool {
    let (Some(start), Some(len)) = (read_u64(list), read_u64(list + 8)) else { return false };
    if len == 0 {
        return true;
    }
    let n = if len > GO_MAX_LABELS as u64 {
        read.labels.cut |= LABELS_CUT_COUNT;
        GO_MAX_LABELS as u32
    } else {
        len as u32
    };
    let bytes = n * (LIST_LABEL_WORDS as u32 * 8);
    // SAFETY: `strings` is 8 labels' words of map memory; `bytes` is at most that.
    let ok = unsafe { read_raw(read.strings.as_mut_ptr().cast(), bytes, start as *const c_void) } == 0;
    set_found(read, if ok { u64::from(n) } else { 0 });
    ok
}

/// The strings of a `map[string]string` `labelMap` at `labels` (a pointer to its `hmap`): its
/// buckets and their overflow chains, in order, up to [`MAX_BUCKET_READS`] reads; labels
/// found, into `read.strings`. False when a read faulted.
#[inline(always)]
fn map(read: &mut LabelRead, labels: u64) -> bool {
    let Some(hmap) = read_u64(labels) else { return false };
    if hmap == 0 {
        return true;
    }
    // SAFETY: a fault-safe read of user memory.
    let Ok(header) = (unsafe { bpf_probe_read_user(hmap as *const [u64; 4]) }) else { return false };
    if header[0] == 0 {
        return true;
    }
    if header[HMAP_OLDBUCKETS_WORD] != 0 {
        // Growing: some labels are still in the old buckets (not for a map of 8 or fewer).
        read.labels.cut |= LABELS_CUT_COUNT;
    }
    let bits = (header[1] >> ((HMAP_B - 8) * 8)) & 0xff;
    let buckets = header[HMAP_BUCKETS_WORD];
    let bucket_count = 1u64 << (bits & 31);
    let (mut index, mut at) = (0u64, buckets);
    for _ in 0..MAX_BUCKET_READS {
        // SAFETY: `bucket` is a bucket's words of map memory.
        let ok =
            unsafe { read_raw(read.bucket.as_mut_ptr().cast(), (BUCKET_WORDS * 8) as u32, at as *const c_void) == 0 };
        if !ok {
            return false;
        }
        take_slots(read);
        let overflow = read.bucket[BUCKET_WORDS - 1];
        if overflow != 0 {
            at = overflow;
        } else {
            index += 1;
            if index >= bucket_count {
                return true;
            }
            at = buckets + index * (BUCKET_WORDS as u64 * 8);
        }
    }
    read.labels.cut |= LABELS_CUT_COUNT;
    true
}

/// Takes the full slots of the bucket read into `read.strings` after those found already.
#[inline(always)]
fn take_slots(read: &mut LabelRead) {
    let tophash = read.bucket[0];
    for slot in 0..8usize {
        if (tophash >> (slot * 8)) & 0xff < MIN_TOP_HASH {
            continue;
        }
        let found = found(read);
        if found as usize >= GO_MAX_LABELS {
            read.labels.cut |= LABELS_CUT_COUNT;
            break;
        }
        let to = (found as usize & (GO_MAX_LABELS - 1)) * LIST_LABEL_WORDS;
        read.strings[to] = read.bucket[1 + 2 * slot];
        read.strings[to + 1] = read.bucket[2 + 2 * slot];
        read.strings[to + 2] = read.bucket[17 + 2 * slot];
        read.strings[to + 3] = read.bucket[18 + 2 * slot];
        set_found(read, found + 1);
    }
}

/// Copies the found labels' bytes into the entry, cut at their bounds.
#[inline(always)]
fn copy_strings(read: &mut LabelRead) {
    let found = found(read);
    for i in 0..GO_MAX_LABELS {
        if i as u64 >= found {
            break;
        }
        let at = i * LIST_LABEL_WORDS;
        let (key, key_len, value, value_len) =
            (read.strings[at], read.strings[at + 1], read.strings[at + 2], read.strings[at + 3]);
        if key_len > GO_LABEL_KEY_BYTES as u64 || value_len > GO_LABEL_VALUE_BYTES as u64 {
            read.labels.cut |= LABELS_CUT_BYTES;
        }
        let label = &mut read.labels.labels[i];
        // A string that cannot be read stays empty (its length 0).
        if read_bytes(&mut label.key, key, key_len) {
            label.key_len = key_len.min(GO_LABEL_KEY_BYTES as u64) as u32;
        }
        if read_bytes(&mut label.value, value, value_len) {
            label.value_len = value_len.min(GO_LABEL_VALUE_BYTES as u64) as u32;
        }
        read.labels.len = i as u32 + 1;
    }
}

/// The entry's hash under the load's key, word by word (even, never `NO_LABELS`).
#[inline(always)]
fn hash_labels(labels: &GoLabels) -> u64 {
    let words = (labels as *const GoLabels).cast::<u64>();
    let mut hash = hash_start(STACK_HASH_KEY.load());
    for i in 0..GO_LABELS_WORDS {
        // SAFETY: within the entry, 8-aligned.
        hash = hash_frame(hash, unsafe { ptr::read_volatile(words.add(i)) });
    }
    finish_hash(hash, GO_LABELS_WORDS as u32)
}
