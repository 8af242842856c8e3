//! The interval dump: [`Collector::dump`] cuts the interval, renders and writes its profiles
//! (following process events while it does), then prunes what exited and bounds the
//! symbolizer's memory. When to close or drop the symbolizer's caches is decided by
//! [`cache_step`], a pure function.

use std::{
    collections::HashSet,
    time::{Duration, Instant, SystemTime},
};

use super::{decide, notes, Collector};
use crate::{
    capture::log_slow,
    ebpf::Counters,
    ids::Pid,
    procs,
    profiles::Counts,
    profiles::{Context, ProfileKind, Settings, View},
    render::{Renderer, Window},
    sink::{DumpError, IntervalDump},
};

/// How often the collector follows process events while a dump's files are made durable.
pub(super) const FOLLOW_WHILE_FINISHING: Duration = Duration::from_millis(2);

/// Resident memory above which the symbolizer's open files are closed after a dump (their
/// symbols found are kept). Two thirds of the daemon's 96 MiB target: at 2,000 processes the
/// daemon's own tables hold it near 48 MiB, and a budget below that closed (and re-parsed,
/// inflating compressed debug info) every file after every dump, a sixth of its CPU. When the
/// files in use need more, closes back off ([`FileCloses`]).
const SYMBOLIZER_FILES_BUDGET: u64 = 64 << 20;

/// Resident memory above which the symbol caches are dropped after a dump.
const SYMBOLIZER_RSS_BUDGET: u64 = 96 << 20;

/// A file the symbolizer has not been asked new addresses of for this long is closed at the
/// next dump (its symbols found are kept). A program that ran once otherwise held its parsed
/// files until the files budget: a pyenv Python's, with debug info, put 14 MiB on the daemon
/// for good. Files of programs that keep producing new stacks stay open; a file closed too
/// early costs one parse when a new address shows up, at most once a minute.
const SYMBOLIZER_IDLE_FILE: Duration = Duration::from_secs(60);

impl Collector {
    /// The last interval's files, then a moment for the exporters to send them.
    pub(super) fn final_dump(&mut self) {
        self.dump();
        let files = &mut self.files;
        files.close();
    }

    /// Writes the interval's profiles, applies retention, forgets exited processes.
    pub(super) fn dump(&mut self) {
        let started = Instant::now();
        // The cut: what was sampled until now belongs to this interval, not the next.
        self.drain();
        self.refresh_live();
        let end = SystemTime::now();
        let window = Window {
            start: self.interval_start,
            duration: end.duration_since(self.interval_start).unwrap_or_default(),
        };
        let mut interval = std::mem::take(&mut self.interval);
        self.interval_start = end;
        let serving = self.serving();
        let targets = decide::dump_targets(&serving, &self.config.processes, self.capture.catalog(), &interval);
        for (pid, _) in targets.iter().filter(|(_, kinds)| kinds.contains(&ProfileKind::Threads)) {
            // A process that exited or cannot be dumped is written without it (logged).
            if let Ok(dump) = self.thread_dump(*pid) {
                interval.set_thread_dump(*pid, dump);
            }
        }
        let counters = self.capture.counters().unwrap_or_default();
        let files = &mut self.files;
        let begun = files.begin(end, file_count(&targets));
        log_slow("dump: live heap, thread dumps", started);
        let result = begun.and_then(|mut dump| {
            self.write_profiles(&mut dump, &targets, &mut interval, window, &counters);
            self.finish_files(dump)
        });
        if let Err(err) = result {
            self.record_error(&err);
        }
        self.bound_symbol_caches();
        self.prune();
        // Give back what the interval's counts, the encoders and the pruned processes freed:
        // glibc keeps freed heap, so resident memory would stay at the highest any interval
        // reached (one with a burst of short-lived processes, say) instead of following what
        // the daemon holds. A few milliseconds a dump.
        let started = Instant::now();
        // SAFETY: malloc_trim only releases free heap memory.
        unsafe { libc::malloc_trim(0) };
        log_slow("dump: give freed memory back", started);
    }

