//! The user-stack walk: unwind tables built from each file's `.eh_frame` (see
//! `docs/unwinding.md`), frame pointers where there is no table.
//!
//! Starts from the thread's saved user registers (valid whether the sample hit user or kernel
//! mode). Each step finds the frame's mapping in the process's `UNWIND_PROCESSES` entry, its
//! row in the mapping's table (`UNWIND_TABLES` → shards of `UNWIND_ROWS`), computes the CFA
//! and reads the return address (and the caller's rbp, if saved) from the stack. The frame
//! loop is a `bpf_loop` callback, so the verifier checks one step, not 512 unrolled ones,
//! and the cost is linear in the depth.
//!
//! Not `bpf_get_stack(BPF_F_USER_STACK)`: the kernel's walk follows `rbp` until a read
//! faults, and code without frame pointers (Debian's libc calls `main`) leaves garbage in
//! `rbp`. Here a frame is followed only if it lies above the previous one and within the
//! stack's reach, so garbage is rejected without touching memory.
//!
//! One file over 600 lines on purpose: the step, the mapping search, the row search and the
//! stack window share `WalkState` and the verifier's view of one `bpf_loop` callback, and the
//! layout of their reads is tuned together (see `docs/unwinding.md`); what can stand apart
//! already does (`walk_state`, `uprobe_frames`, `runtimes`).

#![allow(non_upper_case_globals)]

use core::{ffi::c_void, ptr};

use aya_ebpf::{
    bindings::{pt_regs, BPF_F_MMAPABLE, BPF_F_NO_PREALLOC},
    helpers::generated::{bpf_get_current_task_btf, bpf_loop, bpf_probe_read_user, bpf_task_pt_regs},
    macros::map,
    maps::{Array, HashMap, LruHashMap, PerCpuArray, RingBuf},
};
use profiler_common::{
    maps::{
        CONTROL_EXEC_EPOCH, CONTROL_UNWIND_EPOCH, REGISTER_ASKED_MAX_ENTRIES, REGISTER_ASKS_BYTES,
        REGISTER_DECLINED_MAX_ENTRIES, ROW_CACHE_MAX_SLOT_ENTRIES, UNWIND_PROCESSES_LARGE_MAX_ENTRIES,
        UNWIND_PROCESSES_MAX_ENTRIES, UNWIND_ROWS_DEFAULT_ENTRIES, UNWIND_TABLES_MAX_ENTRIES,
    },
    stack::{finish_hash, hash_start},
    unwind::{
        sigframe, MAPPING_SEARCH_STEPS, MAX_TABLE_SHARDS, NO_TABLE, PROCESS_RUNTIMES, SHARD_ROWS, SHARD_ROWS_SHIFT,
        SMALL_MAPPING_SEARCH_STEPS, TABLE_SEARCH_STEPS,
    },
    walk::GO_G_STACK_HI,
    RegisterAsk, SmallUnwindProcess, Stack, Unsupported, UnwindCounter, UnwindKind, UnwindMapping, UnwindProcess,
    UnwindRow, UnwindTableInfo, MAX_USER_STACK_DEPTH, STACK_CHUNKS,
};

use crate::{
    maps::{
        bump, Scratch, CONTROL, ROW_CACHE_SLOT_ENTRIES, SCRATCH_SLOTS, STACK_HASH_KEY, STACK_SCRATCH, STACK_WINDOW,
        STACK_WINDOW_WORDS,
    },
    uprobe_frames::{self, restore},
    walk_state::{push_word, KeptMapping, WalkState, KEPT_MAPPINGS, UNWIND_STATE},
};

/// Every loaded unwind table's rows (resized at load time to the memory budget).
#[map]
// Mmapable: userspace writes whole tables into it directly, not one row per syscall.
pub static UNWIND_ROWS: Array<UnwindRow> = Array::with_max_entries(UNWIND_ROWS_DEFAULT_ENTRIES, BPF_F_MMAPABLE);

#[map]
pub static UNWIND_TABLES: Array<UnwindTableInfo> = Array::with_max_entries(UNWIND_TABLES_MAX_ENTRIES, 0);

// 776 B per process, for most processes; allocated as processes are registered.
#[map]
pub static UNWIND_PROCESSES: HashMap<u32, SmallUnwindProcess> =
    HashMap::with_max_entries(UNWIND_PROCESSES_MAX_ENTRIES, BPF_F_NO_PREALLOC);

// 6 KiB per process, for the few with many libraries.
#[map]
pub static UNWIND_PROCESSES_LARGE: HashMap<u32, UnwindProcess> =
    HashMap::with_max_entries(UNWIND_PROCESSES_LARGE_MAX_ENTRIES, BPF_F_NO_PREALLOC);

