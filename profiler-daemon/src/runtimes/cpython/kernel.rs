//! What the kernel walker is given of a CPython process (`PYTHON_PROCESSES`): where the
//! main interpreter is, and its version's structure offsets, from the same detection the
//! thread dumps use ([`super::detect`]). The walker then adds each thread's Python frames
//! to every stack it takes (see `profiler-ebpf`'s `runtimes/cpython.rs`); [`crate::resolve`] names
//! them.

use profiler_common::runtimes::cpython::{
    maps::PYTHON_PROCESSES, PythonCounter, PythonProcess, PYTHON_FRAME_READ_BYTES, PYTHON_NO_CFRAME,
    PYTHON_NO_CSTACK_OWNER, PYTHON_NO_IS_ENTRY,
};
use serde_json::json;

use super::{
    detect::{self, Detection, Interpreter},
    offsets::{CurrentFrame, EntryMark},
    ReadFailure,
};
use crate::{
    ebpf::{self, Session},
    ids::Pid,
    procs::{self, MapEntry},
    runtimes::Registrations,
};

/// How the name of CPython's shared library begins.
pub const LIBRARY_PREFIX: &str = "libpython3";

/// Whether `maps` has a file named like CPython's interpreter or library: only such
/// processes are looked at when they register (reading every program's symbols at each of
/// a busy machine's execs would cost more than the walk saves). An interpreter linked into
/// a program of another name gets Python frames in thread dumps only.
pub fn candidate(maps: &[MapEntry]) -> bool {
    maps.iter().filter(|m| !m.unmapped && m.is_file()).any(|m| {
        let name = m.path.rsplit('/').next().unwrap_or("");
        name.starts_with(LIBRARY_PREFIX) || name.starts_with("python3")
    })
}

/// The walker's entry for process `pid`: `None` when no mapped file exports `_PyRuntime`,
/// an error saying why for a CPython the walker cannot read (a version or build it does not
/// know). A process in another pid namespace than the profiler's gets that namespace.
pub fn find(
    pid: Pid,
    maps: &[MapEntry],
    open: &dyn Fn(&MapEntry) -> Option<crate::opened::OpenedFile>,
) -> Result<Option<PythonProcess>, String> {
    let mut process = match detect::detect(pid, maps, None, open) {
        Ok(Detection::Python(interp)) => entry(&interp)?,
        // A shared build's executable is named like CPython's; its library may not be
        // mapped yet (the process registers again when it is).
        // A candidate that could not be opened (its process gone): the process registers
        // again, and is looked at again, at its next mapping change.
        Ok(Detection::NotPython) | Err(ReadFailure::Unopened(_)) => return Ok(None),
        Ok(Detection::Unsupported(why)) => return Err(why),
        Err(err) => return Err(err.to_string()),
    };
    let namespace = |pid: Option<u32>| {
        let found = match pid {
            Some(pid) => procs::pid_namespace(pid),
            None => procs::own_pid_namespace(),
        };
        found.map_err(|err| format!("cannot read the pid namespace: {err}"))
    };
    let (theirs, ours) = (namespace(Some(pid.0))?, namespace(None)?);
    if theirs != ours {
        (process.pidns_dev, process.pidns_ino) = (theirs.dev, theirs.ino);
    }
    Ok(Some(process))
}

