//! The side-band records the kernel writes (see `ring`), parsed into [`ProcessEvent`]s. Only
//! what the catalogue needs is kept: executable mappings, `exec`s and renames, process
//! creation (not thread creation) and process exit. Each record ends with the sample id
//! `SAMPLE_TYPE` asks for: pid, tid and time.

use std::{borrow::Cow, sync::Arc};

use crate::{
    ids::Pid,
    procs::{Device, MapEntry},
};

const PERF_RECORD_LOST: u32 = 2;
const PERF_RECORD_COMM: u32 = 3;
const PERF_RECORD_EXIT: u32 = 4;
const PERF_RECORD_FORK: u32 = 7;
const PERF_RECORD_MMAP2: u32 = 10;
const PERF_RECORD_CGROUP: u32 = 19;
const PERF_RECORD_MISC_COMM_EXEC: u16 = 1 << 13;
/// `misc` of an MMAP2 record that carries a build id instead of device and inode (never
/// asked for here, but another user of the ring's attributes could).
const PERF_RECORD_MISC_MMAP_BUILD_ID: u16 = 1 << 14;
const PROT_EXEC: u32 = 4;
/// The trailing sample id: pid, tid (u32 each), time (u64).
const SAMPLE_ID_LEN: usize = 16;

/// What happened to a process, at `time` (`CLOCK_MONOTONIC` nanoseconds).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ProcessEvent {
    /// An executable mapping appeared (an `exec`'s image, the dynamic loader, a library,
    /// a `dlopen`).
    Mapped { pid: Pid, time: u64, map: MapEntry },
    /// The process called `execve`: its mappings are replaced, its name is `name`.
    Exec { pid: Pid, time: u64, name: String },
    /// The process (its main thread) renamed itself (`prctl(PR_SET_NAME)`).
    Renamed { pid: Pid, time: u64, name: String },
    /// A new process, forked from `parent`: it has the parent's mappings until it execs.
    Forked { pid: Pid, parent: Pid, time: u64 },
    /// The process exited (its main thread did).
    Exited { pid: Pid, time: u64 },
    /// A cgroup was created: its id (its directory's inode) and path in the hierarchy.
    Cgroup { id: u64, path: String },
    /// The ring was full: `count` records were dropped.
    Lost { count: u64 },
}

impl ProcessEvent {
    /// The process it is about (none for lost records).
    pub fn pid(&self) -> Option<Pid> {
        match self {
            Self::Mapped { pid, .. }
            | Self::Exec { pid, .. }
            | Self::Renamed { pid, .. }
            | Self::Forked { pid, .. }
            | Self::Exited { pid, .. } => Some(*pid),
            Self::Cgroup { .. } | Self::Lost { .. } => None,
        }
    }

    /// When it happened; lost records sort first.
    pub fn time(&self) -> u64 {
        match self {
            Self::Mapped { time, .. }
            | Self::Exec { time, .. }
            | Self::Renamed { time, .. }
            | Self::Forked { time, .. }
            | Self::Exited { time, .. } => *time,
            Self::Cgroup { .. } | Self::Lost { .. } => 0,
        }
    }
}

