//! Interpreted frames in place of the interpreter loop's native frames, once a stack is
//! symbolized: one activation of the runtime's loop function ([`Runtime::loop_function`])
//! runs the frames up to and including the next entry frame, so the loop's frames and the
//! runs pair up in order, leaf first. Interpreted frames get locations of a mapping of their
//! own ([`Runtime::mapping`]), one per (function, file, line). Shared by thread dumps
//! (frames read from the process) and sampled profiles (frames walked by the kernel).
//!
//! The rule is the one of a runtime whose loop is a native function; a runtime whose frames
//! run without one (a JIT's) adds its own rule here, chosen by [`Runtime`].

use std::collections::HashMap;

use super::{LabelValue, LocationInfo, MappingInfo, ResolvedProfile};
use crate::{
    runtimes::{Runtime, RuntimeFrame},
    symbolize::Frame,
};

/// Where interpreted frames' locations are numbered from: not a canonical address, above
/// every user one and below where hidden kernel addresses start
/// ([`super::HIDDEN_KERNEL_BASE`]), so none is mistaken for code. Each runtime's mapping
/// starts at its own 2^48 ([`base`]).
pub const INTERPRETED_BASE: u64 = 0x4000_0000_0000_0000;

/// Where `runtime`'s frames' locations are numbered from.
fn base(runtime: Runtime) -> u64 {
    INTERPRETED_BASE + ((runtime as u64) << 48)
}

/// Whether `mapping` holds a runtime's frames (whose function names are final).
pub fn is_interpreted_mapping(mapping: &MappingInfo) -> bool {
    Runtime::ALL.into_iter().any(|runtime| mapping.path == runtime.mapping())
}

/// Puts `frames[i]` (leaf first) of `runtime` in place of sample `i`'s locations of its loop
/// function: the n-th activation of the loop (leaf first) by the n-th run of frames. Runs
/// left over (a native walk cut short) are not placed, and the sample's label
/// ([`Runtime::label`]) says how many frames; loop frames left over keep their native name.
/// Samples past the end of `frames`, or with no frames, are left as they are.
pub fn merge(resolved: &mut ResolvedProfile, runtime: Runtime, frames: &[&[RuntimeFrame]]) {
    if frames.iter().all(|frames| frames.is_empty()) {
        return;
    }
    let (path, loop_function) = (runtime.mapping(), runtime.loop_function());
    // A profile merged before (a thread dump's running threads, merged with their sampled
    // stacks) has the runtime's mapping: number on from its end.
    let existing = resolved.mappings.iter().position(|m| m.path == path);
    let mapping = existing.unwrap_or(resolved.mappings.len());
    let first = existing.map_or(base(runtime), |m| resolved.mappings[m].limit);
    let mut interned: HashMap<(&str, &str, u32), usize> = HashMap::new();
    let mut samples = std::mem::take(&mut resolved.samples);
    for (sample, frames) in samples.iter_mut().zip(frames) {
        if frames.is_empty() {
            continue;
        }
        let mut runs = frames.split_inclusive(|f| f.entry).peekable();
        let mut merged = Vec::with_capacity(sample.locations.len() + frames.len());
        for &location in &sample.locations {
            let is_eval = resolved.locations[location].frames.iter().any(|f| f.function == loop_function);
            let Some(run) = runs.next_if(|_| is_eval) else {
                merged.push(location);
                continue;
            };
            for frame in run {
                let next = first + interned.len() as u64;
                let key = (frame.qualname.as_str(), frame.filename.as_str(), frame.line);
                let index =
                    *interned.entry(key).or_insert_with(|| location_for(&mut resolved.locations, mapping, next, frame));
                merged.push(index);
            }
        }
        sample.locations = merged;
        let left: usize = runs.map(<[RuntimeFrame]>::len).sum();
        if left > 0 {
            // Said on the sample, not dropped silently: the native walk ended before the
            // loop frames that ran these (a cut or failed walk).
            let said = format!("{left} outer {} frames not placed", runtime.language());
            sample.labels.push((runtime.label(), LabelValue::Str(said)));
        }
    }
    resolved.samples = samples;
    resolved.frames.locations += interned.len() as u64;
    let limit = first + interned.len() as u64;
    match existing {
        Some(m) => resolved.mappings[m].limit = limit,
        None if !interned.is_empty() => resolved.mappings.push(MappingInfo {
            start: base(runtime),
            limit,
            offset: 0,
            path: path.into(),
            build_id: None,
            has_functions: true,
            has_lines: true,
            has_inline_frames: false,
        }),
        None => {}
    }
}

/// A new location for `frame` at `address` of the runtime's mapping.
fn location_for(locations: &mut Vec<LocationInfo>, mapping: usize, address: u64, frame: &RuntimeFrame) -> usize {
    locations.push(LocationInfo {
        address,
        mapping: Some(mapping),
        frames: vec![Frame {
            function: frame.qualname.clone(),
            file: Some(frame.filename.clone()),
            line: frame.line,
            offset: 0,
        }],
    });
    locations.len() - 1
}
