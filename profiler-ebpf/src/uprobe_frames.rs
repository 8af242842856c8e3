//! Frames the kernel's uprobes moved into the process's `[uprobes]` page, put back (review
//! F15; see `profiler_common::UprobeOffsets`).
//!
//! - While a uretprobe'd function runs (the heap probes' `malloc`, or any other tool's), its
//!   return slot on the user stack holds the `[uprobes]` trampoline's address. A walk that
//!   read it as the caller's pc showed a frame in no mapping and lost the caller. The kernel
//!   keeps the original in `current->utask->return_instances`, newest (innermost) first, each
//!   with the slot it replaced: a walk, which goes from the innermost frame out, consumes the
//!   list in the same order. A thread sampled in the trampoline itself (its function has
//!   returned into it, and the kernel's return handler runs) is walked from the caller the
//!   kernel is about to return to.
//! - A thread sampled while the kernel single-steps a probed instruction's copy (in another
//!   slot of the page) is at the probed address, plus the distance into the copy.
//!
//! The cost for a thread with no uprobe state is one read of `current->utask` per walk.

#![allow(non_upper_case_globals)]

use aya_ebpf::{
    helpers::{bpf_get_current_task, bpf_probe_read_kernel},
    Global,
};
use profiler_common::UprobeOffsets;

use crate::walk_state::WalkState;

/// Set at load time from the kernel's BTF; `task_utask` 0 turns the restoring off.
#[unsafe(no_mangle)]
pub static UPROBE_OFFSETS: Global<UprobeOffsets> = Global::new(UprobeOffsets {
    task_utask: 0,
    utask_return_instances: 0,
    utask_xol_vaddr: 0,
    utask_vaddr: 0,
    instance_stack: 0,
    instance_return_address: 0,
    instance_next: 0,
    task_mm: 0,
    mm_xol_area: 0,
    xol_vaddr: 0,
});

/// Instances looked at per trampoline met: a tail call from one probed function to another
/// leaves two instances for one slot (the kernel marks the second `chained`), and a
/// `longjmp` out of a probed call leaves one the kernel has not yet cleaned up.
const INSTANCES_PER_TRAMPOLINE: usize = 4;

/// Bytes of one slot of the `[uprobes]` page (`UPROBE_XOL_SLOT_BYTES` on x86_64); the
/// trampoline has the first.
const SLOT_BYTES: u64 = 128;

#[inline(always)]
fn read(addr: u64) -> Option<u64> {
    // SAFETY: a fault-safe read of kernel memory; a bad address returns an error.
    unsafe { bpf_probe_read_kernel(addr as *const u64) }.ok()
}

/// Sets the walk's trampoline address and first pending instance (both 0 when the thread
/// has no uretprobe pending, or the kernel's layout is unknown), and moves a sampled pc out
/// of the `[uprobes]` page. Returns how many frames it put back (0 or 1), to count.
#[inline(always)]
pub fn start(state: &mut WalkState) -> u32 {
    // Volatile: LLVM merges plain zero stores next to the walk's others into a call of a
    // byte-at-a-time `memset`.
    // SAFETY: plain writes to this CPU's walk state.
    unsafe {
        core::ptr::write_volatile(&mut state.trampoline, 0);
        core::ptr::write_volatile(&mut state.return_instance, 0);
    }
    let offsets = UPROBE_OFFSETS.load();
    if offsets.task_utask == 0 {
        return 0;
    }
    // SAFETY: a helper without arguments.
    let task = unsafe { bpf_get_current_task() };
    let Some(utask) = read(task + u64::from(offsets.task_utask)).filter(|&u| u != 0) else { return 0 };
    let mut restored = u32::from(stepping(state, utask, &offsets));
    let Some(first) = read(utask + u64::from(offsets.utask_return_instances)).filter(|&i| i != 0) else {
        return restored;
    };
    let Some(mm) = read(task + u64::from(offsets.task_mm)).filter(|&m| m != 0) else { return restored };
    let Some(area) = read(mm + u64::from(offsets.mm_xol_area)).filter(|&a| a != 0) else { return restored };
    let Some(trampoline) = read(area + u64::from(offsets.xol_vaddr)) else { return restored };
    state.trampoline = trampoline;
    state.return_instance = first;
    if state.pc.wrapping_sub(trampoline) < SLOT_BYTES {
        restored += u32::from(returning(state, first, &offsets));
    }
    restored
}

/// The thread was sampled in the out-of-line copy of a probed instruction: its pc is the
/// probed address plus the distance into the copy. Exact, like the sampled pc it replaces.
#[inline(always)]
fn stepping(state: &mut WalkState, utask: u64, offsets: &UprobeOffsets) -> bool {
    let Some(slot) = read(utask + u64::from(offsets.utask_xol_vaddr)).filter(|&s| s != 0) else { return false };
    let into = state.pc.wrapping_sub(slot);
    if into >= SLOT_BYTES {
        return false;
    }
    let Some(probed) = read(utask + u64::from(offsets.utask_vaddr)).filter(|&v| v != 0) else { return false };
    state.pc = probed + into;
    true
}

/// One `struct return_instance` of the kernel's: the user stack slot whose return address a
/// uretprobe replaced, the address it held, and the next (outer) instance.
struct Instance {
    stack: u64,
    original: u64,
    next: u64,
}

/// The return instance at `at`, or `None` if any of its three words cannot be read.
#[inline(always)]
fn instance(at: u64, offsets: &UprobeOffsets) -> Option<Instance> {
    Some(Instance {
        stack: read(at + u64::from(offsets.instance_stack))?,
        original: read(at + u64::from(offsets.instance_return_address))?,
        next: read(at + u64::from(offsets.instance_next))?,
    })
}

/// The thread was sampled in the trampoline: its probed function has returned into it, and
/// the kernel is about to send it to the newest instance's original address. That caller is
/// the innermost frame, its stack pointer just above the slot the return popped.
#[inline(always)]
fn returning(state: &mut WalkState, first: u64, offsets: &UprobeOffsets) -> bool {
    let Some(Instance { stack, original, next }) = instance(first, offsets) else { return false };
    state.pc = original;
    state.sp = stack + 8;
    // A return address: looked up inside the call, at pc − 1.
    state.exact = 0;
    state.return_instance = next;
    true
}

/// `ra`, read from the stack at `slot`; or, if it is the trampoline, the return address the
/// uretprobe replaced there (the caller counts a changed address). An instance not found
/// for the slot leaves `ra` as it is.
#[inline(always)]
pub fn restore(state: &mut WalkState, ra: u64, slot: u64) -> u64 {
    if state.trampoline == 0 || ra != state.trampoline {
        return ra;
    }
    let offsets = UPROBE_OFFSETS.load();
    let mut instance = state.return_instance;
    for _ in 0..INSTANCES_PER_TRAMPOLINE {
        if instance == 0 {
            break;
        }
        let Some(Instance { stack, original, next }) = self::instance(instance, &offsets) else { break };
        instance = next;
        if stack == slot {
            state.return_instance = next;
            return original;
        }
    }
    ra
}
