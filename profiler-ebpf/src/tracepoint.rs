//! Reading fields of tracepoint records, shared by the futex, thread-creation and exec programs.

use aya_ebpf::{programs::TracePointContext, EbpfContext};

/// A tracepoint record field. Records are readable directly (the verifier checks the offset
/// against the record), which is cheaper than a probe-read helper.
#[inline(always)]
pub fn read_field(ctx: &TracePointContext, offset: usize) -> u64 {
    // SAFETY: an aligned 8-byte field inside the tracepoint record.
    unsafe { core::ptr::read_volatile(ctx.as_ptr().cast::<u8>().add(offset).cast::<u64>()) }
}

/// A 4-byte field: the verifier checks a read's end against the record's fixed part, so a
/// trailing 4-byte field cannot be read as 8 bytes (the program would be refused at attach).
#[inline(always)]
pub fn read_field_u32(ctx: &TracePointContext, offset: usize) -> u32 {
    // SAFETY: an aligned 4-byte field inside the tracepoint record.
    unsafe { core::ptr::read_volatile(ctx.as_ptr().cast::<u8>().add(offset).cast::<u32>()) }
}
