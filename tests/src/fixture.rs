//! Fixture programs: built from `tests/fixtures/` into `<target>/fixtures/` on first use (and
//! again whenever the source is newer than the binary), and run behind a guard that kills and
//! reaps them on drop so a failing test never leaves a spinning process behind.

use std::collections::VecDeque;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, ExitStatus, Stdio};

/// The C compiler flags every C fixture is built with: frame pointers everywhere (leaf
/// functions included), no inlining and no tail calls, so each function is its own frame.
const CFLAGS: &[&str] = &[
    "-O1",
    "-g",
    "-fno-omit-frame-pointer",
    "-mno-omit-leaf-frame-pointer",
    "-fno-optimize-sibling-calls",
    "-fno-inline",
];

/// Added for the heap fixtures: without them GCC treats the allocator as builtins and deletes
/// malloc/free pairs and allocations whose blocks it can prove unread, even at -O1.
const CFLAGS_HEAP: &[&str] =
    &["-fno-builtin-malloc", "-fno-builtin-free", "-fno-builtin-calloc", "-fno-builtin-realloc"];

/// The flags of the fixtures built the way distributions and release builds are: optimized,
/// no frame pointers (leaf or not). No inlining and no tail calls still, so each named
/// function is its own frame and the expected chains are real.
const CFLAGS_NO_FRAME_POINTERS: &[&str] =
    &["-O2", "-g", "-fomit-frame-pointer", "-fno-optimize-sibling-calls", "-fno-inline"];

/// The Rust release fixture: optimized, no frame pointers, inlining on.
const RUSTFLAGS_RELEASE: &[&str] = &["-C", "opt-level=3", "-g", "--edition", "2021"];

/// The Rust fixture flags. `opt-level=1` keeps `#[inline(never)]` functions as real frames.
const RUSTFLAGS: &[&str] = &["-C", "opt-level=1", "-C", "force-frame-pointers=yes", "-g", "--edition", "2021"];

