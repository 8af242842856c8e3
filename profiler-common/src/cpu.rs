//! The CPU profile's map layout: what one on-CPU sample is counted under.

/// Key of the per-CPU sample counts: one entry per (process, thread, user stack, kernel
/// stack). The thread name is part of the key so that a thread that exits before the map is
/// drained keeps its name.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CpuSampleKey {
    /// Process id (the kernel's tgid) in the initial pid namespace.
    pub tgid: u32,
    /// Thread id (the kernel's pid) in the initial pid namespace.
    pub tid: u32,
    /// Hash of the user stack in the set's stack map, or [`crate::NO_STACK`].
    pub user_stack: u64,
    /// Hash of the kernel stack in the set's stack map, or [`crate::NO_STACK`].
    pub kernel_stack: u64,
    /// The thread's `comm`, NUL-padded.
    pub comm: [u8; 16],
    /// The goroutine's pprof labels (a Go process): the hash of their entry in `GO_LABELS`,
    /// or one of `runtimes::go`'s `NO_LABELS`, `LABELS_UNREADABLE`, `LABELS_MAP_FULL`.
    pub labels: u64,
}

const _: () = assert!(core::mem::size_of::<CpuSampleKey>() == 48);

/// Indices into the `CPU_COUNTERS` per-CPU array.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CpuCounter {
    /// Samples counted into a map (idle and filtered-out samples are not).
    Samples = 0,
    /// Samples whose user stack could not be read (counted with no user stack).
    UserStackFailed = 1,
    /// Samples whose kernel stack could not be read (counted with no kernel stack).
    KernelStackFailed = 2,
    /// Stacks not stored because the stack map was full (counted with no stack).
    StacksMapFull = 3,
    /// Samples lost because the counts map was full.
    CountsMapFull = 4,
    /// User stacks cut at `MAX_USER_STACK_DEPTH` frames.
    UserStackTruncated = 5,
    /// Samples of processes in cgroups the configuration does not select (not walked).
    CgroupFiltered = 6,
    /// Ticks of a CPU that was idle, or running a process a `--pid` list leaves out or one
    /// outside the profiler's pid namespace: not
    /// samples, but counted so that the ticks the program ran for add up (see the daemon's
    /// `CpuCounters::ticks_missed`).
    NotSampled = 7,
    /// Samples of a Go process whose goroutine had pprof labels, read and stored.
    GoLabels = 8,
    /// Samples of a Go process whose goroutine's labels could not be read (a fault).
    GoLabelsUnreadable = 9,
    /// Samples whose label set was not stored: the labels map was full.
    GoLabelsMapFull = 10,
}

impl CpuCounter {
    /// Number of counters (the length of the `CPU_COUNTERS` array).
    pub const COUNT: u32 = 11;
    /// All counters, in index order.
    pub const ALL: [CpuCounter; Self::COUNT as usize] = [
        CpuCounter::Samples,
        CpuCounter::UserStackFailed,
        CpuCounter::KernelStackFailed,
        CpuCounter::StacksMapFull,
        CpuCounter::CountsMapFull,
        CpuCounter::UserStackTruncated,
        CpuCounter::CgroupFiltered,
        CpuCounter::NotSampled,
        CpuCounter::GoLabels,
        CpuCounter::GoLabelsUnreadable,
        CpuCounter::GoLabelsMapFull,
    ];
}

/// How the `CGROUP_FILTER` set applies (the value at `CONTROL_CGROUP_MODE` in `CONTROL`): what the configuration's
/// cgroup and unit matchers decide in the kernel, before any stack is walked.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CgroupFilterMode {
    /// Every cgroup.
    Off = 0,
    /// Only tasks in the listed cgroups.
    Include = 1,
    /// Every task but those in the listed cgroups.
    Exclude = 2,
}

#[cfg(feature = "user")]
// SAFETY: repr(C), only integers and a byte array, no padding (size asserted above).
unsafe impl aya::Pod for CpuSampleKey {}
