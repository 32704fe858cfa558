use crate::ExecutionError;
use alloy_consensus::ReceiptEnvelope;
use alloy_eips::eip7685::Requests;
use overdrive_primitives::{BlockWithSenders, ChainParams};
use revm::{DatabaseRef, database::BundleState, database_interface::DBErrorMarker};

/// What executing one block produces. Two executors agree on a block exactly when their
/// outputs compare equal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockOutput {
    /// One receipt per transaction (status, cumulative gas, logs and bloom).
    pub receipts: Vec<ReceiptEnvelope>,
    /// Gas used by the block (after refunds).
    pub gas_used: u64,
    /// EIP-4844 blob gas used by the block.
    pub blob_gas_used: u64,
    /// EIP-7685 requests (Prague and later; empty before).
    pub requests: Requests,
    /// State changes of the block with the reverts that undo them.
    pub bundle: BundleState,
}

/// A pre-state reader an executor can share across threads.
pub trait StateReader:
    DatabaseRef<Error: DBErrorMarker + std::error::Error + Send + Sync + 'static>
    + Sync
    + std::fmt::Debug
{
}

impl<T> StateReader for T where
    T: DatabaseRef<Error: DBErrorMarker + std::error::Error + Send + Sync + 'static>
        + Sync
        + std::fmt::Debug
{
}

/// Executes a block against a pre-state.
///
/// Implementations must be deterministic and must return exactly what
/// [`crate::SequentialExecutor`] returns for the same input, errors included (same variant,
/// same transaction index).
pub trait ExecuteBlock: Send + Sync {
    /// Short name for logs and benchmark output.
    fn name(&self) -> &'static str;

    /// Executes `block` on top of `state`. On error nothing is returned: there is no partial
    /// state to clean up.
    fn execute<DB: StateReader>(
        &self,
        spec: &ChainParams,
        block: &BlockWithSenders,
        state: &DB,
    ) -> Result<BlockOutput, ExecutionError>;
}
