//! The ABI between profiler's eBPF programs and its userspace: map key and value layouts, map
//! names and sizes, counter indices and load-time global names.
//!
//! Everything here is `#[repr(C)]`, `Copy`, built from fixed-width integers with explicit
//! padding, and checked for size at compile time, because the kernel side (bpfel, `no_std`)
//! and the userspace side (x86_64) must agree byte for byte. Neither side spells a map name as
//! a literal: both use the constants below. The `user` feature adds aya's `Pod` impls; the
//! kernel build never sees aya.
#![no_std]

pub mod cpu;
pub mod stack;

pub use cpu::{CpuSampleKey, CpuCounter};
pub use stack::{Stack, MAX_STACK_DEPTH, NO_STACK};

/// Names of load-time globals (set with `EbpfLoader::set_global`, never recompiled).
pub mod globals {
    /// `u8`: 1 when only processes listed in [`crate::maps::TARGET_PIDS`] are sampled.
    pub const FILTER_PIDS: &str = "FILTER_PIDS";
}

/// Map names, shared by both sides, and their sizes.
pub mod maps {
    /// Per-CPU hash of [`crate::CpuSampleKey`] → sample count, for map set 0.
    pub const CPU_COUNTS_0: &str = "CPU_COUNTS_0";
    /// The same for map set 1 (see [`CONTROL`]).
    pub const CPU_COUNTS_1: &str = "CPU_COUNTS_1";
    /// Hash of stack hash (`u64`) → [`crate::Stack`], for map set 0.
    pub const STACKS_0: &str = "STACKS_0";
    /// The same for map set 1.
    pub const STACKS_1: &str = "STACKS_1";
    /// Array of one `u32`: the map set (0 or 1) the kernel programs write to now. Userspace
    /// flips it, lets in-flight programs finish, then drains and clears the other set, so
    /// draining never races with the kernel's writes.
    pub const CONTROL: &str = "CONTROL";
    /// Index of the active-set slot in [`CONTROL`].
    pub const CONTROL_ACTIVE_SET: u32 = 0;
    /// Per-CPU array of `u64` event and drop counters, indexed by [`crate::CpuCounter`].
    pub const CPU_COUNTERS: &str = "CPU_COUNTERS";
    /// Hash of tgid (`u32`) → `u8`: the processes sampled when `FILTER_PIDS` is set.
    pub const TARGET_PIDS: &str = "TARGET_PIDS";
    /// Per-CPU scratch array of one [`crate::Stack`] (too big for the 512-byte BPF stack).
    pub const STACK_SCRATCH: &str = "STACK_SCRATCH";

    /// Distinct (process, thread, stacks) keys per map set.
    pub const CPU_COUNTS_MAX_ENTRIES: u32 = 16_384;
    /// Distinct stacks (user and kernel together) per map set.
    pub const STACKS_MAX_ENTRIES: u32 = 16_384;
    /// Processes that can be selected with `--pid`.
    pub const TARGET_PIDS_MAX_ENTRIES: u32 = 4_096;
}
