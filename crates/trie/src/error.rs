//! The crate's error type.

use crate::store::TrieId;
use alloy_primitives::B256;
use alloy_trie::Nibbles;

/// Why a trie operation failed.
#[derive(Debug, thiserror::Error)]
pub enum TrieError {
    /// The node store failed.
    #[error("node store: {0}")]
    Store(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// A node that a parent references is not in the store.
    #[error("node missing at {path:?} of {trie:?}")]
    MissingNode {
        /// The trie.
        trie: TrieId,
        /// The path of the missing node.
        path: Nibbles,
    },
    /// A stored node cannot sit where it was found: an extension with an empty key, a key
    /// that runs past 64 nibbles, a branch at full depth, an extension over a non-branch. The
    /// trie never writes one; a corrupted or foreign store can hold one.
    #[error("malformed node at {path:?} of {trie:?}: {reason}")]
    MalformedNode {
        /// The trie.
        trie: TrieId,
        /// The node's path.
        path: Nibbles,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// Storage changed for an account that neither exists nor is created by the same diff.
    #[error("storage changed for account {0}, which does not exist")]
    MissingAccount(B256),
    /// A stored leaf (an account, or a slot of this account) does not decode.
    #[error("stored leaf of account {address} does not decode: {source}")]
    LeafDecode {
        /// Hashed address of the account.
        address: B256,
        /// The decoding error.
        source: alloy_rlp::Error,
    },
    /// A raw key is longer than the 32 bytes a trie path holds.
    #[error("key of {0} bytes is longer than 32 bytes")]
    KeyTooLong(usize),
    /// The worker pool could not be built.
    #[error("thread pool: {0}")]
    ThreadPool(#[from] rayon::ThreadPoolBuildError),
    /// A configuration value is out of range.
    #[error("invalid configuration: {0}")]
    InvalidConfig(String),
    /// An internal consistency check failed (a bug, reported instead of panicking).
    #[error("internal invariant violated: {0}")]
    Invariant(&'static str),
}

impl TrieError {
    pub(crate) fn store(error: impl std::error::Error + Send + Sync + 'static) -> Self {
        Self::Store(Box::new(error))
    }
}
