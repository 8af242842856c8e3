//! `cargo xtask bench memory`: the kernel memory of every BPF map the profiler creates with
//! every profile kind on and the default budgets, as the kernel accounts it (`memlock` in
//! the profiler's `/proc/PID/fdinfo`, what bpftool shows as `bytes_memlock`), and the same
//! maps priced from the kernel's own formula (module `kernel`) at 64 and 256 possible CPUs.
//! A map that allocates on insert is priced full (its budget), since that is what a busy
//! host reaches, except the set being drained of a pair (`*_1`), priced empty: userspace
//! empties it within milliseconds of a flip, while the other set fills. Each map's row says
//! what its size follows (`scales with`: CPUs, processes, stacks, keys a second...; module
//! `scaling`). `PROFILER_BIN=PATH` measures that binary instead (as every bench does).

mod kernel;
mod scaling;

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;
use std::process::{Child, Command};
use std::time::Duration;

use anyhow::{bail, Context, Result};

use self::kernel::{Overheads, Shape};
use super::heap::tracer::Tracer;
use super::{fresh_dir, report::target};
use crate::workspace;

#[derive(clap::Args, Debug)]
pub struct MemoryArgs {
    /// Seconds the profiler captures before its maps are read.
    #[arg(long, default_value_t = 3)]
    seconds: u64,
}

/// The target at 256 possible CPUs with every kind and every runtime on, unwind rows
/// included (#51)...
const MAX_MIB_AT_256: f64 = 80.0;
/// ...under a ceiling of 96 MiB, so that at least 16 MiB stay free for the runtimes to come
/// (Go, Node.js, the JVM), each with maps of its own.
const CEILING_MIB_AT_256: f64 = 96.0;
const RUNTIMES_ROOM_MIB: f64 = 16.0;
const CPU_COUNTS: [u64; 2] = [64, 256];
const PROFILER_ATTACHED: &str = "attached; capturing";

/// One map of the profiler, as the kernel reports it.
struct Map {
    name: String,
    shape: Shape,
    memlock: u64,
}

pub fn run(args: &MemoryArgs) -> Result<()> {
    crate::setup::prepare_bench()?;
    let bin = workspace::profiler_bin();
    let out = fresh_dir(&workspace::target_dir().join("xtask-bench/memory"))?;
    let target = Target(Command::new("sleep").arg("600").spawn().context("failed to start sleep")?);
    workspace::stage("profiler snapshot with every profile kind (heap on a sleeping process)");
    let tracer = Tracer::start("profiler", profiler_cmd(&bin, &out, target.0.id()), PROFILER_ATTACHED)?;
    std::thread::sleep(Duration::from_secs(args.seconds));
    let maps = read_maps(tracer.pid())?;
    let stopped = tracer.stop()?;
    if !stopped.status.success() {
        bail!("the profiler failed ({}); its stderr:\n{}", stopped.status, stopped.stderr);
    }
    print(&maps, possible_cpus()?);
    Ok(())
}

/// `bench all --quick`: the same capture (it is short already), its table, and the total at
/// 256 possible CPUs against the target.
pub fn quick() -> Result<Vec<super::all::Headline>> {
    use super::all::{Bar, Headline, Unit};
    let out = fresh_dir(&workspace::target_dir().join("xtask-bench/memory"))?;
    let target = Target(Command::new("sleep").arg("600").spawn().context("failed to start sleep")?);
    let cmd = profiler_cmd(&workspace::profiler_bin(), &out, target.0.id());
    let tracer = Tracer::start("profiler", cmd, PROFILER_ATTACHED)?;
    std::thread::sleep(Duration::from_secs(MemoryArgs { seconds: 3 }.seconds));
    let maps = read_maps(tracer.pid())?;
    let stopped = tracer.stop()?;
    if !stopped.status.success() {
        bail!("the profiler failed ({}); its stderr:\n{}", stopped.status, stopped.stderr);
    }
    let totals = print(&maps, possible_cpus()?);
    let at_256 = totals[3] as f64 / (1 << 20) as f64;
    let figure = format!("BPF maps' kernel memory at {} CPUs, all kinds on", CPU_COUNTS[1]);
    Ok(vec![Headline::new("memory", &figure, Some(at_256), Bar::AtMost(MAX_MIB_AT_256), Unit::Mib)])
}

fn profiler_cmd(bin: &Path, out: &Path, pid: u32) -> Command {
    let mut cmd = Command::new(bin);
    cmd.env("RUST_LOG", "info")
        .args(["snapshot", "--duration", "10m", "--profiles", "cpu,heap,block,mutex,threadcreate,threads,offcpu"])
        .args(["--pid", &pid.to_string(), "--output"])
        .arg(out);
    cmd
}

/// The sleeping heap target, killed on drop.
struct Target(Child);

