//! The BlockchainTests fixture format: ethereum/tests' and execution-spec-tests'.
//!
//! Every field either format may carry is declared, and any other is an error: a fixture with
//! a field the runner does not know may state a rule the runner does not check.

use alloy_primitives::{Address, B256, Bytes, U64, U128, U256};
use serde::Deserialize;
use std::collections::BTreeMap;

/// One BlockchainTests test case.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Fixture {
    /// Fork schedule name, e.g. `Cancun` or `PragueToOsakaAtTime15k`.
    pub network: String,
    /// The chain: id and blob schedule (execution-spec-tests only; ethereum/tests fixtures
    /// are all chain 1 with Ethereum's blob parameters).
    pub config: Option<FixtureConfig>,
    /// Pre-state.
    pub pre: BTreeMap<Address, FixtureAccount>,
    /// RLP of the genesis block.
    #[serde(rename = "genesisRLP")]
    pub genesis_rlp: Bytes,
    /// The genesis header as JSON; the runner decodes `genesis_rlp` instead.
    pub genesis_block_header: Option<serde_json::Value>,
    /// Blocks to import in order.
    pub blocks: Vec<FixtureBlock>,
    /// Expected post-state (either this or `post_state_hash`).
    pub post_state: Option<BTreeMap<Address, FixtureAccount>>,
    /// Expected post-state root.
    pub post_state_hash: Option<B256>,
    /// Expected head after importing every block.
    pub lastblockhash: B256,
    /// Sealing engine; only `NoProof` is meaningful post-merge.
    pub seal_engine: Option<String>,
    /// Where the test came from (filler, commit, spec reference); not read.
    #[serde(rename = "_info")]
    pub info: Option<serde_json::Value>,
}

/// The `config` of an execution-spec-tests fixture.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FixtureConfig {
    /// Same as the fixture's `network`.
    pub network: String,
    /// EIP-155 chain id.
    pub chainid: U64,
    /// Blob parameters per fork name (`Cancun`, `Prague`, `Osaka`, `BPO1`, ...).
    pub blob_schedule: BTreeMap<String, FixtureBlobParams>,
}

/// One fork's EIP-7840 blob parameters.
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FixtureBlobParams {
    /// Target blobs per block.
    pub target: U64,
    /// Maximum blobs per block.
    pub max: U64,
    /// Denominator of the blob base fee's exponential update.
    pub base_fee_update_fraction: U128,
}

/// An account of a fixture's pre- or post-state.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct FixtureAccount {
    /// Balance in wei.
    pub balance: U256,
    /// Nonce.
    pub nonce: U64,
    /// Code.
    pub code: Bytes,
    /// Storage; zero values may appear and mean "absent".
    pub storage: BTreeMap<U256, U256>,
}

/// A block of a fixture. Only `rlp` and `expect_exception` are read: the block is what its RLP
/// says, and the JSON views of it are the filler's.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FixtureBlock {
    /// The block's RLP (may be deliberately malformed).
    pub rlp: Bytes,
    /// Set when the block must be rejected; names the expected reason.
    pub expect_exception: Option<String>,
    /// The header as JSON.
    pub block_header: Option<serde_json::Value>,
    /// The transactions as JSON.
    pub transactions: Option<serde_json::Value>,
    /// The ommer headers as JSON.
    pub uncle_headers: Option<serde_json::Value>,
    /// The withdrawals as JSON.
    pub withdrawals: Option<serde_json::Value>,
    /// The block number as the filler saw it.
    pub blocknumber: Option<serde_json::Value>,
    /// The chain the filler built the block on (side-chain tests).
    pub chainname: Option<serde_json::Value>,
    /// An invalid block's contents as JSON.
    #[serde(rename = "rlp_decoded")]
    pub rlp_decoded: Option<serde_json::Value>,
    /// Marks a block with an oversized number in its JSON view.
    pub has_big_int: Option<serde_json::Value>,
    /// The filler's verdict on each raw transaction.
    pub transaction_sequence: Option<serde_json::Value>,
}