/// The processes a walk found unregistered, told to userspace to register now (see
/// [`ask_registration`]).
#[map]
pub static REGISTER_ASKS: RingBuf = RingBuf::with_byte_size(REGISTER_ASKS_BYTES, 0);

#[map]
pub static REGISTER_ASKED: LruHashMap<u32, u8> = LruHashMap::with_max_entries(REGISTER_ASKED_MAX_ENTRIES, 0);

/// The processes userspace will not register (see `profiler_common::maps::REGISTER_DECLINED`).
#[map]
pub static REGISTER_DECLINED: HashMap<u32, u8> =
    HashMap::with_max_entries(REGISTER_DECLINED_MAX_ENTRIES, BPF_F_NO_PREALLOC);

/// Tells userspace, once per process (until its next exec), that a walk met process `tgid`
/// unregistered. Userspace reads the side band's records at once and registers it, so a
/// process is registered when it is first sampled or waits, even while userspace reads the
/// records of a storm of short-lived programs only every few tens of milliseconds: the
/// processes nothing samples cost it no wake-up.
#[inline(always)]
fn ask_registration(tgid: u32) {
    // SAFETY (both): only check for presence.
    if unsafe { REGISTER_ASKED.get(&tgid) }.is_some() || unsafe { REGISTER_DECLINED.get(&tgid) }.is_some() {
        return;
    }
    if REGISTER_ASKED.insert(&tgid, &1, 0).is_err() {
        return;
    }
    let ask = RegisterAsk { tgid, _pad: 0, comm: crate::maps::current_comm() };
    // Default wake-up: the reader is woken when it has read everything before this record.
    if REGISTER_ASKS.output::<RegisterAsk>(&ask, 0).is_err() {
        // Full: asked again at the next walk, not forgotten.
        let _ = REGISTER_ASKED.remove(&tgid);
    }
}

#[map]
pub static UNWIND_COUNTERS: PerCpuArray<u64> = PerCpuArray::with_max_entries(UnwindCounter::COUNT, 0);

/// Rows this CPU found lately, each with the range of offsets it covers, in sets of two
/// entries indexed by (table load id, the offset's [`ROW_CACHE_BUCKET_SHIFT`] bucket): a hit
/// skips the table's binary search, whose ~16 dependent reads spread over the row array were
/// the largest part of a frame's cost (`step_callback` was a third of the futex programs'
/// time). An entry serves any offset of its row, not only the one that was searched: an
/// interpreter's leaf pc is a different address of its loop nearly every sample, and with an
/// entry per exact offset 6 in 10 samples of `python3.11` searched (each search about a half
/// of the walk's time on a loaded machine). Two ways, the row's index choosing one, so that
/// two neighbouring rows of one bucket (a loop before a function's call and the return
/// address after it) do not evict each other at every sample. One table of
/// `ROW_CACHE_SLOT_ENTRIES` per [`Scratch`] slot (fewer on hosts with many CPUs); entries
/// are only ever whole facts about an immutable table (a reloaded slot has a new load id),
/// and an entry is used only for offsets inside its row's range, so a stale or misplaced
/// entry cannot match.
#[map]
pub static ROW_CACHE: PerCpuArray<CachedRow> =
    PerCpuArray::with_max_entries(ROW_CACHE_MAX_SLOT_ENTRIES * SCRATCH_SLOTS, 0);

/// Row `row` of the table of load id `id`, which covers the offsets from its `pc_offset` up
/// to `end` (the next row's `pc_offset`); `id` 0 is empty (no table has load id 0).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct CachedRow {
    id: u32,
    end: u32,
    row: UnwindRow,
}

// Both per-CPU caches are priced at this size (`profiler_common::maps::cache_slot_entries`).
const _: () = assert!(core::mem::size_of::<CachedRow>() as u64 == profiler_common::maps::CACHE_ENTRY_BYTES);

/// Offsets share a [`ROW_CACHE`] set by 256-byte bucket: a hot loop's few kilobytes take a
/// few dozen sets, and rows rarely change more than once within one bucket of a function.
const ROW_CACHE_BUCKET_SHIFT: u32 = 8;

/// Adds one to an unwinder counter (see [`bump`] for why both contexts may share it).
#[inline(always)]
pub(crate) fn count(index: u32) {
    bump(&UNWIND_COUNTERS, index);
}

/// How far above the sampled stack pointer a frame may lie: the default 8 MiB main-thread
/// stack limit. Frames beyond it are garbage, not frames.
const MAX_STACK_SPAN: u64 = 8 << 20;

