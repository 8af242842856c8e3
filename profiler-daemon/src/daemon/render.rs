//! Turns one process's counts into a finished profile: the daemon's path through
//! profiles → resolve → pprof, shared by interval dumps and socket queries.

use std::time::{Duration, SystemTime};

use crate::{
    aggregate::{Aggregate, KnownProcess, ProcessCounts},
    config::ProfileKind,
    pprof::{self, proto::Profile},
    primitive, profiles, resolve,
    symbolize::Symbolizer,
};

/// Settings that shape profiles.
#[derive(Clone, Copy, Debug)]
pub struct RenderSettings {
    pub frequency_hz: u32,
    pub heap_sample_bytes: u64,
}

/// What a rendered profile covers.
#[derive(Clone, Debug)]
pub struct Window {
    pub start: SystemTime,
    pub duration: Duration,
}

/// Renders `kind` for `process` from `counts`; `alloc_default` makes `alloc_space` the
/// default sample type of a heap profile (Go's `allocs`). Block and mutex samples get their
/// `primitive` label here, after symbolization.
#[allow(clippy::too_many_arguments)]
pub fn render(
    agg: &Aggregate,
    process: &KnownProcess,
    counts: &ProcessCounts,
    kind: ProfileKind,
    alloc_default: bool,
    settings: RenderSettings,
    window: &Window,
    comments: Vec<String>,
    sym: &mut Symbolizer,
) -> Option<Profile> {
    let (mut shape, samples) = match kind {
        ProfileKind::Cpu => profiles::cpu(counts, settings.frequency_hz),
        ProfileKind::Heap => profiles::heap(counts, settings.heap_sample_bytes),
        ProfileKind::Block => profiles::block(counts),
        ProfileKind::Mutex => profiles::mutex(counts),
        ProfileKind::ThreadCreate => profiles::threadcreate(counts),
    };
    if alloc_default {
        shape.default_sample_type = "alloc_space";
    }
    let mut resolved = resolve::resolve(process, agg, samples, sym);
    if matches!(kind, ProfileKind::Block | ProfileKind::Mutex) {
        primitive::label(&mut resolved);
    }
    let meta = pprof::ProfileMeta { start: window.start, duration: window.duration, comments };
    Some(pprof::encode(&resolved, &shape, &meta))
}