/// The fixture programs. Each prints `ready` once it runs its own code. The CPU fixtures take
/// their run time in seconds as argv[1]; `HeapSites` takes a delay and a linger time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FixtureKind {
    /// `cpu_split.c`: main → work_loop → hot_a (75% of CPU time) / hot_b (25%).
    CpuSplitC,
    /// `cpu_split.rs`: the same in Rust, crate `cpu_split_rs`.
    CpuSplitRust,
    /// `syscall_heavy.c`: main → kernel_work → read(2) of /dev/zero; mostly kernel time.
    SyscallHeavy,
    /// `heap_sites.c`: main → site_* functions that allocate known blocks (see the source),
    /// after a delay (argv[1], seconds) that leaves time to attach; prints `allocated`, then
    /// lingers argv[2] seconds and exits.
    HeapSites,
    /// `heap_mixed.c`: main → mixed_site allocates 2,000,000 × 16 B and 200 × 1 MiB through
    /// one malloc call, keeping a quarter of each; argv[1] delay (`stop`: until SIGCONT),
    /// then prints `small S N L`, `big S N L` (size, allocated, live), `allocated`, lingers
    /// argv[2] seconds.
    HeapMixed,
    /// `heap_churn.c`: keep_site allocates 200,000 × 32 B into a ring, then churn_site frees
    /// the oldest and allocates its replacement until argv[2] seconds have passed (200,000
    /// live throughout); argv[1] delay (`stop`: until SIGCONT); prints `kept N`, `churning`
    /// once churning, then `churned N` at the end.
    HeapChurn,
    /// `lock_contention.c`: two threads taking one pthread mutex in turns, 12,000 waits of
    /// ~50 us in contend_lock, each woken by the other's release_lock, and a condvar waiter (cond_waiter_wait), each measuring its own wait;
    /// after a delay (argv[1]) prints `lock_wait_ns N R S` (R: the lockers' run-queue delay, S: Σ lock time² in µs²), `cond_wait_ns N`, `done`, lingers
    /// argv[2] seconds.
    LockContention,
    /// `futex_requeue.c`: a waiter in wait_for_signal moved by FUTEX_CMP_REQUEUE (broadcast)
    /// onto a second word, then woken by a FUTEX_WAKE of it (unlock); after a delay (argv[1])
    /// prints `requeue_wait_ns N`, `done`, lingers argv[2] seconds.
    FutexRequeue,
    /// `thread_churn.c`: two child processes in turn, each 20,032 threads, 64 at a time, each
    /// spinning argv[3] us of its CPU time (none by default) in churn_spin and making one
    /// FUTEX_WAIT (timing out) in churn_wait; after a delay (argv[1]) prints `waits N` (all
    /// children's), `worker_cpu_ms A B` (each child's workers'), `done`, lingers argv[2] s.
    ThreadChurn,
    /// `fifo_swap.c`: maps argv[3] fresh copies of the ELF argv[2] executable from
    /// directories under argv[1], each swapped with a FIFO for argv[4] ms as it is mapped
    /// (the review's N1 attack); prints `attempts N`, `done`, then sleeps until killed.
    FifoSwap,
    /// `spinner_crowd.c`: forks argv[1] children, each spinning in crowd_spin for ever (they
    /// die with it); prints `ready` once all are forked.
    SpinnerCrowd,
    /// `stack_flood.c`: 8 threads making FUTEX_WAITs of 150 us from 65,536 distinct stacks
    /// (flood_step → go_left/go_right … → flood_wait) for argv[1] seconds; then prints
    /// `waits N`, `done`.
    StackFlood,
    /// `thread_spawner.c`: spawn_workers creates 7 threads, spawn_one 1, fork_children forks 3
    /// processes; after a delay (argv[1]) prints `done`, lingers argv[2] seconds.
    ThreadSpawner,
    /// `rust_mutex.rs`: threads contending for a `std::sync::Mutex` in `contend`; after a
    /// delay prints `lock_wait_ns N` and `done`, lingers.
    RustMutex,
    /// `cpu_split.c` built `-O2 -fomit-frame-pointer`: the same split, unwound by CFI only.
    CpuSplitNoFp,
    /// `heap_sites.c` built `-O2 -fomit-frame-pointer`.
    HeapSitesNoFp,
    /// `libc_hot.c` (no frame pointers): hot paths inside libc's qsort and memcpy, called
    /// from named functions of the program.
    LibcHot,
    /// `inline_rs.rs`: Rust at opt-level 3 without frame pointers; main → run → spin, with
    /// `mix` inlined into spin.
    InlineRust,
    /// `jit_spin.c`: main → run_jit → generated code in anonymous memory named `jit_spin`
    /// in `/tmp/perf-PID.map`.
    JitSpin,
    /// `fuse_hang.c`: a FUSE file system serving one file, `prog`, that stops answering on
    /// SIGUSR1 (or never answers the threads of a given comm); see [`crate::fuse`].
    FuseHang,
    /// `thread_dump.c`: threads blocked in pthread_cond_wait, read, nanosleep,
    /// pthread_mutex_lock and epoll_wait, a busy one, a 1 ms watchdog and a 10 ms
    /// condition-wait ticker (see the source); argv[1] seconds, then the watchdog's late
    /// wakeups and `done`.
    ThreadDumpC,
    /// `thread_dump.c` built `-O2 -fomit-frame-pointer`.
    ThreadDumpCNoFp,
    /// `thread_dump.rs`: threads blocked in `std::sync::Mutex::lock` and `thread::sleep`,
    /// and a busy one, with frame pointers.
    ThreadDumpRust,
    /// `thread_dump.rs` at opt-level 3 without frame pointers.
    ThreadDumpRustNoFp,
    /// `short_lived.c` (no frame pointers): main → work → spin for argv[1] ms of CPU, then
    /// exits; prints nothing (started in loops by a shell).
    ShortLived,
    /// `fork_workers.c` (no frame pointers): forks argv[1] children one after another, each
    /// running child_main → child_work → hot_loop for argv[2] ms without exec.
    ForkWorkers,
    /// `dlopen_host.c` (no frame pointers): dlopens `libdl_spin.so` after a delay and spins
    /// in it (see [`FixtureKind::DlSpinLibrary`]).
    DlopenHost,
    /// `dl_spin.c` built as `libdl_spin.so` without frame pointers: lib_spin → lib_inner.
    DlSpinLibrary,
    /// `stack_churn.c`: a new distinct stack every ~0.2 ms (2^16 of them), for argv[1]
    /// seconds.
    StackChurn,
    /// `offcpu_sleeper.c`: threads blocked in nanosleep (sleep_long, sleep_short), a pipe read
    /// (read_pipe) and a condvar (wait_cond) for times they measure, and starved_work kept
    /// waiting for its core by a spinner; after a delay (argv[1]) prints the measured times
    /// (see the source), `done`, lingers argv[2] seconds.
    OffCpuSleeper,
    /// `rare_sleeper.c MODE`: `alternate`: sleep_a 30 ms and sleep_b 10 ms in turn for 5 s;
    /// `short`: sleep_short 1 ms 5,000 times; after a delay (argv[2]) prints the times it
    /// measured (`a_ns`, `b_ns`, `short_ns`, `short_sq_us2`), `done`, lingers argv[3] seconds.
    RareSleeper,
    /// `mutex_handoff.c`: four threads take one mutex 150 times each, holding it 1.5 ms
    /// (about 600 waits of a few ms); after a delay (argv[1]) prints `lock_wait_ns N R S`
    /// (see `lock_waits`), `done`, lingers argv[2] seconds.
    MutexHandoff,
    /// `bpf_calls.c`: main → copy_loop reads a 1 MiB BPF array value with `bpf()` for
    /// argv[1] ms of its CPU time (BPF instrumentation off on its CPU for much of it);
    /// prints `ready`, then `cpu_ms N`.
    BpfCalls,
    /// `many_threads SECONDS THREADS`: idle threads for the cost of thread dumps.
    ManyThreads,
}

