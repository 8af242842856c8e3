//! Loading the embedded object: its load-time globals and map sizes from the
//! [`SessionConfig`], the maps of programs that will not be attached shrunk to one entry, and
//! what is set once after the load (the pid list, the heap's intervals, the task iterator,
//! exec tracking).

use std::os::fd::OwnedFd;

use aya::{Ebpf, EbpfLoader};
use profiler_common::{globals, maps, TaskOffsets, UprobeOffsets};

use super::{
    btf, filters::select_pids, futex, heap, offcpu, task_iter, threadcreate, unwind, Error, Result, Session,
    SessionConfig, EBPF_OBJECT,
};

impl Session {
    /// Loads the object and sets the process filter and heap sampling table. Attaches nothing.
    pub fn load(config: &SessionConfig) -> Result<Self> {
        // Stats must be on before the programs run for their runs to be counted.
        let stats = config.enable_stats.then(enable_run_time_stats).transpose()?;
        let filter: u8 = (!config.pids.is_empty()).into();
        let (pidns_dev, pidns_ino) = config.pid_namespace.map_or((0u64, 0u64), |ns| (ns.dev, ns.ino));
        let (task_offsets, uprobes, fsbase) = kernel_offsets(config.thread_dumps)?;
        let stack_key = random_key()?;
        // The per-CPU caches keep to a fixed budget: fewer entries per CPU on a host with many.
        let cpus = aya::util::nr_cpus()
            .map_err(|(path, source)| Error::Io { action: format!("read the possible CPUs from {path}"), source })?
            as u32;
        let row_cache = maps::cache_slot_entries(maps::ROW_CACHE_MAX_SLOT_ENTRIES, maps::ROW_CACHE_BUDGET_BYTES, cpus);
        let stored_stacks =
            maps::cache_slot_entries(maps::STORED_STACKS_MAX_SLOT_ENTRIES, maps::STORED_STACKS_BUDGET_BYTES, cpus);
        let mut loader = EbpfLoader::new();
        loader
            .override_global(globals::ROW_CACHE_SLOT_ENTRIES, &row_cache, true)
            .override_global(globals::STORED_STACKS_SLOT_ENTRIES, &stored_stacks, true)
            .map_max_entries(maps::ROW_CACHE, row_cache * maps::SCRATCH_SLOTS)
            .map_max_entries(maps::STORED_STACKS, stored_stacks * maps::SCRATCH_SLOTS)
            .override_global(globals::FILTER_PIDS, &filter, true)
            .override_global(globals::HEAP_SAMPLE_BYTES, &config.heap_sample_bytes, true)
            .override_global(globals::PIDNS_DEV, &pidns_dev, true)
            .override_global(globals::PIDNS_INO, &pidns_ino, true)
            .override_global(globals::TASK_OFFSETS, &task_offsets, true)
            .override_global(globals::UPROBE_OFFSETS, &uprobes, true)
            .override_global(globals::TASK_FSBASE, &fsbase, true)
            .override_global(globals::STACK_HASH_KEY, &stack_key, true)
            .override_global(globals::STACK_SHARE_CAPS, &config.share_caps, true)
            .map_max_entries(maps::HEAP_LIVE, config.heap_max_live)
            .map_max_entries(maps::UNWIND_ROWS, config.unwind_rows)
            // No more table slots than the rows have shards: each table takes one at least.
            .map_max_entries(maps::UNWIND_TABLES, maps::unwind_table_slots(config.unwind_rows));
        // Each set holds the keys of one drain's samples: as many as the rate can make.
        let heap_totals = maps::heap_totals_entries(config.heap_sample_bytes);
        loader.map_max_entries(maps::HEAP_TOTALS_0, heap_totals).map_max_entries(maps::HEAP_TOTALS_1, heap_totals);
        shrink_unused_maps(&mut loader, config);
        let mut ebpf = loader.load(EBPF_OBJECT).map_err(|e| Error::Load(Box::new(e)))?;
        let exec_tracking_error = set_up_loaded(&mut ebpf, config)?;
        Ok(Self {
            ebpf,
            stack_hash_key: stack_key,
            generation: 0,
            heap_loaded: false,
            heap_links: Default::default(),
            unwind_rows: config.unwind_rows,
            exec_tracking_error,
            offcpu_walks_at_switch_out: false,
            cpu_clock: None,
            unwind_removals: Vec::new(),
            removals_since: None,
            unwind_epoch: 0,
            live_reads_cut: Default::default(),
            _stats: stats,
        })
    }
}