/// The lowest kernel address on x86_64; user addresses are below it.
const USER_ADDR_LIMIT: u64 = 0x0000_8000_0000_0000;

/// Bytes of user stack copied per read: frames lie close together, and one helper call costs
/// about as much for 512 bytes as for 8 here, so a window holds several frames.
const WINDOW_BYTES: u64 = (STACK_WINDOW_WORDS * 8) as u64;

/// Words of the window kept below the address that caused a refill: the caller's rbp is
/// saved below the return address, and is read after it.
const WINDOW_SLACK_WORDS: u64 = 4;

/// The current thread's saved user pc, sp and bp.
#[inline(always)]
fn user_regs() -> Option<(u64, u64, u64)> {
    // SAFETY: both helpers take and return kernel-checked BTF pointers; the fields are read
    // through the BTF pointer (the verifier makes them fault-safe loads), which costs three
    // loads where copying the whole `pt_regs` with a helper cost a call and 168 bytes.
    unsafe {
        let task = bpf_get_current_task_btf();
        let regs = bpf_task_pt_regs(task) as *const pt_regs;
        if regs.is_null() {
            return None;
        }
        Some((ptr::read_volatile(&(*regs).rip), ptr::read_volatile(&(*regs).rsp), ptr::read_volatile(&(*regs).rbp)))
    }
}

/// Walks the current thread's user stack into this CPU's `STACK_SCRATCH` entry for `slot`,
/// leaf first; `tgid` names its process in `UNWIND_PROCESSES`. Returns false when the thread
/// has no user context (kernel threads); else the stack's hash.
#[inline(always)]
pub fn walk(slot: Scratch, tgid: u32) -> Option<u64> {
    let slot = slot as u32;
    let (pc, sp, bp) = user_regs()?;
    if pc == 0 || pc >= USER_ADDR_LIMIT {
        return None;
    }
    let state = UNWIND_STATE.get_ptr_mut(slot)?;
    // SAFETY: this CPU's scratch entry for the caller's context, see `Scratch`.
    let state = unsafe { &mut *state };
    // Field by field, the zeros as volatile stores: a whole-struct write compiles to a call
    // of a byte-at-a-time `memset` for its run of zero fields. (`lo` and `hi` are set before
    // each search.)
    state.pc = pc;
    state.sp = sp;
    state.bp = bp;
    state.stack_top = sp.saturating_add(MAX_STACK_SPAN);
    // SAFETY: plain writes to this CPU's state slot.
    unsafe {
        ptr::write_volatile(&mut state.window_base, 0);
        ptr::write_volatile(&mut state.window_len, 0);
        ptr::write_volatile(&mut state.mapping_start, 0);
        ptr::write_volatile(&mut state.mapping_end, 0);
        ptr::write_volatile(&mut state.mapping_bias, 0);
    }
    state.mapping_table = NO_TABLE;
    state.tgid = tgid;
    state.exact = 1;
    state.slot = slot;
    state.runtimes = PROCESS_RUNTIMES;
    state.hash = hash_start(STACK_HASH_KEY.load());
    // Before any read of the process's entry (see `KeptMapping`).
    state.epoch = control(CONTROL_UNWIND_EPOCH);
    state.exec_epoch = control(CONTROL_EXEC_EPOCH);
    let restored = uprobe_frames::start(state);
    if restored > 0 {
        count(UnwindCounter::UprobeFrames as u32);
    }
    if restored > 1 {
        count(UnwindCounter::UprobeFrames as u32);
    }
    let out = STACK_SCRATCH.get_ptr_mut(slot * STACK_CHUNKS as u32)?;
    // SAFETY: as above.
    let out: &mut Stack = unsafe { &mut *out };
    out.len = 0;
    out.truncated = 0;
    // SAFETY: the callback is a static function of this object; its context is `slot`, on
    // this stack for the whole loop.
    unsafe {
        bpf_loop(
            MAX_USER_STACK_DEPTH as u32 + 1,
            step_callback as *mut c_void,
            (&slot as *const u32).cast_mut().cast(),
            0,
        );
    }
    // An interpreter's frames go after the native ones (see `crate::runtimes`). The callbacks
    // wrote the state through their own lookups: read it again, not a cached copy.
    // SAFETY: a plain read of this CPU's live scratch entry.
    let runtimes = unsafe { ptr::read_volatile(&state.runtimes) };
    if runtimes != 0 {
        crate::runtimes::walk(slot, tgid, runtimes);
    }
    // SAFETY: plain reads of this CPU's live scratch entries.
    let (hash, len) = unsafe { (ptr::read_volatile(&state.hash), ptr::read_volatile(&out.len)) };
    Some(finish_hash(hash, len))
}

