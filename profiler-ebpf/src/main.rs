//! profiler's kernel side: one file per program kind, each with its own maps; the maps and
//! helpers they share (the process filter, the map-set switch, the stack maps, scratch) are
//! in [`maps`].
//!
//! The programs only count: they aggregate samples by key in BPF maps and never stream
//! per-sample events to userspace.
#![no_std]
#![no_main]
// `core::intrinsics::atomic_xadd`: the counts maps' atomic adds (see `maps::atomic_add`);
// only the kernel build is nightly (a host build is clippy's, on stable).
#![cfg_attr(target_arch = "bpf", feature(core_intrinsics))]
#![cfg_attr(target_arch = "bpf", allow(internal_features))]
// Map keys and values go by reference: one passed by value is copied onto the 512-byte BPF
// stack first (`stacks.insert(hash, *scratch)` would copy a 1 KiB stack and fail to build).
#![allow(clippy::needless_borrows_for_generic_args)]

mod cpu;
mod exec;
mod futex;
mod heap;
mod maps;
mod offcpu;
mod runtimes;
mod stack;
mod thread_dump;
mod threadcreate;
mod tracepoint;
mod uprobe_frames;
mod user_stack;
mod walk_state;

// Only for the kernel target: a host build (clippy over the workspace, where feature
// unification links std through profiler-common's `user` feature) has std's.
#[cfg(target_arch = "bpf")]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    // SAFETY: the verifier rejects any program with a reachable panic path (no loops without
    // bounds, no calls that can fail this way), so this is never reached at run time.
    unsafe { core::hint::unreachable_unchecked() }
}
