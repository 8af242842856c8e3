//! Bounding the since-start totals of processes that churn threads: their CPU and off-CPU
//! counts are keyed by thread id, so a server that replaces its worker threads all day adds
//! keys forever. Past [`THREADS_KEPT`] threads in one process's counts, the entries of
//! threads that have exited are folded under [`Tid::EXITED`], labelled
//! [`EXITED_THREADS`]: the values stay, by stack; only the exited threads' ids go.

use std::{
    collections::{HashMap, HashSet},
    hash::Hash,
};

use crate::ids::Tid;

/// Thread ids one process's counts keep before exited ones are folded.
pub const THREADS_KEPT: usize = 256;

/// The `thread` label of folded entries.
pub const EXITED_THREADS: &str = "(exited threads)";

/// Folds the entries of exited threads of `samples` (keyed by thread through `tid`) under
/// [`Tid::EXITED`] when `threads` (thread id → name) holds more than [`THREADS_KEPT`];
/// `alive` says whether a thread still exists. Returns the threads folded.
pub fn fold<K, V>(
    samples: &mut HashMap<K, V>,
    threads: &mut HashMap<Tid, String>,
    tid: impl Fn(&mut K) -> &mut Tid,
    merge: impl Fn(&mut V, V),
    alive: impl Fn(Tid) -> bool,
) -> usize
where
    K: Eq + Hash,
    V: Default,
{
    if threads.len() <= THREADS_KEPT {
        return 0;
    }
    let gone: HashSet<Tid> = threads.keys().copied().filter(|&t| t != Tid::EXITED && !alive(t)).collect();
    if gone.is_empty() {
        return 0;
    }
    let mut folded = HashMap::with_capacity(samples.len());
    for (mut key, value) in samples.drain() {
        let thread = tid(&mut key);
        if gone.contains(thread) {
            *thread = Tid::EXITED;
        }
        merge(folded.entry(key).or_default(), value);
    }
    *samples = folded;
    threads.retain(|t, _| !gone.contains(t));
    threads.insert(Tid::EXITED, EXITED_THREADS.to_string());
    gone.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exited_threads_fold_by_stack_past_the_limit_only() {
        let n = THREADS_KEPT as u32 + 10;
        // Each thread has one sample of stack (tid % 2); odd tids have exited.
        let mut samples: HashMap<(Tid, u64), u64> = (1..=n).map(|t| ((Tid(t), u64::from(t % 2)), 1)).collect();
        let mut threads: HashMap<Tid, String> = (1..=n).map(|t| (Tid(t), format!("t{t}"))).collect();
        let alive = |t: Tid| t.0.is_multiple_of(2);
        let folded = fold(&mut samples, &mut threads, |k| &mut k.0, |v, n| *v += n, alive);
        assert_eq!(folded, n as usize / 2);
        assert_eq!(samples.values().sum::<u64>(), u64::from(n), "nothing lost");
        assert_eq!(samples[&(Tid::EXITED, 1)], u64::from(n / 2), "the exited threads' stack, summed");
        assert_eq!(threads.len(), n as usize / 2 + 1);
        assert_eq!(threads[&Tid::EXITED], EXITED_THREADS);
        // Under the limit nothing is folded.
        let mut few: HashMap<(Tid, u64), u64> = [((Tid(3), 1), 1)].into();
        let mut names: HashMap<Tid, String> = [(Tid(3), "t3".to_string())].into();
        assert_eq!(fold(&mut few, &mut names, |k| &mut k.0, |v, n| *v += n, |_| false), 0);
        assert!(few.contains_key(&(Tid(3), 1)));
    }
}
