//! The state of one user-stack walk, which the native walker ([`crate::user_stack`]) and
//! every interpreter's walker ([`crate::runtimes`]) push frames onto: the per-CPU
//! [`WalkState`] and the scratch stack it hashes as it grows. Below both walkers, so neither
//! imports the other's internals to add a frame.

use core::ptr;

use aya_ebpf::{macros::map, maps::PerCpuArray};
use profiler_common::{
    stack::{hash_frame, STACK_TRUNCATED},
    WalkTotals, MAX_USER_STACK_DEPTH, STACK_CHUNKS, STACK_PIECE_FRAMES, WALK_STATE_BYTES,
};

use crate::maps::{SCRATCH_SLOTS, STACK_SCRATCH};

#[map]
pub static UNWIND_STATE: PerCpuArray<WalkState> = PerCpuArray::with_max_entries(SCRATCH_SLOTS, 0);

/// The registers of the frame being unwound, in a per-CPU map (the `bpf_loop` callback and
/// its caller share it).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct WalkState {
    /// Frames this context stepped on this CPU since load, by a table row and by frame
    /// pointers (`profiler_common::WalkTotals`, which userspace adds to `UNWIND_COUNTERS`'
    /// figures). First, and never reset: a separate counter bump per walk touched one more
    /// cold cache line per sample, about 4% of it at 99 Hz.
    pub(crate) totals: WalkTotals,
    pub(crate) pc: u64,
    pub(crate) sp: u64,
    pub(crate) bp: u64,
    /// Bounds of the stack: frames lie in `[lowest sp, stack_top)`.
    pub(crate) stack_top: u64,
    /// User stack bytes copied into `STACK_WINDOW`: `[window_base, window_base + window_len)`.
    pub(crate) window_base: u64,
    pub(crate) window_len: u64,
    /// Binary-search bounds, kept in map memory and accessed volatile: the verifier then
    /// sees unknown values at every loop head and prunes the search's paths instead of
    /// following each of its 2^22 branch combinations.
    pub(crate) lo: u32,
    pub(crate) hi: u32,
    /// The mapping of the last frame looked up (`mapping_end` 0: none yet).
    pub(crate) mapping_start: u64,
    pub(crate) mapping_end: u64,
    pub(crate) mapping_bias: u64,
    pub(crate) mapping_table: u32,
    pub(crate) tgid: u32,
    /// 1 when `pc` is exact (the sampled pc, or restored from a signal frame), 0 when it is a
    /// return address (looked up at pc − 1, inside the call).
    pub(crate) exact: u32,
    /// The `Scratch` slot of the walking program: which `STACK_WINDOW` entry is its own.
    pub(crate) slot: u32,
    /// The runtimes the process may run, as its entry's flags say
    /// (`profiler_common::unwind::process_runtime`); every runtime's flag until the entry is
    /// read, so an unregistered process is still looked up in the runtimes' maps.
    pub(crate) runtimes: u32,
    /// The rows, load id and base address of `mapping_table`'s table, read with the mapping
    /// (rows 0: none): a frame whose row is cached needs no lookup of the table.
    pub(crate) table_rows: u32,
    pub(crate) table_id: u32,
    /// The frames so far folded into the stack's hash (`profiler_common::stack`).
    pub(crate) hash: u64,
    pub(crate) table_base: u64,
    /// `CONTROL`'s unwind epochs when the walk began (see [`KeptMapping`]).
    pub(crate) epoch: u32,
    pub(crate) exec_epoch: u32,
    /// The `[uprobes]` trampoline's address and the next uretprobe instance not yet matched
    /// to a frame, when the thread has a uretprobe pending (0: none; see
    /// [`crate::uprobe_frames`]).
    pub(crate) trampoline: u64,
    pub(crate) return_instance: u64,
    /// Mappings found by earlier walks of this context on this CPU, by a hash of the
    /// process and the address's 2 MiB region. Not reset by a walk. Used only by the
    /// contexts that cannot be preempted mid-walk (see `user_stack::find_mapping`).
    pub(crate) kept: [KeptMapping; KEPT_MAPPINGS],
}

// Userspace reads the entries as this many bytes (see `WalkTotals`).
const _: () = assert!(core::mem::size_of::<WalkState>() == WALK_STATE_BYTES);

/// Entries of [`WalkState::kept`] (a power of two).
pub(crate) const KEPT_MAPPINGS: usize = 4;

/// A mapping a walk found, kept for the next walks on the CPU: a sample usually repeats the
/// process and files of the one before, and finding a mapping again (the process's hash
/// entry, a binary search through its list, the table's entry) touched about ten cache
/// lines that the 10 ms between samples leave cold. Valid while `CONTROL`'s epochs equal
/// those read before the process was: userspace counts each change of a process's list or a
/// table after making it, the exec program each unregistration.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct KeptMapping {
    /// 0: empty (no process has tgid 0).
    pub(crate) tgid: u32,
    pub(crate) epoch: u32,
    pub(crate) exec_epoch: u32,
    pub(crate) table: u32,
    pub(crate) start: u64,
    pub(crate) end: u64,
    pub(crate) bias: u64,
    pub(crate) table_base: u64,
    pub(crate) table_rows: u32,
    pub(crate) table_id: u32,
    pub(crate) runtimes: u32,
    pub(crate) _pad: u32,
}

/// [`push_word`] onto the walk of `slot`, folding `word` into its hash.
#[inline(always)]
pub fn push_to_walk(slot: u32, word: u64) -> bool {
    let Some(state) = UNWIND_STATE.get_ptr_mut(slot) else { return false };
    // SAFETY: this CPU's slot, see `user_stack::walk`.
    let state = unsafe { &mut *state };
    push_word(slot, word, &mut state.hash)
}

/// Appends `word` (an address, or an interpreter's frame word) to the scratch stack of
/// `slot` and folds it into `hash`. False at the depth limit, where the stack is marked
/// truncated and `word` left out.
#[inline(always)]
pub fn push_word(slot: u32, word: u64, hash: &mut u64) -> bool {
    // The first piece holds the walk's length and flags; frame n goes to piece
    // n / STACK_PIECE_FRAMES (see `profiler_common::stack`).
    let first = slot * STACK_CHUNKS as u32;
    let Some(head) = STACK_SCRATCH.get_ptr_mut(first) else { return false };
    // SAFETY: this CPU's slot, see `user_stack::walk`. `head` may be the piece written below, so it is
    // only accessed through the raw pointer.
    let len = unsafe { (*head).len } as usize;
    if len >= MAX_USER_STACK_DEPTH {
        // SAFETY: as above.
        unsafe { (*head).truncated = STACK_TRUNCATED };
        return false;
    }
    // The compiler knows `len % STACK_PIECE_FRAMES` is in bounds and drops the check; the
    // verifier cannot follow `%`. A volatile read hides the range so the check stays.
    let at = len % STACK_PIECE_FRAMES;
    // SAFETY: a read of a local.
    let at = unsafe { ptr::read_volatile(&at) };
    // Most stacks fit the first piece, already at hand: no second lookup.
    let piece = if len < STACK_PIECE_FRAMES {
        Some(head)
    } else {
        STACK_SCRATCH.get_ptr_mut(first + (len / STACK_PIECE_FRAMES) as u32)
    };
    if let Some(piece) = piece {
        // SAFETY: as above.
        if let Some(ip) = unsafe { (*piece).ips.get_mut(at) } {
            *ip = word;
        }
    }
    // SAFETY: as above.
    unsafe { (*head).len = len as u32 + 1 };
    *hash = hash_frame(*hash, word);
    true
}