/// One frame: records the pc and steps to the caller. 0 continues, 1 stops. `ctx` points to
/// the walk's scratch slot.
#[inline(never)]
extern "C" fn step_callback(_index: u64, ctx: *mut c_void) -> i64 {
    // SAFETY: `walk` passes a pointer to a `u32` on its stack.
    let slot = unsafe { *(ctx as *const u32) };
    let Some(state) = UNWIND_STATE.get_ptr_mut(slot) else { return 1 };
    // SAFETY: this CPU's slot, see `walk`.
    let state = unsafe { &mut *state };
    if !push_word(slot, state.pc, &mut state.hash) {
        return 1;
    }
    if step(state) {
        0
    } else {
        1
    }
}

/// What the tables say about the current frame.
enum Found {
    Row(UnwindRow),
    /// No row: step with frame pointers and count why.
    Fallback(UnwindCounter),
}

/// Steps `state` from its frame to the caller's. False when the walk ends.
#[inline(always)]
fn step(state: &mut WalkState) -> bool {
    let row = match find_row(state.slot) {
        Ok(row) => row,
        Err(reason) => return fallback_step(state, reason),
    };
    let cfa = match row.kind {
        k if k == UnwindKind::CfaRsp as u8 => state.sp.wrapping_add((row.operand as u64) << 3),
        k if k == UnwindKind::CfaRbp as u8 => state.bp.wrapping_add((row.operand as u64) << 3),
        k if k == UnwindKind::Plt as u8 => {
            let pushed = ((state.pc & 15) >= row.operand as u64) as u64;
            state.sp.wrapping_add(8 + (pushed << 3))
        }
        k if k == UnwindKind::SignalFrame as u8 => return signal_frame_step(state),
        k if k == UnwindKind::EndOfStack as u8 => {
            count(UnwindCounter::EndOfStack as u32);
            return false;
        }
        k if k == UnwindKind::Unsupported as u8 => {
            let reason = (row.operand as u32).min(Unsupported::COUNT as u32 - 1);
            count(UnwindCounter::Unsupported0 as u32 + reason);
            return false;
        }
        k if k == UnwindKind::GoCgoReturn as u8 => return go_cgo_return_step(state, row.operand),
        _ => return fallback_step(state, UnwindCounter::NoCfi as u32),
    };
    if cfa <= state.sp || cfa >= state.stack_top {
        count(UnwindCounter::BadFrame as u32);
        return false;
    }
    let Some(ra) = read_word(state, cfa - 8) else {
        count(UnwindCounter::BadRead as u32);
        return false;
    };
    let ra = restored(state, ra, cfa - 8);
    if row.rbp_cfa_words != 0 {
        let at = cfa.wrapping_add((row.rbp_cfa_words as i64 as u64) << 3);
        let Some(bp) = read_word(state, at) else {
            count(UnwindCounter::BadRead as u32);
            return false;
        };
        state.bp = bp;
    }
    state.totals.by_table += 1;
    state.sp = cfa;
    next_pc(state, ra)
}

/// The return address `ra` read at `slot`, or the one a pending uretprobe replaced there
/// (counted).
#[inline(always)]
fn restored(state: &mut WalkState, ra: u64, slot: u64) -> u64 {
    let original = restore(state, ra, slot);
    if original != ra {
        count(UnwindCounter::UprobeFrames as u32);
    }
    original
}

/// Moves to return address `ra`; false (the end of the stack) for 0 or a non-user address.
#[inline(always)]
fn next_pc(state: &mut WalkState, ra: u64) -> bool {
    if ra == 0 {
        count(UnwindCounter::EndOfStack as u32);
        return false;
    }
    if ra >= USER_ADDR_LIMIT {
        count(UnwindCounter::BadFrame as u32);
        return false;
    }
    state.pc = ra;
    state.exact = 0;
    true
}