/// Sizes the maps of programs that will not be attached at one entry, and the pid list's at
/// its length: preallocating them costs start-up time and kernel memory for nothing.
fn shrink_unused_maps(loader: &mut EbpfLoader<'_>, config: &SessionConfig) {
    let unused: [(bool, &[&str]); 4] = [
        (config.heap, &heap::MAPS),
        (config.futex, &futex::MAPS),
        (config.threadcreate, &threadcreate::MAPS),
        (config.offcpu, &offcpu::MAPS),
    ];
    for map in unused.into_iter().filter(|(used, _)| !used).flat_map(|(_, maps)| maps.iter()) {
        loader.map_max_entries(map, 1);
    }
    // Written only at load: as large as the list.
    loader.map_max_entries(maps::TARGET_PIDS, (config.pids.len() as u32).clamp(1, maps::TARGET_PIDS_MAX_ENTRIES));
}

/// What is set once in the loaded object: the pid list, the heap's sampling intervals, the
/// task iterator, and exec tracking. Returns why execs are not tracked, if they are not.
fn set_up_loaded(ebpf: &mut Ebpf, config: &SessionConfig) -> Result<Option<String>> {
    select_pids(ebpf, &config.pids)?;
    if config.heap {
        heap::fill_intervals(ebpf, config.heap_sample_bytes)?;
    }
    if config.thread_dumps {
        task_iter::load(ebpf)?;
    }
    // Without it a process that calls execve unwinds with its old tables until its
    // mappings are read again; worth a warning, not worth refusing to profile.
    Ok(unwind::attach_exec(ebpf).err().map(|e| {
        let message = crate::error::chain(&e);
        tracing::warn!(
            "exec tracking is off ({message}); is tracefs mounted? (mount -t tracefs tracefs /sys/kernel/tracing)"
        );
        message
    }))
}
/// A random `u64` from the kernel's generator.
fn random_key() -> Result<u64> {
    let mut key = [0u8; 8];
    // SAFETY: getrandom writes at most `key.len()` bytes into the buffer.
    let n = unsafe { libc::getrandom(key.as_mut_ptr().cast(), key.len(), 0) };
    if n != key.len() as isize {
        let source = std::io::Error::last_os_error();
        return Err(Error::Io { action: "draw the stack hash key (getrandom)".into(), source });
    }
    Ok(u64::from_ne_bytes(key))
}

/// The `task_struct` and `struct pid` layout of the running kernel (needed only for thread
/// dumps, whose walk cannot run without it) and where it keeps what its uprobes moved, from
/// one parse of its BTF: the parse holds every struct of the kernel in memory while it lasts.
/// Also where a task's TLS base is (0 when unknown: Go processes' samples then carry no
/// labels, and the log says so).
fn kernel_offsets(thread_dumps: bool) -> Result<(TaskOffsets, UprobeOffsets, u32)> {
    let types = match btf::Types::vmlinux() {
        Ok(types) => types,
        Err(err) if thread_dumps => return Err(Error::TaskLayout(err)),
        Err(err) => return Ok((TaskOffsets::default(), no_uprobe_offsets(err), 0)),
    };
    let task =
        if thread_dumps { btf::task_offsets(&types).map_err(Error::TaskLayout)? } else { TaskOffsets::default() };
    let uprobes = btf::uprobe_offsets(&types).unwrap_or_else(no_uprobe_offsets);
    let fsbase = btf::fsbase_offset(&types).unwrap_or_else(|err| {
        tracing::info!("Go processes' samples will carry no pprof labels: {err}");
        0
    });
    Ok((task, uprobes, fsbase))
}

/// All 0, when the kernel's BTF lacks what its uprobes moved: walks show the `[uprobes]`
/// page, and the log says so.
fn no_uprobe_offsets(err: btf::BtfError) -> UprobeOffsets {
    tracing::info!("stacks through a uprobe will show the [uprobes] page: {err}");
    UprobeOffsets::default()
}

fn enable_run_time_stats() -> Result<OwnedFd> {
    aya::sys::enable_stats(aya::sys::Stats::RunTime).map_err(|err| Error::KernelFeature {
        feature: "BPF run-time statistics (BPF_ENABLE_STATS)",
        detail: err.to_string(),
    })
}
