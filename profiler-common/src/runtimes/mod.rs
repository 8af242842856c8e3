//! The runtimes whose frames the kernel walkers read, one module each: the structures the
//! walker of a runtime shares with userspace (per-process entries, counters, map names). The
//! set is closed and matches [`crate::FrameKind`]'s interpreted variants; what the maps of
//! all runtimes are, [`crate::maps::ALL`] collects from [`MAPS`].

pub mod cpython;
pub mod go;

/// Every runtime's maps: CPython's walker's, then Go's label reader's.
pub const MAPS: [&str; 6] = crate::maps::join(cpython::maps::ALL, go::maps::ALL);

/// Every runtime's counter map and how many counters it has, by interpreted
/// [`crate::FrameKind`] (`FrameKind::Python`, 1, first).
pub const COUNTERS: [(&str, u32); 1] = [(cpython::maps::PYTHON_COUNTERS, cpython::PythonCounter::COUNT)];

/// The most counters a runtime's walker has.
pub const MAX_COUNTERS: usize = 8;

const _: () = {
    let mut i = 0;
    while i < COUNTERS.len() {
        assert!(COUNTERS[i].1 as usize <= MAX_COUNTERS);
        i += 1;
    }
};
