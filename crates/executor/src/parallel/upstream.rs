//! What the parallel path mirrors of alloy-evm and revm instead of calling them, listed in one
//! place, with the tests that fail when the upstream behaviour it mirrors changes.
//!
//! Mirrored for alloy-evm 0.38.0 and revm 42.0.1 (revm-database 42.0.0); the lock-file test
//! below fails on any other version, so that a bump re-reads each item first:
//!
//! - [`commit_gas_and_receipt`]: the gas accounting and the receipt of alloy-evm's
//!   `EthBlockExecutor::commit_transaction`, for a result executed on another thread. A copy
//!   because that thread already computed the logs bloom, and because the committer commits
//!   the state itself (the cache now, the transitions folded later; `transitions.rs`), where
//!   `commit_transaction` builds the bloom on the committer and folds inside `State::commit`.
//!   It writes `EthBlockExecutor`'s public fields, as `commit_transaction` does. It would go
//!   with an alloy-evm entry that accounts a result and builds its receipt from given parts
//!   (bloom included) and leaves the state commit to the caller. Tested against
//!   `commit_transaction` here.
//! - The state commit in `commit.rs`: `CacheState::apply_evm_state` with the transitions
//!   queued, then the changes handed to the state hook if there is one, which is revm's
//!   `State::commit` for a `State` without a block-access-list builder (the committer checks
//!   it is absent); `tests/state_hook.rs` compares what the hook hears with the sequential
//!   executor's. It would go with a `State` method that updates the cache and returns the
//!   transitions unfolded.
//! - `merge.rs`: revm's `State::merge_transitions` (present accounts and
//!   `TransitionAccount::create_revert`), split across two threads; `merge::tests` compares it
//!   with revm's own merge on the same transitions. It would go with a parallel merge in revm.
//! - `transitions.rs`: revm's `TransitionState::add_transitions` fold, run on pool threads;
//!   the differential tests (every workload, the fixtures) compare the resulting bundle, with
//!   its reverts, against the sequential executor's, which folds inside revm.

use alloy_consensus::{Eip658Value, Receipt, ReceiptEnvelope, ReceiptWithBloom, TxType};
use alloy_evm::eth::{EthBlockExecutor, receipt_builder::AlloyReceiptBuilder};
use alloy_primitives::{Bloom, Log};
use revm::context::result::{ExecutionResult, HaltReason};

/// alloy-evm's `EthBlockExecutor::commit_transaction` without its state commit: adds the
/// result's gas to the block's counters (and `blob_gas_used` when Cancun is active) and pushes
/// its receipt, built from `logs` (the result's, taken out of it) and their `logs_bloom`
/// (computed where the transaction ran; ignored without logs, whose bloom is empty).
pub(super) fn commit_gas_and_receipt<E, Spec>(
    executor: &mut EthBlockExecutor<'_, E, Spec, AlloyReceiptBuilder>,
    result: &ExecutionResult<HaltReason>,
    logs: Vec<Log>,
    logs_bloom: Bloom,
    tx_type: TxType,
    blob_gas_used: u64,
    cancun: bool,
) {
    let gas = result.gas();
    executor.block_regular_gas_used += gas.block_regular_gas_used();
    executor.block_state_gas_used += gas.block_state_gas_used();
    executor.cumulative_tx_gas_used += gas.tx_gas_used();
    if cancun {
        executor.blob_gas_used = executor.blob_gas_used.saturating_add(blob_gas_used);
    }
    // A transaction without logs has the empty bloom: its 256 bytes are not read.
    let logs_bloom = if logs.is_empty() {
        Bloom::ZERO
    } else {
        logs_bloom
    };
    let receipt = ReceiptWithBloom {
        receipt: Receipt {
            status: Eip658Value::Eip658(result.is_success()),
            cumulative_gas_used: executor.cumulative_tx_gas_used,
            logs,
        },
        logs_bloom,
    };
    executor.receipts.push(envelope(tx_type, receipt));
}

