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
        bpf_probe_read_kernel, bpf_probe_read_user,
        generated::{bpf_get_current_task_btf, bpf_task_pt_regs},
    },
};
use profiler_common::{Stack, MAX_STACK_DEPTH};

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

/// Walks the current thread's user stack into `out`, leaf first. Returns false when the
/// thread has no user context (kernel threads).
#[inline(always)]
pub fn walk(out: &mut Stack) -> bool {
    let Some(regs) = user_regs() else { return false };
    let (ip, sp, mut bp) = (regs.rip, regs.rsp, regs.rbp);
    if ip == 0 || ip >= USER_ADDR_LIMIT {
        return false;
    }
    out.ips[0] = ip;
    let mut len = 1;
    let stack_top = sp.saturating_add(MAX_STACK_SPAN);
    let mut floor = sp;
    for _ in 1..MAX_STACK_DEPTH {
        if bp < floor || bp >= stack_top || bp & 7 != 0 {
            break;
        }
        // SAFETY: a fault-safe read of user memory; failure ends the walk.
        let Ok(frame) = (unsafe { bpf_probe_read_user(bp as *const [u64; 2]) }) else { break };
        let (next_bp, ret) = (frame[0], frame[1]);
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
