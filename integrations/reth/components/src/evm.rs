//! The node's EVM configuration: reth's `EthEvmConfig`, whose block executor takes whole
//! blocks to overdrive's parallel executor where reth validates or imports them.

use crate::{BlockState, OverdriveBlockExecutor, ParallelBlocks};
use alloy_evm::{
    EvmEnv, EvmFactory,
    block::{BlockExecutorFactory, StateDB},
    eth::{EthBlockExecutionCtx, EthBlockExecutor, EthTxResult},
};
use reth_chainspec::ChainSpec;
use reth_ethereum_primitives::{Block, EthPrimitives, Receipt, TransactionSigned, TxType};
use reth_evm::{
    ConfigureEngineEvm, ConfigureEvm, Database, EvmEnvFor, EvmFor, ExecutableTxIterator,
    ExecutionCtxFor, InspectorFor, NextBlockEnvAttributes, execute::Executor,
};
use reth_evm_ethereum::{EthBlockAssembler, EthEvmConfig, factory::RethEvmFactory};
use reth_primitives_traits::{SealedBlock, SealedHeader};
use revm::{context::result::HaltReason, database::State, inspector::NoOpInspector};
use std::sync::Arc;

/// The engine's payload type.
pub type ExecutionData = alloy_rpc_types_engine::ExecutionData;

/// reth's EVM configuration with overdrive's parallel executor for whole blocks.
///
/// Blocks run on the parallel executor when reth executes a block it already has whole, with
/// no inspector: the engine validating a payload or a downloaded block, the pipeline's execution
/// stage, ExEx backfill, `re-execute`. Building a payload (the executor created without a
/// transaction count) and tracing stay on reth's executor, and so does [`Self::executor`],
/// whose callers read the executor's account cache afterwards (execution witnesses).
#[derive(Debug, Clone)]
pub struct OverdriveEvmConfig {
    inner: EthEvmConfig<ChainSpec, RethEvmFactory>,
    parallel: Option<Arc<ParallelBlocks>>,
}

impl OverdriveEvmConfig {
    /// `inner` with whole blocks on `parallel` (`None`: reth's executor throughout).
    pub fn new(
        inner: EthEvmConfig<ChainSpec, RethEvmFactory>,
        parallel: Option<Arc<ParallelBlocks>>,
    ) -> Self {
        Self { inner, parallel }
    }

    /// reth's configuration inside.
    pub fn inner(&self) -> &EthEvmConfig<ChainSpec, RethEvmFactory> {
        &self.inner
    }

    /// The parallel executor whole blocks run on, if any.
    pub fn parallel(&self) -> Option<&Arc<ParallelBlocks>> {
        self.parallel.as_ref()
    }
}

impl BlockExecutorFactory for OverdriveEvmConfig {
    type EvmFactory = RethEvmFactory;
    type ExecutionCtx<'a> = EthBlockExecutionCtx<'a>;
    type Transaction = TransactionSigned;
    type Receipt = Receipt;
    type TxExecutionResult = EthTxResult<HaltReason, TxType>;
    type Executor<'a, DB: StateDB, I: InspectorFor<Self, DB>> =
        OverdriveBlockExecutor<'a, <RethEvmFactory as EvmFactory>::Evm<DB, I>>;

    fn evm_factory(&self) -> &Self::EvmFactory {
        self.inner.evm_factory()
    }

    fn create_executor<'a, DB, I>(
        &'a self,
        evm: <RethEvmFactory as EvmFactory>::Evm<DB, I>,
        ctx: EthBlockExecutionCtx<'a>,
    ) -> Self::Executor<'a, DB, I>
    where
        DB: StateDB,
        I: InspectorFor<Self, DB>,
    {
        OverdriveBlockExecutor::new(EthBlockExecutor::new(
            evm,
            ctx,
            self.inner.chain_spec(),
            self.inner.executor_factory.receipt_builder(),
        ))
    }
}

