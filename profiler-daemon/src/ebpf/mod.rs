//! The only module that touches aya: loads the embedded eBPF object, attaches the CPU
//! sampler to every online CPU, and reads its maps (see [`drain`]).
//!
//! Ownership: one [`CpuSampler`] owns the loaded object; dropping it detaches everything.

mod drain;

use std::{os::fd::OwnedFd, time::Duration};

use aya::{
    maps::{Array, HashMap, PerCpuArray},
    programs::{
        perf_event::{PerfEventConfig, PerfEventScope, SamplePolicy, SoftwareEvent},
        PerfEvent,
    },
    util::online_cpus,
    Ebpf, EbpfLoader,
};
pub use drain::{CpuBatch, RawCpuSample};
use profiler_common::{globals, maps, CpuCounter};

use crate::error::{Error, Result};

/// The eBPF object built by `build.rs` (aya-build) from the `profiler-ebpf` crate.
static EBPF_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/profiler"));

const CPU_PROGRAM: &str = "cpu_sample";

/// What to sample and how often.
#[derive(Clone, Debug)]
pub struct CpuSamplerConfig {
    /// Samples per second per CPU.
    pub frequency_hz: u32,
    /// Processes to sample; empty means every process.
    pub pids: Vec<u32>,
}

/// Totals of the kernel's event and drop counters since load.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CpuCounters {
    pub samples: u64,
    pub user_stack_failed: u64,
    pub kernel_stack_failed: u64,
    pub stacks_map_full: u64,
    pub counts_map_full: u64,
    pub user_stack_truncated: u64,
}

impl CpuCounters {
    fn set(&mut self, counter: CpuCounter, value: u64) {
        let slot = match counter {
            CpuCounter::Samples => &mut self.samples,
            CpuCounter::UserStackFailed => &mut self.user_stack_failed,
            CpuCounter::KernelStackFailed => &mut self.kernel_stack_failed,
            CpuCounter::StacksMapFull => &mut self.stacks_map_full,
            CpuCounter::CountsMapFull => &mut self.counts_map_full,
            CpuCounter::UserStackTruncated => &mut self.user_stack_truncated,
        };
        *slot = value;
    }
}

/// Cost of the CPU program as the kernel measures it (needs BPF run-time stats enabled).
#[derive(Clone, Copy, Debug)]
pub struct ProgramStats {
    pub run_count: u64,
    pub run_time: Duration,
}

/// The loaded and attached CPU sampler.
pub struct CpuSampler {
    ebpf: Ebpf,
    active_set: u32,
    _stats: Option<OwnedFd>,
}

impl CpuSampler {
    /// Loads the programs, selects the processes and attaches to every online CPU.
    pub fn start(config: &CpuSamplerConfig, enable_stats: bool) -> Result<Self> {
        // Stats must be on before the program runs for its first sample to be counted.
        let stats = enable_stats.then(enable_run_time_stats).transpose()?;
        let filter: u8 = (!config.pids.is_empty()).into();
        let mut ebpf = EbpfLoader::new()
            .override_global(globals::FILTER_PIDS, &filter, true)
            .load(EBPF_OBJECT)
            .map_err(load_error)?;
        select_pids(&mut ebpf, &config.pids)?;
        attach_cpu_clock(&mut ebpf, config.frequency_hz)?;
        Ok(Self { ebpf, active_set: 0, _stats: stats })
    }

    /// Sums the per-CPU counters.
    pub fn counters(&self) -> Result<CpuCounters> {
        let map = self.ebpf.map(maps::CPU_COUNTERS).ok_or_else(|| missing_map(maps::CPU_COUNTERS))?;
        let array: PerCpuArray<_, u64> = PerCpuArray::try_from(map).map_err(map_error("open", maps::CPU_COUNTERS))?;
        let mut totals = CpuCounters::default();
        for counter in CpuCounter::ALL {
            let values = array
                .get(&(counter as u32), 0)
                .map_err(map_error("read", maps::CPU_COUNTERS))?;
            totals.set(counter, values.iter().sum());
        }
        Ok(totals)
    }

