//! The executors' metrics, recorded through the `metrics` facade once per block on the calling
//! thread. Inside reth they reach reth's Prometheus endpoint; under `overdrive --metrics` they
//! reach overdrive's. With no recorder installed each call does nothing.
//!
//! Names follow Prometheus conventions (`_total` counters, `_seconds` durations); the
//! `executor` label is [`crate::ExecuteBlock::name`].

use crate::{BlockOutput, CommitStats, ExecutionError};
use metrics::{Unit, counter, describe_counter, describe_histogram, histogram};
use std::time::Duration;

const BLOCKS: &str = "overdrive_executor_blocks_total";
const REJECTED: &str = "overdrive_executor_blocks_rejected_total";
const TRANSACTIONS: &str = "overdrive_executor_transactions_total";
const GAS: &str = "overdrive_executor_gas_used_total";
const DURATION: &str = "overdrive_executor_block_duration_seconds";
const VALIDATED: &str = "overdrive_executor_parallel_validated_total";
const EXACT: &str = "overdrive_executor_parallel_exact_total";
const HELPED: &str = "overdrive_executor_parallel_helped_total";
const INVALID: &str = "overdrive_executor_parallel_invalid_total";
const RESPECULATED: &str = "overdrive_executor_parallel_respeculated_total";

/// Registers the help text and unit of every executor metric with the installed recorder.
pub fn describe_metrics() {
    describe_counter!(
        BLOCKS,
        "Blocks executed, by executor and by the path the block took (parallel or sequential)"
    );
    describe_counter!(
        REJECTED,
        "Blocks rejected: an invalid transaction or a database error; for the parallel \
         executor also a panic (the sequential one lets a panic unwind to its caller)"
    );
    describe_counter!(TRANSACTIONS, "Transactions of executed blocks");
    describe_counter!(GAS, "Gas used by executed blocks");
    describe_histogram!(
        DURATION,
        Unit::Seconds,
        "Wall time of one block's execution, by executor and path, rejected blocks included"
    );
    describe_counter!(
        VALIDATED,
        "Parallel path: speculative results that passed validation and were committed"
    );
    describe_counter!(
        EXACT,
        "Parallel path: transactions the committer executed exactly (before the hints, after a \
         failed validation, or once the block went sequential)"
    );
    describe_counter!(
        HELPED,
        "Parallel path: transactions the committer speculated while waiting for another thread"
    );
    describe_counter!(
        INVALID,
        "Parallel path: speculative results that failed validation (re-executed exactly)"
    );
    describe_counter!(
        RESPECULATED,
        "Parallel path: speculative results a pool thread found stale and executed again \
         before the committer took them"
    );
}

/// Records one `execute` call of `executor`.
pub(crate) fn record_block(
    executor: &'static str,
    path: &'static str,
    txs: usize,
    result: &Result<BlockOutput, ExecutionError>,
    elapsed: Duration,
) {
    histogram!(DURATION, "executor" => executor, "path" => path).record(elapsed.as_secs_f64());
    match result {
        Ok(output) => {
            counter!(BLOCKS, "executor" => executor, "path" => path).increment(1);
            counter!(TRANSACTIONS, "executor" => executor).increment(txs as u64);
            counter!(GAS, "executor" => executor).increment(output.gas_used);
        }
        Err(_) => counter!(REJECTED, "executor" => executor).increment(1),
    }
}

/// Records what the committer did in a block that took the parallel path.
pub(crate) fn record_commit(stats: &CommitStats) {
    counter!(VALIDATED).increment(stats.validated as u64);
    counter!(EXACT).increment(stats.exact as u64);
    counter!(HELPED).increment(stats.helped as u64);
    counter!(INVALID).increment(stats.invalid as u64);
    counter!(RESPECULATED).increment(stats.respeculated as u64);
}

#[cfg(test)]
mod tests {
    use crate::{
        ExecuteBlock, ExecutionError, ParallelConfig, ParallelExecutor, SequentialExecutor,
    };
    use metrics::{SharedString, Unit};
    use metrics_util::{
        CompositeKey,
        debugging::{DebugValue, DebuggingRecorder},
    };
    use overdrive_workload::{WorkloadConfig, WorkloadKind, generate};

    type Series = Vec<(CompositeKey, Option<Unit>, Option<SharedString>, DebugValue)>;

    /// The summed value of counter `name` over the series whose labels include `labels`.
    fn counter(series: &Series, name: &str, labels: &[(&str, &str)]) -> u64 {
        series
            .iter()
            .filter(|(key, ..)| {
                let key = key.key();
                key.name() == name
                    && labels.iter().all(|(k, v)| {
                        key.labels()
                            .any(|label| label.key() == *k && label.value() == *v)
                    })
            })
            .map(|(.., value)| match value {
                DebugValue::Counter(n) => *n,
                other => panic!("{name} is not a counter: {other:?}"),
            })
            .sum()
    }

    #[test]
    fn blocks_are_counted_by_executor_path_and_outcome() {
        let workload = generate(&WorkloadConfig {
            accounts: 200,
            txs_per_block: 40,
            blocks: 1,
            ..WorkloadConfig::new(WorkloadKind::Transfer)
        })
        .expect("transfer workload");
        let (spec, state) = (&workload.chain_spec, &workload.genesis);
        let block = &workload.blocks[0];
        let txs = block.transactions.len() as u64;
        // The first transaction again: its nonce is spent by then.
        let mut invalid = block.clone();
        invalid.transactions.push(block.transactions[0].clone());

        let parallel = ParallelExecutor::new(ParallelConfig {
            threads: 2,
            min_txs_for_parallel: 0,
            min_gas_for_parallel: 0,
            ..Default::default()
        });
        let one_thread = ParallelExecutor::with_threads(1);
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        let gas = metrics::with_local_recorder(&recorder, || {
            let output = SequentialExecutor.execute(spec, block, state).unwrap();
            parallel.execute(spec, block, state).unwrap();
            one_thread.execute(spec, block, state).unwrap();
            assert!(matches!(
                parallel.execute(spec, &invalid, state),
                Err(ExecutionError::InvalidTransaction { .. })
            ));
            output.gas_used
        });

        // A snapshot drains the recorder: one for all the checks.
        let series = snapshotter.snapshot().into_vec();
        let blocks = |executor, path| {
            counter(
                &series,
                super::BLOCKS,
                &[("executor", executor), ("path", path)],
            )
        };
        assert_eq!(blocks("sequential", "sequential"), 1);
        assert_eq!(blocks("parallel", "parallel"), 1);
        assert_eq!(blocks("parallel", "sequential"), 1);
        let rejected = |executor| counter(&series, super::REJECTED, &[("executor", executor)]);
        assert_eq!((rejected("sequential"), rejected("parallel")), (0, 1));
        let per = |name, executor| counter(&series, name, &[("executor", executor)]);
        assert_eq!(per(super::TRANSACTIONS, "sequential"), txs);
        assert_eq!(per(super::TRANSACTIONS, "parallel"), 2 * txs);
        assert_eq!(per(super::GAS, "parallel"), 2 * gas);
        // The one parallel-path block that committed: each transaction once, one way or the
        // other (helping is speculation, counted besides).
        let committed =
            counter(&series, super::VALIDATED, &[]) + counter(&series, super::EXACT, &[]);
        assert_eq!(committed, txs);
    }
}
