//! The threads given up on, still blocked, which the sibling handles share; and the
//! refusals they cause: a stalled device, a lane's or an owner's budget of stuck threads
//! used up.

use std::sync::{
    atomic::{AtomicBool, Ordering},
    Arc,
};

use super::{
    charge::{Charge, Lane, Owner},
    DeviceName, OffloadStats, Stall, MAX_ABANDONED, MAX_ABANDONED_PERF_MAPS, MAX_ABANDONED_PER_OWNER,
};
use crate::procs::Device;

/// A thread given up on, still blocked.
pub(super) struct Abandoned {
    /// The device it is stuck on; `None` for a path walk, or a job that was only slow.
    pub(super) device: Option<Device>,
    /// Whose share it uses.
    pub(super) owner: Owner,
    pub(super) lane: Lane,
    pub(super) alive: Arc<AtomicBool>,
}

/// What the siblings share.
#[derive(Default)]
pub(super) struct Shared {
    pub(super) abandoned: Vec<Abandoned>,
    pub(super) stats: OffloadStats,
}

impl Shared {
    /// Forgets threads that came back, which frees their devices.
    pub(super) fn reap(&mut self) {
        let before = self.abandoned.len();
        self.abandoned.retain(|a| a.alive.load(Ordering::Acquire));
        self.stats.recovered += (before - self.abandoned.len()) as u64;
    }

    pub(super) fn is_stalled(&self, device: Device) -> bool {
        self.abandoned.iter().any(|a| a.device == Some(device))
    }

    /// Why a job with `charge` for `owner` must not run now, if it must not.
    pub(super) fn refusal(&self, what: &str, charge: Charge, owner: Owner) -> Option<Stall> {
        let what = what.to_string();
        if charge.lane == Lane::Files {
            if let Some(device) = charge.device.filter(|&d| self.is_stalled(d)) {
                return Some(Stall::DeviceStalled { what, device: DeviceName(Some(device)) });
            }
        }
        let cap = match charge.lane {
            Lane::Files => MAX_ABANDONED,
            Lane::PerfMaps => MAX_ABANDONED_PERF_MAPS,
        };
        let stuck = self.abandoned.iter().filter(|a| a.lane == charge.lane).count();
        if stuck >= cap {
            return Some(Stall::TooManyStuck { what, stuck });
        }
        let owned = self.abandoned.iter().filter(|a| a.owner == owner).count();
        match owner {
            Owner::Daemon => None,
            Owner::Uid(uid) if owned >= MAX_ABANDONED_PER_OWNER => {
                Some(Stall::OwnerStuck { what, whose: format!("uid {uid}'s processes") })
            }
            // Processes gone before their owner was read share one owner's share: exiting
            // must not free a user from theirs.
            Owner::Gone if owned >= MAX_ABANDONED_PER_OWNER => {
                Some(Stall::OwnerStuck { what, whose: "processes gone before their owner was read".into() })
            }
            _ => None,
        }
    }
}
