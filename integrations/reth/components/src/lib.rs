//! overdrive's components as reth v2.5.1 node components.
//!
//! - [`OverdriveEvmConfig`]: reth's `EthEvmConfig` whose block executor runs whole blocks on
//!   overdrive's parallel executor where reth validates or imports them (engine, pipeline,
//!   backfill); payload building, tracing and execution witnesses stay on reth's executor.
//! - [`OverdriveNode`]: reth's `EthereumNode` with that executor, for `node` and the offline
//!   commands; [`import::ImportCommand`] is `import` with the database at hand.
//! - [`pool::OverdrivePoolBuilder`]: reth's transaction pool whose validator runs batches in
//!   parallel by sender, and [`rpc::BatchSubmit`], the `overdrive_sendRawTransactions`
//!   endpoint that feeds it batches (`--overdrive.pool`).
//! - [`exex::timings_exex`]: an ExEx reporting which executor ran each committed block, its time
//!   and gas.
//! - [`merkle::ParallelMerkleStage`]: reth's `MerkleExecute` pipeline stage with the changed
//!   storage tries hashed in parallel and committed in resumable chunks
//!   (`--overdrive.merkle-stage`), set into `import`'s pipeline and, through
//!   [`launch::MerkleStageLauncher`] (reth's node launcher with its own pipeline), `node`'s,
//!   and run over a range by [`stage_run::MerkleRunCommand`] (`stage run merkle`).
//! - [`state_root::OverdriveStateRoot`]: reth's `StateRootStrategy` with the root of each
//!   block the engine validates computed by overdrive's parallel trie, kept in memory
//!   (`--overdrive.state-root overdrive`), installed by
//!   [`state_root::OverdriveEngineValidatorBuilder`].
//! - [`OverdriveArgs`]: the `--overdrive.*` flags; with every component off the node is stock
//!   reth.
//!
//! The logic lives in the core crates (`overdrive-executor`, `overdrive-intake`, `overdrive-trie`); this crate adapts reth's types and
//! registers the components.

pub mod args;
mod convert;
mod evm;
mod executor;
pub mod exex;
pub mod import;
pub mod launch;
pub mod merkle;
mod node;
mod parallel;
pub mod pool;
pub mod rpc;
pub mod stage_run;
mod state;
pub mod state_root;

pub use args::{ExecMode, OverdriveArgs, split_args};
pub use evm::OverdriveEvmConfig;
pub use executor::{OverdriveBlockExecutor, StateAccess};
pub use node::{OverdriveExecutorBuilder, OverdriveNode};
pub use parallel::{
    BlockLog, BlockRecord, ExecutedBy, FactoryOpener, Ineligible, ParallelBlocks, ProviderOpener,
    StateAt, StateOpener,
};
pub use state::{BlockState, hook_updates};
