//! CPython's part of the ABI: what the kernel walker needs to walk a CPython process's
//! `_PyInterpreterFrame` chain ([`PythonProcess`], written by userspace per process), the
//! walk's counters ([`PythonCounter`]) and its maps' names. Its frames are words of
//! [`FrameKind::Python`](crate::FrameKind::Python) (see [`crate::frame`]).

/// Names and sizes of CPython's maps (see [`crate::maps`], whose `ALL` lists them).
pub mod maps {
    /// Hash of tgid (`u32`) → [`super::PythonProcess`]: the CPython processes whose Python
    /// frames the walker adds to their user stacks.
    pub const PYTHON_PROCESSES: &str = "PYTHON_PROCESSES";
    /// Per-CPU array of `u64`, indexed by [`super::PythonCounter`].
    pub const PYTHON_COUNTERS: &str = "PYTHON_COUNTERS";
    /// Per-CPU scratch of the Python walk, one entry per scratch slot.
    pub const PYTHON_STATE: &str = "PYTHON_STATE";
    /// CPython processes walked at once.
    pub const PYTHON_PROCESSES_MAX_ENTRIES: u32 = 1_024;
    /// Every map of CPython's walker.
    pub const ALL: [&str; 3] = [PYTHON_PROCESSES, PYTHON_COUNTERS, PYTHON_STATE];
}

/// [`PythonProcess::thread_cframe`] when the thread state holds the current frame itself
/// (3.13), with no `_PyCFrame` in between.
pub const PYTHON_NO_CFRAME: u16 = u16::MAX;
/// [`PythonProcess::frame_is_entry`] when frames have no `is_entry` flag (3.12+: the
/// activation's shim frame marks it instead).
pub const PYTHON_NO_IS_ENTRY: u16 = u16::MAX;
/// [`PythonProcess::cstack_owner`] when no frame is a C-stack shim (3.11).
pub const PYTHON_NO_CSTACK_OWNER: u8 = u8::MAX;
/// `FRAME_OWNED_BY_GENERATOR`: a generator's frame is complete before its first instruction.
pub const PYTHON_OWNED_BY_GENERATOR: u8 = 1;
/// Bytes of a `_PyInterpreterFrame` the walker reads at once: every field it needs lies
/// within them (userspace checks the offsets before it registers a process).
pub const PYTHON_FRAME_READ_BYTES: usize = 0x50;

/// What the kernel walker needs to walk a CPython process's frames: where the main
/// interpreter's thread list is, and the structure offsets of its version. Value of
/// `PYTHON_PROCESSES`, by tgid, written by userspace when it registers the process.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PythonProcess {
    /// The address of `_PyRuntime.interpreters.head` (a pointer to the main interpreter).
    pub interpreters_head: u64,
    /// `PyInterpreterState.threads.head`.
    pub interp_threads_head: u16,
    /// `PyThreadState.next`.
    pub thread_next: u16,
    /// `PyThreadState.native_thread_id`: the kernel's tid of the thread.
    pub thread_native_id: u16,
    /// `PyThreadState.cframe` (3.11, 3.12), or [`PYTHON_NO_CFRAME`].
    pub thread_cframe: u16,
    /// `_PyCFrame.current_frame` (3.11, 3.12), or `PyThreadState.current_frame` (3.13).
    pub current_frame: u16,
    /// `_PyInterpreterFrame.previous`.
    pub frame_previous: u16,
    /// `f_code` or `f_executable`.
    pub frame_code: u16,
    /// `prev_instr` or `instr_ptr`.
    pub frame_instr: u16,
    /// `owner` (a byte).
    pub frame_owner: u16,
    /// `is_entry` (a byte, 3.11), or [`PYTHON_NO_IS_ENTRY`].
    pub frame_is_entry: u16,
    /// `PyCodeObject.co_code_adaptive`: where the instructions start.
    pub code_adaptive: u16,
    /// The owner value of an activation's shim frame (3.12+), or [`PYTHON_NO_CSTACK_OWNER`].
    pub cstack_owner: u8,
    pub _pad: u8,
    /// The process's pid namespace (the kernel's `dev_t` and inode of its `ns/pid`) when it
    /// is not the profiler's: `native_thread_id` holds the thread's id there, which the
    /// walker asks the kernel for. 0 and 0: the profiler's own namespace.
    pub pidns_dev: u64,
    pub pidns_ino: u64,
}

const _: () = assert!(core::mem::size_of::<PythonProcess>() == 48);

/// Indices of the `PYTHON_COUNTERS` per-CPU array.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PythonCounter {
    /// Walks of a registered CPython process's frames.
    Walks = 0,
    /// Python frames recorded.
    Frames = 1,
    /// Walks whose thread has no thread state with a current frame in the thread list (not
    /// a Python thread, in no Python code now, or beyond the threads searched).
    NoThreadState = 2,
    /// Walks that stopped at a read of the interpreter's memory that failed.
    BadRead = 3,
    /// Walks cut at the stack's depth limit (the outermost Python frames are missing).
    Truncated = 4,
    /// Frames skipped because their code pointer cannot be a code object.
    BadCode = 5,
}

impl PythonCounter {
    pub const COUNT: u32 = 6;
}

#[cfg(feature = "user")]
// SAFETY: repr(C), only integers, padding explicit (size asserted above).
unsafe impl aya::Pod for PythonProcess {}
