//! What a job's stall is charged to: the device it works on (which it may say as it goes),
//! the process it works for (whose owner's share of stuck threads it uses), and its lane.

use std::sync::{
    atomic::{AtomicU64, Ordering},
    Arc,
};

use crate::{ids::Pid, procs::Device};

/// Which budget of stuck threads a job draws on.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Lane {
    /// Mapped files (executables, libraries) and the daemon's own work.
    #[default]
    Files,
    /// Perf maps (`/tmp/perf-PID.map`), which any user writes.
    PerfMaps,
}

/// What a job's stall is charged to: the device it starts on (it may say another as it
/// goes: [`Charger::charge_to`]), the process it works for (whose owner's share it
/// uses), and its lane.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Charge {
    pub device: Option<Device>,
    pub pid: Option<Pid>,
    pub lane: Lane,
}

impl Charge {
    /// Work on a file of `device` for process `pid`.
    pub fn file(device: Device, pid: Pid) -> Self {
        Self { device: Some(device), pid: Some(pid), lane: Lane::Files }
    }

    /// Work for process `pid` on no known device yet (a path still to be walked).
    pub fn path(pid: Pid) -> Self {
        Self { device: None, pid: Some(pid), lane: Lane::Files }
    }

    /// A perf map of process `pid`.
    pub fn perf_map(pid: Pid) -> Self {
        Self { device: None, pid: Some(pid), lane: Lane::PerfMaps }
    }

    /// The daemon's own work (closing files): no device, no process.
    pub fn internal() -> Self {
        Self::default()
    }
}

impl From<Option<Device>> for Charge {
    fn from(device: Option<Device>) -> Self {
        Self { device, ..Self::default() }
    }
}

/// A job's way to say where it works.
#[derive(Clone, Debug, Default)]
pub struct Charger(pub(super) CurrentDevice);

impl Charger {
    /// Says which device the job works on from now on (`None`: a path walk, which may lead
    /// anywhere): a stall from here on is charged to it.
    pub fn charge_to(&self, device: Option<Device>) {
        self.0.store(encode(device), Ordering::Release);
    }
}

/// The device a worker's current job says it is working on, shared with its caller: a
/// device's `major << 32 | minor`, or [`NO_DEVICE`].
pub(super) type CurrentDevice = Arc<AtomicU64>;
pub(super) const NO_DEVICE: u64 = u64::MAX;

pub(super) fn encode(device: Option<Device>) -> u64 {
    device.map_or(NO_DEVICE, |d| (u64::from(d.major) << 32) | u64::from(d.minor))
}

pub(super) fn decode(word: u64) -> Option<Device> {
    (word != NO_DEVICE).then_some(Device { major: (word >> 32) as u32, minor: word as u32 })
}

/// Whose share of stuck threads a job uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Owner {
    /// The daemon's own work (no process).
    Daemon,
    /// The real uid of the process it works for.
    Uid(u32),
    /// A process already gone when the job was asked for.
    Gone,
}

impl Owner {
    /// Read when the job is asked for (by the time it stalls, its process may be gone):
    /// the real uid from `/proc/PID/status` (the directory's owner would be root for a
    /// process that made itself undumpable).
    pub(super) fn of(charge: Charge) -> Self {
        match charge.pid {
            None => Owner::Daemon,
            Some(pid) => crate::procs::read_credentials(pid.0).map_or(Owner::Gone, |c| Owner::Uid(c.uids[0])),
        }
    }
}
