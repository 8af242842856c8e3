//! The maps and helpers every program shares: the process filter, the map-set switch
//! (`CONTROL`), the two stack maps, the per-CPU scratch of stack captures, and the counter
//! and count helpers. Maps that belong to one program kind are declared in that kind's file.
//! Static names equal the constants in `profiler_common::maps` (aya names a map after its
//! static); userspace opens them by those constants.
#![allow(non_upper_case_globals)]

use aya_ebpf::{
    bindings::{bpf_pidns_info, BPF_F_NO_PREALLOC, BPF_NOEXIST},
    helpers::{
        bpf_get_current_pid_tgid,
        generated::{bpf_get_current_cgroup_id, bpf_get_current_comm, bpf_get_ns_current_pid_tgid},
    },
    macros::map,
    maps::{Array, HashMap, PerCpuArray},
    Global,
};
use profiler_common::{
    maps::{
        target_pid_slot, CGROUP_FILTER_MAX_ENTRIES, CONTROL_CGROUP_MODE, CONTROL_SLOTS, ROW_CACHE_MAX_SLOT_ENTRIES,
        STACKS_MAX_ENTRIES, STORED_STACKS_MAX_SLOT_ENTRIES, TARGET_PIDS_MAX_ENTRIES, TARGET_PID_SHARED,
        TARGET_PID_SLOTS_LEN,
    },
    share::{ShareKey, STACK_SHARES_MAX_ENTRIES},
    CgroupFilterMode, ShareCaps, ShareUse, Stack, STACK_CHUNKS,
};

/// The load's random stack-hash key (`profiler_common::globals::STACK_HASH_KEY`).
#[unsafe(no_mangle)]
pub static STACK_HASH_KEY: Global<u64> = Global::new(0);

/// Entries of each [`Scratch`] context's table in `ROW_CACHE` (a power of two, set at load
/// from the possible CPUs: see `profiler_common::maps::cache_slot_entries`).
#[unsafe(no_mangle)]
pub static ROW_CACHE_SLOT_ENTRIES: Global<u32> = Global::new(ROW_CACHE_MAX_SLOT_ENTRIES);

/// The same for `STORED_STACKS`.
#[unsafe(no_mangle)]
pub static STORED_STACKS_SLOT_ENTRIES: Global<u32> = Global::new(STORED_STACKS_MAX_SLOT_ENTRIES);

/// 1 when only the processes in `TARGET_PIDS` are sampled (set at load time).
#[unsafe(no_mangle)]
pub static FILTER_PIDS: Global<u8> = Global::new(0);

#[map]
pub static TARGET_PIDS: HashMap<u32, u8> = HashMap::with_max_entries(TARGET_PIDS_MAX_ENTRIES, 0);

#[map]
pub static TARGET_PID_SLOTS: Array<u32> = Array::with_max_entries(TARGET_PID_SLOTS_LEN, 0);

/// The profiler's pid namespace, as `(st_dev, st_ino)` of its `/proc/self/ns/pid` (the
/// device as the kernel's `dev_t`), set at load time when it is not the initial namespace;
/// 0 in the initial one, whose ids the kernel reports directly.
#[unsafe(no_mangle)]
pub static PIDNS_DEV: Global<u64> = Global::new(0);
#[unsafe(no_mangle)]
pub static PIDNS_INO: Global<u64> = Global::new(0);

/// The current task: its kernel-wide `pid_tgid` (unique, for keys of state that lives
/// between two programs) and its ids as the profiler sees them (in its pid namespace), which
/// is how every count names it.
#[derive(Clone, Copy)]
pub struct Task {
    pub pid_tgid: u64,
    pub tgid: u32,
    pub tid: u32,
}

/// The current task, or `None` for a task whose pid namespace is not the profiler's: a
/// profiler in a container profiles the processes of its container, under their pids there.
#[inline(always)]
pub fn current_task() -> Option<Task> {
    current_task_of(bpf_get_current_pid_tgid())
}

