//! The thread dump: an `iter/task` program. Userspace creates the iterator for one process
//! (the link's `pid` parameter), reads it, and gets one [`ThreadRecord`] per thread: its
//! id, whether it is on a CPU, its state and context switches, the user registers it saved
//! at its last entry into the kernel (`bpf_task_pt_regs`) and its kernel stack
//! (`bpf_get_task_stack`). The thread is never stopped or signalled: a blocked thread's
//! saved registers and stacks do not change while it stays blocked.
//!
//! aya-ebpf has no `#[iter]` macro: the section and the context are written out here. The
//! `task_struct` fields read come at offsets userspace found in the kernel's BTF
//! ([`TaskOffsets`], a load-time global), since these programs have no CO-RE relocations.
#![allow(non_upper_case_globals)]

use core::ffi::c_void;

use aya_ebpf::{
    bindings::pt_regs,
    helpers::{
        bpf_probe_read_kernel,
        generated::{bpf_get_current_task, bpf_get_task_stack, bpf_seq_write, bpf_task_pt_regs},
    },
    macros::map,
    maps::PerCpuArray,
    Global,
};
use profiler_common::{TaskOffsets, ThreadRecord, KERNEL_STACK_DEPTH};

/// Where the `task_struct` fields are (set at load time; all 0 when thread dumps are off,
/// and the program is then never loaded).
#[unsafe(no_mangle)]
pub static TASK_OFFSETS: Global<TaskOffsets> = Global::new(TaskOffsets {
    pid: 0,
    tgid: 0,
    on_cpu: 0,
    state: 0,
    nvcsw: 0,
    nivcsw: 0,
    thread_pid: 0,
    pid_numbers: 0,
    upid_size: 0,
    pid_level: 0,
});

#[map]
pub static THREAD_RECORD: PerCpuArray<ThreadRecord> = PerCpuArray::with_max_entries(1, 0);

/// `struct bpf_iter_meta`: the iterator's output file first.
#[repr(C)]
struct IterMeta {
    seq: *mut c_void,
}

/// `struct bpf_iter__task`: the context of an `iter/task` program.
#[repr(C)]
struct IterTask {
    meta: *mut IterMeta,
    /// NULL once, after the last task.
    task: *mut c_void,
}

#[unsafe(no_mangle)]
#[unsafe(link_section = "iter/task")]
pub fn thread_dump(ctx: *mut c_void) -> i32 {
    let _ = try_thread_dump(ctx as *const IterTask);
    0
}

#[inline(always)]
fn try_thread_dump(ctx: *const IterTask) -> Result<(), ()> {
    // SAFETY: the context is the kernel's `bpf_iter__task`; both fields are BTF pointers the
    // verifier types (the task may be NULL, checked below).
    let (meta, task) = unsafe { ((*ctx).meta, (*ctx).task) };
    if task.is_null() {
        return Err(());
    }
    // SAFETY: `meta` is a valid BTF pointer to `bpf_iter_meta`, whose first field is `seq`.
    let seq = unsafe { (*meta).seq };
    let record = THREAD_RECORD.get_ptr_mut(0).ok_or(())?;
    // SAFETY: this CPU's slot; iterator programs do not nest on a CPU.
    let record = unsafe { &mut *record };
    let offsets = TASK_OFFSETS.load();
    let base = task as u64;
    record.tid = thread_id(base, &offsets);
    record._pad = 0;
    record.on_cpu = field::<u32>(base, offsets.on_cpu);
    record.state = field::<u32>(base, offsets.state);
    record.switches = field::<u64>(base, offsets.nvcsw).wrapping_add(field::<u64>(base, offsets.nivcsw));
    record.regs_valid = 0;
    // SAFETY: `task` is a non-NULL task_struct BTF pointer; the registers are copied with a
    // fault-safe read.
    let regs = unsafe { bpf_task_pt_regs(task.cast()) } as *const pt_regs;
    if !regs.is_null() {
        // SAFETY: as above.
        if let Ok(regs) = unsafe { bpf_probe_read_kernel(regs) } {
            record.ip = regs.rip;
            record.sp = regs.rsp;
            record.bp = regs.rbp;
            record.syscall = regs.orig_rax as i64;
            record.regs_valid = 1;
        }
    }
    let bytes = (KERNEL_STACK_DEPTH * 8) as u32;
    // SAFETY: the buffer is this CPU's record's frame array, `bytes` long.
    let written = unsafe { bpf_get_task_stack(task.cast(), record.kernel.as_mut_ptr().cast(), bytes, 0) };
    record.kernel_len = if written > 0 { (written as u32) / 8 } else { 0 };
    let size = core::mem::size_of::<ThreadRecord>() as u32;
    // SAFETY: `seq` is the iterator's seq_file; the record is `size` bytes of map memory.
    unsafe { bpf_seq_write(seq.cast(), (record as *const ThreadRecord).cast(), size) };
    Ok(())
}

/// The task's id in the pid namespace of the thread reading the iterator (the profiler's,
/// which is the one the kernel found the process in): `task->pid` in the initial namespace,
/// else `task->thread_pid->numbers[level].nr`, where `level` is the reader's own
/// `thread_pid->level` (0 if the task has no id at that level).
#[inline(always)]
fn thread_id(task: u64, offsets: &TaskOffsets) -> u32 {
    // SAFETY: a plain helper call; the pointer is only read through fault-safe reads.
    let reader = unsafe { bpf_get_current_task() };
    let reader_pid = field::<u64>(reader, offsets.thread_pid);
    let level = if reader_pid == 0 { 0 } else { field::<u32>(reader_pid, offsets.pid_level) };
    if level == 0 {
        return field::<u32>(task, offsets.pid);
    }
    let pid = field::<u64>(task, offsets.thread_pid);
    // A task made in a namespace above ours has no id in it (and no `numbers[level]`).
    if pid == 0 || field::<u32>(pid, offsets.pid_level) < level {
        return 0;
    }
    let level = level as u64 & 63;
    let upid = pid + offsets.pid_numbers as u64 + level * offsets.upid_size as u64;
    // `struct upid` starts with `int nr`.
    field::<u32>(upid, 0)
}

/// The `T` at `base + offset` in kernel memory, or 0 when it cannot be read.
#[inline(always)]
fn field<T: Copy + Default>(base: u64, offset: u32) -> T {
    // SAFETY: a fault-safe read of kernel memory.
    unsafe { bpf_probe_read_kernel((base + offset as u64) as *const T) }.unwrap_or_default()
}
