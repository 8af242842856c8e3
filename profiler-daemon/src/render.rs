//! One process's counts to a finished profile: the kind's samples → resolve (symbols) → the
//! kind's labels → pprof. The one path from counts to bytes, shared by snapshots, interval
//! dumps and socket queries.

use std::{
    collections::HashMap,
    time::{Duration, SystemTime},
};

use crate::{
    catalog::{Catalog, KnownProcess},
    ebpf::Counters,
    ids::Pid,
    pprof::{self, Encoded},
    profiles::{Context, ProcessCounts, ProfileKind, Settings, View},
    resolve::{self, Namers, ResolvedProfile},
};

/// What a rendered profile covers.
#[derive(Clone, Copy, Debug)]
pub struct Window {
    pub start: SystemTime,
    pub duration: Duration,
}

/// What every profile of one render pass shares.
pub struct Renderer<'a> {
    pub catalog: &'a Catalog,
    pub settings: Settings,
    pub context: Context,
    pub window: Window,
    /// The kernel's counters, for the comments' drop counts.
    pub counters: &'a Counters,
    /// Whether kernel addresses are shown (root) or hidden (anyone else; see
    /// [`ResolvedProfile::hide_kernel_addresses`]).
    pub kernel_addresses: bool,
}

/// A finished profile and what a summary says of it.
#[derive(Clone, Debug)]
pub struct Rendered {
    pub pid: Pid,
    pub name: String,
    pub kind: ProfileKind,
    pub encoded: Encoded,
    /// The kind's headline value summed over samples (CPU samples, live bytes, delay, threads).
    pub value: u64,
    /// The leaf function with the largest headline value; `-` when there is none.
    pub hottest: String,
}

impl Renderer<'_> {
    /// `view` of `process` from `counts` in Go's text layout for the kind (`debug=1`, or 2
    /// for the thread dump's per-thread layout).
    pub fn text(
        &self,
        process: &KnownProcess,
        counts: &ProcessCounts,
        view: View,
        debug: u8,
        sym: &mut Namers,
    ) -> String {
        let kind = view.kind;
        let mut resolved = resolve::resolve(process, self.catalog, kind.samples(counts, &self.settings), sym);
        if !self.kernel_addresses {
            resolved.hide_kernel_addresses();
        }
        // The text form has no comments to say what the rule left out.
        let _ = kind.label(&mut resolved, counts);
        pprof::go_text(&resolved, kind.text_format(&self.settings, debug))
    }

    /// Renders `view` of `process` from `counts`. `notes` are extra comment lines (e.g. what
    /// was probed).
    pub fn render(
        &self,
        process: &KnownProcess,
        counts: &ProcessCounts,
        view: View,
        notes: Vec<String>,
        sym: &mut Namers,
    ) -> Rendered {
        let kind = view.kind;
        let mut shape = kind.shape(&self.settings);
        if let Some(default) = view.default_sample_type() {
            shape.default_sample_type = default;
        }
        let samples = kind.samples(counts, &self.settings);
        let mut resolved = resolve::resolve(process, self.catalog, samples, sym);
        let left_out = kind.label(&mut resolved, counts);
        let mut comments = kind.comments(self.context, self.counters, &self.settings, counts);
        comments.extend(left_out);
        comments.extend(resolved.notes.iter().cloned());
        if !self.kernel_addresses && resolved.hide_kernel_addresses() {
            comments.push(format!(
                "kernel addresses are shown from {:#x} on, relative to the lowest: only root sees where the kernel is",
                resolve::HIDDEN_KERNEL_BASE
            ));
        }
        if process.info.is_none() {
            comments.push("the process exited before its mappings could be read: user frames unsymbolized".into());
        }
        comments.push(attribution(process));
        if process.stacks_over_share > 0 {
            comments.push(format!(
                "refused a new stack {} times since it was first seen (once per sample in the kernel, \
                 once per stack and drain in the daemon): this process held its share of the kernel's \
                 stack table or the daemon's ([limits] process_share_percent, uid_share_percent); those \
                 samples count without frames",
                process.stacks_over_share
            ));
        }
        comments.extend(notes);
        let meta = pprof::ProfileMeta { start: self.window.start, duration: self.window.duration, comments };
        let encoded = pprof::encode(&resolved, &shape, &meta);
        let index = kind.headline().value_index;
        let value = resolved.samples.iter().map(|s| s.values.get(index).copied().unwrap_or(0)).sum::<i64>();
        Rendered {
            pid: process.pid,
            name: process.name.clone(),
            kind,
            encoded,
            value: value.max(0) as u64,
            hottest: hottest_function(&resolved, index),
        }
    }
}

/// Who the process is, as its profile says: pid, name, executable, owner, cgroup, and the
/// systemd unit and container its cgroup names (what `[processes]` matchers select by).
fn attribution(process: &KnownProcess) -> String {
    let info = process.info.as_ref();
    let or_unknown = |value: Option<String>| value.unwrap_or_else(|| "unknown".into());
    let cgroup = info.and_then(|i| i.cgroup.clone());
    let uid = info.map(|i| i.uid).filter(|&uid| uid != crate::procs::UNKNOWN_UID);
    format!(
        "process {} (pid {}): executable {}, uid {}, cgroup {}, unit {}, container {}",
        process.name,
        process.pid,
        or_unknown(info.and_then(|i| i.exe.as_ref()).map(|e| e.display().to_string())),
        or_unknown(uid.map(|u| u.to_string())),
        or_unknown(cgroup.clone()),
        cgroup.as_deref().and_then(crate::procs::unit_of).unwrap_or("none"),
        cgroup.as_deref().and_then(crate::procs::container_of).unwrap_or("none"),
    )
}

/// The function with the largest self value at `value_index` (the leaf frame's innermost
/// function).
fn hottest_function(resolved: &ResolvedProfile, value_index: usize) -> String {
    let mut flat = HashMap::<String, i64>::new();
    for sample in &resolved.samples {
        let Some(&leaf) = sample.locations.first() else { continue };
        let loc = &resolved.locations[leaf];
        let name = loc.frames.first().map_or_else(|| format!("{:#x}", loc.address), |f| f.function.clone());
        *flat.entry(name).or_default() += sample.values.get(value_index).copied().unwrap_or(0);
    }
    flat.into_iter()
        .filter(|(_, v)| *v > 0)
        .max_by(|a, b| a.1.cmp(&b.1).then_with(|| b.0.cmp(&a.0)))
        .map_or_else(|| "-".into(), |(name, _)| name)
}
