//! Python frames in place of the interpreter loop's native frames, once a stack is
//! symbolized: one activation of `_PyEval_EvalFrameDefault` runs the frames up to and
//! including the next entry frame, so the loop's frames and the runs pair up in order, leaf
//! first. Python frames get locations of a mapping of their own, [`PYTHON_MAPPING`], one per
//! (function, file, line). Shared by thread dumps (frames read from the process) and sampled
//! profiles (frames walked by the kernel).

use std::collections::HashMap;

use super::{LabelValue, LocationInfo, MappingInfo, ResolvedProfile, PYTHON_MAPPING};
use crate::{python::PythonFrame, symbolize::Frame};

/// Where Python frames' locations are numbered from: not a canonical address, above every
/// user one and below where hidden kernel addresses start
/// ([`super::HIDDEN_KERNEL_BASE`]), so none is mistaken for code.
pub const PYTHON_BASE: u64 = 0x4000_0000_0000_0000;

/// The interpreter loop's function: one native activation runs a run of Python frames.
pub const EVAL_FUNCTION: &str = "_PyEval_EvalFrameDefault";

/// Puts `python[i]` (leaf first) in place of sample `i`'s `_PyEval_EvalFrameDefault`
/// locations: the n-th activation of the loop (leaf first) by the n-th run of Python frames.
/// Runs left over (a native walk cut short) are not placed, and the sample's `python` label
/// says how many frames; loop frames left over keep their native name. Samples past the end
/// of `python`, or with no frames, are left as they are.
pub fn merge(resolved: &mut ResolvedProfile, python: &[&[PythonFrame]]) {
    if python.iter().all(|frames| frames.is_empty()) {
        return;
    }
    // A profile merged before (a thread dump's running threads, merged with their sampled
    // stacks) has its Python mapping: number on from its end.
    let existing = resolved.mappings.iter().position(|m| m.path == PYTHON_MAPPING);
    let mapping = existing.unwrap_or(resolved.mappings.len());
    let first = existing.map_or(PYTHON_BASE, |m| resolved.mappings[m].limit);
    let mut interned: HashMap<(&str, &str, u32), usize> = HashMap::new();
    let mut samples = std::mem::take(&mut resolved.samples);
    for (sample, frames) in samples.iter_mut().zip(python) {
        if frames.is_empty() {
            continue;
        }
        let mut runs = frames.split_inclusive(|f| f.entry).peekable();
        let mut merged = Vec::with_capacity(sample.locations.len() + frames.len());
        for &location in &sample.locations {
            let is_eval = resolved.locations[location].frames.iter().any(|f| f.function == EVAL_FUNCTION);
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
        let left: usize = runs.map(<[PythonFrame]>::len).sum();
        if left > 0 {
            // Said on the sample, not dropped silently: the native walk ended before the
            // loop frames that ran these (a cut or failed walk).
            sample.labels.push(("python", LabelValue::Str(format!("{left} outer Python frames not placed"))));
        }
    }
    resolved.samples = samples;
    resolved.frames.locations += interned.len() as u64;
    let limit = first + interned.len() as u64;
    match existing {
        Some(m) => resolved.mappings[m].limit = limit,
        None if !interned.is_empty() => resolved.mappings.push(MappingInfo {
            start: PYTHON_BASE,
            limit,
            offset: 0,
            path: PYTHON_MAPPING.into(),
            build_id: None,
            has_functions: true,
            has_lines: true,
            has_inline_frames: false,
        }),
        None => {}
    }
}

/// A new location for `frame` at `address` of the Python mapping.
fn location_for(locations: &mut Vec<LocationInfo>, mapping: usize, address: u64, frame: &PythonFrame) -> usize {
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