/// [`current_task`] for a program that has already read `bpf_get_current_pid_tgid`.
#[inline(always)]
pub fn current_task_of(pid_tgid: u64) -> Option<Task> {
    let ino = PIDNS_INO.load();
    if ino == 0 {
        return Some(Task { pid_tgid, tgid: (pid_tgid >> 32) as u32, tid: pid_tgid as u32 });
    }
    let mut ns = bpf_pidns_info { pid: 0, tgid: 0 };
    let size = core::mem::size_of::<bpf_pidns_info>() as u32;
    // SAFETY: `ns` is a writable struct of `size` bytes on this program's stack.
    if unsafe { bpf_get_ns_current_pid_tgid(PIDNS_DEV.load(), ino, &mut ns, size) } != 0 {
        return None;
    }
    Some(Task { pid_tgid, tgid: ns.tgid, tid: ns.pid })
}

/// The current task, if its process is profiled.
#[inline(always)]
pub fn wanted_task() -> Option<Task> {
    current_task().filter(|task| wanted(task.tgid) && cgroup_wanted())
}

/// The cgroups the configuration's cgroup and unit matchers select, decided here so that
/// an excluded process costs no walk (see `CgroupFilterMode`).
#[map]
pub static CGROUP_FILTER: HashMap<u64, u8> = HashMap::with_max_entries(CGROUP_FILTER_MAX_ENTRIES, 0);

/// Whether the current task's cgroup is profiled.
#[inline(always)]
pub fn cgroup_wanted() -> bool {
    let mode = CONTROL.get(CONTROL_CGROUP_MODE).copied().unwrap_or(CgroupFilterMode::Off as u32);
    if mode == CgroupFilterMode::Off as u32 {
        return true;
    }
    // SAFETY: a helper without arguments.
    let id = unsafe { bpf_get_current_cgroup_id() };
    // SAFETY: only checks for presence.
    let listed = unsafe { CGROUP_FILTER.get(&id) }.is_some();
    listed == (mode == CgroupFilterMode::Include as u32)
}

#[map]
pub static CONTROL: Array<u32> = Array::with_max_entries(CONTROL_SLOTS, 0);

// Stack entries are 512 bytes each: allocate on insert instead of preallocating 8 MiB. One
// table for both sets (a key's low bit is its set, see `profiler_common::stack::set_key`): the
// drained set's entries leave it within milliseconds of a flip, so a second table of the same
// size would stand empty most of the time.
#[map]
pub static STACKS: HashMap<u64, Stack> = HashMap::with_max_entries(STACKS_MAX_ENTRIES, BPF_F_NO_PREALLOC);

/// Each process's and uid's cap on new entries in one set's stack map (see
/// `profiler_common::share`), set at load.
#[unsafe(no_mangle)]
pub static STACK_SHARE_CAPS: Global<ShareCaps> = Global::new(ShareCaps { per_process: 0, per_uid: 0, binding_from: 0 });

// What each owner put in each set's stack map; allocated on insert, as an owner's first new
// stack of the second is rare next to the samples that reuse stacks.
#[map]
pub static STACK_SHARES_0: HashMap<ShareKey, ShareUse> =
    HashMap::with_max_entries(STACK_SHARES_MAX_ENTRIES, BPF_F_NO_PREALLOC);
#[map]
pub static STACK_SHARES_1: HashMap<ShareKey, ShareUse> =
    HashMap::with_max_entries(STACK_SHARES_MAX_ENTRIES, BPF_F_NO_PREALLOC);

/// Which slot of the per-CPU scratch maps (`STACK_SCRATCH`, `STACK_WINDOW`, `UNWIND_STATE`,
/// `STORED_STACKS`, `ROW_CACHE`) a program uses. The CPU program runs in the timer interrupt
/// and can interrupt a uprobe program on the same CPU: the kernel keeps tracepoint and
/// perf-event programs from nesting (its per-CPU `bpf_prog_active`), but uprobe programs do
/// not take that guard. With one slot, a CPU sample taken during a heap walk overwrote the
/// walk's frames with its own kernel stack (heap samples with kernel addresses as user
/// frames).
#[derive(Clone, Copy)]
#[repr(u32)]
pub enum Scratch {
    /// Programs in the context of a task: uprobes and tracepoints.
    Task = 0,
    /// The perf-event (CPU sampling) program, in interrupt context.
    Interrupt = 1,
    /// The scheduler's switch (off-CPU profile): it can run while a task-context program
    /// of the thread switched out is preempted mid-walk (syscall tracepoint and uprobe
    /// programs may be preempted).
    Switch = 2,
}

