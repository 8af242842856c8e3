//! Opening the object's maps by name, the raw `bpf(2)` call for what aya does not wrap, and
//! the reads the program modules share: draining a counts map, summing per-CPU counters.

use aya::{
    maps::{HashMap, MapData, PerCpuArray},
    Ebpf,
};

use super::{map_error, missing, Result};

/// Opens map `name` as type `M`.
pub(super) fn map_mut<'a, M>(ebpf: &'a mut Ebpf, name: &'static str) -> Result<M>
where
    M: TryFrom<&'a mut aya::maps::Map, Error = aya::maps::MapError>,
{
    let map = ebpf.map_mut(name).ok_or_else(|| missing(name))?;
    M::try_from(map).map_err(map_error("open", name))
}

/// The `bpf(2)` command `cmd` with `attr`, a `union bpf_attr` member (`repr(C)`, no
/// padding) the kernel may write back into; the call's non-negative result.
///
/// # Safety
/// Every pointer in `attr` names live memory of the size `attr` states for it, writable
/// where `cmd` writes, for the whole call.
pub(super) unsafe fn bpf_call<T>(cmd: libc::c_long, attr: &mut T) -> std::io::Result<i64> {
    // SAFETY: `attr` is live and writable for `size_of::<T>()` bytes; its pointers are the
    // caller's to vouch for.
    let ret = unsafe { libc::syscall(libc::SYS_bpf, cmd, attr as *mut T, std::mem::size_of::<T>() as u32) };
    if ret < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(ret)
}

/// Opens map `name` read-only as type `M`.
pub(super) fn map_ref<'a, M>(ebpf: &'a Ebpf, name: &'static str) -> Result<M>
where
    M: TryFrom<&'a aya::maps::Map, Error = aya::maps::MapError>,
{
    let map = ebpf.map(name).ok_or_else(|| missing(name))?;
    M::try_from(map).map_err(map_error("open", name))
}

/// Reads every entry of a counts map (a hash every CPU adds to) and deletes it.
pub(super) fn drain_counts<K, V>(ebpf: &mut Ebpf, name: &'static str) -> Result<Vec<(K, V)>>
where
    K: aya::Pod,
    V: aya::Pod,
{
    let mut map: HashMap<&mut MapData, K, V> = map_mut(ebpf, name)?;
    let keys: Vec<K> = map.keys().filter_map(|k| k.ok()).collect();
    let mut entries = Vec::with_capacity(keys.len());
    for key in keys {
        if let Ok(value) = map.get(&key, 0) {
            entries.push((key, value));
        }
        map.remove(&key).map_err(map_error("clear", name))?;
    }
    Ok(entries)
}

/// Sums each per-CPU slot of the counter array `name`, `N` counters in index order.
pub(super) fn sum_counters<const N: usize>(ebpf: &Ebpf, name: &'static str) -> Result<[u64; N]> {
    sum_counters_of(ebpf, name, N as u32)
}

/// The first `count` counters of `name` (up to `N`), summed over CPUs; the rest 0.
pub(super) fn sum_counters_of<const N: usize>(ebpf: &Ebpf, name: &'static str, count: u32) -> Result<[u64; N]> {
    let array: PerCpuArray<&MapData, u64> = map_ref(ebpf, name)?;
    let mut out = [0; N];
    for (index, slot) in out.iter_mut().enumerate().take(count as usize) {
        let values = array.get(&(index as u32), 0).map_err(map_error("read", name))?;
        *slot = values.iter().sum();
    }
    Ok(out)
}
