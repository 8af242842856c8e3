//! The queries: the index, profiles (at once, or over a `seconds=S` window), and thread
//! dumps asked for, with their walks run off the collector. Whether a window may open is
//! decided by [`admit_window`], a pure function; what may be answered is [`super::decide`]'s.

use std::{
    sync::Arc,
    time::{Instant, SystemTime},
};

use tokio::sync::oneshot;

use super::{decide, dump::FOLLOW_WHILE_FINISHING, notes, Collector};
use crate::{
    capture::CaptureError,
    control::{IndexEntry, ProfileBody, ProfileQuery, QueryError, Viewer},
    daemon::thread_dumps::{DumpQuery, Walked},
    ids::Pid,
    procs,
    profiles::{Context, Counts, ProcessCounts, ProfileKind, Settings},
    render::{Renderer, Window},
    thread_dump::ThreadDump,
};

/// On-demand captures (`seconds=S`) in flight at once.
const MAX_WINDOWS: usize = 16;

/// Of those, the ones one uid other than root may have open; more get a 429.
const MAX_WINDOWS_PER_UID: usize = 4;

/// Of those, the ones only root may open, so that other users cannot lock root out.
const ROOT_WINDOWS: usize = 4;

/// A dump query (none for an interval's dump) and its dump.
type DumpAnswer = (Option<DumpQuery>, Result<Arc<ThreadDump>, QueryError>);

/// A `seconds=S` query waiting for its window to end.
pub(super) struct PendingWindow {
    pub(super) query: ProfileQuery,
    pub(super) start: SystemTime,
    pub(super) deadline: Instant,
    pub(super) counts: Counts,
    pub(super) reply: oneshot::Sender<Result<ProfileBody, QueryError>>,
}

impl Collector {
    pub(super) fn index(&mut self, viewer: Viewer, pid: Option<Pid>) -> Vec<IndexEntry> {
        if let Some(pid) = pid {
            // A process's own page is what a dump of it would see: one not known yet (idle
            // since the daemon started) is read first, and listed with what it can give now.
            self.read_before(ProfileKind::Threads, pid);
        }
        let catalog = self.capture.catalog();
        let mut entries = decide::index(
            &self.serving(),
            &self.config.processes,
            catalog,
            &self.total,
            viewer,
            pid,
            &mut credentials_now,
        );
        // A dump is taken when asked for: the index shows how many threads there are now,
        // as Go's shows how many goroutines.
        for entry in &mut entries {
            for (kind, count) in &mut entry.profiles {
                if *kind == ProfileKind::Threads {
                    *count = procs::thread_count(entry.pid.0).unwrap_or(0);
                }
            }
        }
        entries
    }

    /// Reads what a query of `kind` about `pid` needs of the process first (see
    /// [`decide::before_query`]).
    fn read_before(&mut self, kind: ProfileKind, pid: Pid) {
        match decide::before_query(kind, self.capture.catalog().process(pid)) {
            decide::BeforeQuery::Track if procs::exists(pid.0) => self.capture.track(pid),
            decide::BeforeQuery::Inspect => self.capture.inspect(pid),
            decide::BeforeQuery::Track | decide::BeforeQuery::Nothing => {}
        }
    }

