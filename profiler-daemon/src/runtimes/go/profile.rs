//! The label keys under which a goroutine's own facts ride on its sample ([`GOID`],
//! [`STATE`], [`STACK`], [`CREATOR`], …), beside its pprof labels: what
//! `profiles::goroutines` writes and `pprof::goroutine_text` reads. Here, below both, so
//! neither depends on the other.

/// The goroutine's id.
pub const GOID: &str = "goroutine";
/// Go's bracket text: `chan receive, 2 minutes`.
pub const STATE: &str = "goroutine_state";
/// Where its frames come from.
pub const STACK: &str = "goroutine_stack";
/// Before symbolization 1 (the stack's last word is the creator's pc); after, the creating
/// function's name.
pub const CREATOR: &str = "goroutine_created_by";
/// `file:line +0xoff` of the `go` statement.
pub const CREATOR_AT: &str = "goroutine_created_at";
/// The creator's goroutine id (Go 1.21 on).
pub const PARENT: &str = "goroutine_parent";

/// Whether a sample label is one of the goroutine's own facts (not a pprof label).
pub fn is_fact(key: &str) -> bool {
    key == GOID || key.starts_with("goroutine_")
}
