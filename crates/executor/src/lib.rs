//! Block executors for overdrive.
//!
//! Every executor implements [`ExecuteBlock`]: it takes a block with recovered senders, a
//! pre-state reader (revm `DatabaseRef`) and the chain spec, and returns receipts, gas,
//! EIP-7685 requests and the bundle state with reverts. [`SequentialExecutor`] runs alloy-evm's
//! `EthBlockExecutor` over `revm::State` (reth's own path) and is the reference that every
//! faster executor must equal bit for bit. [`ParallelExecutor`] is the fast one: optimistic
//! (Block-STM style) execution scheduled by a dependency DAG, committed in block order through
//! the reference's own state and receipt path, with the same output and the same errors.
//!
//! Both record per-block metrics through the `metrics` facade (see [`describe_metrics`]).

mod error;
mod metrics;
mod parallel;
mod readers;
mod sequential;
mod traits;

pub use error::ExecutionError;
pub use metrics::describe_metrics;
pub use parallel::{
    CommitStats, DEFAULT_MIN_GAS_FOR_PARALLEL, DEFAULT_MIN_TXS_FOR_PARALLEL, LEARNED_BLOCKS,
    LearnedSchedule, POOL_FOLDING_SPARE, ParallelConfig, ParallelExecutor, Scheduling,
    TransitionFolding, block_gas_estimate,
};
pub use readers::{BundleOverlay, CachedReader, PerThreadReader};
pub use sequential::{SequentialExecutor, canonical_reverts, evm_env, execution_ctx};
pub use traits::{BlockOutput, ExecuteBlock, StateReader};
