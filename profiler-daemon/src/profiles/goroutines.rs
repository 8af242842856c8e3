//! A Go process's goroutines as the `threads` kind's samples: one per goroutine, its stack
//! the goroutine's frames, its labels the goroutine's pprof labels plus its own facts under
//! the keys of [`crate::runtimes::go::profile`]. The creator's pc rides as the stack's
//! outermost word, to be symbolized with the rest, and is taken off again once symbolized
//! ([`take_creators`]), becoming the `CREATOR` and `CREATOR_AT` labels that
//! `goroutine?debug=2` prints as `created by`.

use std::sync::Mutex;

use crate::{
    ids::StackId,
    resolve::{LabelValue, ResolvedProfile, StackSample},
    runtimes::go::{
        profile::{CREATOR, CREATOR_AT, GOID, PARENT, STACK, STATE},
        GoDump, Goroutine,
    },
};

/// Distinct pprof label keys kept over the daemon's life (of goroutine dumps and CPU samples
/// alike): labels are keyed by `&'static str` here, so a key is interned once and kept; past the cap, new keys are dropped.
const MAX_LABEL_KEYS: usize = 4096;
static KEYS: Mutex<Vec<&'static str>> = Mutex::new(Vec::new());

/// The samples of `go`'s goroutines, their stacks keyed by `stack_id`.
pub fn samples(go: &GoDump, stack_id: impl Fn(&[u64]) -> StackId) -> Vec<StackSample> {
    go.goroutines.iter().map(|g| sample(g, stack_id(&g.frames))).collect()
}

fn sample(g: &Goroutine, user_stack: StackId) -> StackSample {
    let mut state = g.state.clone();
    if g.wait_minutes >= 1 {
        state.push_str(&format!(", {} minutes", g.wait_minutes));
    }
    if g.locked_to_thread {
        state.push_str(", locked to thread");
    }
    let mut stack = g.stack.describe().to_string();
    if g.moving {
        stack.push_str(", moved while read");
    }
    let mut labels =
        vec![(GOID, LabelValue::Num(g.goid, None)), (STATE, LabelValue::Str(state)), (STACK, LabelValue::Str(stack))];
    if g.gopc != 0 {
        labels.push((CREATOR, LabelValue::Num(1, None)));
    }
    if let Some(parent) = g.parent_goid {
        labels.push((PARENT, LabelValue::Num(parent, None)));
    }
    for (key, value) in g.labels.iter().flat_map(|labels| labels.iter()) {
        if let Some(key) = intern(key) {
            labels.push((key, LabelValue::Str(value.clone())));
        }
    }
    StackSample {
        user_stack,
        kernel_stack: StackId::NONE,
        user_leaf_is_return: !g.stack.exact_leaf(),
        values: vec![1],
        unscaled: Vec::new(),
        labels,
    }
}

/// `key` as a `&'static str`, interned; `None` past [`MAX_LABEL_KEYS`].
pub(super) fn intern(key: &str) -> Option<&'static str> {
    let mut keys = KEYS.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    if let Some(&known) = keys.iter().find(|&&k| k == key) {
        return Some(known);
    }
    if keys.len() >= MAX_LABEL_KEYS {
        return None;
    }
    let leaked: &'static str = Box::leak(key.to_string().into_boxed_str());
    keys.push(leaked);
    Some(leaked)
}

/// Takes each goroutine's creator frame (its stack's outermost location) off its stack,
/// into the [`CREATOR`] and [`CREATOR_AT`] labels, as Go's `created by` line names it: the
/// function holding the `go` statement, its file and line, and the offset of the pc.
pub fn take_creators(resolved: &mut ResolvedProfile) {
    let locations = &resolved.locations;
    for sample in &mut resolved.samples {
        let Some(at) = sample.labels.iter().position(|(k, _)| *k == CREATOR) else { continue };
        let Some(location) = sample.locations.pop() else {
            sample.labels.remove(at);
            continue;
        };
        let info = &locations[location];
        let (name, place) = match info.frames.last() {
            // The pc is a return address: Go prints its offset, one past the call's.
            Some(f) => {
                (f.function.clone(), format!("{}:{} +{:#x}", f.file.as_deref().unwrap_or("?"), f.line, f.offset + 1))
            }
            None => (format!("{:#x}", info.address + 1), "?:0".to_string()),
        };
        sample.labels[at] = (CREATOR, LabelValue::Str(name));
        sample.labels.push((CREATOR_AT, LabelValue::Str(place)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtimes::go::{layout, profile::is_fact, GoroutineStack};

    fn goroutine(goid: i64, labels: Option<crate::runtimes::go::labels::Labels>) -> Goroutine {
        Goroutine {
            goid,
            status: layout::G_WAITING,
            state: "chan receive".into(),
            wait_minutes: 3,
            locked_to_thread: false,
            frames: vec![0x10, 0x20, 0x30],
            truncated: false,
            stack: GoroutineStack::Saved,
            gopc: 0x30,
            parent_goid: None,
            labels,
            moving: false,
        }
    }

    #[test]
    fn a_goroutine_is_one_sample_with_its_facts_and_pprof_labels() {
        let go = GoDump {
            goroutines: vec![goroutine(7, Some(vec![("worker".into(), "a".into())].into())), goroutine(8, None)],
            ..GoDump::default()
        };
        let samples = samples(&go, |frames| StackId(frames.len() as u64));
        assert_eq!(samples.len(), 2);
        let labels = &samples[0].labels;
        assert!(labels.contains(&(GOID, LabelValue::Num(7, None))));
        assert!(labels.contains(&(STATE, LabelValue::Str("chan receive, 3 minutes".into()))));
        assert!(labels.contains(&("worker", LabelValue::Str("a".into()))));
        assert!(labels.contains(&(CREATOR, LabelValue::Num(1, None))));
        assert!(samples[0].user_leaf_is_return, "a saved pc is a return address");
        assert!(!samples[1].labels.iter().any(|(k, _)| !is_fact(k)), "no pprof labels");
        assert_eq!(samples[0].user_stack, StackId(3));
    }
}