impl Drop for Target {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The maps' table: each map's memory now, the formula's check of it, and its size full here
/// and on larger hosts; then the totals and the targets, and the 256-CPU figure by what the
/// maps scale with. Returns the totals (now, full here, at 64 and 256 CPUs).
fn print(maps: &[Map], here: u64) -> [u64; 4] {
    let measured: Vec<(Shape, u64)> = maps.iter().map(|m| (m.shape, m.memlock)).collect();
    let overheads = Overheads::calibrate(&measured, here);
    println!();
    println!(
        "{:<16} {:<15} {:>4} {:>6} {:>8} {:>5}  {:>11} {:>6}  {:>11} {:>11} {:>11}  scales with",
        "map", "type", "key", "value", "entries", "flags", "kernel now", "check", "full here", "64 CPUs", "256 CPUs",
    );
    let (totals, checked, mut by_scaling) = print_rows(maps, overheads, here);
    print_totals(totals, checked, overheads, here);
    print_by_scaling(&mut by_scaling);
    totals
}

/// One row per map. Returns the columns' totals (now, full here, at 64 and 256 CPUs), how
/// many preallocated maps the formula matched, of how many, and the 256-CPU figure by what
/// the maps scale with.
fn print_rows(maps: &[Map], overheads: Overheads, here: u64) -> ([u64; 4], (u32, u32), ByScaling) {
    let mut totals = [0u64; 4];
    let mut by_scaling = ByScaling::new();
    let mut checked = (0, 0);
    for map in maps {
        let (shape, known) = (map.shape, map.shape.known());
        let in_use = overheads.entries_in_use(&shape, map.memlock, here);
        let formula_now = shape.bytes(overheads, here, in_use);
        let check = match (known, shape.preallocated()) {
            (false, _) => "?".to_string(),
            (true, false) => format!("~{in_use}"),
            (true, true) if formula_now == map.memlock => "=".to_string(),
            (true, true) => format!("{:+}", map.memlock as i64 - formula_now as i64),
        };
        if known && shape.preallocated() {
            checked = (checked.0 + u32::from(formula_now == map.memlock), checked.1 + 1);
        }
        let full = |cpus: u64| {
            if known {
                let at = Shape { max_entries: entries_at(&map.name, shape.max_entries, cpus), ..shape };
                let priced = if scaling::drained_set(&map.name, &shape) { 0 } else { at.max_entries.into() };
                at.bytes(overheads, cpus, priced)
            } else {
                map.memlock
            }
        };
        let row = [map.memlock, full(here), full(CPU_COUNTS[0]), full(CPU_COUNTS[1])];
        for (total, bytes) in totals.iter_mut().zip(row) {
            *total += bytes;
        }
        let scales = scaling::scales_with(&map.name, &shape);
        match by_scaling.iter_mut().find(|(name, _)| *name == scales) {
            Some((_, bytes)) => *bytes += row[3],
            None => by_scaling.push((scales, row[3])),
        }
        println!(
            "{:<16} {:<15} {:>4} {:>6} {:>8} {:>5x}  {:>11} {:>6}  {:>11} {:>11} {:>11}  {}",
            map.name,
            shape.type_name(),
            shape.key_size,
            shape.value_size,
            shape.max_entries,
            shape.flags,
            mib(row[0]),
            check,
            mib(row[1]),
            mib(row[2]),
            mib(row[3]),
            scales
        );
    }
    (totals, checked, by_scaling)
}

/// Bytes at 256 CPUs by what the maps scale with (`scaling::scales_with`).
type ByScaling = Vec<(&'static str, u64)>;

/// The 256-CPU figure by what it scales with, largest first.
fn print_by_scaling(by_scaling: &mut ByScaling) {
    by_scaling.sort_by_key(|&(_, bytes)| std::cmp::Reverse(bytes));
    println!("at 256 CPUs, by what the maps' size follows:");
    for (scales, bytes) in by_scaling.iter() {
        println!("  {:>11}  {scales}", mib(*bytes));
    }
}

/// The totals row, what the columns mean, and the targets.
fn print_totals(totals: [u64; 4], checked: (u32, u32), overheads: Overheads, here: u64) {
    println!(
        "{:<16} {:<15} {:>4} {:>6} {:>8} {:>5}  {:>11} {:>6}  {:>11} {:>11} {:>11}",
        "total",
        "",
        "",
        "",
        "",
        "",
        mib(totals[0]),
        "",
        mib(totals[1]),
        mib(totals[2]),
        mib(totals[3])
    );
    println!(
        "\n{here} possible CPUs here. `check`: `=` where the formula gives the kernel's own figure; \
         `~N`: entries in use of a map that allocates on insert (priced full in the last three columns; \
         a drained set of a pair, `*_1`, priced empty).\n\
         struct sizes found: bpf_htab {} B, bpf_array {} B\n\
         {}",
        overheads.htab,
        overheads.array,
        scaling::LEGEND
    );
    println!("targets:");
    target(
        "formula = kernel, preallocated maps",
        &format!("{} of {}", checked.0, checked.1),
        Some(checked.0 == checked.1),
    );
    let at_256 = totals[3] as f64 / (1 << 20) as f64;
    target(
        &format!("total at 256 CPUs <= {MAX_MIB_AT_256} MiB"),
        &format!("{at_256:.1} MiB"),
        Some(at_256 <= MAX_MIB_AT_256),
    );
    let room = CEILING_MIB_AT_256 - at_256;
    target(
        &format!("room to {CEILING_MIB_AT_256} MiB >= {RUNTIMES_ROOM_MIB} MiB"),
        &format!("{room:.1} MiB"),
        Some(room >= RUNTIMES_ROOM_MIB),
    );
}

/// Entries the daemon gives map `name`, loaded with `here` entries, on a host of `cpus`
/// possible CPUs: the per-CPU caches keep to a budget, every other map's size is fixed.
fn entries_at(name: &str, here: u32, cpus: u64) -> u32 {
    use profiler_common::maps::*;
    let slots = |max, budget| cache_slot_entries(max, budget, cpus as u32) * SCRATCH_SLOTS;
    match name {
        ROW_CACHE => slots(ROW_CACHE_MAX_SLOT_ENTRIES, ROW_CACHE_BUDGET_BYTES),
        STORED_STACKS => slots(STORED_STACKS_MAX_SLOT_ENTRIES, STORED_STACKS_BUDGET_BYTES),
        _ => here,
    }
}

fn mib(bytes: u64) -> String {
    format!("{:.2} MiB", bytes as f64 / (1 << 20) as f64)
}

/// Possible CPUs, from `/sys/devices/system/cpu/possible` (`0-1`, `0-3,8-11`).
fn possible_cpus() -> Result<u64> {
    let text = std::fs::read_to_string("/sys/devices/system/cpu/possible")
        .context("failed to read /sys/devices/system/cpu/possible")?;
    let mut count = 0;
    for range in text.trim().split(',') {
        let (first, last) = range.split_once('-').unwrap_or((range, range));
        count += last.parse::<u64>()? - first.parse::<u64>()? + 1;
    }
    Ok(count)
}

/// The BPF maps process `pid` holds open: `memlock` and `map_id` from its fdinfo, the rest
/// from `BPF_OBJ_GET_INFO_BY_FD` on a descriptor of our own for that id.
fn read_maps(pid: u32) -> Result<Vec<Map>> {
    let dir = format!("/proc/{pid}/fdinfo");
    let mut maps = Vec::new();
    for entry in std::fs::read_dir(&dir).with_context(|| format!("failed to list {dir}"))? {
        let Ok(text) = std::fs::read_to_string(entry?.path()) else { continue };
        let field =
            |name: &str| text.lines().find_map(|l| l.strip_prefix(name)).and_then(|v| v.trim().parse::<u64>().ok());
        let (Some(memlock), Some(id)) = (field("memlock:"), field("map_id:")) else { continue };
        if maps.iter().any(|m: &(u32, u64)| m.0 == id as u32) {
            continue;
        }
        maps.push((id as u32, memlock));
    }
    let mut out: Vec<Map> = maps
        .into_iter()
        .map(|(id, memlock)| {
            let (name, shape) = map_info(id).with_context(|| format!("failed to read the info of map id {id}"))?;
            Ok(Map { name, shape, memlock })
        })
        .collect::<Result<_>>()?;
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

const BPF_MAP_GET_FD_BY_ID: libc::c_long = 14;
const BPF_OBJ_GET_INFO_BY_FD: libc::c_long = 15;

/// `struct bpf_map_info`'s name and shape for map `id`.
fn map_info(id: u32) -> Result<(String, Shape)> {
    let by_id: [u32; 3] = [id, 0, 0];
    // SAFETY: the attr is a readable `bpf_attr` prefix of the size passed.
    let fd = unsafe { libc::syscall(libc::SYS_bpf, BPF_MAP_GET_FD_BY_ID, by_id.as_ptr(), 12u32) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error()).context("BPF_MAP_GET_FD_BY_ID");
    }
    // SAFETY: the kernel just returned this descriptor to us; nobody else owns it.
    let fd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
    let mut info = [0u32; 22];
    let attr: [u64; 2] = [u64::from(fd.as_raw_fd() as u32) | ((4 * info.len() as u64) << 32), info.as_mut_ptr() as u64];
    // SAFETY: the attr names a writable buffer of the length it gives.
    if unsafe { libc::syscall(libc::SYS_bpf, BPF_OBJ_GET_INFO_BY_FD, attr.as_ptr(), 16u32) } < 0 {
        return Err(std::io::Error::last_os_error()).context("BPF_OBJ_GET_INFO_BY_FD");
    }
    let name_bytes: Vec<u8> = info[6..10].iter().flat_map(|w| w.to_le_bytes()).take_while(|&b| b != 0).collect();
    let shape =
        Shape { map_type: info[0], key_size: info[2], value_size: info[3], max_entries: info[4], flags: info[5] };
    Ok((String::from_utf8_lossy(&name_bytes).into_owned(), shape))
}
