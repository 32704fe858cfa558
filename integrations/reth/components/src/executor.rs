//! The block executor reth drives, transaction by transaction, for every block: reth's own
//! `EthBlockExecutor`, which on the paths that validate or import whole blocks buffers the
//! block's transactions and runs them together on overdrive's parallel executor in `finish`.

use crate::{BlockState, ExecutedBy, ParallelBlocks, convert};
use alloy_consensus::transaction::Recovered;
use alloy_evm::{
    Evm, EvmEnv, RecoveredTx,
    block::{BlockExecutionError, BlockExecutor, ExecutableTx, GasOutput, StateDB},
    eth::{EthBlockExecutor, EthTxResult},
};
use reth_chainspec::ChainSpec;
use reth_ethereum_primitives::{Receipt, TransactionSigned, TxType};
use reth_evm_ethereum::RethReceiptBuilder;
use reth_execution_types::BlockExecutionResult;
use revm::context::{BlockEnv, TxEnv, result::HaltReason};
use std::sync::Arc;

/// The state handle of a whole-block run: how to reach the `revm::State` behind the EVM's
/// database. reth's executor traits only promise a `Database + DatabaseCommit`; the node's
/// configuration, which knows it built a `State`, hands this in (see
/// `OverdriveEvmConfig::create_executor`).
pub type StateAccess<DB> = for<'x> fn(&'x mut DB) -> &'x mut dyn BlockState;

/// The EVMs reth's Ethereum executor runs on (reth's EVM factory's, with any database and
/// inspector).
pub trait EthereumEvm:
    Evm<
        DB: StateDB,
        Tx = TxEnv,
        HaltReason = HaltReason,
        BlockEnv = BlockEnv,
        Spec = revm::primitives::hardfork::SpecId,
    >
{
}

impl<E> EthereumEvm for E where
    E: Evm<
            DB: StateDB,
            Tx = TxEnv,
            HaltReason = HaltReason,
            BlockEnv = BlockEnv,
            Spec = revm::primitives::hardfork::SpecId,
        >
{
}

/// reth's `EthBlockExecutor`, with a whole-block mode.
pub struct OverdriveBlockExecutor<'a, E: Evm> {
    inner: EthBlockExecutor<'a, E, &'a Arc<ChainSpec>, &'a RethReceiptBuilder>,
    whole_block: Option<WholeBlock<'a, E>>,
}

/// A block being collected for overdrive's executor.
struct WholeBlock<'a, E: Evm> {
    parallel: &'a ParallelBlocks,
    state: StateAccess<E::DB>,
    /// Whether reth asked for the pre-execution changes (overdrive's executor makes them).
    pre_execution: bool,
    /// The transactions in alloy's envelope (overdrive's executor takes them so), with the
    /// environments reth made of them (its own executor takes those, if it runs the block).
    transactions: Vec<Recovered<alloy_consensus::TxEnvelope>>,
    envs: Vec<E::Tx>,
}

impl<'a, E: Evm> OverdriveBlockExecutor<'a, E> {
    /// reth's executor as it is.
    pub fn new(inner: EthBlockExecutor<'a, E, &'a Arc<ChainSpec>, &'a RethReceiptBuilder>) -> Self {
        Self {
            inner,
            whole_block: None,
        }
    }

    /// Collects the block and runs it on `parallel` in `finish`, committing through `state`.
    pub fn whole_block(mut self, parallel: &'a ParallelBlocks, state: StateAccess<E::DB>) -> Self {
        let capacity = self.inner.ctx.tx_count_hint.unwrap_or_default();
        self.whole_block = Some(WholeBlock {
            parallel,
            state,
            pre_execution: false,
            transactions: Vec::with_capacity(capacity),
            envs: Vec::with_capacity(capacity),
        });
        self
    }

    /// Whether the block is collected for overdrive's executor.
    pub fn is_whole_block(&self) -> bool {
        self.whole_block.is_some()
    }
}

impl<E: EthereumEvm> OverdriveBlockExecutor<'_, E> {
    /// Leaves whole-block mode for reth's path: what was held back runs now, in order.
    fn run_held_back(&mut self) -> Result<(), BlockExecutionError> {
        let Some(held) = self.whole_block.take() else {
            return Ok(());
        };
        if held.pre_execution {
            self.inner.apply_pre_execution_changes()?;
        }
        for (env, tx) in held.envs.into_iter().zip(held.transactions) {
            let (tx, signer) = tx.into_parts();
            let tx = Recovered::new_unchecked(TransactionSigned::from(tx), signer);
            self.inner.execute_transaction((env, &tx))?;
        }
        Ok(())
    }
}

