//! The thread dump's side of the session: loads the `iter/task` program and reads it for one
//! process. aya 0.14 attaches iterators without parameters (every task of the machine); the
//! link is created here with the kernel's `pid` parameter instead, so the kernel visits only
//! that process's threads (the cost follows its thread count, not the machine's), and the
//! pid is read in the profiler's own pid namespace.

use std::{
    fs::File,
    io::Read,
    os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd},
};

use aya::{programs::Iter, Btf, Ebpf};
use profiler_common::{programs, ThreadRecord};

use super::{missing, program_error, Error, Result};
use crate::ids::Pid;

const PROGRAM: &str = programs::THREAD_DUMP;

// From include/uapi/linux/bpf.h (checked against aya-obj's generated bindings).
const BPF_LINK_CREATE: libc::c_long = 28;
const BPF_ITER_CREATE: libc::c_long = 33;
const BPF_TRACE_ITER: u32 = 28;

/// `link_create` of `union bpf_attr`, as far as iterators use it.
#[repr(C)]
#[derive(Default)]
struct LinkCreate {
    prog_fd: u32,
    target_fd: u32,
    attach_type: u32,
    flags: u32,
    iter_info: u64,
    iter_info_len: u32,
    _pad: u32,
    /// The rest of `union bpf_attr`'s largest member: the kernel wants the unused tail zero.
    _tail: [u64; 12],
}

/// `union bpf_iter_link_info` for task iterators: `tid`, `pid` or `pid_fd`.
#[repr(C)]
#[derive(Default)]
struct TaskIterInfo {
    tid: u32,
    pid: u32,
    pid_fd: u32,
    _pad: u32,
}

/// `iter_create` of `union bpf_attr`.
#[repr(C)]
#[derive(Default)]
struct IterCreate {
    link_fd: u32,
    flags: u32,
    _tail: [u64; 14],
}

/// Loads the program (verifies it) without creating any iterator.
pub(super) fn load(ebpf: &mut Ebpf) -> Result<()> {
    let btf = Btf::from_sys_fs().map_err(|err| Error::KernelFeature {
        feature: "BTF (/sys/kernel/btf/vmlinux), which thread dumps need",
        detail: err.to_string(),
    })?;
    let program: &mut Iter = ebpf
        .program_mut(PROGRAM)
        .ok_or_else(|| missing(PROGRAM))?
        .try_into()
        .map_err(program_error("find", PROGRAM))?;
    program.load("task", &btf).map_err(program_error("load", PROGRAM))
}

/// The loaded program, for reading the iterator of one process at a time on any thread: it
/// owns a duplicate of the program's descriptor, so a thread dump walks off the thread that
/// owns the session (the kernel keeps the program while any descriptor of it is open).
pub struct ThreadIterator {
    prog: OwnedFd,
}

/// The iterator of the loaded program.
pub(super) fn iterator(ebpf: &Ebpf) -> Result<ThreadIterator> {
    let program: &Iter =
        ebpf.program(PROGRAM).ok_or_else(|| missing(PROGRAM))?.try_into().map_err(program_error("find", PROGRAM))?;
    let prog_fd = program.fd().map_err(program_error("use", PROGRAM))?;
    let prog = prog_fd
        .as_fd()
        .try_clone_to_owned()
        .map_err(|source| Error::Io { action: format!("duplicate the descriptor of the program {PROGRAM}"), source })?;
    Ok(ThreadIterator { prog })
}

impl ThreadIterator {
    /// One record per thread of process `pid`, as the threads are now.
    pub fn read(&self, pid: Pid) -> Result<Vec<ThreadRecord>> {
        let info = TaskIterInfo { pid: pid.0, ..TaskIterInfo::default() };
        let mut attr = LinkCreate {
            prog_fd: self.prog.as_raw_fd() as u32,
            attach_type: BPF_TRACE_ITER,
            iter_info: &info as *const TaskIterInfo as u64,
            iter_info_len: size_of::<TaskIterInfo>() as u32,
            ..LinkCreate::default()
        };
        // SAFETY: `iter_info` points at `info`, of `iter_info_len` bytes, alive until the end.
        let link = unsafe { bpf(BPF_LINK_CREATE, &mut attr) }.map_err(|source| Error::Io {
            action: format!("create the thread iterator of pid {pid} (BPF_LINK_CREATE)"),
            source,
        })?;
        let mut attr = IterCreate { link_fd: link.as_raw_fd() as u32, ..IterCreate::default() };
        // SAFETY: no pointers.
        let iter = unsafe { bpf(BPF_ITER_CREATE, &mut attr) }.map_err(|source| Error::Io {
            action: format!("open the thread iterator of pid {pid} (BPF_ITER_CREATE)"),
            source,
        })?;
        let mut bytes = Vec::new();
        File::from(iter)
            .read_to_end(&mut bytes)
            .map_err(|source| Error::Io { action: format!("read the thread iterator of pid {pid}"), source })?;
        Ok(records(&bytes))
    }
}

/// The whole records in `bytes` (the iterator writes only whole ones).
fn records(bytes: &[u8]) -> Vec<ThreadRecord> {
    bytes
        .chunks_exact(size_of::<ThreadRecord>())
        // SAFETY: `ThreadRecord` is plain integers (repr(C), no padding) and the chunk has
        // its size; the read is unaligned-safe.
        .map(|chunk| unsafe { std::ptr::read_unaligned(chunk.as_ptr().cast::<ThreadRecord>()) })
        .collect()
}

/// The `bpf(2)` command `cmd` with `attr`; a command that returns a descriptor.
///
/// # Safety
/// As [`super::bpf_call`]: every pointer in `attr` names live memory of the size stated.
unsafe fn bpf<T>(cmd: libc::c_long, attr: &mut T) -> std::io::Result<OwnedFd> {
    // SAFETY: passed on from the caller.
    let fd = unsafe { super::bpf_call(cmd, attr) }?;
    // SAFETY: the kernel returned a new descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attrs_have_the_kernels_layout() {
        assert_eq!(std::mem::offset_of!(LinkCreate, iter_info), 16);
        assert_eq!(std::mem::offset_of!(LinkCreate, iter_info_len), 24);
        assert_eq!(std::mem::offset_of!(TaskIterInfo, pid), 4);
        assert_eq!(size_of::<TaskIterInfo>(), 16, "the union's size: its cgroup member is 16 bytes");
        assert_eq!(BPF_TRACE_ITER, aya_obj::generated::bpf_attach_type::BPF_TRACE_ITER as u32);
        assert_eq!(BPF_LINK_CREATE, aya_obj::generated::bpf_cmd::BPF_LINK_CREATE as libc::c_long);
        assert_eq!(BPF_ITER_CREATE, aya_obj::generated::bpf_cmd::BPF_ITER_CREATE as libc::c_long);
    }

    #[test]
    fn only_whole_records_are_read() {
        let size = size_of::<ThreadRecord>();
        let mut bytes = vec![0u8; size * 2 + 10];
        bytes[0] = 7;
        bytes[size] = 9;
        let records = records(&bytes);
        assert_eq!(records.iter().map(|r| r.tid).collect::<Vec<_>>(), [7, 9]);
    }
}
