//! Which processes the programs record: the pid list, set once at load, and the cgroup
//! filter, replaced while the session runs.

use aya::{
    maps::{Array, HashMap, MapData},
    Ebpf,
};
use profiler_common::{maps, CgroupFilterMode};

use super::{map_error, map_mut, Result, Session};
use crate::ids::Pid;

impl Session {
    /// What the kernel filters by cgroup (see `profiler_common::CgroupFilterMode`).
    pub fn set_cgroup_filter(&mut self, mode: CgroupFilterMode, ids: &std::collections::BTreeSet<u64>) -> Result<()> {
        set_cgroup_filter(&mut self.ebpf, mode, ids)
    }
}

/// Replaces the cgroups filtered in the kernel: `mode` and the cgroup ids it applies to.
pub(super) fn set_cgroup_filter(
    ebpf: &mut Ebpf,
    mode: CgroupFilterMode,
    ids: &std::collections::BTreeSet<u64>,
) -> Result<()> {
    let old: Vec<u64> = {
        let filter: HashMap<&mut MapData, u64, u8> = map_mut(ebpf, maps::CGROUP_FILTER)?;
        filter.keys().filter_map(|k| k.ok()).filter(|id| !ids.contains(id)).collect()
    };
    // Off while the set changes: a sample meanwhile is counted rather than lost.
    let mut control: Array<&mut MapData, u32> = map_mut(ebpf, maps::CONTROL)?;
    control
        .set(maps::CONTROL_CGROUP_MODE, CgroupFilterMode::Off as u32, 0)
        .map_err(map_error("write", maps::CONTROL))?;
    let mut filter: HashMap<&mut MapData, u64, u8> = map_mut(ebpf, maps::CGROUP_FILTER)?;
    for id in old {
        let _ = filter.remove(&id);
    }
    for &id in ids {
        filter.insert(id, 1, 0).map_err(map_error("write", maps::CGROUP_FILTER))?;
    }
    let mut control: Array<&mut MapData, u32> = map_mut(ebpf, maps::CONTROL)?;
    control.set(maps::CONTROL_CGROUP_MODE, mode as u32, 0).map_err(map_error("write", maps::CONTROL))
}

pub(super) fn select_pids(ebpf: &mut Ebpf, pids: &[Pid]) -> Result<()> {
    let mut targets: HashMap<&mut MapData, u32, u8> = map_mut(ebpf, maps::TARGET_PIDS)?;
    let mut slots = vec![0u32; maps::TARGET_PID_SLOTS_LEN as usize];
    for pid in pids {
        targets.insert(pid.0, 1, 0).map_err(map_error("write", maps::TARGET_PIDS))?;
        let slot = &mut slots[maps::target_pid_slot(pid.0) as usize];
        *slot = maps::with_target_pid(*slot, pid.0);
    }
    let mut array: Array<&mut MapData, u32> = map_mut(ebpf, maps::TARGET_PID_SLOTS)?;
    for (index, &tgid) in slots.iter().enumerate().filter(|(_, &tgid)| tgid != 0) {
        array.set(index as u32, tgid, 0).map_err(map_error("write", maps::TARGET_PID_SLOTS))?;
    }
    Ok(())
}