/// The walker's entry for `interp`; refuses offsets the walker cannot use (a pointer field
/// not 8-aligned, or beyond the bytes of a frame it reads).
pub fn entry(interp: &Interpreter) -> Result<PythonProcess, String> {
    let o = &interp.offsets;
    let short = |v: u64| u16::try_from(v).map_err(|_| format!("offset {v:#x} out of range"));
    let frame_pointer = |v: u64| {
        if v.is_multiple_of(8) && v + 8 <= PYTHON_FRAME_READ_BYTES as u64 {
            Ok(v as u16)
        } else {
            Err(format!("frame field at {v:#x}: not where the walker reads"))
        }
    };
    let frame_byte = |v: u64| {
        if v < PYTHON_FRAME_READ_BYTES as u64 {
            Ok(v as u16)
        } else {
            Err(format!("frame field at {v:#x}: not where the walker reads"))
        }
    };
    let (thread_cframe, current_frame) = match o.current_frame {
        CurrentFrame::ViaCFrame { cframe, current_frame } => (short(cframe)?, short(current_frame)?),
        CurrentFrame::Direct(offset) => (PYTHON_NO_CFRAME, short(offset)?),
    };
    let (frame_is_entry, cstack_owner) = match o.entry {
        EntryMark::IsEntry(offset) => (frame_byte(offset)?, PYTHON_NO_CSTACK_OWNER),
        EntryMark::CStackOwner(owner) => (PYTHON_NO_IS_ENTRY, owner),
    };
    Ok(PythonProcess {
        interpreters_head: interp.runtime + o.runtime_interpreters_head,
        interp_threads_head: short(o.interp_threads_head)?,
        thread_next: short(o.thread_next)?,
        thread_native_id: short(o.thread_native_id)?,
        thread_cframe,
        current_frame,
        frame_previous: frame_pointer(o.frame_previous)?,
        frame_code: frame_pointer(o.frame_code)?,
        frame_instr: frame_pointer(o.frame_instr)?,
        frame_owner: frame_byte(o.frame_owner)?,
        frame_is_entry,
        code_adaptive: short(o.code_adaptive)?,
        cstack_owner,
        _pad: 0,
        pidns_dev: 0,
        pidns_ino: 0,
    })
}

/// Gives the walker `pid`'s interpreter (`None`: makes it forget it). False when its map is
/// full.
pub fn give(session: &mut Session, pid: Pid, process: Option<&PythonProcess>) -> ebpf::Result<bool> {
    session.set_runtime_process(PYTHON_PROCESSES, pid, process)
}

/// One of the walk's counters, from `counters` (the walker's, by [`PythonCounter`]).
fn counter(counters: &[u64], which: PythonCounter) -> u64 {
    counters.get(which as usize).copied().unwrap_or(0)
}

/// The `/status` object of the kernel's walk of CPython frames: processes given to it, and
/// what its walks did.
pub fn status(registered: &Registrations, counters: &[u64]) -> serde_json::Value {
    use PythonCounter as P;
    let p = |which| counter(counters, which);
    json!({
        "processes": registered.processes,
        "map_full": registered.map_full,
        "unsupported": registered.unsupported,
        "last_unsupported_reason": registered.unsupported_reason,
        "walks": p(P::Walks),
        "frames": p(P::Frames),
        "no_thread_state": p(P::NoThreadState),
        "unreadable": p(P::BadRead),
        "cut_at_depth_limit": p(P::Truncated),
        "bad_code_pointers": p(P::BadCode),
    })
}

/// What the walk of CPython frames did (whole machine), for the profile's comment, when it
/// ran at all.
pub fn walks_comment(counters: &[u64]) -> String {
    use PythonCounter as P;
    let p = |which| counter(counters, which);
    if p(P::Walks) == 0 {
        return String::new();
    }
    format!(
        "; Python frame walks {}: frames {}, no thread state for the thread {}, interpreter memory unreadable {}, \
         cut at the depth limit {}, frames without a code object {}",
        p(P::Walks),
        p(P::Frames),
        p(P::NoThreadState),
        p(P::BadRead),
        p(P::Truncated),
        p(P::BadCode),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtimes::cpython::offsets;

    fn interp(offsets: offsets::Offsets) -> Interpreter {
        Interpreter { version: (3, 12), path: "python3.12".into(), runtime: 0x1000, code_type: None, offsets }
    }

    #[test]
    fn entries_of_the_known_layouts() {
        let e = entry(&interp(offsets::V3_11)).unwrap();
        assert_eq!((e.interpreters_head, e.thread_cframe, e.frame_is_entry), (0x1028, 0x38, 0x44));
        assert_eq!(e.cstack_owner, PYTHON_NO_CSTACK_OWNER);
        let e = entry(&interp(offsets::V3_12)).unwrap();
        assert_eq!((e.frame_code, e.frame_previous, e.frame_is_entry, e.cstack_owner), (0, 8, PYTHON_NO_IS_ENTRY, 3));
    }

    #[test]
    fn a_layout_the_walker_cannot_read_is_refused() {
        let mut bad = offsets::V3_12;
        bad.frame_instr = 0x3c;
        assert!(entry(&interp(bad)).unwrap_err().contains("0x3c"));
        bad.frame_instr = 0x50;
        assert!(entry(&interp(bad)).is_err());
    }
}
