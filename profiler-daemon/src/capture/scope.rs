//! Which processes are selected and registered: the scope of pids, the `[processes]`
//! selection (with the kernel's cgroup filter and the declined asks), and the registration
//! of selected processes with the unwinder.

use std::time::Duration;

use super::{Capture, CaptureError};
use crate::{
    catalog::Catalog,
    cgroups::{self, CgroupFilter},
    config::ProcessSelection,
    declined::{DeclinedStats, Seen},
    ebpf,
    ids::Pid,
    sideband::Sideband,
};

impl Capture {
    pub(super) fn sync_unwinder(&mut self, budget: Option<Duration>, give_way: bool) -> ebpf::Result<bool> {
        let selection = &self.selection;
        let processes = self
            .catalog
            .processes()
            .filter(move |p| !p.exited && selection.matches(&p.facts()))
            .map(|p| (p.pid, p.maps_version, p.maps()));
        // The backlog at a drain gives way as soon as process events wait, so that a process
        // started now is registered before the next old one.
        let sideband = self.sideband.as_ref().filter(|_| give_way);
        let events_waiting = || sideband.is_some_and(Sideband::has_records);
        self.unwinder.sync(&mut self.session, processes, budget, &events_waiting)
    }

    /// Registers `pids` (the processes a batch of events changed) with the unwinder, and
    /// nothing else: they run now, and a short-lived one must not wait behind a backlog of
    /// older processes (those are registered at the drains).
    pub(super) fn sync_changed(&mut self, pids: &[Pid], budget: Duration) -> ebpf::Result<()> {
        let (selection, catalog) = (&self.selection, &self.catalog);
        let processes = pids
            .iter()
            .filter_map(|pid| catalog.process(*pid))
            .filter(move |p| !p.exited && selection.matches(&p.facts()))
            .map(|p| (p.pid, p.maps_version, p.maps()));
        self.unwinder.sync(&mut self.session, processes, Some(budget), &|| false).map(|_| ())
    }

    /// Caps each process's share of the catalogue's stacks (see [`Catalog::set_process_share`]).
    pub fn set_process_share(&mut self, percent: u32) {
        self.catalog.set_process_share(percent);
    }

    /// Builds unwind tables only for the processes `selection` matches from now on (a
    /// process already registered keeps its tables until it exits).
    pub fn select(&mut self, selection: &ProcessSelection) {
        self.selection = selection.clone();
        self.filter_cgroups();
        // Any process may be selected now: each asks again at its next walk.
        if let Err(err) = self.declined.clear(&mut self.session) {
            tracing::warn!("{}", crate::error::chain(&CaptureError::Decline(err)));
        }
    }

    /// The processes whose walks were told not to ask for a registration.
    pub fn declined_stats(&self) -> DeclinedStats {
        self.declined.stats()
    }

    /// Tells the kernel which cgroups the selection's cgroup and unit matchers select, from
    /// the hierarchy as it is now (new cgroups are added as the side band reports them).
    pub(super) fn filter_cgroups(&mut self) {
        let root = cgroups::cgroup2_root();
        let filter = match root {
            Some(root) if CgroupFilter::applies(&self.selection) => {
                CgroupFilter::for_selection(&self.selection, &cgroups::scan(&root))
            }
            _ => CgroupFilter::default(),
        };
        self.set_cgroup_filter(filter);
    }

    fn set_cgroup_filter(&mut self, filter: CgroupFilter) {
        if filter == self.cgroup_filter {
            return;
        }
        let mode = filter.mode.unwrap_or(ebpf::CgroupFilterMode::Off);
        match self.session.set_cgroup_filter(mode, &filter.ids) {
            Ok(()) => self.cgroup_filter = filter,
            Err(err) => tracing::warn!(
                "cgroup and unit matchers are applied in userspace only (every process is walked): {}",
                crate::error::chain(&err)
            ),
        }
    }

    /// Adds the cgroups just created that the selection's matchers select (or exclude).
    pub(super) fn filter_new_cgroups(&mut self, created: &[(u64, String)]) {
        if created.is_empty() || self.cgroup_filter.mode.is_none() {
            return;
        }
        let fresh = CgroupFilter::for_selection(&self.selection, created);
        let mut filter = self.cgroup_filter.clone();
        filter.ids.extend(fresh.ids);
        self.set_cgroup_filter(filter);
    }

    /// Registers a process before it has data (a heap target found by a scan).
    pub fn track(&mut self, pid: Pid) {
        self.catalog.track(pid);
    }

    /// Reads the owner of a process known from events only (see [`Catalog::inspect`]).
    pub fn inspect(&mut self, pid: Pid) {
        self.catalog.inspect(pid);
    }
}

/// How the catalogue, the selection and a snapshot's pid scope see process `pid`, for
/// [`crate::declined::Declined`].
pub(super) fn seen(catalog: &Catalog, selection: &ProcessSelection, scope: &[Pid], pid: Pid) -> Seen {
    match catalog.process(pid) {
        None => Seen::Unknown,
        Some(process) if process.exited => Seen::Exited,
        Some(process) if in_scope(scope, pid) && selection.matches(&process.facts()) => Seen::Selected,
        Some(_) => Seen::LeftOut,
    }
}

/// Whether `pid` is in the chosen `scope` of pids (empty: every process is).
pub(super) fn in_scope(scope: &[Pid], pid: Pid) -> bool {
    scope.is_empty() || scope.contains(&pid)
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;
    use crate::{catalog::Sighting, config::Matcher, ids::StackId, sideband::ProcessEvent};

    // pids far above pid_max: never alive, so the catalogue reads nothing from /proc.
    const A: Pid = Pid(0x7fff_ff00);
    const B: Pid = Pid(0x7fff_ff01);
    const GONE: Pid = Pid(0x7fff_ff02);

    /// A catalogue that sampled A and B, and saw GONE sampled and then exit.
    fn catalog() -> Catalog {
        let mut catalog = Catalog::default();
        catalog.follow_exits();
        let sighting = |pid| Sighting {
            pid,
            user_stack: StackId(7),
            kernel_stack: StackId::NONE,
            user_leaf_is_return: false,
            main_thread_name: None,
        };
        catalog.learn(&HashMap::new(), &[sighting(A), sighting(B), sighting(GONE)]);
        catalog.apply(&[ProcessEvent::Exited { pid: GONE, time: 1 }]);
        catalog
    }

    #[test]
    fn an_empty_scope_holds_every_process() {
        assert!(in_scope(&[], A));
        assert!(in_scope(&[A], A));
        assert!(!in_scope(&[A], B));
    }

    #[test]
    fn a_process_is_selected_only_in_scope_and_matched_and_alive() {
        let catalog = catalog();
        let all = ProcessSelection::default();
        assert_eq!(seen(&catalog, &all, &[], A), Seen::Selected);
        assert_eq!(seen(&catalog, &all, &[], Pid(0x7fff_ff09)), Seen::Unknown);
        assert_eq!(seen(&catalog, &all, &[], GONE), Seen::Exited);
        // Left out by the pid scope, or by the selection.
        assert_eq!(seen(&catalog, &all, &[B], A), Seen::LeftOut);
        let only_b = ProcessSelection { include: vec![Matcher::Pid(B.0)], exclude: vec![] };
        assert_eq!(seen(&catalog, &only_b, &[], A), Seen::LeftOut);
        assert_eq!(seen(&catalog, &only_b, &[], B), Seen::Selected);
    }
}