/// Steps through the kernel's signal frame: the interrupted registers are saved at fixed
/// offsets from rsp, and the interrupted pc is exact.
#[inline(always)]
fn signal_frame_step(state: &mut WalkState) -> bool {
    let sp = state.sp;
    // In ascending order, so that one window read serves all three.
    let (Some(bp), Some(next_sp), Some(pc)) = (
        read_word(state, sp + sigframe::RBP_OFFSET),
        read_word(state, sp + sigframe::RSP_OFFSET),
        read_word(state, sp + sigframe::RIP_OFFSET),
    ) else {
        count(UnwindCounter::BadRead as u32);
        return false;
    };
    if pc == 0 || pc >= USER_ADDR_LIMIT || next_sp == 0 || next_sp >= USER_ADDR_LIMIT {
        count(UnwindCounter::BadFrame as u32);
        return false;
    }
    count(UnwindCounter::SignalFrames as u32);
    // The handler may run on an alternate stack: the interrupted stack gets its own bounds.
    state.stack_top = next_sp.saturating_add(MAX_STACK_SPAN);
    state.sp = next_sp;
    state.bp = bp;
    state.pc = pc;
    state.exact = 1;
    true
}

/// Steps from Go's `runtime.asmcgocall` at the return from its C call back to the goroutine
/// stack it left (see [`UnwindKind::GoCgoReturn`] and `profiler_common::walk`'s twin).
#[inline(always)]
fn go_cgo_return_step(state: &mut WalkState, words: u16) -> bool {
    let at = state.sp.wrapping_add((words as u64) << 3);
    let (Some(depth), Some(g)) = (read_word(state, at), read_word(state, at + 8)) else {
        count(UnwindCounter::BadRead as u32);
        return false;
    };
    let goroutine_sp = if g == 0 {
        depth
    } else {
        let Some(hi) = read_word(state, g.wrapping_add(GO_G_STACK_HI)) else {
            count(UnwindCounter::BadRead as u32);
            return false;
        };
        hi.wrapping_sub(depth)
    };
    if goroutine_sp == 0 || goroutine_sp >= USER_ADDR_LIMIT || goroutine_sp & 7 != 0 {
        count(UnwindCounter::BadFrame as u32);
        return false;
    }
    // The window is refilled from the new stack (never below its sp).
    state.sp = goroutine_sp;
    let Some(ra) = read_word(state, goroutine_sp) else {
        count(UnwindCounter::BadRead as u32);
        return false;
    };
    count(UnwindCounter::GoStackSwitches as u32);
    state.sp = goroutine_sp + 8;
    state.stack_top = state.sp.saturating_add(MAX_STACK_SPAN);
    next_pc(state, ra)
}

/// Steps from a frame no table row describes, counting why. The interrupted frame (exact
/// pc) is first tried as a leaf that has not touched the stack: glibc ends `clone3`'s CFI
/// before its `syscall` on purpose, and JIT code has none, yet both return through `[rsp]`.
/// The guess is taken only if `[rsp]` is an address in one of the process's executable
/// mappings; otherwise frame pointers.
#[inline(always)]
fn fallback_step(state: &mut WalkState, reason: u32) -> bool {
    count(reason);
    if state.exact == 1 && reason != UnwindCounter::NoProcess as u32 {
        let sp = state.sp;
        if let Some(ra) = read_word(state, sp) {
            let ra = restored(state, ra, sp);
            if ra != 0 && ra < USER_ADDR_LIMIT && profiler_find_mapping(state.slot, ra - 1) == 0 {
                count(UnwindCounter::LeafGuesses as u32);
                state.sp = sp + 8;
                return next_pc(state, ra);
            }
        }
    }
    frame_pointer_step(state)
}

/// Steps with the frame record at rbp (saved rbp, then the return address), if rbp points
/// into the stack above the current frame.
#[inline(always)]
fn frame_pointer_step(state: &mut WalkState) -> bool {
    let bp = state.bp;
    if bp < state.sp || bp >= state.stack_top || bp & 7 != 0 {
        return false;
    }
    let (Some(next_bp), Some(ra)) = (read_word(state, bp), read_word(state, bp + 8)) else {
        count(UnwindCounter::BadRead as u32);
        return false;
    };
    let ra = restored(state, ra, bp + 8);
    state.totals.by_frame_pointer += 1;
    state.sp = bp + 16;
    state.bp = next_bp;
    next_pc(state, ra)
}

/// `CONTROL`'s slot `index`, 0 if missing.
#[inline(always)]
fn control(index: u32) -> u32 {
    // SAFETY: a plain read of a live array element (userspace or an atomic add writes it).
    CONTROL.get_ptr(index).map_or(0, |value| unsafe { ptr::read_volatile(value) })
}