impl FixtureKind {
    /// The binary's file name, which is also the process comm (all are < 16 bytes).
    pub fn comm(self) -> &'static str {
        match self {
            Self::CpuSplitC => "cpu_split",
            Self::CpuSplitRust => "cpu_split_rs",
            Self::SyscallHeavy => "syscall_heavy",
            Self::HeapSites => "heap_sites",
            Self::HeapMixed => "heap_mixed",
            Self::HeapChurn => "heap_churn",
            Self::LockContention => "lock_contention",
            Self::FutexRequeue => "futex_requeue",
            Self::ThreadChurn => "thread_churn",
            Self::FifoSwap => "fifo_swap",
            Self::SpinnerCrowd => "spinner_crowd",
            Self::StackFlood => "stack_flood",
            Self::ThreadSpawner => "thread_spawner",
            Self::RustMutex => "rust_mutex",
            Self::CpuSplitNoFp => "cpu_split_nofp",
            Self::HeapSitesNoFp => "heap_sites_nofp",
            Self::LibcHot => "libc_hot",
            Self::InlineRust => "inline_rs",
            Self::JitSpin => "jit_spin",
            Self::FuseHang => "fuse_hang",
            Self::ThreadDumpC => "tdump_c",
            Self::ThreadDumpCNoFp => "tdump_c_nofp",
            Self::ThreadDumpRust => "tdump_rs",
            Self::ThreadDumpRustNoFp => "tdump_rs_nofp",
            Self::ShortLived => "short_lived",
            Self::ForkWorkers => "fork_workers",
            Self::DlopenHost => "dlopen_host",
            Self::DlSpinLibrary => "libdl_spin.so",
            Self::StackChurn => "stack_churn",
            Self::OffCpuSleeper => "offcpu_sleeper",
            Self::RareSleeper => "rare_sleeper",
            Self::MutexHandoff => "mutex_handoff",
            Self::BpfCalls => "bpf_calls",
            Self::ManyThreads => "many_threads",
        }
    }

    fn source_name(self) -> &'static str {
        match self {
            Self::CpuSplitC => "cpu_split.c",
            Self::CpuSplitRust => "cpu_split.rs",
            Self::SyscallHeavy => "syscall_heavy.c",
            Self::LockContention => "lock_contention.c",
            Self::FutexRequeue => "futex_requeue.c",
            Self::ThreadChurn => "thread_churn.c",
            Self::FifoSwap => "fifo_swap.c",
            Self::SpinnerCrowd => "spinner_crowd.c",
            Self::StackFlood => "stack_flood.c",
            Self::ThreadSpawner => "thread_spawner.c",
            Self::RustMutex => "rust_mutex.rs",
            Self::HeapSites | Self::HeapSitesNoFp => "heap_sites.c",
            Self::HeapMixed => "heap_mixed.c",
            Self::HeapChurn => "heap_churn.c",
            Self::CpuSplitNoFp => "cpu_split.c",
            Self::LibcHot => "libc_hot.c",
            Self::InlineRust => "inline_rs.rs",
            Self::JitSpin => "jit_spin.c",
            Self::FuseHang => "fuse_hang.c",
            Self::ThreadDumpC | Self::ThreadDumpCNoFp => "thread_dump.c",
            Self::ThreadDumpRust | Self::ThreadDumpRustNoFp => "thread_dump.rs",
            Self::ShortLived => "short_lived.c",
            Self::ForkWorkers => "fork_workers.c",
            Self::DlopenHost => "dlopen_host.c",
            Self::DlSpinLibrary => "dl_spin.c",
            Self::StackChurn => "stack_churn.c",
            Self::OffCpuSleeper => "offcpu_sleeper.c",
            Self::RareSleeper => "rare_sleeper.c",
            Self::MutexHandoff => "mutex_handoff.c",
            Self::BpfCalls => "bpf_calls.c",
            Self::ManyThreads => "many_threads.c",
        }
    }

    /// Builds the fixture if it is missing or older than its source; returns the binary path.
    pub fn build(self) -> PathBuf {
        let source = crate::workspace_root().join("tests/fixtures").join(self.source_name());
        let out_dir = crate::target_dir().join("fixtures");
        let binary = out_dir.join(self.comm());
        if is_fresh(&binary, &source) {
            return binary;
        }
        std::fs::create_dir_all(&out_dir).unwrap_or_else(|e| panic!("failed to create {}: {e}", out_dir.display()));
        // Build under a temporary name and rename, so an interrupted build never leaves a
        // truncated binary that looks fresh.
        let partial = out_dir.join(format!("{}.partial-{}", self.comm(), std::process::id()));
        crate::cc::run(&mut self.compiler_command(&source, &partial))
            .unwrap_or_else(|e| panic!("failed to build fixture {}: {e}", source.display()));
        std::fs::rename(&partial, &binary)
            .unwrap_or_else(|e| panic!("failed to move {} into place: {e}", partial.display()));
        binary
    }

    fn compiler_command(self, source: &Path, output: &Path) -> Command {
        if matches!(
            self,
            Self::CpuSplitRust | Self::InlineRust | Self::RustMutex | Self::ThreadDumpRust | Self::ThreadDumpRustNoFp
        ) {
            let mut cmd = Command::new("rustc");
            let release = matches!(self, Self::InlineRust | Self::ThreadDumpRustNoFp);
            let flags = if release { RUSTFLAGS_RELEASE } else { RUSTFLAGS };
            cmd.args(flags).args(["--crate-name", self.comm()]);
            cmd.arg("-o").arg(output).arg(source);
            return cmd;
        }
        crate::cc::command(&self.c_flags(), source, output)
    }

    /// The C compiler flags of a C fixture.
    fn c_flags(self) -> Vec<&'static str> {
        let mut flags = match self {
            Self::CpuSplitNoFp
            | Self::LibcHot
            | Self::HeapSitesNoFp
            | Self::ThreadDumpCNoFp
            | Self::ShortLived
            | Self::ForkWorkers
            | Self::DlopenHost
            | Self::DlSpinLibrary => CFLAGS_NO_FRAME_POINTERS.to_vec(),
            _ => CFLAGS.to_vec(),
        };
        if matches!(self, Self::HeapSites | Self::HeapSitesNoFp | Self::HeapMixed | Self::HeapChurn) {
            flags.extend(CFLAGS_HEAP);
        }
        if self == Self::LibcHot {
            // Keep the memcpy call a call into libc.
            flags.push("-fno-builtin-memcpy");
        }
        if matches!(
            self,
            Self::LockContention
                | Self::FutexRequeue
                | Self::ThreadChurn
                | Self::FifoSwap
                | Self::StackFlood
                | Self::ThreadSpawner
                | Self::ThreadDumpC
                | Self::ThreadDumpCNoFp
                | Self::OffCpuSleeper
                | Self::ManyThreads
        ) {
            flags.push("-pthread");
        }
        if self == Self::DlSpinLibrary {
            flags.extend(["-shared", "-fPIC"]);
        }
        flags
    }
}