/// The state handle [`OverdriveBlockExecutor::whole_block`] needs, for the `State` reth built.
fn state_of<'x, DB: Database>(db: &'x mut &mut State<DB>) -> &'x mut dyn BlockState {
    &mut **db
}

impl ConfigureEvm for OverdriveEvmConfig {
    type Primitives = EthPrimitives;
    type Error = <EthEvmConfig as ConfigureEvm>::Error;
    type NextBlockEnvCtx = NextBlockEnvAttributes;
    type BlockExecutorFactory = Self;
    type BlockAssembler = EthBlockAssembler<ChainSpec>;

    fn block_executor_factory(&self) -> &Self::BlockExecutorFactory {
        self
    }

    fn block_assembler(&self) -> &Self::BlockAssembler {
        self.inner.block_assembler()
    }

    fn evm_env(&self, header: &alloy_consensus::Header) -> Result<EvmEnv, Self::Error> {
        self.inner.evm_env(header)
    }

    fn next_evm_env(
        &self,
        parent: &alloy_consensus::Header,
        attributes: &NextBlockEnvAttributes,
    ) -> Result<EvmEnv, Self::Error> {
        self.inner.next_evm_env(parent, attributes)
    }

    fn context_for_block<'a>(
        &self,
        block: &'a SealedBlock<Block>,
    ) -> Result<EthBlockExecutionCtx<'a>, Self::Error> {
        self.inner.context_for_block(block)
    }

    fn context_for_next_block(
        &self,
        parent: &SealedHeader,
        attributes: Self::NextBlockEnvCtx,
    ) -> Result<EthBlockExecutionCtx<'_>, Self::Error> {
        self.inner.context_for_next_block(parent, attributes)
    }

    fn with_jit_support_enabled(self, enabled: bool) -> Self {
        Self {
            inner: self.inner.with_jit_support_enabled(enabled),
            parallel: self.parallel,
        }
    }

    fn create_executor<'a, DB, I>(
        &'a self,
        evm: EvmFor<Self, &'a mut State<DB>, I>,
        ctx: EthBlockExecutionCtx<'a>,
    ) -> OverdriveBlockExecutor<'a, EvmFor<Self, &'a mut State<DB>, I>>
    where
        DB: Database,
        I: InspectorFor<Self, &'a mut State<DB>> + 'a,
    {
        let mut evm = evm;
        BlockState::prepare(&mut **alloy_evm::Evm::db_mut(&mut evm));
        // A block reth has whole comes with its transaction count; one being built does not.
        // An inspector must see every step, so a traced block stays on reth's executor.
        let whole = ctx.tx_count_hint.is_some()
            && ctx.slot_number.is_none()
            && std::any::type_name::<I>() == std::any::type_name::<NoOpInspector>();
        let executor = BlockExecutorFactory::create_executor(self, evm, ctx);
        match &self.parallel {
            Some(parallel) if whole => executor.whole_block(parallel, state_of::<DB>),
            _ => executor,
        }
    }

    fn executor<DB: Database>(
        &self,
        db: DB,
    ) -> impl Executor<DB, Primitives = Self::Primitives, Error = reth_evm::execute::BlockExecutionError>
    {
        self.inner.executor(db)
    }
}

impl ConfigureEngineEvm<ExecutionData> for OverdriveEvmConfig {
    fn evm_env_for_payload(&self, payload: &ExecutionData) -> Result<EvmEnvFor<Self>, Self::Error> {
        self.inner.evm_env_for_payload(payload)
    }

    fn context_for_payload<'a>(
        &self,
        payload: &'a ExecutionData,
    ) -> Result<ExecutionCtxFor<'a, Self>, Self::Error> {
        self.inner.context_for_payload(payload)
    }

    fn tx_iterator_for_payload(
        &self,
        payload: &ExecutionData,
    ) -> Result<impl ExecutableTxIterator<Self>, Self::Error> {
        self.inner.tx_iterator_for_payload(payload)
    }
}