impl<E: EthereumEvm> BlockExecutor for OverdriveBlockExecutor<'_, E> {
    type Transaction = TransactionSigned;
    type Receipt = Receipt;
    type Evm = E;
    type Result = EthTxResult<HaltReason, TxType>;

    fn apply_pre_execution_changes(&mut self) -> Result<(), BlockExecutionError> {
        match &mut self.whole_block {
            Some(held) => {
                held.pre_execution = true;
                Ok(())
            }
            None => self.inner.apply_pre_execution_changes(),
        }
    }

    fn execute_transaction(
        &mut self,
        tx: impl ExecutableTx<Self>,
    ) -> Result<GasOutput, BlockExecutionError> {
        let Some(held) = &mut self.whole_block else {
            return self.inner.execute_transaction(tx);
        };
        let (env, recovered) = tx.into_parts();
        held.transactions
            .push(convert::transaction(recovered.tx(), *recovered.signer()));
        held.envs.push(env);
        // Neither the engine nor reth's whole-block executor reads the gas of a transaction
        // here; the block's totals come out of `finish`.
        Ok(GasOutput::default())
    }

    fn execute_transaction_without_commit(
        &mut self,
        tx: impl ExecutableTx<Self>,
    ) -> Result<Self::Result, BlockExecutionError> {
        // A caller that needs each result (payload building, access-list execution) gets
        // reth's path, whatever came before.
        self.run_held_back()?;
        self.inner.execute_transaction_without_commit(tx)
    }

    fn commit_transaction(&mut self, output: Self::Result) -> GasOutput {
        self.inner.commit_transaction(output)
    }

    fn finish(mut self) -> Result<(Self::Evm, BlockExecutionResult<Receipt>), BlockExecutionError> {
        let Some(held) = self.whole_block.take() else {
            return self.inner.finish();
        };
        let env = EvmEnv {
            cfg_env: self.inner.evm.cfg_env().clone(),
            block_env: self.inner.evm.block().clone(),
        };
        let state = (held.state)(self.inner.evm.db_mut());
        let WholeBlock {
            parallel,
            state: access,
            pre_execution,
            transactions,
            envs,
        } = held;
        match parallel.execute(&env, &self.inner.ctx, transactions, state) {
            Ok((output, _)) => {
                let result = BlockExecutionResult {
                    receipts: convert::receipts(output.receipts),
                    requests: output.requests,
                    gas_used: output.gas_used,
                    blob_gas_used: output.blob_gas_used,
                };
                Ok((self.inner.evm, result))
            }
            Err((why, transactions)) => {
                let number = env.block_env.number.saturating_to::<u64>();
                tracing::debug!(
                    target: "overdrive::exec",
                    block = number,
                    reason = %why,
                    "block runs on reth's executor"
                );
                let parent_hash = self.inner.ctx.parent_hash;
                let started = std::time::Instant::now();
                let count = transactions.len();
                self.whole_block = Some(WholeBlock {
                    parallel,
                    state: access,
                    pre_execution,
                    transactions,
                    envs,
                });
                self.run_held_back()?;
                let (evm, result) = self.inner.finish()?;
                if matches!(why, crate::Ineligible::Rejected(_)) {
                    tracing::warn!(
                        target: "overdrive::exec",
                        block = number,
                        reason = %why,
                        "reth's executor accepted a block overdrive's rejected"
                    );
                }
                parallel.log().push(crate::BlockRecord {
                    number,
                    parent_hash,
                    transactions: count,
                    gas_used: result.gas_used,
                    executed_by: ExecutedBy::Reth,
                    elapsed: started.elapsed(),
                });
                Ok((evm, result))
            }
        }
    }

    fn evm_mut(&mut self) -> &mut Self::Evm {
        &mut self.inner.evm
    }

    fn evm(&self) -> &Self::Evm {
        &self.inner.evm
    }

    fn receipts(&self) -> &[Self::Receipt] {
        self.inner.receipts()
    }
}