    /// Run count and time of the CPU program, if the kernel has stats on.
    pub fn program_stats(&self) -> Result<ProgramStats> {
        let program: &PerfEvent = self
            .ebpf
            .program(CPU_PROGRAM)
            .ok_or_else(|| missing_map(CPU_PROGRAM))?
            .try_into()
            .map_err(program_error("find", CPU_PROGRAM))?;
        let info = program.info().map_err(program_error("query", CPU_PROGRAM))?;
        Ok(ProgramStats { run_count: info.run_count(), run_time: info.run_time() })
    }

    /// Flips the kernel to the other map set and drains the one it wrote to until now.
    pub fn drain(&mut self) -> Result<CpuBatch> {
        let drained = self.active_set;
        self.active_set ^= 1;
        self.set_active(self.active_set)?;
        // A sampler that read the old set index just before the flip is still writing to it.
        // BPF programs run to completion in microseconds; wait far longer than that.
        std::thread::sleep(Duration::from_millis(5));
        drain::drain_set(&mut self.ebpf, drained)
    }

    fn set_active(&mut self, set: u32) -> Result<()> {
        let map = self.ebpf.map_mut(maps::CONTROL).ok_or_else(|| missing_map(maps::CONTROL))?;
        let mut control: Array<_, u32> = Array::try_from(map).map_err(map_error("open", maps::CONTROL))?;
        control
            .set(maps::CONTROL_ACTIVE_SET, set, 0)
            .map_err(map_error("write", maps::CONTROL))
    }
}

fn enable_run_time_stats() -> Result<OwnedFd> {
    aya::sys::enable_stats(aya::sys::Stats::RunTime).map_err(|err| Error::KernelFeature {
        feature: "BPF run-time statistics (BPF_ENABLE_STATS)",
        detail: err.to_string(),
    })
}

fn select_pids(ebpf: &mut Ebpf, pids: &[u32]) -> Result<()> {
    let map = ebpf.map_mut(maps::TARGET_PIDS).ok_or_else(|| missing_map(maps::TARGET_PIDS))?;
    let mut targets: HashMap<_, u32, u8> = HashMap::try_from(map).map_err(map_error("open", maps::TARGET_PIDS))?;
    for &pid in pids {
        targets.insert(pid, 1, 0).map_err(map_error("write", maps::TARGET_PIDS))?;
    }
    Ok(())
}

fn attach_cpu_clock(ebpf: &mut Ebpf, frequency_hz: u32) -> Result<()> {
    let program: &mut PerfEvent = ebpf
        .program_mut(CPU_PROGRAM)
        .ok_or_else(|| missing_map(CPU_PROGRAM))?
        .try_into()
        .map_err(program_error("find", CPU_PROGRAM))?;
    program.load().map_err(program_error("load", CPU_PROGRAM))?;
    let cpus = online_cpus().map_err(|(path, source)| Error::Io {
        action: format!("read the online CPUs from {path}"),
        source,
    })?;
    for cpu in cpus {
        program
            .attach(
                PerfEventConfig::Software(SoftwareEvent::CpuClock),
                PerfEventScope::AllProcessesOneCpu { cpu },
                SamplePolicy::Frequency(frequency_hz.into()),
                false,
            )
            .map_err(|source| Error::Program { action: "attach (perf event on a cpu)", program: CPU_PROGRAM, source })?;
    }
    Ok(())
}

fn load_error(err: aya::EbpfError) -> Error {
    Error::Load(err)
}

fn missing_map(name: &'static str) -> Error {
    Error::KernelFeature {
        feature: "an object this build expects",
        detail: format!("{name} is missing from the embedded eBPF object; rebuild profiler"),
    }
}

fn map_error(action: &'static str, map: &'static str) -> impl Fn(aya::maps::MapError) -> Error {
    move |source| Error::Map { action, map, source }
}

fn program_error(
    action: &'static str,
    program: &'static str,
) -> impl Fn(aya::programs::ProgramError) -> Error {
    move |source| Error::Program { action, program, source }
}