    pub(super) fn query(&mut self, query: ProfileQuery, reply: oneshot::Sender<Result<ProfileBody, QueryError>>) {
        if reply.is_closed() {
            // The client hung up while the query was queued (the front let it go): a thread
            // dump nobody waits for would cost the collector for nothing.
            return;
        }
        // Credentials read now are judged by `check_query` as for any process.
        self.read_before(query.view.kind, query.pid);
        let catalog = self.capture.catalog();
        if let Err(err) = decide::check_query(&self.serving(), &self.config, catalog, &query, &mut credentials_now) {
            let _ = reply.send(Err(err));
            return;
        }
        let open = self.windows.iter().map(|w| w.query.viewer);
        if let (Some(_), Err(refused)) = (query.window, admit_window(query.viewer, open)) {
            if refused == WindowRefusal::UidShare {
                self.windows_over_uid_share += 1;
            }
            let _ = reply.send(Err(refused.error(query.viewer)));
            return;
        }
        match query.window {
            Some(duration) => {
                // Samples taken before the window opens are counted before it exists, not
                // in it (F19: up to a drain interval of them landed in a `seconds=S` window).
                self.drain();
                self.windows.push(PendingWindow {
                    query,
                    start: SystemTime::now(),
                    deadline: Instant::now() + duration,
                    counts: Counts::default(),
                    reply,
                });
            }
            // Answered when its walk ends (see `serve_dumps`).
            None if query.view.kind == ProfileKind::Threads => self.dumps.push(DumpQuery { query, reply }),
            None => {
                if query.view.kind == ProfileKind::Heap {
                    self.refresh_live();
                }
                let window = Window { start: self.started, duration: self.started_at.elapsed() };
                let counts = self.total.process(query.pid).cloned().unwrap_or_default();
                let _ = reply.send(self.answer(&query, &counts, window));
            }
        }
    }

    fn answer(
        &mut self,
        query: &ProfileQuery,
        counts: &ProcessCounts,
        window: Window,
    ) -> Result<ProfileBody, QueryError> {
        let counters = self.capture.counters().unwrap_or_default();
        let catalog = self.capture.catalog();
        let process = catalog.process(query.pid).ok_or(QueryError::UnknownPid(query.pid))?;
        // Checked again at the end of a window: the process may have changed uid meanwhile.
        if !decide::visible(query.viewer, process, &mut credentials_now) {
            return Err(QueryError::NotVisible(query.pid));
        }
        let renderer = Renderer {
            catalog,
            settings: Settings::from(&self.config),
            context: Context::Query,
            window,
            counters: &counters,
            kernel_addresses: query.viewer == Viewer::ROOT,
        };
        let bytes = if query.debug > 0 {
            renderer.text(process, counts, query.view, query.debug, &mut self.sym).into_bytes()
        } else {
            let notes = notes(&self.capture, query.pid, query.view.kind);
            renderer.render(process, counts, query.view, notes, &mut self.sym).encoded.gzip()
        };
        Ok(ProfileBody { bytes, text: query.debug > 0 })
    }

    /// Answers the windows whose time is up.
    pub(super) fn finish_windows(&mut self) {
        // A client that hung up needs no answer, and must not hold a window until its end.
        self.windows.retain(|w| !w.reply.is_closed());
        let now = Instant::now();
        let (due, waiting): (Vec<_>, Vec<_>) =
            std::mem::take(&mut self.windows).into_iter().partition(|w| w.deadline <= now);
        self.windows = waiting;
        if due.is_empty() {
            return;
        }
        self.drain();
        if due.iter().any(|w| w.query.view.kind == ProfileKind::Heap) {
            // Updates the open windows' live state; the due ones take it below.
            self.refresh_live();
        }
        for w in due {
            let window = Window { start: w.start, duration: w.start.elapsed().unwrap_or_default() };
            let mut counts = w.counts.process(w.query.pid).cloned().unwrap_or_default();
            if let Some(total) = self.total.process(w.query.pid) {
                counts = counts.with_live_from(total);
            }
            let _ = w.reply.send(self.answer(&w.query, &counts, window));
        }
    }

    /// Answers the dump whose walk ended, if one did, and begins the next queued one.
    /// Returns whether a dump was answered.
    pub(super) fn serve_dumps(&mut self) -> bool {
        let ended = self.dumps.ended().map(|walked| self.end_dump(walked));
        let answered = ended.is_some();
        if let Some((Some(waiter), dump)) = ended {
            self.answer_dump(waiter, dump);
        }
        while let Some(waiter) = self.dumps.next_query() {
            let pid = waiter.query.pid;
            match self.begin_dump(pid, Some(waiter)) {
                Ok(()) => break,
                Err((waiter, err)) => {
                    if let Some(waiter) = waiter {
                        let _ = waiter.reply.send(Err(err));
                    }
                }
            }
        }
        answered
    }

