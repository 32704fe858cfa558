use alloy_evm::block::{BlockExecutionError, BlockValidationError};
use alloy_primitives::B256;

/// Why a block could not be executed. Any of these rejects the block.
///
/// Variants carry rendered messages rather than the EVM's generic error types so that two
/// executors' errors can be compared for equality in differential tests.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ExecutionError {
    /// A transaction is invalid against the state it runs on (nonce, balance, fees, intrinsic
    /// gas, blob rules...).
    #[error("invalid transaction {hash}: {reason}")]
    InvalidTransaction {
        /// Hash of the offending transaction.
        hash: B256,
        /// What the EVM said.
        reason: String,
    },
    /// A transaction's gas limit exceeds what is left of the block's gas limit.
    #[error("transaction gas limit {gas_limit} exceeds the block's remaining gas {available}")]
    BlockGasExceeded {
        /// The transaction's gas limit.
        gas_limit: u64,
        /// Gas left in the block before it.
        available: u64,
    },
    /// A required system call (EIP-4788, EIP-2935, EIP-7002, EIP-7251) failed or its input
    /// was missing.
    #[error("system call failed: {0}")]
    SystemCall(String),
    /// The state reader failed.
    #[error("state read failed: {0}")]
    Database(String),
    /// Any other block-level failure reported by the EVM layer.
    #[error("block execution failed: {0}")]
    Other(String),
    /// Executing the block panicked (in the committer, a worker's scheduling or the state
    /// reader, on an exact execution); the block is rejected rather than the process. A panic
    /// that only a speculative execution meets is not an error: that transaction is executed
    /// again exactly.
    #[error("executor worker panicked: {0}")]
    WorkerPanic(String),
}

impl From<BlockExecutionError> for ExecutionError {
    fn from(err: BlockExecutionError) -> Self {
        match err {
            BlockExecutionError::Validation(v) => match v {
                BlockValidationError::InvalidTx { hash, error } => Self::InvalidTransaction {
                    hash,
                    reason: error.to_string(),
                },
                BlockValidationError::TransactionGasLimitMoreThanAvailableBlockGas {
                    transaction_gas_limit,
                    block_available_gas,
                } => Self::BlockGasExceeded {
                    gas_limit: transaction_gas_limit,
                    available: block_available_gas,
                },
                BlockValidationError::EVM { error, .. } => Self::Database(error.to_string()),
                other @ (BlockValidationError::MissingParentBeaconBlockRoot
                | BlockValidationError::CancunGenesisParentBeaconBlockRootNotZero {
                    ..
                }
                | BlockValidationError::BeaconRootContractCall { .. }
                | BlockValidationError::BlockHashContractCall { .. }
                | BlockValidationError::WithdrawalRequestsContractCall { .. }
                | BlockValidationError::ConsolidationRequestsContractCall { .. }) => {
                    Self::SystemCall(other.to_string())
                }
                other => Self::Other(other.to_string()),
            },
            other => Self::Other(other.to_string()),
        }
    }
}
