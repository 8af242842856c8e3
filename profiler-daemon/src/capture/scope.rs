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
    pub(super) fn in_scope(&self, pid: Pid) -> bool {
        self.scope.is_empty() || self.scope.contains(&pid)
    }

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
/// [`Declined`].
pub(super) fn seen(catalog: &Catalog, selection: &ProcessSelection, scope: &[Pid], pid: Pid) -> Seen {
    match catalog.process(pid) {
        None => Seen::Unknown,
        Some(process) if process.exited => Seen::Exited,
        Some(process) if (scope.is_empty() || scope.contains(&pid)) && selection.matches(&process.facts()) => {
            Seen::Selected
        }
        Some(_) => Seen::LeftOut,
    }
}
