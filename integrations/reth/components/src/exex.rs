//! An execution extension that reports, for every block the node commits, which executor ran it,
//! how long execution took and how much gas it used: a log line and Prometheus metrics
//! (`overdrive_block_*`, on reth's `--metrics` endpoint).

use crate::{BlockLog, BlockRecord};
use alloy_consensus::BlockHeader;
use futures::TryStreamExt;
use reth_exex::{ExExContext, ExExEvent};
use reth_node_builder::FullNodeComponents;
use std::sync::Arc;

/// Registers the metrics' descriptions (once, at start).
pub fn describe_metrics() {
    metrics::describe_counter!(
        "overdrive_block_executed_total",
        "Committed blocks, by the executor that ran them"
    );
    metrics::describe_histogram!(
        "overdrive_block_execution_seconds",
        metrics::Unit::Seconds,
        "Execution time of committed blocks, by executor"
    );
    metrics::describe_counter!(
        "overdrive_block_gas_total",
        "Gas of committed blocks, by executor"
    );
    metrics::describe_counter!(
        "overdrive_block_transactions_total",
        "Transactions of committed blocks, by executor"
    );
    metrics::describe_gauge!(
        "overdrive_block_gas_per_second",
        "Gas per second of execution of the last committed block that used gas"
    );
}

/// Reports one committed block.
fn report(record: &BlockRecord) {
    let executor = record.executed_by.label();
    let seconds = record.elapsed.as_secs_f64();
    metrics::counter!("overdrive_block_executed_total", "executor" => executor).increment(1);
    metrics::histogram!("overdrive_block_execution_seconds", "executor" => executor)
        .record(seconds);
    metrics::counter!("overdrive_block_gas_total", "executor" => executor)
        .increment(record.gas_used);
    metrics::counter!("overdrive_block_transactions_total", "executor" => executor)
        .increment(record.transactions as u64);
    let mgas_per_s = if seconds > 0.0 {
        record.gas_used as f64 / seconds / 1e6
    } else {
        0.0
    };
    if record.gas_used > 0 {
        metrics::gauge!("overdrive_block_gas_per_second").set(mgas_per_s * 1e6);
    }
    tracing::info!(
        target: "overdrive::exex",
        number = record.number,
        txs = record.transactions,
        gas = record.gas_used,
        executor,
        elapsed_ms = format_args!("{:.2}", seconds * 1e3),
        mgas_per_s = format_args!("{mgas_per_s:.1}"),
        "Block executed"
    );
}

/// The ExEx: takes each committed block's record from `log` (the executor's), reports it, and
/// confirms the chain's tip as finished so that reth can prune behind it.
pub async fn timings_exex<N: FullNodeComponents>(
    mut ctx: ExExContext<N>,
    log: Arc<BlockLog>,
) -> eyre::Result<()> {
    while let Some(notification) = ctx.notifications.try_next().await? {
        let Some(chain) = notification.committed_chain() else {
            continue;
        };
        for block in chain.blocks_iter() {
            match log.take(block.number(), block.parent_hash()) {
                Some(record) => report(&record),
                // Executed before this process started, or by a path that keeps no record.
                None => tracing::debug!(
                    target: "overdrive::exex",
                    number = block.number(),
                    "committed block without an execution record"
                ),
            }
        }
        ctx.events
            .send(ExExEvent::FinishedHeight(chain.tip().num_hash()))?;
    }
    Ok(())
}