    /// Renders the profiles of `targets` from `interval` into `dump`.
    fn write_profiles(
        &mut self,
        dump: &mut IntervalDump,
        targets: &[(Pid, Vec<ProfileKind>)],
        interval: &mut Counts,
        window: Window,
        counters: &Counters,
    ) {
        for (pid, kinds) in targets {
            for &kind in kinds {
                // A dump of many processes takes a while: the kernel's map sets are still
                // drained every second meanwhile (into the next interval), so they do not
                // fill up, and the watchdog sees the collector work.
                self.heartbeat.beat();
                if Instant::now() >= self.next_drain {
                    let reused = self.drain();
                    interval.forget(&reused);
                }
                // Processes started meanwhile are registered while they run.
                let reused = self.capture.follow();
                interval.forget(&reused);
                self.forget_reused(&reused);
                let renderer = Renderer {
                    catalog: self.capture.catalog(),
                    settings: Settings::from(&self.config),
                    context: Context::Interval,
                    window,
                    counters,
                    // Files in the output directory are root's (see `crate::output`).
                    kernel_addresses: true,
                };
                let (Some(process), Some(counts)) = (renderer.catalog.process(*pid), interval.process(*pid)) else {
                    continue;
                };
                let started = Instant::now();
                let notes = notes(&self.capture, *pid, kind);
                let rendered = renderer.render(process, counts, View::of(kind), notes, &mut self.sym);
                dump.rendered_in(started.elapsed());
                dump.put(&rendered, &process.facts());
                log_slow("dump: one profile", started);
            }
        }
    }

    /// Finishing makes the files durable (a syncfs that waits for the disk, often 100 ms or
    /// more): meanwhile processes keep starting, and one not registered before it runs is
    /// unwound without its tables. The collector follows them while another thread waits for
    /// the disk.
    fn finish_files(&mut self, mut dump: IntervalDump) -> Result<(), DumpError> {
        let files = &mut self.files;
        let capture = &mut self.capture;
        let mut reused = Vec::new();
        dump.leave_thread();
        let started = Instant::now();
        let finished = std::thread::scope(|scope| {
            let finishing = scope.spawn(move || files.finish(dump));
            while !finishing.is_finished() {
                reused.extend(capture.follow());
                std::thread::sleep(FOLLOW_WHILE_FINISHING);
            }
            finishing.join()
        });
        log_slow("dump: make the files durable (following meanwhile)", started);
        self.forget_reused(&reused);
        match finished {
            Ok(result) => result,
            Err(panic) => std::panic::resume_unwind(panic),
        }
    }

    /// Forgets the processes gone for a while and the stacks nothing references any more.
    fn prune(&mut self) {
        let grace = prune_grace(self.config.interval);
        // History whose frames the stack table evicted: one entry per thread and kind, not
        // one per stack ever seen (a process making new stacks all day grew them for good).
        let catalog = self.capture.catalog();
        let held = |id| catalog.stack(id).is_some();
        self.evicted_rows_folded += self.total.fold_evicted_stacks(held);
        for window in &mut self.windows {
            self.evicted_rows_folded += window.counts.fold_evicted_stacks(held);
        }
        let mut keep = HashSet::new();
        self.total.stacks(&mut keep);
        for window in &self.windows {
            window.counts.stacks(&mut keep);
        }
        let (gone, problems) = self.capture.prune(grace, &keep);
        self.total.forget(&gone);
        self.threads_folded += self.total.fold_exited_threads(|pid, tid| procs::thread_exists(pid.0, tid.0));
        for pid in &gone {
            self.heap_failed.remove(pid);
        }
        if let Some(problem) = problems.last() {
            self.record_error(problem);
        }
    }