    /// Begins a dump of `pid` and launches its walk.
    fn begin_dump(&mut self, pid: Pid, waiter: Option<DumpQuery>) -> Result<(), (Option<DumpQuery>, QueryError)> {
        let started = match self.capture.start_thread_dump(pid) {
            Ok(started) => started,
            Err(err) => return Err((waiter, self.dump_error(err))),
        };
        match self.dumps.launch(started, waiter) {
            Ok(()) => Ok(()),
            Err(unlaunched) => {
                let (started, waiter, err) = *unlaunched;
                self.capture.abandon_thread_dump(started.ticket, None);
                let message = format!("failed to start a thread for the dump of pid {pid}: {err}");
                self.record(message.clone());
                Err((waiter, QueryError::Unavailable(message)))
            }
        }
    }

    /// Ends a walk: what the capture learns from it, and the dump.
    fn end_dump(&mut self, walked: Walked) -> DumpAnswer {
        let Walked { ticket, waiter, outcome } = walked;
        let dump = match outcome {
            Ok(outcome) => {
                self.capture.finish_thread_dump(ticket, outcome).map(Arc::new).map_err(|e| self.dump_error(e))
            }
            Err(_panic) => {
                self.capture.abandon_thread_dump(ticket, None);
                let message = "a thread dump's walk panicked; see the log".to_string();
                self.record(message.clone());
                Err(QueryError::Unavailable(message))
            }
        };
        (waiter, dump)
    }

    /// Answers a dump query with its dump, rendered with the process's counts as they are now.
    fn answer_dump(&mut self, waiter: DumpQuery, dump: Result<Arc<ThreadDump>, QueryError>) {
        let DumpQuery { query, reply } = waiter;
        let answer = dump.and_then(|dump| {
            let window = Window { start: dump.taken, duration: dump.duration };
            let mut counts = self.total.process(query.pid).cloned().unwrap_or_default();
            counts.threads.dump = Some(dump);
            counts.threads.os_threads = query.os_threads;
            self.answer(&query, &counts, window)
        });
        let _ = reply.send(answer);
    }

    /// Dumps the threads of `pid` for an interval's files: after the walk in flight (its query
    /// answered), the walk runs off this thread while this one follows process events.
    pub(super) fn thread_dump(&mut self, pid: Pid) -> Result<Arc<ThreadDump>, QueryError> {
        if let Some((Some(waiter), dump)) = self.await_walk() {
            self.answer_dump(waiter, dump);
        }
        self.begin_dump(pid, None).map_err(|(_, err)| err)?;
        match self.await_walk() {
            Some((_, dump)) => dump,
            None => Err(QueryError::Unavailable(format!("the dump of pid {pid} was lost"))),
        }
    }

    /// Waits for the walk in flight, if any, following process events meanwhile.
    fn await_walk(&mut self) -> Option<DumpAnswer> {
        while self.dumps.busy() {
            if let Some(walked) = self.dumps.ended() {
                return Some(self.end_dump(walked));
            }
            self.heartbeat.beat();
            let reused = self.capture.follow();
            self.forget_reused(&reused);
            std::thread::sleep(FOLLOW_WHILE_FINISHING);
        }
        None
    }

    /// A dump's error as its query's: a process that exited meanwhile is answered as one.
    fn dump_error(&mut self, err: CaptureError) -> QueryError {
        match err {
            CaptureError::NoProcess(pid) => QueryError::UnknownPid(pid),
            err => {
                let message = crate::error::chain(&err);
                self.record(message.clone());
                QueryError::Unavailable(message)
            }
        }
    }
}
/// Why a `seconds=S` window was not opened.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum WindowRefusal {
    /// [`MAX_WINDOWS`] are open.
    Full,
    /// The windows other users may have are open (the last [`ROOT_WINDOWS`] are root's).
    OthersFull,
    /// The viewer has [`MAX_WINDOWS_PER_UID`] open.
    UidShare,
}

