//! profiler's kernel side: one file per program kind, shared maps in [`maps`].
//!
//! The programs only count: they aggregate samples by key in BPF maps and never stream
//! per-sample events to userspace.
#![no_std]
#![no_main]

mod cpu;
mod exec;
mod futex;
mod heap;
mod maps;
mod stack;
mod thread;
mod user_stack;

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    // SAFETY: the verifier rejects any program with a reachable panic path (no loops without
    // bounds, no calls that can fail this way), so this is never reached at run time.
    unsafe { core::hint::unreachable_unchecked() }
}