    /// Bounds the symbolizer's memory after a dump, in three steps. Under the budgets, the
    /// files idle for [`SYMBOLIZER_IDLE_FILE`] are closed, one by one. Past
    /// [`SYMBOLIZER_FILES_BUDGET`] it closes all its files (their mapped pages and parsed debug
    /// info are most of its memory, and they include the files of processes long gone) but
    /// keeps the symbols found, so only files with new addresses are opened again. Closing
    /// them all after every dump instead cost 2.3x the CPU (each file re-parsed each
    /// interval). Past [`SYMBOLIZER_RSS_BUDGET`] the results go too, and the next dump re-reads
    /// what it needs. All are counted in /status.
    fn bound_symbol_caches(&mut self) {
        // JITs keep appending to their perf maps: read them afresh for each dump.
        self.sym.symbols.forget_perf_maps();
        let rss = resident_bytes().unwrap_or(0);
        let close = self.file_closes.at_dump(rss > SYMBOLIZER_FILES_BUDGET);
        match cache_step(rss, close) {
            CacheStep::DropAll => {
                tracing::debug!("resident memory over budget; dropping the symbol caches");
                self.sym.symbols.forget_files();
                self.symbol_cache_resets += 1;
            }
            CacheStep::CloseFiles => {
                tracing::debug!("resident memory over the files budget; closing the symbolizer's files");
                self.sym.symbols.close_files();
                self.symbol_file_closes += 1;
            }
            CacheStep::CloseIdle => {
                let closed = self.sym.symbols.close_idle_files(SYMBOLIZER_IDLE_FILE);
                if closed > 0 {
                    tracing::debug!("closed {closed} idle files of the symbolizer");
                    self.symbol_idle_file_closes += closed as u64;
                }
            }
        }
        // The freed parsers (and caches) go back to the system at the end of the dump.
    }
}
/// How long a process gone is kept before a dump forgets it: an interval, and at least a
/// minute (a query of it soon after its exit still finds it).
fn prune_grace(interval: Duration) -> Duration {
    interval.max(Duration::from_secs(60))
}

/// The files a dump of `targets` writes: one per process and kind.
fn file_count(targets: &[(Pid, Vec<ProfileKind>)]) -> usize {
    targets.iter().map(|(_, kinds)| kinds.len()).sum()
}

/// What a dump does to bound the symbolizer's memory (see [`Collector::bound_symbol_caches`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum CacheStep {
    /// Drop the files and the symbols found.
    DropAll,
    /// Close every file, keep the symbols found.
    CloseFiles,
    /// Close the files idle for [`SYMBOLIZER_IDLE_FILE`].
    CloseIdle,
}

/// The step for a resident set of `rss` bytes, when [`FileCloses`](super::FileCloses) says
/// whether closing every file is due (`close`): past [`SYMBOLIZER_RSS_BUDGET`] the caches go
/// whatever `close` says.
fn cache_step(rss: u64, close: bool) -> CacheStep {
    if rss > SYMBOLIZER_RSS_BUDGET {
        CacheStep::DropAll
    } else if close {
        CacheStep::CloseFiles
    } else {
        CacheStep::CloseIdle
    }
}

/// This process's resident set size, from `/proc/self/statm`.
fn resident_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * 4096)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn past_the_memory_budget_the_caches_go_whatever_the_file_closes_say() {
        assert_eq!(cache_step(SYMBOLIZER_RSS_BUDGET + 1, false), CacheStep::DropAll);
        assert_eq!(cache_step(SYMBOLIZER_RSS_BUDGET + 1, true), CacheStep::DropAll);
        // At the budget, not past it: the files are closed if due, else only the idle ones.
        assert_eq!(cache_step(SYMBOLIZER_RSS_BUDGET, true), CacheStep::CloseFiles);
        assert_eq!(cache_step(SYMBOLIZER_RSS_BUDGET, false), CacheStep::CloseIdle);
        assert_eq!(cache_step(0, false), CacheStep::CloseIdle);
    }

    #[test]
    fn gone_processes_are_kept_an_interval_and_at_least_a_minute() {
        assert_eq!(prune_grace(Duration::from_secs(10)), Duration::from_secs(60));
        assert_eq!(prune_grace(Duration::from_secs(300)), Duration::from_secs(300));
    }

    #[test]
    fn a_dump_writes_one_file_per_process_and_kind() {
        assert_eq!(file_count(&[]), 0);
        let targets = [(Pid(1), vec![ProfileKind::Cpu, ProfileKind::Heap]), (Pid(2), vec![ProfileKind::Cpu])];
        assert_eq!(file_count(&targets), 3);
    }
}