/// Slots of each scratch map: one per [`Scratch`].
pub use profiler_common::maps::SCRATCH_SLOTS;

#[map]
/// Per [`Scratch`] slot, [`STACK_CHUNKS`] consecutive entries: a walk of up to
/// `MAX_USER_STACK_DEPTH` frames, stored as that many pieces (see `profiler_common::stack`).
pub static STACK_SCRATCH: PerCpuArray<Stack> = PerCpuArray::with_max_entries(SCRATCH_SLOTS * STACK_CHUNKS as u32, 0);

/// Words of user stack the walker copies per read (a power of two).
pub const STACK_WINDOW_WORDS: usize = 64;

#[map]
pub static STACK_WINDOW: PerCpuArray<[u64; STACK_WINDOW_WORDS]> = PerCpuArray::with_max_entries(SCRATCH_SLOTS, 0);

/// Adds one to slot `index` of a per-CPU counter array. Each counter map belongs to programs
/// of one kind; a CPU sample interrupting a uprobe program between this load and store (see
/// [`Scratch`]) can lose one count of a counter both contexts share (the unwinder's): a rare
/// off-by-one in a diagnostic counter, accepted, as the BPF target's `core` has no atomic add.
#[inline(always)]
pub fn bump(counters: &PerCpuArray<u64>, index: u32) {
    if let Some(slot) = counters.get_ptr_mut(index) {
        // SAFETY: this CPU's slot of a live array map element.
        unsafe { *slot += 1 };
    }
}

/// Adds `n` to the counter at `counter` with one atomic instruction (`lock xadd`): every
/// CPU writes the counts maps. The BPF target has atomic adds but no compare-and-swap, so
/// `core`'s `AtomicU64::fetch_add` does not exist there; the intrinsic does, and with its
/// result unused it compiles to the add without fetch that every kernel accepts.
#[inline(always)]
pub fn atomic_add(counter: *mut u64, n: u64) {
    #[cfg(target_arch = "bpf")]
    // SAFETY: callers pass a pointer into a live map value, 8-byte aligned.
    unsafe {
        core::intrinsics::atomic_xadd::<u64, u64, { core::intrinsics::AtomicOrdering::Relaxed }>(counter, n)
    };
    // The host build (clippy over the workspace) has the stable API.
    #[cfg(not(target_arch = "bpf"))]
    // SAFETY: as above; no other access to this word is non-atomic.
    unsafe { core::sync::atomic::AtomicU64::from_ptr(counter) }.fetch_add(n, core::sync::atomic::Ordering::Relaxed);
}

/// [`atomic_add`] for a `u32` (one `lock xadd` of 32 bits).
#[inline(always)]
pub fn atomic_add_u32(counter: *mut u32, n: u32) {
    #[cfg(target_arch = "bpf")]
    // SAFETY: callers pass a pointer into a live map value, 4-byte aligned.
    unsafe {
        core::intrinsics::atomic_xadd::<u32, u32, { core::intrinsics::AtomicOrdering::Relaxed }>(counter, n)
    };
    #[cfg(not(target_arch = "bpf"))]
    // SAFETY: as above; no other access to this word is non-atomic.
    unsafe { core::sync::atomic::AtomicU32::from_ptr(counter) }.fetch_add(n, core::sync::atomic::Ordering::Relaxed);
}

/// Flags of every counts map of a pair (`*_COUNTS_0`/`_1`, `HEAP_TOTALS_0`/`_1`): entries
/// are allocated as keys are first inserted, not preallocated. Userspace drains a set and
/// deletes every entry of it within milliseconds of a flip, so of a pair only the set being
/// filled holds entries for long: allocated on insert, a pair costs about one full set of
/// kernel memory where two preallocated sets cost two whatever their use. The price is an
/// allocation from the kernel's per-CPU element cache at a key's first insert of a set (the
/// stack map has allocated its entries so from every program kind since it was made).
pub const COUNTS_MAP_FLAGS: u32 = BPF_F_NO_PREALLOC;