/// Parses one record (its type, misc and body); `None` for records of no interest (thread
/// creation and exit, data mappings, unknown types) and malformed ones.
pub fn parse(kind: u32, misc: u16, body: &[u8]) -> Option<ProcessEvent> {
    let time = || u64_at(body, body.len().checked_sub(8)?);
    match kind {
        PERF_RECORD_MMAP2 => mmap2(misc, body, time()?),
        PERF_RECORD_COMM => {
            let (pid, tid) = (u32_at(body, 0)?, u32_at(body, 4)?);
            let name = c_string(body.get(8..body.len().checked_sub(SAMPLE_ID_LEN)?)?);
            // A thread renaming itself does not rename the process.
            if pid != tid && misc & PERF_RECORD_MISC_COMM_EXEC == 0 {
                return None;
            }
            let (pid, time) = (Pid(pid), time()?);
            Some(if misc & PERF_RECORD_MISC_COMM_EXEC != 0 {
                ProcessEvent::Exec { pid, time, name }
            } else {
                ProcessEvent::Renamed { pid, time, name }
            })
        }
        PERF_RECORD_FORK => {
            let (pid, ppid, tid) = (u32_at(body, 0)?, u32_at(body, 4)?, u32_at(body, 8)?);
            // A new thread shares its process's pid; only a new process has pid == tid
            // and a pid of its own.
            (pid == tid && pid != ppid).then_some(ProcessEvent::Forked {
                pid: Pid(pid),
                parent: Pid(ppid),
                time: u64_at(body, 16)?,
            })
        }
        PERF_RECORD_EXIT => {
            let (pid, tid) = (u32_at(body, 0)?, u32_at(body, 8)?);
            (pid == tid).then_some(ProcessEvent::Exited { pid: Pid(pid), time: u64_at(body, 16)? })
        }
        PERF_RECORD_LOST => Some(ProcessEvent::Lost { count: u64_at(body, 8)? }),
        PERF_RECORD_CGROUP => Some(ProcessEvent::Cgroup {
            id: u64_at(body, 0)?,
            path: c_string(body.get(8..body.len().checked_sub(SAMPLE_ID_LEN)?)?),
        }),
        _ => None,
    }
}

fn mmap2(misc: u16, body: &[u8], time: u64) -> Option<ProcessEvent> {
    let prot = u32_at(body, 56)?;
    if prot & PROT_EXEC == 0 || misc & PERF_RECORD_MISC_MMAP_BUILD_ID != 0 {
        return None;
    }
    let (start, len, offset) = (u64_at(body, 8)?, u64_at(body, 16)?, u64_at(body, 24)?);
    let path = c_str(body.get(64..body.len().checked_sub(SAMPLE_ID_LEN)?)?);
    let map = MapEntry {
        start,
        end: start.checked_add(len)?,
        offset,
        // One allocation: the path is shared from here on (see `MapEntry::path`).
        path: Arc::from(&*path),
        inode: u64_at(body, 40)?,
        device: Device { major: u32_at(body, 32)?, minor: u32_at(body, 36)? },
        generation: u64_at(body, 48)?,
        unmapped: false,
    };
    Some(ProcessEvent::Mapped { pid: Pid(u32_at(body, 0)?), time, map })
}

/// The NUL-terminated string at the start of `bytes` (the kernel pads it to 8 bytes).
fn c_string(bytes: &[u8]) -> String {
    c_str(bytes).into_owned()
}

/// [`c_string`], borrowed when it is valid UTF-8.
fn c_str(bytes: &[u8]) -> Cow<'_, str> {
    let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    String::from_utf8_lossy(&bytes[..end])
}

fn u32_at(bytes: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_ne_bytes(bytes.get(at..at + 4)?.try_into().ok()?))
}

