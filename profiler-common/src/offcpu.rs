//! The off-CPU profile's map layout: time threads spent switched out, by (thread, state at
//! the switch, user stack, kernel stack), from switched-out intervals sampled by length
//! (`crate::sampling::by_length` at `OffCpuConfig::rate_ns`).

/// log2 of `maps::OFFCPU_MAYBE_PENDING_SLOTS`: 8,192 counters, 64 KiB.
pub const MAYBE_PENDING_SLOT_BITS: u32 = 13;

/// The `OFFCPU_MAYBE_PENDING` slot of the task at `task_struct` address `task`: the top bits
/// of a multiplicative hash (the addresses are slab objects a few KiB apart, so their low
/// bits alone would crowd a few slots).
#[inline(always)]
pub fn maybe_pending_slot(task: u64) -> u32 {
    (task.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> (64 - MAYBE_PENDING_SLOT_BITS)) as u32
}

/// Why a sampled thread left the CPU, as the switch-out saw it.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OffCpuState {
    /// It slept (`prev_state` S, D, or another sleeping state): it waited for an event.
    Blocked = 0,
    /// It was preempted while runnable (`prev_state` is `TASK_RUNNING`, or the switch was a
    /// preemption): it waited for a core.
    Runnable = 1,
}

impl OffCpuState {
    /// The state of a key's `state` field (`Blocked` for any value but `Runnable`'s).
    pub fn from_raw(raw: u32) -> Self {
        if raw == Self::Runnable as u32 {
            Self::Runnable
        } else {
            Self::Blocked
        }
    }

    /// The `state` label's value.
    pub fn name(self) -> &'static str {
        match self {
            Self::Blocked => "blocked",
            Self::Runnable => "runnable",
        }
    }
}

/// Key of the off-CPU counts.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct OffCpuKey {
    pub tgid: u32,
    pub tid: u32,
    pub user_stack: u64,
    pub kernel_stack: u64,
    /// An [`OffCpuState`].
    pub state: u32,
    pub _pad: u32,
    /// The thread's name at the switch-out.
    pub comm: [u8; 16],
}

const _: () = assert!(core::mem::size_of::<OffCpuKey>() == 48);

/// Values of the off-CPU counts: the switches and the time off a CPU they stand for, already
/// unbiased by the kernel (a short interval kept with probability d/rate counts rate/d
/// switches of `rate` ns in all; on the walk-at-switch-out path a 1-in-N switch counts N).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OffCpuTotals {
    /// In 1/`crate::sampling::WEIGHT_ONE` switches.
    pub switches: u64,
    pub off_cpu_ns: u64,
}

/// Slots of `OFFCPU_OUT` (a power of two): the kernel's default `pid_max` up to 32 CPUs,
/// where no two live threads share one (as `crate::futex::FUTEX_PENDING_SLOTS`).
pub const OUT_SLOTS: u32 = 32_768;

/// The `OFFCPU_OUT` slot of the thread whose kernel `pid_tgid` this is.
#[inline(always)]
pub fn out_slot(pid_tgid: u64) -> u32 {
    pid_tgid as u32 & (OUT_SLOTS - 1)
}

/// A thread's slot in `OFFCPU_OUT`, written at every switch-out and read at the switch-in
/// (the length of an interval decides whether it is sampled, so every one is timed): the
/// thread that last used it (its pid_tgid) and, while it is off the CPU, when it left
/// (`out_ns`, 0 when none in flight) and why. A thread whose slot holds another's interval
/// in flight (ids equal modulo `OUT_SLOTS`) keeps its own in `OFFCPU_PENDING`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct OutSlot {
    pub owner: u64,
    /// `bpf_ktime_get_ns` at the switch-out.
    pub out_ns: u64,
    /// An [`OffCpuState`].
    pub state: u32,
    pub _pad: u32,
}

const _: () = assert!(core::mem::size_of::<OutSlot>() == 24);

const _: () = assert!(core::mem::size_of::<OffCpuTotals>() == 16);

/// A sampled switch-out, kept per task until it is switched back in.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct SwitchedOut {
    /// `bpf_ktime_get_ns` when it left the CPU.
    pub out_ns: u64,
    /// The key its time is charged to. Walked at the switch-out
    /// (`OffCpuConfig::walk_at_switch_out`): all of it; else (a thread whose `OFFCPU_OUT`
    /// slot was taken) only `state`, the rest read when it is back on a CPU.
    pub key: OffCpuKey,
}

const _: () = assert!(core::mem::size_of::<SwitchedOut>() == 56);

/// The off-CPU knobs, `OFFCPU_CONFIG`'s one entry: one lookup per switch reads them all.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OffCpuConfig {
    /// With `walk_at_switch_out` only: record 1 in N switches (0 or 1: every switch), decided
    /// before the interval's length is known.
    pub sample_every: u32,
    /// 1 on kernels without `sched_exit_tp` (before Linux 6.16): a sampled switch's stacks are
    /// walked as the thread leaves the CPU (the time taken first) and its time charged at
    /// `sched_switch`; the walk perturbs the waits it samples.
    pub walk_at_switch_out: u32,
    /// Otherwise: an interval off the CPU at least this long is always recorded, a shorter
    /// one with probability length/rate (0 or 1: every interval).
    pub rate_ns: u64,
}

const _: () = assert!(core::mem::size_of::<OffCpuConfig>() == 16);

/// Indices into the `OFFCPU_COUNTERS` per-CPU array.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OffCpuCounter {
    /// Sampled switches charged at switch-in.
    Charged = 0,
    /// Sampled switch-outs not remembered: the in-flight map was full.
    PendingMapFull = 1,
    /// Charges lost because the counts map was full.
    CountsMapFull = 2,
    /// Stacks not stored (map full or unreadable); the time is counted with no stack.
    StackLost = 3,
    /// Sampled switch-outs of processes whose cgroup is not selected (not walked).
    CgroupFiltered = 4,
    /// Intervals shorter than the rate its sampling left out (not walked), all threads.
    Unsampled = 5,
}

impl OffCpuCounter {
    /// Number of counters (the length of the `OFFCPU_COUNTERS` array).
    pub const COUNT: u32 = 6;
    /// All counters, in index order.
    pub const ALL: [OffCpuCounter; Self::COUNT as usize] = [
        OffCpuCounter::Charged,
        OffCpuCounter::PendingMapFull,
        OffCpuCounter::CountsMapFull,
        OffCpuCounter::StackLost,
        OffCpuCounter::CgroupFiltered,
        OffCpuCounter::Unsampled,
    ];
}

#[cfg(feature = "user")]
// SAFETY: repr(C), only integers, padding explicit (sizes asserted above).
unsafe impl aya::Pod for OffCpuKey {}
#[cfg(feature = "user")]
// SAFETY: as above.
unsafe impl aya::Pod for OffCpuTotals {}
#[cfg(feature = "user")]
// SAFETY: as above.
unsafe impl aya::Pod for SwitchedOut {}
#[cfg(feature = "user")]
// SAFETY: as above.
unsafe impl aya::Pod for OffCpuConfig {}
#[cfg(feature = "user")]
// SAFETY: as above.
unsafe impl aya::Pod for OutSlot {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_are_numbered_in_order() {
        for (i, c) in OffCpuCounter::ALL.iter().enumerate() {
            assert_eq!(*c as usize, i);
        }
        assert_eq!(OffCpuState::from_raw(OffCpuState::Runnable as u32), OffCpuState::Runnable);
        assert_eq!(OffCpuState::from_raw(7), OffCpuState::Blocked);
    }
}
