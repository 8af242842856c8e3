//! Go's part of the ABI: what the CPU program needs to read the pprof labels of the goroutine
//! running on the sampled thread ([`GoProcess`], written by userspace per Go process), the
//! labels as the kernel stores them ([`GoLabels`], one map entry per distinct set, keyed by
//! its hash as stacks are) and the maps' names. Go's frames need no walker of their own (Go
//! keeps frame pointers), so Go has no [`crate::FrameKind`]: the labels are the sample's, not
//! frames of its stack.
//!
//! Bounds: [`GO_MAX_LABELS`] labels per sample, keys cut at [`GO_LABEL_KEY_BYTES`] bytes and
//! values at [`GO_LABEL_VALUE_BYTES`]; Go's own CPU profile keeps every label whole, so what
//! is cut is marked in the entry ([`GoLabels::cut`]) and counted.

/// Names and sizes of Go's maps (see [`crate::maps`], whose `ALL` lists them).
pub mod maps {
    /// Hash of tgid (`u32`) → [`super::GoProcess`]: the Go processes whose labels are read.
    pub const GO_PROCESSES: &str = "GO_PROCESSES";
    /// Hash of a label set's key (its hash with the map set in the low bit, as stack keys,
    /// see [`crate::stack::set_key`]) → [`super::GoLabels`].
    pub const GO_LABELS: &str = "GO_LABELS";
    /// Per-CPU scratch of the label read, one entry per scratch slot.
    pub const GO_LABEL_SCRATCH: &str = "GO_LABEL_SCRATCH";
    /// Go processes read at once.
    pub const GO_PROCESSES_MAX_ENTRIES: u32 = 1_024;
    /// Distinct label sets of both map sets (one drain's each): allocated on insert. A
    /// service's labels (handler, endpoint, tenant) make tens; a set that finds the map full
    /// leaves its samples without labels, counted. 512, not 4,096: at 840 bytes an entry the
    /// larger map took `bench memory`'s total at 256 CPUs past its 80 MiB budget (82.9 MiB).
    pub const GO_LABELS_MAX_ENTRIES: u32 = 512;
    /// Every map of Go's label reader.
    pub const ALL: [&str; 3] = [GO_PROCESSES, GO_LABELS, GO_LABEL_SCRATCH];
}

/// Labels read per sample at most.
pub const GO_MAX_LABELS: usize = 8;
/// Bytes kept of a label's key.
pub const GO_LABEL_KEY_BYTES: usize = 32;
/// Bytes kept of a label's value.
pub const GO_LABEL_VALUE_BYTES: usize = 64;

/// [`GoProcess::labels_form`]: `g.labels` points at a `labelMap` that is a
/// `map[string]string` (Go before 1.24): an `hmap` and its buckets.
pub const GO_LABELS_MAP: u32 = 1;
/// [`GoProcess::labels_form`]: `g.labels` points at a `labelMap` that is a struct holding a
/// sorted `[]label` of `{key, value string}` (Go 1.24 on).
pub const GO_LABELS_LIST: u32 = 2;

/// The label hash of a sample without labels: not a Go process, or a goroutine that has none.
pub const NO_LABELS: u64 = 0;
/// The label hash of a sample whose goroutine's labels could not be read (a fault reading
/// the thread's `g` or its labels): counted.
pub const LABELS_UNREADABLE: u64 = 1;
/// The label hash of a sample whose label set was not stored (the labels map full).
pub const LABELS_MAP_FULL: u64 = 3;

/// [`GoLabels::cut`] bit: the goroutine has more labels than [`GO_MAX_LABELS`] (or more than
/// the map's buckets read hold).
pub const LABELS_CUT_COUNT: u32 = 1;
/// [`GoLabels::cut`] bit: a key or value was longer than its bound and is cut.
pub const LABELS_CUT_BYTES: u32 = 2;

/// What the label read needs of a Go process: where its threads keep their current `g`, and
/// where `g` keeps its labels. Value of `GO_PROCESSES`, by tgid.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GoProcess {
    /// The current `g`'s address is at `fsbase + g_tls_offset` (amd64: -8 for an internally
    /// linked binary; the TLS offset of `runtime.tlsg` for an externally linked one).
    pub g_tls_offset: i64,
    /// `g.labels`' offset in `runtime.g`.
    pub labels_offset: u32,
    /// [`GO_LABELS_MAP`] or [`GO_LABELS_LIST`].
    pub labels_form: u32,
}

const _: () = assert!(core::mem::size_of::<GoProcess>() == 16);

/// One label, its key and value cut at their bounds.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GoLabel {
    /// Bytes of `key` that are the key's.
    pub key_len: u32,
    pub value_len: u32,
    pub key: [u8; GO_LABEL_KEY_BYTES],
    pub value: [u8; GO_LABEL_VALUE_BYTES],
}

/// A goroutine's labels as the kernel read them, in its map's order (userspace sorts them);
/// the unused labels and bytes are zero, so equal sets hash equal.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GoLabels {
    /// Labels in `labels`.
    pub len: u32,
    /// [`LABELS_CUT_COUNT`], [`LABELS_CUT_BYTES`].
    pub cut: u32,
    pub labels: [GoLabel; GO_MAX_LABELS],
}

/// `GoLabels` in 8-byte words (the kernel hashes it word by word).
pub const GO_LABELS_WORDS: usize = core::mem::size_of::<GoLabels>() / 8;

const _: () = assert!(core::mem::size_of::<GoLabels>() == 8 + GO_MAX_LABELS * 104);
const _: () = assert!(core::mem::size_of::<GoLabels>().is_multiple_of(8));

impl GoLabels {
    /// The labels, as (key, value) bytes.
    pub fn pairs(&self) -> impl Iterator<Item = (&[u8], &[u8])> {
        let len = (self.len as usize).min(GO_MAX_LABELS);
        self.labels[..len].iter().map(|label| {
            let key = &label.key[..(label.key_len as usize).min(GO_LABEL_KEY_BYTES)];
            let value = &label.value[..(label.value_len as usize).min(GO_LABEL_VALUE_BYTES)];
            (key, value)
        })
    }
}

#[cfg(feature = "user")]
// SAFETY: repr(C), only integers, no padding (size asserted above).
unsafe impl aya::Pod for GoProcess {}
#[cfg(feature = "user")]
// SAFETY: repr(C), integers and byte arrays, no padding (size asserted above).
unsafe impl aya::Pod for GoLabels {}
