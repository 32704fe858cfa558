use alloy_primitives::{Address, B256, Bytes, U64, U256};
use serde::Deserialize;
use std::collections::BTreeMap;

/// One BlockchainTests test case (the fields the runner uses).
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Fixture {
    /// Fork schedule name, e.g. `Cancun` or `ShanghaiToCancunAtTime15k`.
    pub network: String,
    /// Pre-state.
    pub pre: BTreeMap<Address, FixtureAccount>,
    /// RLP of the genesis block.
    #[serde(rename = "genesisRLP")]
    pub genesis_rlp: Bytes,
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
}

/// An account of a fixture's pre- or post-state.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
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

/// A block of a fixture.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FixtureBlock {
    /// The block's RLP (may be deliberately malformed).
    pub rlp: Bytes,
    /// Set when the block must be rejected; names the expected reason.
    pub expect_exception: Option<String>,
}
