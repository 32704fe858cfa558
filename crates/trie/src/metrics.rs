//! The trie's metrics, recorded through the `metrics` facade once per computed root on the
//! calling thread. Inside reth they reach reth's Prometheus endpoint; under
//! `overdrive --metrics` they reach overdrive's. With no recorder installed each call does
//! nothing. The `threads` label is the trie's worker count, which tells apart the tries of a
//! process that has several (the benchmark's one-thread and N-thread tries).

use crate::TrieStats;
use metrics::{Unit, counter, describe_counter, describe_histogram, histogram};
use std::time::Duration;

const ROOTS: &str = "overdrive_trie_roots_total";
const DURATION: &str = "overdrive_trie_root_duration_seconds";
const KECCAK: &str = "overdrive_trie_keccak_calls_total";
const WRITTEN: &str = "overdrive_trie_nodes_written_total";
const DELETED: &str = "overdrive_trie_nodes_deleted_total";
const ACCOUNTS: &str = "overdrive_trie_account_updates_total";
const SLOTS: &str = "overdrive_trie_slot_updates_total";

/// Registers the help text and unit of every trie metric with the installed recorder.
pub fn describe_metrics() {
    describe_counter!(ROOTS, "State roots computed");
    describe_histogram!(
        DURATION,
        Unit::Seconds,
        "Wall time of one state root: storage tries, account trie and the node changes, before \
         they are written"
    );
    describe_counter!(
        KECCAK,
        "Keccak calls hashing nodes (at most one per changed node)"
    );
    describe_counter!(WRITTEN, "Nodes re-encoded and to be written");
    describe_counter!(
        DELETED,
        "Nodes to be deleted (wiped storage tries not counted)"
    );
    describe_counter!(ACCOUNTS, "Account leaves updated, created or deleted");
    describe_counter!(SLOTS, "Storage slots updated");
}

/// Records one root computed by a trie of `threads` workers.
pub(crate) fn record_root(stats: &TrieStats, elapsed: Duration, threads: usize) {
    let labels = [("threads", threads.to_string())];
    counter!(ROOTS, &labels).increment(1);
    histogram!(DURATION, &labels).record(elapsed.as_secs_f64());
    counter!(KECCAK, &labels).increment(stats.keccak_calls);
    counter!(WRITTEN, &labels).increment(stats.dirty_nodes);
    counter!(DELETED, &labels).increment(stats.deleted_nodes);
    counter!(ACCOUNTS, &labels).increment(stats.account_updates);
    counter!(SLOTS, &labels).increment(stats.slot_updates);
}

#[cfg(test)]
mod tests {
    use crate::{HashedAccount, HashedStateChanges, MemNodeStore, StateTrie, TrieConfig};
    use alloy_primitives::{B256, U256};
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};
    use revm::primitives::KECCAK_EMPTY;

    #[test]
    fn each_root_is_recorded_with_its_work() {
        let mut diff = HashedStateChanges::default();
        for i in 1..=40u8 {
            let account = HashedAccount {
                nonce: 1,
                balance: U256::from(i),
                code_hash: KECCAK_EMPTY,
            };
            diff.accounts.insert(B256::repeat_byte(i), Some(account));
        }
        let config = TrieConfig {
            threads: 2,
            ..TrieConfig::default()
        };
        let mut trie = StateTrie::new(MemNodeStore::new(), config).unwrap();
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        let (first, second) = metrics::with_local_recorder(&recorder, || {
            (trie.apply(&diff).unwrap(), trie.apply(&diff).unwrap())
        });

        let series = snapshotter.snapshot().into_vec();
        let value = |name: &str| {
            series
                .iter()
                .find(|(key, ..)| {
                    key.key().name() == name
                        && key
                            .key()
                            .labels()
                            .any(|l| l.key() == "threads" && l.value() == "2")
                })
                .map(|(.., value)| value)
        };
        let counter = |name| match value(name) {
            Some(DebugValue::Counter(n)) => *n,
            other => panic!("{name}: {other:?}"),
        };
        assert_eq!(counter(super::ROOTS), 2);
        let stats = [first.stats, second.stats];
        let sum = |f: fn(&crate::TrieStats) -> u64| stats.iter().map(f).sum::<u64>();
        assert!(sum(|s| s.keccak_calls) > 0);
        assert_eq!(counter(super::KECCAK), sum(|s| s.keccak_calls));
        assert_eq!(counter(super::WRITTEN), sum(|s| s.dirty_nodes));
        assert_eq!(counter(super::DELETED), sum(|s| s.deleted_nodes));
        assert_eq!(counter(super::ACCOUNTS), 80);
        assert_eq!(counter(super::SLOTS), 0);
        match value(super::DURATION) {
            Some(DebugValue::Histogram(times)) => assert_eq!(times.len(), 2),
            other => panic!("{other:?}"),
        }
    }
}