fn is_fresh(binary: &Path, source: &Path) -> bool {
    let mtime = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified());
    match (mtime(binary), mtime(source)) {
        (Ok(built), Ok(written)) => built >= written,
        _ => false,
    }
}

/// A running fixture. Dropping it kills the process (SIGKILL) and reaps it.
pub struct Fixture {
    kind: FixtureKind,
    child: Child,
    /// Kept open so the fixture never sees a closed stdout; read by `expect_line`.
    stdout: BufReader<ChildStdout>,
    /// Lines read ahead by [`Fixture::hold_through`], handed out before the pipe's.
    held: VecDeque<String>,
    reaped: bool,
}

impl Fixture {
    /// Builds (if needed) and starts `kind` to run for `seconds`, and returns once it has
    /// printed `ready`, i.e. once it is executing its own code.
    pub fn spawn(kind: FixtureKind, seconds: u32) -> Self {
        Self::spawn_with_args(kind, &[&seconds.to_string()])
    }

    /// Like [`Fixture::spawn`], with the fixture's whole argument list.
    pub fn spawn_with_args(kind: FixtureKind, args: &[&str]) -> Self {
        let mut cmd = Command::new(kind.build());
        cmd.args(args);
        Self::from_command(kind, cmd)
    }

    /// Like [`Fixture::spawn`], as the unprivileged user `nobody` (uid/gid 65534, no groups),
    /// from a copy of the binary in `scratch` (made 0755) so that permissions on the
    /// workspace cannot make the exec fail. `setpriv` execs the fixture: the pid is its own.
    pub fn spawn_as_nobody(kind: FixtureKind, seconds: u32, scratch: &Path) -> Self {
        Self::spawn_as_nobody_with_args(kind, &[&seconds.to_string()], scratch)
    }