fn u64_at(bytes: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_ne_bytes(bytes.get(at..at + 8)?.try_into().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample_id(pid: u32, time: u64) -> Vec<u8> {
        [pid.to_ne_bytes(), pid.to_ne_bytes()].concat().into_iter().chain(time.to_ne_bytes()).collect()
    }

    fn mmap2_body(prot: u32, path: &str) -> Vec<u8> {
        let mut body = Vec::new();
        for v in [7u32, 8] {
            body.extend(v.to_ne_bytes());
        }
        for v in [0x7f00_0000_1000u64, 0x2000, 0x1000] {
            body.extend(v.to_ne_bytes());
        }
        for v in [0xfeu32, 1] {
            body.extend(v.to_ne_bytes());
        }
        for v in [42u64, 9] {
            body.extend(v.to_ne_bytes());
        }
        for v in [prot, 2] {
            body.extend(v.to_ne_bytes());
        }
        let mut name = path.as_bytes().to_vec();
        name.resize(path.len().div_ceil(8) * 8 + 8, 0);
        body.extend(name);
        body.extend(sample_id(7, 1234));
        body
    }

    #[test]
    fn executable_mappings_are_kept_with_their_file_identity() {
        let event = parse(PERF_RECORD_MMAP2, 0, &mmap2_body(5, "/usr/lib/libc.so.6")).unwrap();
        let ProcessEvent::Mapped { pid, time, map } = event else { panic!("{event:?}") };
        assert_eq!((pid, time, map.generation), (Pid(7), 1234, 9));
        assert_eq!((map.start, map.end, map.offset, map.inode), (0x7f00_0000_1000, 0x7f00_0000_3000, 0x1000, 42));
        assert_eq!(map.device, Device { major: 0xfe, minor: 1 });
        assert_eq!(&*map.path, "/usr/lib/libc.so.6");
        assert_eq!(parse(PERF_RECORD_MMAP2, 0, &mmap2_body(1, "/data")), None, "not executable");
        assert_eq!(parse(PERF_RECORD_MMAP2, 0, &mmap2_body(5, "/x")[..40]), None, "truncated");
    }

    #[test]
    fn execs_forks_and_exits_of_processes_not_threads() {
        let comm = |pid: u32, tid: u32, name: &str| {
            let mut body = [pid.to_ne_bytes(), tid.to_ne_bytes()].concat();
            body.extend(name.as_bytes());
            body.resize(8 + 16, 0);
            body.extend(sample_id(pid, 55));
            body
        };
        let exec = parse(PERF_RECORD_COMM, PERF_RECORD_MISC_COMM_EXEC, &comm(3, 3, "grep")).unwrap();
        assert_eq!(exec, ProcessEvent::Exec { pid: Pid(3), time: 55, name: "grep".into() });
        assert_eq!(
            parse(PERF_RECORD_COMM, 0, &comm(3, 3, "worker")),
            Some(ProcessEvent::Renamed { pid: Pid(3), time: 55, name: "worker".into() })
        );
        assert_eq!(parse(PERF_RECORD_COMM, 0, &comm(3, 4, "thread-2")), None, "a thread's name");
        let task = |pid: u32, ppid: u32, tid: u32| {
            let mut body: Vec<u8> = [pid, ppid, tid, ppid].iter().flat_map(|v| v.to_ne_bytes()).collect();
            body.extend(99u64.to_ne_bytes());
            body.extend(sample_id(pid, 99));
            body
        };
        assert_eq!(
            parse(PERF_RECORD_FORK, 0, &task(10, 3, 10)),
            Some(ProcessEvent::Forked { pid: Pid(10), parent: Pid(3), time: 99 })
        );
        assert_eq!(parse(PERF_RECORD_FORK, 0, &task(3, 3, 11)), None, "a new thread");
        assert_eq!(parse(PERF_RECORD_EXIT, 0, &task(10, 3, 10)), Some(ProcessEvent::Exited { pid: Pid(10), time: 99 }));
        assert_eq!(parse(PERF_RECORD_EXIT, 0, &task(3, 3, 11)), None, "a thread exits");
        let lost: Vec<u8> = [1u64, 17].iter().flat_map(|v| v.to_ne_bytes()).chain(sample_id(0, 0)).collect();
        assert_eq!(parse(PERF_RECORD_LOST, 0, &lost), Some(ProcessEvent::Lost { count: 17 }));
        let mut cgroup = 42u64.to_ne_bytes().to_vec();
        cgroup.extend(b"/system.slice/a.service\0");
        cgroup.resize(8 + 24, 0);
        cgroup.extend(sample_id(0, 1));
        let created = parse(PERF_RECORD_CGROUP, 0, &cgroup);
        assert_eq!(created, Some(ProcessEvent::Cgroup { id: 42, path: "/system.slice/a.service".into() }));
    }
}
