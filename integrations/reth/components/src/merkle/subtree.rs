//! One trie cut into its sixteen subtrees, so one huge trie is hashed on many threads.
//!
//! reth stores no node at a trie's root path (its updates drop the empty path), so the nodes
//! under `[n]` depend only on the keys whose hash starts with nibble `n`: reth's own
//! `StorageRoot` or `StateRoot` run over cursors that see only that subtree writes exactly the
//! rows reth writes there when it hashes the whole trie. The root is then hashed over the new
//! rows with nothing marked changed, which reads the top nodes of each subtree.

use alloy_primitives::B256;
use reth_storage_errors::db::DatabaseError;
use reth_trie::{
    BranchNodeCompact, Nibbles,
    hashed_cursor::{HashedCursor, HashedCursorFactory, HashedStorageCursor},
    trie_cursor::{TrieCursor, TrieCursorFactory, TrieStorageCursor},
};

/// Which trie a [`Subtree`] cuts; the other passes through whole.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// The account trie and the hashed accounts: each account's storage trie stays whole.
    Accounts,
    /// Every storage trie and its hashed slots.
    Storage,
}

/// Cursor factories that show one trie's nodes and keys under one first nibble only.
#[derive(Debug, Clone)]
pub struct Subtree<F> {
    inner: F,
    nibble: u8,
    side: Side,
}

impl<F> Subtree<F> {
    /// The subtree under `nibble` (0..16) of the `side` tries `inner` opens.
    pub const fn new(inner: F, side: Side, nibble: u8) -> Self {
        debug_assert!(nibble < 16);
        Self {
            inner,
            nibble,
            side,
        }
    }

    fn nibble_for(&self, side: Side) -> Option<u8> {
        (self.side == side).then_some(self.nibble)
    }
}

impl<F: TrieCursorFactory> TrieCursorFactory for Subtree<F> {
    type AccountTrieCursor<'a>
        = SubtreeNodes<F::AccountTrieCursor<'a>>
    where
        Self: 'a;
    type StorageTrieCursor<'a>
        = SubtreeNodes<F::StorageTrieCursor<'a>>
    where
        Self: 'a;

    fn account_trie_cursor(&self) -> Result<Self::AccountTrieCursor<'_>, DatabaseError> {
        Ok(SubtreeNodes::new(
            self.inner.account_trie_cursor()?,
            self.nibble_for(Side::Accounts),
        ))
    }

    fn storage_trie_cursor(
        &self,
        hashed_address: B256,
    ) -> Result<Self::StorageTrieCursor<'_>, DatabaseError> {
        Ok(SubtreeNodes::new(
            self.inner.storage_trie_cursor(hashed_address)?,
            self.nibble_for(Side::Storage),
        ))
    }
}

impl<F: HashedCursorFactory> HashedCursorFactory for Subtree<F> {
    type AccountCursor<'a>
        = SubtreeKeys<F::AccountCursor<'a>>
    where
        Self: 'a;
    type StorageCursor<'a>
        = SubtreeKeys<F::StorageCursor<'a>>
    where
        Self: 'a;

    fn hashed_account_cursor(&self) -> Result<Self::AccountCursor<'_>, DatabaseError> {
        Ok(SubtreeKeys {
            inner: self.inner.hashed_account_cursor()?,
            nibble: self.nibble_for(Side::Accounts),
        })
    }

    fn hashed_storage_cursor(
        &self,
        hashed_address: B256,
    ) -> Result<Self::StorageCursor<'_>, DatabaseError> {
        Ok(SubtreeKeys {
            inner: self.inner.hashed_storage_cursor(hashed_address)?,
            nibble: self.nibble_for(Side::Storage),
        })
    }
}

/// A trie cursor limited to the paths that start with `prefix` (all of them without one).
#[derive(Debug)]
pub struct SubtreeNodes<C> {
    inner: C,
    prefix: Option<Nibbles>,
}

impl<C> SubtreeNodes<C> {
    fn new(inner: C, nibble: Option<u8>) -> Self {
        Self {
            inner,
            prefix: nibble.map(|n| Nibbles::from_nibbles([n])),
        }
    }

    fn within(
        &self,
        entry: Option<(Nibbles, BranchNodeCompact)>,
    ) -> Option<(Nibbles, BranchNodeCompact)> {
        match &self.prefix {
            Some(prefix) => entry.filter(|(path, _)| path.starts_with(prefix)),
            None => entry,
        }
    }
}

impl<C: TrieCursor> TrieCursor for SubtreeNodes<C> {
    fn seek_exact(
        &mut self,
        key: Nibbles,
    ) -> Result<Option<(Nibbles, BranchNodeCompact)>, DatabaseError> {
        if self.prefix.is_some_and(|prefix| !key.starts_with(&prefix)) {
            return Ok(None);
        }
        let entry = self.inner.seek_exact(key)?;
        Ok(self.within(entry))
    }

    fn seek(
        &mut self,
        key: Nibbles,
    ) -> Result<Option<(Nibbles, BranchNodeCompact)>, DatabaseError> {
        let key = self.prefix.map_or(key, |prefix| key.max(prefix));
        let entry = self.inner.seek(key)?;
        Ok(self.within(entry))
    }

    fn next(&mut self) -> Result<Option<(Nibbles, BranchNodeCompact)>, DatabaseError> {
        let entry = self.inner.next()?;
        Ok(self.within(entry))
    }

    fn current(&mut self) -> Result<Option<Nibbles>, DatabaseError> {
        self.inner.current()
    }

    fn reset(&mut self) {
        self.inner.reset()
    }
}

impl<C: TrieStorageCursor> TrieStorageCursor for SubtreeNodes<C> {
    fn set_hashed_address(&mut self, hashed_address: B256) {
        self.inner.set_hashed_address(hashed_address)
    }
}

/// A hashed-state cursor limited to the keys whose first nibble is `nibble` (all of them
/// without one).
#[derive(Debug)]
pub struct SubtreeKeys<C> {
    inner: C,
    nibble: Option<u8>,
}

impl<C: HashedCursor> SubtreeKeys<C> {
    fn within(&self, entry: Option<(B256, C::Value)>) -> Option<(B256, C::Value)> {
        match self.nibble {
            Some(nibble) => entry.filter(|(key, _)| key[0] >> 4 == nibble),
            None => entry,
        }
    }
}

impl<C: HashedCursor> HashedCursor for SubtreeKeys<C> {
    type Value = C::Value;

    fn seek(&mut self, key: B256) -> Result<Option<(B256, C::Value)>, DatabaseError> {
        let key = match self.nibble {
            Some(nibble) => {
                let mut first = B256::ZERO;
                first[0] = nibble << 4;
                key.max(first)
            }
            None => key,
        };
        let entry = self.inner.seek(key)?;
        Ok(self.within(entry))
    }

    fn next(&mut self) -> Result<Option<(B256, C::Value)>, DatabaseError> {
        let entry = self.inner.next()?;
        Ok(self.within(entry))
    }

    fn reset(&mut self) {
        self.inner.reset()
    }
}

impl<C: HashedStorageCursor> HashedStorageCursor for SubtreeKeys<C> {
    /// Whether the whole account's storage is empty, not the subtree's: reth answers an empty
    /// storage by wiping the account's trie, which is right only for the whole trie. An empty
    /// subtree is walked, and its old nodes come back as removed.
    fn is_storage_empty(&mut self) -> Result<bool, DatabaseError> {
        self.inner.is_storage_empty()
    }

    fn set_hashed_address(&mut self, hashed_address: B256) {
        self.inner.set_hashed_address(hashed_address)
    }
}
