//! Reading fields of tracepoint records, shared by the futex and thread-creation programs.

use aya_ebpf::{programs::TracePointContext, EbpfContext};

/// A tracepoint record field. Records are readable directly (the verifier checks the offset
/// against the record), which is cheaper than a probe-read helper.
#[inline(always)]
pub fn read_field(ctx: &TracePointContext, offset: usize) -> u64 {
    // SAFETY: an aligned 8-byte field inside the tracepoint record.
    unsafe { core::ptr::read_volatile(ctx.as_ptr().cast::<u8>().add(offset).cast::<u64>()) }
}