    /// Like [`Fixture::spawn_as_nobody`], from a setuid-root copy (mode 04755, owner root):
    /// the process's real uid is nobody's, its effective and saved uids root's, and the
    /// kernel makes it non-dumpable, as it does `su` or `passwd` started by a user.
    pub fn spawn_setuid_root_as_nobody(kind: FixtureKind, seconds: u32, scratch: &Path) -> Self {
        use std::os::unix::fs::PermissionsExt;
        let dir = scratch.join("setuid");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        let copy = dir.join(kind.comm());
        std::fs::copy(kind.build(), &copy)
            .unwrap_or_else(|e| panic!("failed to copy fixture {} to {}: {e}", kind.comm(), copy.display()));
        std::os::unix::fs::chown(&copy, Some(0), Some(0)).unwrap();
        std::fs::set_permissions(&copy, std::fs::Permissions::from_mode(0o4755)).unwrap();
        let mut cmd = Command::new("setpriv");
        cmd.args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"]).arg(&copy).arg(seconds.to_string());
        Self::from_command(kind, cmd)
    }

    /// Like [`Fixture::spawn_as_nobody`], with the fixture's whole argument list.
    pub fn spawn_as_nobody_with_args(kind: FixtureKind, args: &[&str], scratch: &Path) -> Self {
        let copy = scratch.join(kind.comm());
        std::fs::copy(kind.build(), &copy)
            .unwrap_or_else(|e| panic!("failed to copy fixture {} to {}: {e}", kind.comm(), copy.display()));
        let mut cmd = Command::new("setpriv");
        cmd.args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"]).arg(&copy).args(args);
        Self::from_command(kind, cmd)
    }

