//! Seeded, deterministic workloads for overdrive's tests and benchmarks.
//!
//! [`generate`] turns a [`WorkloadConfig`] into a [`Workload`]: a genesis state (with a
//! matching [`ChainParams`](overdrive_primitives::ChainParams) and genesis header) and a chain of
//! blocks of signed EIP-1559 transactions, with senders already recovered. Kinds: ETH
//! transfers, OpenZeppelin v5 ERC20 transfers, Uniswap V2 router swaps over many independent
//! pairs (directly decoded, or through the router's fee-on-transfer entry point the hints
//! cannot decode), a hybrid mix with a contention knob, a fully chained ERC20 sequence, ERC20
//! approvals spent by `transferFrom`, ETH transfers around an exchange's hot wallet, and calls
//! of a CPU-heavy contract ([`WorkloadKind::ALL`]); every kind takes a sender-skew knob. The same config and seed always give byte-identical blocks.
//!
//! The contracts are real: the genesis is built by executing their constructors and the
//! liquidity setup with revm, from artifacts that `scripts/setup-contracts.sh` compiles (the
//! ERC20) or fetches (Uniswap V2's published npm builds) into `build-artifacts/`. Per-account
//! balances and allowances are then written straight into storage, at slots [`erc20`] computes.

mod abi;
mod artifacts;
mod config;
mod error;
mod genesis;
mod keys;
mod plan;
mod workload;

#[cfg(test)]
mod tests;

pub use abi::{compute, erc20, uniswap};
pub use artifacts::{ARTIFACTS_ENV, artifacts_dir};
pub use config::{MAX_TOTAL_TXS, MIN_ACCOUNTS, WorkloadConfig, WorkloadKind};
pub use error::WorkloadError;
pub use genesis::{PairInfo, UniswapDeployment};
pub use keys::{deployer_key, private_key};
pub use workload::{
    ALLOWANCE_GAS, BASE_FEE, BLOCK_TIME, COINBASE, Contracts, ERC20_GAS, HOT_ACCOUNT, HOT_SENDERS,
    MAX_FEE_PER_GAS, MAX_PRIORITY_FEE_PER_GAS, MIN_BLOCK_GAS_LIMIT, SWAP_GAS, TRANSFER_GAS,
    Workload, generate, generate_with_artifacts,
};
