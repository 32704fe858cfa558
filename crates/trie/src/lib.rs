//! overdrive-trie: the Merkle-Patricia state root of overdrive.
//!
//! - [`StateTrie`]: the account trie and every storage trie kept node by node in a
//!   [`NodeStore`] (by path; [`MemNodeStore`] in memory). Each block's [`HashedStateChanges`] is
//!   applied top-down, re-encoding and re-hashing only the nodes on changed paths, with all
//!   storage tries and then the account trie spread over a persistent worker pool (each worker
//!   unpinned unless [`TrieConfig::pin_workers`] asks for a core each) and split by nibble
//!   wherever a subtree has many updates. The output is the new root plus the node
//!   writes and deletes to persist ([`StateTrieUpdates`]), or, committed through a
//!   [`CompactTrie`], the rows of a database that keeps branch nodes in alloy-trie's compact
//!   form (reth's trie tables: [`CompactUpdates`]); [`StateTrie::undo_of`]
//!   gives the batch that takes a committed block back, and [`Rounds`] commit a block's
//!   changes while it executes, a round at a time, leaving only the rest to hash at its end.
//!   Every stored node carries its own reference (its hash), so a branch is re-encoded from
//!   its children's stored references and only the nodes on changed paths are rewritten.
//!   Changed nodes are hashed in batches, height by height, eight per pass where the CPU has
//!   AVX-512 and four where it has AVX2 (`keccak` module; [`TrieConfig::batch_hashing`]).
//! - [`BoundedNodeStore`]: a store that keeps only the top of each trie in memory (to a depth,
//!   or a memory budget) and rebuilds the nodes below from the state's leaves, which a
//!   [`LeafSource`] reads (a database's hashed state); [`BoundedNodeStore::prefetch`] does a
//!   key's reads ahead of the block that changes it.
//! - [`RawTrie`]: the same engine over raw keys of any length (the ethereum/tests vectors).
//! - [`reference`](mod@reference): the root by a full alloy-trie `HashBuilder` build, the
//!   definition the trie is tested against.
//!
//! Each computed root is recorded through the `metrics` facade (see [`describe_metrics`]).

mod bounded;
mod compact;
mod engine;
mod error;
mod keccak;
mod metrics;
mod node;
mod raw;
pub mod reference;
mod rounds;
mod state;
mod state_trie;
mod store;
mod undo;

pub use bounded::{BoundedNodeStore, BoundedStoreError, LeafSource, SourceReads};
pub use compact::{CompactNodes, CompactStorage, CompactTrie, CompactUpdates, compact_branch};
pub use error::TrieError;
pub use metrics::describe_metrics;
pub use node::{Node, NodeDecodeError, StoredNode, Value};
pub use raw::RawTrie;
pub use rounds::Rounds;
pub use state::{HashedAccount, HashedStateChanges, HashedStorageChanges};
pub use state_trie::{StateRootOutput, StateTrie, TrieConfig, TrieStats};
pub use store::{
    ChildNodes, MemNodeStore, NodeStore, NodeUpdates, Replaced, StateTrieUpdates,
    StorageNodeUpdates, TrieId,
};

/// Types from alloy-trie that appear in this crate's API.
pub use alloy_trie::{
    BranchNodeCompact, EMPTY_ROOT_HASH, Nibbles, TrieAccount, TrieMask, nodes::RlpNode,
};

/// How many cases a property test runs: `default` in CI, four hundred times as many under
/// the soak switch ([`overdrive_primitives::soak`]).
#[cfg(test)]
pub(crate) fn proptest_cases(default: u32) -> u32 {
    if overdrive_primitives::soak() {
        default * 400
    } else {
        default
    }
}