impl WindowRefusal {
    /// The query's answer: retry later, or (over its own share) wait for one to finish.
    fn error(self, viewer: Viewer) -> QueryError {
        match self {
            Self::Full => {
                QueryError::Unavailable(format!("{MAX_WINDOWS} profile captures are already running; retry later"))
            }
            Self::OthersFull => QueryError::Unavailable(format!(
                "{} profile captures of other users are already running; retry later",
                MAX_WINDOWS - ROOT_WINDOWS
            )),
            Self::UidShare => QueryError::Limited(format!(
                "uid {} already has {MAX_WINDOWS_PER_UID} profile captures running; wait for one to finish",
                viewer.uid
            )),
        }
    }
}

/// Whether `viewer` may open one more window, with windows open by `open` viewers.
fn admit_window(viewer: Viewer, open: impl Iterator<Item = Viewer> + Clone) -> Result<(), WindowRefusal> {
    if open.clone().count() >= MAX_WINDOWS {
        return Err(WindowRefusal::Full);
    }
    if viewer == Viewer::ROOT {
        return Ok(());
    }
    if open.clone().filter(|&v| v != Viewer::ROOT).count() >= MAX_WINDOWS - ROOT_WINDOWS {
        return Err(WindowRefusal::OthersFull);
    }
    if open.filter(|&v| v == viewer).count() >= MAX_WINDOWS_PER_UID {
        return Err(WindowRefusal::UidShare);
    }
    Ok(())
}

/// A process's credentials as they are now, for [`decide::visible`].
fn credentials_now(pid: Pid) -> Option<procs::Credentials> {
    procs::read_credentials(pid.0).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn user(uid: u32) -> Viewer {
        Viewer { uid }
    }

    #[test]
    fn windows_are_admitted_up_to_the_limits_and_root_keeps_its_own() {
        let (alice, bob) = (user(1000), user(1001));
        assert_eq!(admit_window(alice, std::iter::empty()), Ok(()));
        // One uid's share.
        let alices = [alice; MAX_WINDOWS_PER_UID];
        assert_eq!(admit_window(alice, alices.iter().copied()), Err(WindowRefusal::UidShare));
        assert_eq!(admit_window(bob, alices.iter().copied()), Ok(()));
        // Other users fill all but root's windows; root still opens one.
        let others: Vec<Viewer> = (0..MAX_WINDOWS - ROOT_WINDOWS).map(|i| user(2000 + i as u32)).collect();
        assert_eq!(admit_window(alice, others.iter().copied()), Err(WindowRefusal::OthersFull));
        assert_eq!(admit_window(Viewer::ROOT, others.iter().copied()), Ok(()));
        // Root's own windows do not count against other users.
        let roots = [Viewer::ROOT; MAX_WINDOWS - 1];
        assert_eq!(admit_window(alice, roots.iter().copied()), Ok(()));
        // Every window open: no one, root included.
        let full = [Viewer::ROOT; MAX_WINDOWS];
        assert_eq!(admit_window(Viewer::ROOT, full.iter().copied()), Err(WindowRefusal::Full));
        assert_eq!(admit_window(alice, full.iter().copied()), Err(WindowRefusal::Full));
    }

    #[test]
    fn a_refusal_over_a_uids_share_says_wait_and_the_others_retry() {
        assert!(matches!(WindowRefusal::UidShare.error(user(1000)), QueryError::Limited(m) if m.contains("uid 1000")));
        assert!(matches!(WindowRefusal::Full.error(user(1000)), QueryError::Unavailable(_)));
        assert!(matches!(WindowRefusal::OthersFull.error(user(1000)), QueryError::Unavailable(_)));
    }
}