/// The receipt envelope of a transaction type, as alloy-evm's `AlloyReceiptBuilder` builds it.
pub(super) fn envelope(tx_type: TxType, receipt: ReceiptWithBloom<Receipt>) -> ReceiptEnvelope {
    match tx_type {
        TxType::Legacy => ReceiptEnvelope::Legacy(receipt),
        TxType::Eip2930 => ReceiptEnvelope::Eip2930(receipt),
        TxType::Eip1559 => ReceiptEnvelope::Eip1559(receipt),
        TxType::Eip4844 => ReceiptEnvelope::Eip4844(receipt),
        TxType::Eip7702 => ReceiptEnvelope::Eip7702(receipt),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{evm_env, execution_ctx, sequential::block_state};
    use alloy_evm::{Evm as _, EvmFactory, block::BlockExecutor as _, eth::EthEvmFactory};
    use alloy_primitives::logs_bloom;
    use overdrive_primitives::EthereumHardforks;
    use overdrive_workload::{WorkloadConfig, WorkloadKind, generate};
    use revm::DatabaseCommit;

    /// The versions the items above mirror, as the workspace's lock file resolves them.
    #[test]
    fn upstream_versions_are_the_mirrored_ones() {
        let lock = include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/../../Cargo.lock"));
        for (name, version) in [
            ("alloy-evm", "0.38.0"),
            ("revm", "42.0.1"),
            ("revm-database", "42.0.0"),
        ] {
            let entry = format!("name = \"{name}\"\nversion = \"{version}\"\n");
            assert!(
                lock.contains(&entry),
                "{name} is no longer {version}: re-read what parallel/upstream.rs lists \
                 against the new version, then update the versions here"
            );
        }
    }

    /// Each transaction of real blocks (ERC20 transfers with logs, swaps, plain transfers),
    /// committed by alloy-evm's `commit_transaction` on one executor and by
    /// [`commit_gas_and_receipt`] plus revm's commit on another: the same receipts and gas
    /// counters.
    #[test]
    fn gas_and_receipt_equal_commit_transaction() {
        for kind in [
            WorkloadKind::Erc20,
            WorkloadKind::Uniswap,
            WorkloadKind::Transfer,
        ] {
            let workload = generate(&WorkloadConfig {
                accounts: 50,
                txs_per_block: 30,
                blocks: 1,
                ..WorkloadConfig::new(kind)
            })
            .expect("workload");
            let (spec, block) = (&workload.chain_spec, &workload.blocks[0]);
            let cancun = spec.is_cancun_active_at_timestamp(block.header.timestamp);
            let (mut db_a, mut db_b) = (
                block_state(&workload.genesis, block),
                block_state(&workload.genesis, block),
            );
            let executor = |db| {
                EthBlockExecutor::new(
                    EthEvmFactory::default().create_evm(db, evm_env(spec, block)),
                    execution_ctx(block),
                    spec,
                    AlloyReceiptBuilder::default(),
                )
            };
            let (mut upstream, mut mirror) = (executor(&mut db_a), executor(&mut db_b));
            upstream
                .apply_pre_execution_changes()
                .expect("system calls");
            mirror.apply_pre_execution_changes().expect("system calls");
            for tx in block.transactions.iter() {
                let output = upstream
                    .execute_transaction_without_commit(tx)
                    .expect("valid");
                upstream.commit_transaction(output);
                let output = mirror
                    .execute_transaction_without_commit(tx)
                    .expect("valid");
                let (result, state) = (output.result.result, output.result.state);
                let logs = result.logs().to_vec();
                let bloom = logs_bloom(logs.iter());
                commit_gas_and_receipt(
                    &mut mirror,
                    &result,
                    logs,
                    bloom,
                    output.tx_type,
                    output.blob_gas_used,
                    cancun,
                );
                mirror.evm.db_mut().commit(state);
            }
            assert_eq!(mirror.receipts, upstream.receipts, "{kind}");
            assert_eq!(
                mirror.cumulative_tx_gas_used,
                upstream.cumulative_tx_gas_used
            );
            assert_eq!(
                mirror.block_regular_gas_used,
                upstream.block_regular_gas_used
            );
            assert_eq!(mirror.block_state_gas_used, upstream.block_state_gas_used);
            assert_eq!(mirror.blob_gas_used, upstream.blob_gas_used);
            assert!(
                upstream.receipts.iter().any(|r| !r.logs().is_empty())
                    || kind == WorkloadKind::Transfer
            );
        }
    }
}
