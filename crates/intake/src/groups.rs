//! Parallel work over a batch: in order, or in groups that keep each sender's transactions
//! together.

use std::{
    collections::HashMap,
    hash::Hash,
    sync::{Mutex, PoisonError},
};

/// How the intake runs a batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IntakeConfig {
    /// Worker threads (at least one).
    pub threads: usize,
    /// Batches smaller than this run on the caller's thread alone: starting a thread costs
    /// more than a few signature checks.
    pub min_parallel: usize,
}

impl Default for IntakeConfig {
    fn default() -> Self {
        Self {
            threads: std::thread::available_parallelism().map_or(1, usize::from),
            min_parallel: 16,
        }
    }
}

/// Parallel work on batches of transactions.
///
/// A batch runs on the thread that hands it over and on threads started for it, which end
/// with it: a batch is milliseconds of signature checks against tens of microseconds to start
/// a thread, and unlike a pool's idle workers, which spin a while waiting for more work, they
/// take no CPU from the node's RPC and validation tasks between batches.
#[derive(Debug, Clone, Copy)]
pub struct Intake {
    config: IntakeConfig,
}

impl Intake {
    /// Runs batches on up to `config.threads` threads (at least one).
    pub fn new(config: IntakeConfig) -> Self {
        Self {
            config: IntakeConfig {
                threads: config.threads.max(1),
                ..config
            },
        }
    }

    /// Worker threads.
    pub fn threads(&self) -> usize {
        self.config.threads
    }

    fn parallel(&self, len: usize) -> bool {
        self.config.threads > 1 && len >= self.config.min_parallel.max(2)
    }

    /// `f` over every item, in parallel, results in the items' order.
    pub fn map<T, U>(&self, items: Vec<T>, f: impl Fn(T) -> U + Sync + Send) -> Vec<U>
    where
        T: Send,
        U: Send,
    {
        if !self.parallel(items.len()) {
            return items.into_iter().map(f).collect();
        }
        let chunk = items.len().div_ceil(self.config.threads);
        let mut chunks = Vec::new();
        let mut items = items.into_iter();
        loop {
            let part: Vec<T> = items.by_ref().take(chunk).collect();
            if part.is_empty() {
                break;
            }
            chunks.push(part);
        }
        self.run(chunks, |part| part.into_iter().map(&f).collect::<Vec<U>>())
            .into_iter()
            .flatten()
            .collect()
    }

    /// `work` over each part, on the caller's thread and on a thread started for each other
    /// part, each taking the next part left until none is; results in the parts' order. A
    /// thread that cannot be started leaves its part to the others.
    fn run<P: Send, R: Send>(&self, parts: Vec<P>, work: impl Fn(P) -> R + Sync) -> Vec<R> {
        let count = parts.len();
        let queue = Mutex::new(parts.into_iter().enumerate().collect::<Vec<_>>());
        let done = Mutex::new(Vec::with_capacity(count));
        let drain = || {
            loop {
                let next = queue.lock().unwrap_or_else(PoisonError::into_inner).pop();
                let Some((i, part)) = next else { break };
                let result = work(part);
                done.lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push((i, result));
            }
        };
        std::thread::scope(|scope| {
            for _ in 1..count {
                let started = std::thread::Builder::new()
                    .name("intake".to_string())
                    .spawn_scoped(scope, drain);
                if started.is_err() {
                    break;
                }
            }
            drain();
        });
        let mut done = done.into_inner().unwrap_or_else(PoisonError::into_inner);
        done.sort_unstable_by_key(|(i, _)| *i);
        done.into_iter().map(|(_, result)| result).collect()
    }

    /// `f` over every item, with the items split into at most [`Self::threads`] groups such
    /// that all items of one sender (`sender(item)`) are in one group, in their order. Each
    /// group runs on one worker with its own `S` from `open`, made once per group: a database
    /// read transaction, a memo of what it read. Results come back in the items' order.
    ///
    /// The groups are balanced by item count (largest sender first onto the least loaded
    /// group), so one sender with many transactions costs one worker, not the batch.
    pub fn by_sender<T, K, S, U>(
        &self,
        items: Vec<T>,
        sender: impl Fn(&T) -> K,
        open: impl Fn() -> S + Sync + Send,
        f: impl Fn(&mut S, T) -> U + Sync + Send,
    ) -> Vec<U>
    where
        T: Send,
        K: Eq + Hash,
        U: Send,
    {
        if !self.parallel(items.len()) {
            let mut state = open();
            return items.into_iter().map(|item| f(&mut state, item)).collect();
        }
        let keys: Vec<K> = items.iter().map(sender).collect();
        let groups = sender_groups(&keys, self.config.threads);
        let mut slots: Vec<Option<T>> = items.into_iter().map(Some).collect();
        let work: Vec<Vec<(usize, T)>> = groups
            .into_iter()
            .map(|group| {
                group
                    .into_iter()
                    .map(|i| (i, slots[i].take().expect("each index is in one group")))
                    .collect()
            })
            .collect();
        let done: Vec<Vec<(usize, U)>> = self.run(work, |group| {
            let mut state = open();
            group
                .into_iter()
                .map(|(i, item)| (i, f(&mut state, item)))
                .collect()
        });
        let mut out: Vec<Option<U>> = std::iter::repeat_with(|| None).take(keys.len()).collect();
        for (i, result) in done.into_iter().flatten() {
            out[i] = Some(result);
        }
        out.into_iter()
            .map(|r| r.expect("every item has a result"))
            .collect()
    }
}