    /// Starts `sh`, which sleeps `delay_s` and then execs fixture `kind` for `seconds` in
    /// the same process (same pid). Returns at once, before the exec: call
    /// `expect_line("ready")` to wait for the fixture.
    pub fn spawn_exec_later(kind: FixtureKind, delay_s: &str, seconds: u32) -> Self {
        let mut cmd = Command::new("sh");
        cmd.args(["-c", &format!("sleep {delay_s}; exec \"$0\" {seconds}")]).arg(kind.build());
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("failed to start sh for fixture {}: {cmd:?}: {e}", kind.comm()));
        let stdout = BufReader::new(child.stdout.take().expect("stdout is piped"));
        Self { kind, child, stdout, held: VecDeque::new(), reaped: false }
    }

    /// Starts `cmd` (which runs fixture `kind`, from wherever it was copied) and waits for its
    /// `ready`.
    pub fn from_command(kind: FixtureKind, mut cmd: Command) -> Self {
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("failed to start fixture {}: {cmd:?}: {e}", kind.comm()));
        let mut stdout = BufReader::new(child.stdout.take().expect("stdout is piped"));
        let mut line = String::new();
        let read = stdout.read_line(&mut line);
        let fixture = Self { kind, child, stdout, held: VecDeque::new(), reaped: false };
        assert!(
            matches!(read, Ok(n) if n > 0) && line.trim() == "ready",
            "fixture {} did not print `ready` (read {read:?}, got {line:?})",
            kind.comm()
        );
        fixture
    }

    /// Reads the fixture's next stdout line and panics unless it is `wanted` (waits for it).
    pub fn expect_line(&mut self, wanted: &str) {
        let (read, line) = self.next_line();
        assert!(
            matches!(read, Ok(n) if n > 0) && line.trim() == wanted,
            "fixture {} did not print `{wanted}` (read {read:?}, got {line:?})",
            self.kind.comm()
        );
    }

    /// Reads the fixture's next stdout line `KEY N` (waits for it) and returns N; panics
    /// unless the line has that key and a number.
    pub fn read_value(&mut self, key: &str) -> u64 {
        self.read_values(key)[0]
    }

    /// Reads the fixture's next line, `KEY N [M …]`, and returns its numbers (one at least).
    pub fn read_values(&mut self, key: &str) -> Vec<u64> {
        let (read, line) = self.next_line();
        let values: Option<Vec<u64>> = line
            .trim()
            .strip_prefix(key)
            .and_then(|rest| rest.split_whitespace().map(|v| v.parse().ok()).collect())
            .filter(|values: &Vec<u64>| !values.is_empty());
        values.unwrap_or_else(|| {
            panic!("fixture {} did not print `{key} N` (read {read:?}, got {line:?})", self.kind.comm())
        })
    }

    /// The CPU time its main thread has had so far, in ns (`/proc/PID/schedstat`).
    pub fn cpu_ns(&self) -> u64 {
        let path = format!("/proc/{}/schedstat", self.pid());
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("failed to read {path}: {e}"));
        text.split_whitespace().next().and_then(|n| n.parse().ok()).unwrap_or_else(|| panic!("{path}: {text:?}"))
    }

    /// Reads ahead until the fixture prints `last` (waits for it; panics at its end), and
    /// keeps the lines for the readers above: a test learns that the fixture's work is over
    /// (on a loaded machine that may take many times as long as on a quiet one) before it
    /// reads what the fixture measured.
    pub fn hold_through(&mut self, last: &str) {
        loop {
            let mut line = String::new();
            let read = self.stdout.read_line(&mut line);
            assert!(
                matches!(read, Ok(n) if n > 0),
                "fixture {} ended before it printed `{last}` (read {read:?}); it printed {:?}",
                self.kind.comm(),
                self.held
            );
            let done = line.trim() == last;
            self.held.push_back(line);
            if done {
                return;
            }
        }
    }

    /// The next held line, or else the next line from the pipe (waits for it).
    fn next_line(&mut self) -> (std::io::Result<usize>, String) {
        if let Some(line) = self.held.pop_front() {
            return (Ok(line.len()), line);
        }
        let mut line = String::new();
        let read = self.stdout.read_line(&mut line);
        (read, line)
    }

    /// Reads the fixture's next stdout line into `line` (waits for it; empty at its end).
    pub fn read_line(&mut self, line: &mut String) {
        *line = self.next_line().1;
    }

    /// The fixture's pid (its only thread's tid too).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends `signal` to the fixture.
    pub fn signal(&self, signal: libc::c_int) {
        // SAFETY: kill has no memory preconditions; the pid is our child's, not yet reaped.
        let sent = unsafe { libc::kill(self.child.id() as libc::pid_t, signal) };
        assert_eq!(sent, 0, "failed to signal fixture {}", self.kind.comm());
    }

    /// Continues a fixture started with `stop` for its delay (the waiting fixtures stop
    /// themselves after `ready`), once it has stopped: a SIGCONT sent before would be lost.
    /// So its work starts when the test says, after the profiler attached, not after a
    /// delay that a slow start could outlast.
    pub fn resume(&self) {
        let stat = format!("/proc/{}/stat", self.pid());
        // The state is the field after the command name, which may itself hold ") ".
        let stopped = || {
            std::fs::read_to_string(&stat)
                .ok()
                .and_then(|line| line.rsplit_once(") ").map(|(_, rest)| rest.starts_with('T')))
                .unwrap_or(false)
        };
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while !stopped() {
            assert!(
                std::time::Instant::now() < deadline,
                "fixture {} (pid {}) did not stop itself (started with `stop`?) within 10 s of being resumed",
                self.kind.comm(),
                self.pid()
            );
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        self.signal(libc::SIGCONT);
    }

    /// The fixture's process name, as the profiler names its output directory.
    pub fn comm(&self) -> &'static str {
        self.kind.comm()
    }

    /// Waits for the fixture to exit by itself and reaps it.
    pub fn wait(&mut self) -> ExitStatus {
        let status = self.child.wait().expect("failed to wait for fixture");
        self.reaped = true;
        status
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        if self.reaped {
            return;
        }
        // Either may fail if the fixture already exited; the wait still reaps it.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