/// Finds the mapping holding `pc` in the process's list (or kept from an earlier walk) and
/// caches it in `state`.
///
/// The kept mappings serve only the interrupt and switch contexts, which run with
/// preemption off. A task-context walk (uprobes, syscall tracepoints) can be preempted by
/// another task's walk on the same CPU, which shares its slot: an entry torn by that would
/// outlive the walk, where a torn walk state spoils only the one sample.
/// [`find_mapping`] for the leaf guess of [`fallback_step`], as a global function: the
/// verifier checks it once, on its own, where inlined it was checked again for every way the
/// step reached it. 0 when found, else the [`UnwindCounter`] of why not, plus one. `slot` is
/// the walk's [`Scratch`] slot (its state's index).
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn profiler_find_mapping(slot: u32, pc: u64) -> u32 {
    let Some(state) = UNWIND_STATE.get_ptr_mut(slot) else { return UnwindCounter::NoProcess as u32 + 1 };
    // SAFETY: this CPU's state of the walk of `slot`, see `walk`.
    let state = unsafe { &mut *state };
    match find_mapping_inline(state, pc) {
        Ok(()) => 0,
        Err(reason) => reason as u32 + 1,
    }
}

#[inline(always)]
fn find_mapping_inline(state: &mut WalkState, pc: u64) -> Result<(), UnwindCounter> {
    let keep = state.slot != Scratch::Task as u32;
    let region = pc >> 21;
    let at = ((region ^ (region >> 7) ^ state.tgid as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 62) as usize;
    let kept = &state.kept[at & (KEPT_MAPPINGS - 1)];
    if keep
        && kept.tgid == state.tgid
        && kept.epoch == state.epoch
        && kept.exec_epoch == state.exec_epoch
        && kept.start <= pc
        && pc < kept.end
    {
        let kept = *kept;
        state.runtimes = kept.runtimes;
        state.mapping_start = kept.start;
        state.mapping_end = kept.end;
        state.mapping_bias = kept.bias;
        state.mapping_table = kept.table;
        state.table_rows = kept.table_rows;
        state.table_id = kept.table_id;
        state.table_base = kept.table_base;
        return Ok(());
    }
    // SAFETY (both lookups): the value is plain data that only userspace writes, by
    // whole-value updates.
    let found = if let Some(process) = unsafe { UNWIND_PROCESSES.get(&state.tgid) } {
        state.runtimes = process.flags & PROCESS_RUNTIMES;
        search_mappings(state, pc, &process.mappings, process.len, SMALL_MAPPING_SEARCH_STEPS)
    } else {
        match unsafe { UNWIND_PROCESSES_LARGE.get(&state.tgid) } {
            Some(process) => {
                state.runtimes = process.flags & PROCESS_RUNTIMES;
                search_mappings(state, pc, &process.mappings, process.len, MAPPING_SEARCH_STEPS)
            }
            None => {
                ask_registration(state.tgid);
                Err(UnwindCounter::NoProcess)
            }
        }
    };
    if keep && found.is_ok() {
        state.kept[at & (KEPT_MAPPINGS - 1)] = KeptMapping {
            tgid: state.tgid,
            epoch: state.epoch,
            exec_epoch: state.exec_epoch,
            table: state.mapping_table,
            start: state.mapping_start,
            end: state.mapping_end,
            bias: state.mapping_bias,
            table_base: state.table_base,
            table_rows: state.table_rows,
            table_id: state.table_id,
            runtimes: state.runtimes,
            _pad: 0,
        };
    }
    found
}

/// The last of the first `len` of `mappings` starting at or before `pc`, if it holds `pc`,
/// cached in `state`. `N` is a power of two and `steps` covers it (asserted in the ABI crate).
#[inline(always)]
fn search_mappings<const N: usize>(
    state: &mut WalkState,
    pc: u64,
    mappings: &[UnwindMapping; N],
    len: u32,
    steps: usize,
) -> Result<(), UnwindCounter> {
    let count = (len as usize).min(N) as u32;
    set_bounds(state, 0, count);
    for _ in 0..steps {
        let (lo, hi) = bounds(state);
        if lo >= hi {
            break;
        }
        let mid = lo + (hi - lo) / 2;
        if mappings[mid as usize & (N - 1)].start <= pc {
            set_bounds(state, mid + 1, hi);
        } else {
            set_bounds(state, lo, mid);
        }
    }
    let (lo, _) = bounds(state);
    if lo == 0 {
        return Err(UnwindCounter::NoMapping);
    }
    let mapping = &mappings[(lo - 1) as usize & (N - 1)];
    let end = mapping.end();
    if pc >= end {
        return Err(UnwindCounter::NoMapping);
    }
    state.mapping_start = mapping.start;
    state.mapping_end = end;
    state.mapping_bias = mapping.bias;
    state.mapping_table = mapping.table;
    let (rows, id, base) = match UNWIND_TABLES.get(mapping.table) {
        Some(table) if mapping.table != NO_TABLE => (table.rows, table.id, table.base_address),
        _ => (0, 0, 0),
    };
    state.table_rows = rows;
    state.table_id = id;
    state.table_base = base;
    Ok(())
}

/// Finds the row for `state.pc`: its mapping, the mapping's table, the last row at or before
/// the address.
/// [`find_row_inline`] as a global function: the verifier checks its binary searches once,
/// on their own, where inlined into the step they were checked again for every way the step
/// reached them (about 60% of `cpu_sample`'s 270,000 verified instructions). Returns the row
/// as its 8 bytes, or [`NO_ROW`] with the [`UnwindCounter`] of why in the low 32 bits.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn profiler_find_row(slot: u32) -> u64 {
    let Some(state) = UNWIND_STATE.get_ptr_mut(slot) else { return NO_ROW | UnwindCounter::NoTable as u64 };
    // SAFETY: this CPU's state of the walk of `slot`, see `walk`.
    let state = unsafe { &mut *state };
    match find_row_inline(state) {
        // SAFETY: `UnwindRow` is 8 bytes of plain integers.
        Found::Row(row) => unsafe { core::mem::transmute::<UnwindRow, u64>(row) },
        Found::Fallback(reason) => NO_ROW | reason as u64,
    }
}