/// Splits the indices of `keys` into at most `parts` non-empty groups: every index of one key
/// in one group, each group in ascending order, and the groups balanced by count (each key's
/// indices, largest first, go to the group with the fewest so far).
pub fn sender_groups<K: Eq + Hash>(keys: &[K], parts: usize) -> Vec<Vec<usize>> {
    let mut by_key: HashMap<&K, Vec<usize>> = HashMap::new();
    let mut first_seen = Vec::new();
    for (i, key) in keys.iter().enumerate() {
        by_key
            .entry(key)
            .or_insert_with(|| {
                first_seen.push(key);
                Vec::new()
            })
            .push(i);
    }
    // Largest first; ties in the order the keys first appear, so the split is deterministic.
    let mut senders: Vec<Vec<usize>> = first_seen
        .into_iter()
        .map(|k| by_key.remove(k).expect("seen"))
        .collect();
    senders.sort_by_key(|indices| std::cmp::Reverse(indices.len()));
    let mut groups: Vec<Vec<usize>> = vec![Vec::new(); parts.max(1).min(senders.len().max(1))];
    for indices in senders {
        let least = groups
            .iter_mut()
            .min_by_key(|g| g.len())
            .expect("at least one group");
        least.extend(indices);
    }
    groups.retain(|g| !g.is_empty());
    for group in &mut groups {
        group.sort_unstable();
    }
    groups
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    fn intake(threads: usize) -> Intake {
        Intake::new(IntakeConfig {
            threads,
            min_parallel: 2,
        })
    }

    proptest! {
        /// Every index in exactly one group, a key's indices all in one group, each group
        /// ascending, and no group more than the largest key's count above the smallest.
        #[test]
        fn groups_keep_senders_whole_and_balanced(
            keys in prop::collection::vec(0u8..20, 0..300),
            parts in 1usize..9,
        ) {
            let groups = sender_groups(&keys, parts);
            prop_assert!(groups.len() <= parts);
            let mut seen = vec![false; keys.len()];
            let mut group_of = HashMap::new();
            for (g, group) in groups.iter().enumerate() {
                prop_assert!(!group.is_empty());
                prop_assert!(group.windows(2).all(|w| w[0] < w[1]));
                for &i in group {
                    prop_assert!(!std::mem::replace(&mut seen[i], true));
                    prop_assert_eq!(*group_of.entry(keys[i]).or_insert(g), g);
                }
            }
            prop_assert!(seen.iter().all(|&s| s));
            let largest_key = (0u8..20).map(|k| keys.iter().filter(|&&x| x == k).count()).max().unwrap_or(0);
            if let (Some(max), Some(min)) = (groups.iter().map(Vec::len).max(), groups.iter().map(Vec::len).min()) {
                prop_assert!(max - min <= largest_key);
            }
        }

        /// Parallel work returns what the same work one item after the other does.
        #[test]
        fn by_sender_equals_sequential(
            items in prop::collection::vec((0u8..12, any::<u32>()), 0..400),
            threads in 1usize..5,
        ) {
            let intake = intake(threads);
            // The state counts the items each group saw, so a result depends on the order
            // within a sender: it must be that sender's own order.
            let run = |intake: &Intake| intake.by_sender(
                items.clone(),
                |&(k, _)| k,
                HashMap::<u8, u32>::new,
                |seen, (k, v)| {
                    let n = seen.entry(k).or_default();
                    *n += 1;
                    (k, v, *n)
                },
            );
            let parallel = run(&intake);
            let sequential = run(&self::intake(1));
            prop_assert_eq!(parallel, sequential);
        }
    }

    #[test]
    fn map_keeps_order_and_runs_every_item_once() {
        let intake = intake(3);
        let calls = AtomicUsize::new(0);
        let out = intake.map((0..1000u32).collect(), |x| {
            calls.fetch_add(1, Ordering::Relaxed);
            x * 2
        });
        assert_eq!(out, (0..1000u32).map(|x| x * 2).collect::<Vec<_>>());
        assert_eq!(calls.load(Ordering::Relaxed), 1000);
    }

    #[test]
    fn each_group_opens_its_state_once() {
        let intake = intake(4);
        let opened = AtomicUsize::new(0);
        let items: Vec<u32> = (0..200).collect();
        let out = intake.by_sender(
            items,
            |x| x % 10,
            || opened.fetch_add(1, Ordering::Relaxed),
            |_, x| x,
        );
        assert_eq!(out, (0..200).collect::<Vec<_>>());
        assert_eq!(opened.load(Ordering::Relaxed), 4);
        // One sender: one group, whatever the threads.
        opened.store(0, Ordering::Relaxed);
        intake.by_sender(
            vec![1u8; 50],
            |&x| x,
            || opened.fetch_add(1, Ordering::Relaxed),
            |_, x| x,
        );
        assert_eq!(opened.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn small_batches_stay_on_the_callers_thread() {
        let intake = Intake::new(IntakeConfig {
            threads: 4,
            min_parallel: 100,
        });
        let caller = std::thread::current().id();
        let threads = intake.map(vec![(); 10], |()| std::thread::current().id());
        assert!(threads.iter().all(|&t| t == caller));
    }
}