/// Adds `delta` to `key`'s value word by word with atomic adds, or inserts `delta` when the
/// key is new. False when the map is full. `V` is made of `u64` counters only (each count's
/// first value is its increment). Another CPU may create the key between the lookup and the
/// insert; then the lookup is tried again.
///
/// The counts maps are hashes every CPU shares rather than per-CPU hashes: a per-CPU hash
/// holds a value per possible CPU for every entry, so its kernel memory grows with the host
/// (16,384 entries of 16 bytes take 64 MiB at 256 CPUs); a shared entry costs the same on
/// any host, and two CPUs rarely add to the same key at once.
#[inline(always)]
pub fn add_or_insert<K, V>(map: &HashMap<K, V>, key: &K, delta: &V) -> bool {
    const EEXIST: i32 = 17;
    const { assert!(core::mem::size_of::<V>().is_multiple_of(8)) };
    let words = core::mem::size_of::<V>() / 8;
    for _ in 0..2 {
        if let Some(value) = map.get_ptr_mut(key) {
            let (value, delta) = (value.cast::<u64>(), (delta as *const V).cast::<u64>());
            for i in 0..words {
                // SAFETY: word `i` of a live map value and of `delta`, both of `V`'s size.
                unsafe { atomic_add(value.add(i), *delta.add(i)) };
            }
            return true;
        }
        match map.insert(key, delta, BPF_NOEXIST as u64) {
            Ok(()) => return true,
            Err(err) if err == -EEXIST => continue,
            Err(_) => return false,
        }
    }
    false
}

/// [`add_or_insert`] into set `set`'s map of a pair (see [`pick_set`]). Each arm names its
/// map as a constant, so the verifier turns the lookup into a direct call of the hash map's
/// own lookup; a map chosen at run time goes through the generic helper's indirect call (a
/// retpoline on these hosts).
#[inline(always)]
pub fn add_or_insert_in_set<K, V>(set: u32, set_0: &HashMap<K, V>, set_1: &HashMap<K, V>, key: &K, delta: &V) -> bool {
    if set == 0 {
        add_or_insert(set_0, key, delta)
    } else {
        add_or_insert(set_1, key, delta)
    }
}

/// The current task's name. Not aya's `bpf_get_current_comm`, which zeroes its buffer
/// first: the BPF target compiles that into a call of a byte-at-a-time `memset`, and the
/// helper writes all 16 bytes anyway (the name zero-padded, or zeros when it fails).
#[inline(always)]
pub fn current_comm() -> [u8; 16] {
    let mut comm = core::mem::MaybeUninit::<[u8; 16]>::uninit();
    // SAFETY: the helper takes uninitialized memory and writes all 16 bytes of it.
    unsafe {
        bpf_get_current_comm(comm.as_mut_ptr().cast(), 16);
        comm.assume_init()
    }
}

/// Set `set`'s half of a pair of maps: `set_0` or `set_1`. A program reads the active set
/// once ([`active_set`]) and picks all its maps with it, so a count and the stack it names
/// land in the same set even when userspace flips the sets meanwhile.
#[inline(always)]
pub fn pick_set<'a, T>(set: u32, set_0: &'a T, set_1: &'a T) -> &'a T {
    if set == 0 {
        set_0
    } else {
        set_1
    }
}

/// The map set (0 or 1) the programs write to now.
#[inline(always)]
pub fn active_set() -> u32 {
    active_generation() & 1
}

/// How many times userspace has flipped the map sets; its low bit is the active set.
#[inline(always)]
pub fn active_generation() -> u32 {
    match CONTROL.get(profiler_common::maps::CONTROL_ACTIVE_SET) {
        Some(&generation) => generation,
        None => 0,
    }
}

/// Whether samples of process `tgid` are recorded.
#[inline(always)]
pub fn wanted(tgid: u32) -> bool {
    if FILTER_PIDS.load() == 0 {
        return true;
    }
    // 0 is an empty slot, and no process's tgid (the idle tasks have 0).
    match TARGET_PID_SLOTS.get(target_pid_slot(tgid)) {
        Some(&listed) if listed == TARGET_PID_SHARED => {
            // SAFETY: the value is a plain u8 that is only ever read.
            unsafe { TARGET_PIDS.get(&tgid) }.is_some()
        }
        Some(&listed) => listed == tgid && tgid != 0,
        None => false,
    }
}