/// [`profiler_find_row`]'s mark of "no row" in the kind byte (the row's last): no
/// [`UnwindKind`] is 0xff.
const NO_ROW: u64 = 0xff << 56;

/// The row for the current frame of the walk of `slot`, or the [`UnwindCounter`] of why
/// there is none.
#[inline(always)]
fn find_row(slot: u32) -> Result<UnwindRow, u32> {
    let found = profiler_find_row(slot);
    if found & NO_ROW == NO_ROW {
        Err(found as u32)
    } else {
        // SAFETY: 8 bytes that were an `UnwindRow`.
        Ok(unsafe { core::mem::transmute::<u64, UnwindRow>(found) })
    }
}

#[inline(always)]
fn find_row_inline(state: &mut WalkState) -> Found {
    // A return address is looked up inside the call instruction: a call to a `noreturn`
    // function may be the last instruction of its function.
    let pc = state.pc - (state.exact == 0) as u64;
    // Most frames are in the same file as the frame before (recursion, a library's internal
    // calls): the last mapping found saves the process lookup and the mapping search.
    if pc < state.mapping_start || pc >= state.mapping_end {
        if let Err(reason) = find_mapping_inline(state, pc) {
            return Found::Fallback(reason);
        }
    }
    if state.table_rows == 0 {
        return Found::Fallback(UnwindCounter::NoTable);
    }
    let id = state.table_id;
    let offset = pc.wrapping_sub(state.mapping_bias).wrapping_sub(state.table_base);
    if offset > u32::MAX as u64 {
        return Found::Fallback(UnwindCounter::NoCfi);
    }
    let offset = offset as u32;
    let bucket = offset >> ROW_CACHE_BUCKET_SHIFT;
    let entries = ROW_CACHE_SLOT_ENTRIES.load();
    // The set's first entry: even, so that both ways are in this slot's table (`entries` is
    // a power of two, at least 16); the shift keeps neighbouring buckets in distinct sets.
    let set = state.slot * entries
        + (((bucket ^ (bucket >> 9) ^ id.wrapping_mul(0x9e37_79b1)) << 1) & entries.wrapping_sub(2));
    if id != 0 {
        for way in 0..2 {
            if let Some(row) = cached_row(set + way, id, offset) {
                return Found::Row(row);
            }
        }
    }
    // Not cached: the table itself, as it is now. A slot reloaded since the mapping was read
    // has another load id; its rows are not this mapping's.
    let Some(table) = UNWIND_TABLES.get(state.mapping_table) else {
        return Found::Fallback(UnwindCounter::NoTable);
    };
    if table.id != id || table.rows == 0 {
        return Found::Fallback(UnwindCounter::NoTable);
    }

    // The last row with pc_offset <= offset.
    set_bounds(state, 0, table.rows);
    for _ in 0..TABLE_SEARCH_STEPS {
        let (lo, hi) = bounds(state);
        if lo >= hi {
            break;
        }
        let mid = lo + (hi - lo) / 2;
        let Some(row) = row_at(table.shards.as_ptr(), mid) else {
            return Found::Fallback(UnwindCounter::NoTable);
        };
        if row.pc_offset <= offset {
            set_bounds(state, mid + 1, hi);
        } else {
            set_bounds(state, lo, mid);
        }
    }
    let (lo, _) = bounds(state);
    if lo == 0 {
        return Found::Fallback(UnwindCounter::NoCfi);
    }
    let Some(row) = row_at(table.shards.as_ptr(), lo - 1) else {
        return Found::Fallback(UnwindCounter::NoTable);
    };
    if table.id != 0 {
        cache_row(table, lo, offset, set, row);
    }
    Found::Row(row)
}

