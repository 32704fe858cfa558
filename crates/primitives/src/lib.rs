//! Shared types for every overdrive component.
//!
//! - [`ChainParams`]: the fork schedule (by block number and timestamp), presets `mainnet` and
//!   `dev`, and loading of a geth-style `genesis.json`.
//! - [`MemState`]: a plain in-memory world state that implements revm's `DatabaseRef` and
//!   applies a `BundleState`; the reference state that tests, benchmarks and the ef-tests runner
//!   execute against until the MDBX store exists.
//! - [`BlockWithSenders`]: a block whose transaction senders are already recovered, the input of
//!   every executor.
//! - [`prefetch`]: a cache prefetch hint for code that walks large tables.
//! - [`soak`]: whether the long randomized test runs were asked for.

mod block;
mod chain_spec;
mod mem;
mod state;

pub use block::{BlockError, BlockWithSenders};
pub use chain_spec::{
    ChainParams, ChainParamsError, DEV_ACCOUNT_COUNT, dev_address, merged_chain_config,
};
pub use mem::prefetch;
pub use state::{MemAccount, MemState, bytecode_from_raw};

/// Whether `OVERDRIVE_SOAK` (set, not empty, not `0`) asks the randomized tests of every crate
/// for their long runs: one switch, read in one place, starts every soak.
pub fn soak() -> bool {
    std::env::var("OVERDRIVE_SOAK").is_ok_and(|v| v != "0" && !v.is_empty())
}

/// Re-exports of the hardfork vocabulary so downstream crates name one source.
pub use alloy_hardforks::{EthereumHardfork, EthereumHardforks, ForkCondition};
