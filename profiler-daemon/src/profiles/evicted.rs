//! Bounding the since-start totals of processes that make new stacks all day (data-driven
//! recursion, generated code): the catalogue keeps at most its table's stacks and evicts the
//! oldest history to make room for new ones (`Catalog::evict_history`), but the totals are
//! keyed by stack, so they kept a key for every stack ever seen, long after its frames were
//! gone. After each dump, the entries naming a stack the catalogue no longer holds (evicted,
//! or never kept: refused while the table was full of newer stacks, or over a process's
//! share) are folded under [`StackId::EVICTED`]: their values stay, by thread, state and
//! operation; only the stacks go, as they already had.

use std::{collections::HashMap, hash::Hash};

use crate::ids::StackId;

/// Rewrites the keys of `map` that `rewrite` changes (it returns whether it changed the key it
/// was given) and merges the values that then share a key. Returns the entries rewritten.
pub fn fold<K, V>(map: &mut HashMap<K, V>, rewrite: impl Fn(&mut K) -> bool, merge: impl Fn(&mut V, V)) -> usize
where
    K: Eq + Hash + Copy,
    V: Default,
{
    // (old key, new key), each key rewritten once.
    let stale: Vec<(K, K)> = map
        .keys()
        .filter_map(|&key| {
            let mut folded = key;
            rewrite(&mut folded).then_some((key, folded))
        })
        .collect();
    for (key, folded) in &stale {
        let Some(value) = map.remove(key) else { continue };
        merge(map.entry(*folded).or_default(), value);
    }
    stale.len()
}

/// `id`, or [`StackId::EVICTED`] when `held` says the catalogue no longer has its frames.
/// Returns whether it changed.
pub fn evict(id: &mut StackId, held: &impl Fn(StackId) -> bool) -> bool {
    if held(*id) {
        return false;
    }
    *id = StackId::EVICTED;
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_of_evicted_stacks_fold_together_and_keep_their_values() {
        // (thread, stack) → samples; stacks 2 and 4 are held, 6 and 8 were evicted.
        let mut samples: HashMap<(u32, StackId), u64> = [
            ((1, StackId(2)), 1),
            ((1, StackId(6)), 10),
            ((1, StackId(8)), 100),
            ((2, StackId(4)), 1_000),
            ((2, StackId(8)), 10_000),
        ]
        .into();
        let held = |id: StackId| id == StackId(2) || id == StackId(4) || id == StackId::EVICTED;
        let folded = fold(&mut samples, |k| evict(&mut k.1, &held), |v, n| *v += n);
        assert_eq!(folded, 3);
        assert_eq!(samples.values().sum::<u64>(), 11_111, "nothing lost");
        assert_eq!(samples[&(1, StackId::EVICTED)], 110, "one thread's evicted stacks, summed");
        assert_eq!(samples[&(2, StackId::EVICTED)], 10_000);
        assert_eq!(samples[&(1, StackId(2))], 1, "held stacks keep their entries");
        assert_eq!(samples.len(), 4);
        // Folding again changes nothing: the folded key is held.
        assert_eq!(fold(&mut samples, |k| evict(&mut k.1, &held), |v, n| *v += n), 0);
    }
}
