use crate::{BlockOutput, ExecuteBlock, ExecutionError, StateReader};
use alloy_evm::{
    EvmEnv, EvmFactory,
    block::BlockExecutor as _,
    eth::{
        EthBlockExecutionCtx, EthBlockExecutor, EthEvmFactory, receipt_builder::AlloyReceiptBuilder,
    },
};
use overdrive_primitives::{BlockWithSenders, ChainParams};
use revm::database::{BundleState, State, WrapDatabaseRef, states::bundle_state::BundleRetention};
use std::{borrow::Cow, time::Instant};

/// The reference executor: alloy-evm's `EthBlockExecutor` (with every system call the fork
/// requires: EIP-4788, EIP-2935, withdrawals, EIP-6110/7002/7251 requests) over
/// `revm::State` with bundle tracking, one transaction after the other.
#[derive(Debug, Clone, Copy, Default)]
pub struct SequentialExecutor;

/// The EVM environment of a block under `spec`: the spec id, chain id, blob parameters and
/// block env. Shared by every executor so they cannot disagree on it.
pub fn evm_env(spec: &ChainParams, block: &BlockWithSenders) -> EvmEnv {
    EvmEnv::for_eth_block(
        &block.header,
        spec,
        spec.chain_id,
        spec.blob_params_at(block.header.timestamp),
    )
}

/// The `revm::State` a block executes on: bundle tracking, and its account cache and
/// transition map sized for the block up front (a transaction touches two or three accounts),
/// so they are not rehashed as they grow. Capacity changes no output (the reverts, the only
/// order-sensitive part, are sorted). Every executor starts from this one, so a speed-up
/// measured against the sequential executor does not count the presizing.
pub(crate) fn block_state<'a, DB: StateReader>(
    db: &'a DB,
    block: &BlockWithSenders,
) -> State<WrapDatabaseRef<&'a DB>> {
    let mut state = State::builder()
        .with_database_ref(db)
        .with_bundle_update()
        .build();
    let n = block.transactions.len();
    state.cache.accounts.reserve(n * 2);
    if let Some(transitions) = state.transition_state.as_mut() {
        transitions.transitions.reserve(n * 2);
    }
    state
}

/// The execution context (system-call inputs) of a block.
pub fn execution_ctx(block: &BlockWithSenders) -> EthBlockExecutionCtx<'_> {
    EthBlockExecutionCtx {
        parent_hash: block.header.parent_hash,
        parent_beacon_block_root: block.header.parent_beacon_block_root,
        ommers: &block.ommers,
        withdrawals: block.withdrawals.as_deref().map(Cow::Borrowed),
        extra_data: block.header.extra_data.clone(),
        tx_count_hint: Some(block.transactions.len()),
        slot_number: None,
    }
}

/// Puts the reverts of each block of `bundle` in canonical order: by address.
///
/// revm emits a block's reverts in the iteration order of its transition map, which depends on
/// how the map was filled; an executor that builds the bundle differently (in parallel) would
/// emit the same reverts in another order. The order carries no meaning (reth sorts reverts by
/// address when it persists them), so every executor sorts them and outputs compare equal.
pub fn canonical_reverts(bundle: &mut BundleState) {
    for block in bundle.reverts.iter_mut() {
        block.sort_unstable_by_key(|(address, _)| *address);
    }
}

impl ExecuteBlock for SequentialExecutor {
    fn name(&self) -> &'static str {
        "sequential"
    }

    fn execute<DB: StateReader>(
        &self,
        spec: &ChainParams,
        block: &BlockWithSenders,
        state: &DB,
    ) -> Result<BlockOutput, ExecutionError> {
        let started = Instant::now();
        let result = execute_block(spec, block, state);
        crate::metrics::record_block(
            self.name(),
            "sequential",
            block.transactions.len(),
            &result,
            started.elapsed(),
        );
        result
    }
}

/// The reference execution of `block`: alloy-evm's `EthBlockExecutor` over `revm::State`, the
/// bundle merged with its reverts in canonical order. Other executors' sequential paths call
/// it too (and record their own metrics).
pub(crate) fn execute_block<DB: StateReader>(
    spec: &ChainParams,
    block: &BlockWithSenders,
    state: &DB,
) -> Result<BlockOutput, ExecutionError> {
    execute_block_with_hook(spec, block, state, None)
}

/// [`execute_block`], with `hook` hearing every commit, as reth's executor's state hook does.
pub(crate) fn execute_block_with_hook<DB: StateReader>(
    spec: &ChainParams,
    block: &BlockWithSenders,
    state: &DB,
    hook: Option<Box<dyn revm::database::OnStateHook>>,
) -> Result<BlockOutput, ExecutionError> {
    let mut db = block_state(state, block);
    db.set_state_hook(hook);
    let evm = EthEvmFactory::default().create_evm(&mut db, evm_env(spec, block));
    let executor = EthBlockExecutor::new(
        evm,
        execution_ctx(block),
        spec,
        AlloyReceiptBuilder::default(),
    );
    let result = executor.execute_block(block.transactions.iter())?;
    db.merge_transitions(BundleRetention::Reverts);
    let mut bundle = db.take_bundle();
    canonical_reverts(&mut bundle);
    Ok(BlockOutput {
        receipts: result.receipts,
        gas_used: result.gas_used,
        blob_gas_used: result.blob_gas_used,
        requests: result.requests,
        bundle,
    })
}
