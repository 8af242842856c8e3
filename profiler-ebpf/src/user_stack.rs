//! The user-stack walk: frame pointers from the thread's saved user registers.
//!
//! Not `bpf_get_stack(BPF_F_USER_STACK)`: the kernel's walk follows `rbp` until a read
//! faults, and code without frame pointers (Debian's libc calls `main`) leaves garbage in
//! `rbp`, so nearly every sample ends in a page fault, which costs microseconds in a VM. Here
//! a frame is followed only if it lies above the previous one and within the stack's reach,
//! so garbage is rejected without touching memory.

use aya_ebpf::{
    bindings::pt_regs,
    helpers::{
        bpf_probe_read_kernel,
        generated::{bpf_get_current_task_btf, bpf_probe_read_user, bpf_task_pt_regs},
    },
};
use profiler_common::{stack::STACK_WINDOW_WORDS, Stack, MAX_STACK_DEPTH};

use crate::maps::STACK_WINDOW;

/// How far above the sampled stack pointer a frame may lie: the default 8 MiB main-thread
/// stack limit. Frames beyond it are garbage `rbp` values, not frames.
const MAX_STACK_SPAN: u64 = 8 << 20;

/// The lowest kernel address on x86_64; user addresses are below it.
const USER_ADDR_LIMIT: u64 = 0x0000_8000_0000_0000;

/// The current thread's saved user registers (the entry frame at the top of its kernel
/// stack, valid whether the sample hit user or kernel mode).
#[inline(always)]
fn user_regs() -> Option<pt_regs> {
    // SAFETY: both helpers take and return kernel-checked BTF pointers; the read copies the
    // registers with a fault-safe helper.
    unsafe {
        let task = bpf_get_current_task_btf();
        let regs = bpf_task_pt_regs(task) as *const pt_regs;
        if regs.is_null() {
            return None;
        }
        bpf_probe_read_kernel(regs).ok()
    }
}

/// Bytes of user stack copied per read: frames lie close together, and one helper call costs
/// about as much for 512 bytes as for 16 here, so a window holds several frames.
const WINDOW_BYTES: u64 = (STACK_WINDOW_WORDS * 8) as u64;

/// Copies `len` bytes of user memory at `addr` into the window. False if unreadable.
#[inline(always)]
fn read_window(window: &mut [u64; STACK_WINDOW_WORDS], addr: u64, len: u64) -> bool {
    // SAFETY: a fault-safe read into this CPU's window buffer of at least `len` bytes.
    unsafe { bpf_probe_read_user(window.as_mut_ptr().cast(), len as u32, addr as *const _) == 0 }
}

/// Walks the current thread's user stack into `out`, leaf first. Returns false when the
/// thread has no user context (kernel threads).
#[inline(always)]
pub fn walk(out: &mut Stack) -> bool {
    let Some(regs) = user_regs() else { return false };
    let (ip, sp, mut bp) = (regs.rip, regs.rsp, regs.rbp);
    if ip == 0 || ip >= USER_ADDR_LIMIT {
        return false;
    }
    let Some(window) = STACK_WINDOW.get_ptr_mut(0) else { return false };
    // SAFETY: this CPU's window buffer, which nothing else touches while this program runs.
    let window = unsafe { &mut *window };
    let (mut window_base, mut window_len) = (0u64, 0u64);
    out.ips[0] = ip;
    let mut len = 1;
    let stack_top = sp.saturating_add(MAX_STACK_SPAN);
    let mut floor = sp;
    for _ in 1..MAX_STACK_DEPTH {
        if bp < floor || bp >= stack_top || bp & 7 != 0 {
            break;
        }
        if bp < window_base || bp + 16 > window_base + window_len {
            // Near the top of the stack a whole window may run past its mapping: then read
            // just the frame record.
            window_base = bp;
            window_len = if read_window(window, bp, WINDOW_BYTES) {
                WINDOW_BYTES
            } else if read_window(window, bp, 16) {
                16
            } else {
                break;
            };
        }
        let idx = ((bp - window_base) >> 3) as usize & (STACK_WINDOW_WORDS - 1);
        if idx + 1 >= STACK_WINDOW_WORDS {
            break;
        }
        let (next_bp, ret) = (window[idx], window[idx + 1]);
        if ret == 0 || ret >= USER_ADDR_LIMIT {
            break;
        }
        if len < MAX_STACK_DEPTH {
            out.ips[len] = ret;
        }
        len += 1;
        floor = bp + 16;
        bp = next_bp;
    }
    out.len = len.min(MAX_STACK_DEPTH) as u32;
    out.truncated = (len >= MAX_STACK_DEPTH) as u32;
    true
}