/// Keeps `row`, row `lo − 1` of `table`, found for `offset`, in the set `set` of this
/// context's [`ROW_CACHE`].
#[inline(always)]
fn cache_row(table: &UnwindTableInfo, lo: u32, offset: u32, set: u32, row: UnwindRow) {
    // The row holds up to the next row's offset (row `lo`, in the line just read), and the
    // last row to the end of the table's reach. Unreadable: for this offset only.
    let end = if lo < table.rows {
        row_at(table.shards.as_ptr(), lo).map_or(offset.wrapping_add(1), |next| next.pc_offset)
    } else {
        u32::MAX
    };
    // Neighbouring rows take different ways.
    if let Some(entry) = ROW_CACHE.get_ptr_mut(set + ((lo - 1) & 1)) {
        // SAFETY: this CPU's entry in the cache of the walk's context, see `Scratch`: no other
        // writer while this program runs.
        unsafe { *entry = CachedRow { id: table.id, end, row } };
    }
}

/// The row cached at `index` of [`ROW_CACHE`] if it is of table `id` and covers `offset`.
#[inline(always)]
fn cached_row(index: u32, id: u32, offset: u32) -> Option<UnwindRow> {
    let cached = ROW_CACHE.get(index)?;
    (cached.id == id && cached.row.pc_offset <= offset && offset < cached.end).then_some(cached.row)
}

#[inline(always)]
fn bounds(state: &WalkState) -> (u32, u32) {
    // SAFETY: plain reads of this CPU's state slot (see `WalkState::lo`).
    unsafe { (ptr::read_volatile(&state.lo), ptr::read_volatile(&state.hi)) }
}

#[inline(always)]
fn set_bounds(state: &mut WalkState, lo: u32, hi: u32) {
    // SAFETY: plain writes to this CPU's state slot.
    unsafe {
        ptr::write_volatile(&mut state.lo, lo);
        ptr::write_volatile(&mut state.hi, hi);
    }
}

/// Row `index` of a table whose shard list is at `shards`.
#[inline(always)]
fn row_at(shards: *const u16, index: u32) -> Option<UnwindRow> {
    let chunk = (index >> SHARD_ROWS_SHIFT) as usize & (MAX_TABLE_SHARDS - 1);
    // SAFETY: `shards` points to a table's `[u16; MAX_TABLE_SHARDS]` and `chunk` is masked
    // into it.
    let shard = unsafe { *shards.add(chunk) } as u32;
    UNWIND_ROWS.get((shard << SHARD_ROWS_SHIFT) | (index & (SHARD_ROWS - 1))).copied()
}

/// The user word at `addr`, from the window when it holds it, else after refilling the
/// window around `addr`.
#[inline(always)]
fn read_word(state: &mut WalkState, addr: u64) -> Option<u64> {
    let window = STACK_WINDOW.get_ptr_mut(state.slot)?;
    // SAFETY: this CPU's window buffer for the walk's context, see `Scratch`.
    let window = unsafe { &mut *window };
    if addr < state.window_base
        || addr + 8 > state.window_base + state.window_len
        || (addr - state.window_base) & 7 != 0
    {
        // Keep a few words below `addr` (and never below the stack pointer, where the
        // mapping may end); near the top of the stack a whole window may run past the
        // mapping: then read just the word.
        let below = addr.saturating_sub(state.sp).min(WINDOW_SLACK_WORDS * 8) & !7;
        let base = addr - below;
        // SAFETY: fault-safe reads into this CPU's window buffer of `WINDOW_BYTES` bytes.
        let whole = unsafe { bpf_probe_read_user(window.as_mut_ptr().cast(), WINDOW_BYTES as u32, base as *const _) };
        if whole == 0 {
            state.window_base = base;
            state.window_len = WINDOW_BYTES;
        } else {
            // SAFETY: as above, 8 bytes.
            let word = unsafe { bpf_probe_read_user(window.as_mut_ptr().cast(), 8, addr as *const _) };
            if word != 0 {
                return None;
            }
            state.window_base = addr;
            state.window_len = 8;
        }
    }
    let index = ((addr - state.window_base) >> 3) as usize;
    Some(window[index & (STACK_WINDOW_WORDS - 1)])
}
