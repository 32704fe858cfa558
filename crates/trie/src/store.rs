//! Where trie nodes live between blocks: the [`NodeStore`] trait, the batch of changes a block
//! produces ([`TrieUpdates`]), and an in-memory store.

use crate::node::Node;
use alloy_primitives::{
    B256,
    map::{B256Map, HashMap},
};
use alloy_trie::Nibbles;
use rayon::prelude::*;
use std::{borrow::Cow, collections::BTreeMap, convert::Infallible, sync::Arc};

/// Which trie of the state a node belongs to. Every storage trie has its own path namespace,
/// so a wipe can drop a whole trie without walking it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum TrieId {
    /// The account trie (also the namespace of a stand-alone [`crate::RawTrie`]).
    Account,
    /// The storage trie of the account with this hashed address.
    Storage(B256),
}

/// A place that holds trie nodes by path.
///
/// Kept to two operations so that a database-backed store is easy to write: read one node,
/// and write one block's batch. `get` is called from several worker threads at once.
pub trait NodeStore: Send + Sync {
    /// The store's error.
    type Error: std::error::Error + Send + Sync + 'static;

    /// The node at `path` of `trie`, if there is one: borrowed from an in-memory store,
    /// owned (decoded) from a database.
    fn get(&self, trie: TrieId, path: &Nibbles) -> Result<Option<Cow<'_, Node>>, Self::Error>;

    /// Applies one block's changes. Order within a trie: a wipe first, then deletes, then
    /// writes (the trie never emits a delete and a write of the same path in one batch).
    fn apply(&mut self, updates: &TrieUpdates) -> Result<(), Self::Error>;
}

/// Node writes and deletes of one trie.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeUpdates {
    /// Nodes to store (insert or overwrite) by path.
    pub writes: Vec<(Nibbles, Node)>,
    /// Paths whose nodes no longer exist.
    pub deletes: Vec<Nibbles>,
}

impl NodeUpdates {
    /// Whether there is nothing to write or delete.
    pub fn is_empty(&self) -> bool {
        self.writes.is_empty() && self.deletes.is_empty()
    }

    pub(crate) fn append(&mut self, other: &mut Self) {
        self.writes.append(&mut other.writes);
        self.deletes.append(&mut other.deletes);
    }
}

/// Changes to one storage trie.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StorageTrieUpdates {
    /// Drop every node of this storage trie before applying `nodes` (self-destruct, account
    /// deletion, or self-destruct then re-create in one block).
    pub wiped: bool,
    /// The nodes written and deleted after the wipe, if any.
    pub nodes: NodeUpdates,
}

/// Everything one block changes in the stored tries.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TrieUpdates {
    /// Changes to the account trie.
    pub account_nodes: NodeUpdates,
    /// Changes to storage tries, by hashed address.
    pub storage_tries: B256Map<StorageTrieUpdates>,
}

impl TrieUpdates {
    /// Number of node writes in all tries.
    pub fn writes(&self) -> usize {
        self.account_nodes.writes.len()
            + self.storage_tries.values().map(|s| s.nodes.writes.len()).sum::<usize>()
    }

    /// Number of node deletes in all tries (wipes not counted).
    pub fn deletes(&self) -> usize {
        self.account_nodes.deletes.len()
            + self.storage_tries.values().map(|s| s.nodes.deletes.len()).sum::<usize>()
    }

    /// Whether the block changed no node and wiped no trie.
    pub fn is_empty(&self) -> bool {
        self.account_nodes.is_empty()
            && self.storage_tries.values().all(|s| !s.wiped && s.nodes.is_empty())
    }
}

type NodeMap = HashMap<Nibbles, Node>;

/// The nodes of one trie: the root apart, the rest in sixteen maps by first nibble, each
/// behind an `Arc` so that cloning the store is cheap and a clone copies only the shards it
/// later writes to.
#[derive(Clone, Debug, Default)]
struct MemTrie {
    root: Option<Node>,
    shards: [Arc<NodeMap>; 16],
}

/// Batches below this size are applied on the calling thread.
const PARALLEL_APPLY_MIN: usize = 2048;

impl MemTrie {
    fn get(&self, path: &Nibbles) -> Option<&Node> {
        match path.first() {
            None => self.root.as_ref(),
            Some(nibble) => self.shards[usize::from(nibble)].get(path),
        }
    }

    fn is_empty(&self) -> bool {
        self.root.is_none() && self.shards.iter().all(|s| s.is_empty())
    }

    fn len(&self) -> usize {
        usize::from(self.root.is_some()) + self.shards.iter().map(|s| s.len()).sum::<usize>()
    }

    fn apply(&mut self, updates: &NodeUpdates) {
        // Group the batch by shard with one counting sort, then write the shards in parallel.
        fn by_shard<T>(items: &[T], path: impl Fn(&T) -> &Nibbles) -> ([usize; 17], Vec<u32>) {
            let mut starts = [0usize; 17];
            for item in items {
                if let Some(nibble) = path(item).first() {
                    starts[usize::from(nibble) + 1] += 1;
                }
            }
            for i in 1..17 {
                starts[i] += starts[i - 1];
            }
            let mut next = starts;
            let mut order = vec![0u32; starts[16]];
            for (i, item) in items.iter().enumerate() {
                if let Some(nibble) = path(item).first() {
                    order[next[usize::from(nibble)]] = i as u32;
                    next[usize::from(nibble)] += 1;
                }
            }
            (starts, order)
        }
        for path in &updates.deletes {
            if path.is_empty() {
                self.root = None;
            }
        }
        for (path, node) in &updates.writes {
            if path.is_empty() {
                self.root = Some(node.clone());
            }
        }
        let (delete_starts, delete_order) = by_shard(&updates.deletes, |p| p);
        let (write_starts, write_order) = by_shard(&updates.writes, |(p, _)| p);
        let apply_shard = |(shard, map): (usize, &mut Arc<NodeMap>)| {
            let deletes = &delete_order[delete_starts[shard]..delete_starts[shard + 1]];
            let writes = &write_order[write_starts[shard]..write_starts[shard + 1]];
            if deletes.is_empty() && writes.is_empty() {
                return;
            }
            let map = Arc::make_mut(map);
            for &i in deletes {
                map.remove(&updates.deletes[i as usize]);
            }
            for &i in writes {
                let (path, node) = &updates.writes[i as usize];
                map.insert(*path, node.clone());
            }
        };
        if updates.writes.len() + updates.deletes.len() >= PARALLEL_APPLY_MIN {
            self.shards.par_iter_mut().enumerate().for_each(apply_shard);
        } else {
            self.shards.iter_mut().enumerate().for_each(apply_shard);
        }
    }

    fn nodes(&self) -> BTreeMap<Nibbles, Node> {
        let mut out = BTreeMap::new();
        if let Some(root) = &self.root {
            out.insert(Nibbles::new(), root.clone());
        }
        for shard in &self.shards {
            out.extend(shard.iter().map(|(p, n)| (*p, n.clone())));
        }
        out
    }
}

/// An in-memory [`NodeStore`].
///
/// Cloning is cheap (it shares the node maps and copies a shard only when a clone writes to
/// it), so a test runner can keep one store per block and fork a side chain from any of them.
#[derive(Clone, Debug, Default)]
pub struct MemNodeStore {
    accounts: MemTrie,
    storages: B256Map<Arc<MemTrie>>,
}

impl MemNodeStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// All nodes of one trie, by path.
    pub fn nodes(&self, trie: TrieId) -> BTreeMap<Nibbles, Node> {
        match trie {
            TrieId::Account => self.accounts.nodes(),
            TrieId::Storage(owner) => self.storages.get(&owner).map(|t| t.nodes()).unwrap_or_default(),
        }
    }

    /// Hashed addresses of the accounts that have a storage trie, sorted.
    pub fn storage_owners(&self) -> Vec<B256> {
        let mut owners: Vec<B256> = self.storages.keys().copied().collect();
        owners.sort_unstable();
        owners
    }

    /// Number of nodes of all tries.
    pub fn len(&self) -> usize {
        self.accounts.len() + self.storages.values().map(|t| t.len()).sum::<usize>()
    }

    /// Whether the store holds no node.
    pub fn is_empty(&self) -> bool {
        self.accounts.is_empty() && self.storages.is_empty()
    }
}

impl NodeStore for MemNodeStore {
    type Error = Infallible;

    fn get(&self, trie: TrieId, path: &Nibbles) -> Result<Option<Cow<'_, Node>>, Infallible> {
        Ok(match trie {
            TrieId::Account => self.accounts.get(path),
            TrieId::Storage(owner) => self.storages.get(&owner).and_then(|t| t.get(path)),
        }
        .map(Cow::Borrowed))
    }

    fn apply(&mut self, updates: &TrieUpdates) -> Result<(), Infallible> {
        self.accounts.apply(&updates.account_nodes);
        for (owner, storage) in &updates.storage_tries {
            if storage.wiped {
                self.storages.remove(owner);
            }
            if storage.nodes.is_empty() {
                continue;
            }
            let trie = Arc::make_mut(self.storages.entry(*owner).or_default());
            trie.apply(&storage.nodes);
            if trie.is_empty() {
                self.storages.remove(owner);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn leaf(v: u8) -> Node {
        Node::Leaf { key: Nibbles::from_nibbles([1]), value: crate::node::Value::new(&[v]) }
    }

    #[test]
    fn clone_is_isolated() {
        let mut a = MemNodeStore::new();
        let owner = B256::repeat_byte(7);
        let mut updates = TrieUpdates::default();
        updates.account_nodes.writes.push((Nibbles::new(), leaf(1)));
        updates.account_nodes.writes.push((Nibbles::from_nibbles([3, 4]), leaf(2)));
        updates.storage_tries.entry(owner).or_default().nodes.writes.push((Nibbles::new(), leaf(3)));
        a.apply(&updates).unwrap();

        let b = a.clone();
        let mut change = TrieUpdates::default();
        change.account_nodes.deletes.push(Nibbles::from_nibbles([3, 4]));
        change.storage_tries.entry(owner).or_default().wiped = true;
        a.apply(&change).unwrap();

        assert_eq!(a.get(TrieId::Account, &Nibbles::from_nibbles([3, 4])).unwrap(), None);
        assert_eq!(a.get(TrieId::Storage(owner), &Nibbles::new()).unwrap(), None);
        assert_eq!(b.get(TrieId::Account, &Nibbles::from_nibbles([3, 4])).unwrap().as_deref(), Some(&leaf(2)));
        assert_eq!(b.get(TrieId::Storage(owner), &Nibbles::new()).unwrap().as_deref(), Some(&leaf(3)));
        assert_eq!(a.len(), 1);
        assert_eq!(b.len(), 3);
        assert!(a.storage_owners().is_empty());
    }

    #[test]
    fn wipe_then_write_keeps_only_new_nodes() {
        let mut s = MemNodeStore::new();
        let owner = B256::repeat_byte(1);
        let mut u = TrieUpdates::default();
        u.storage_tries.entry(owner).or_default().nodes.writes.push((Nibbles::from_nibbles([5]), leaf(1)));
        s.apply(&u).unwrap();
        let mut u = TrieUpdates::default();
        let st = u.storage_tries.entry(owner).or_default();
        st.wiped = true;
        st.nodes.writes.push((Nibbles::from_nibbles([6]), leaf(2)));
        s.apply(&u).unwrap();
        let nodes = s.nodes(TrieId::Storage(owner));
        assert_eq!(nodes.len(), 1);
        assert_eq!(nodes.get(&Nibbles::from_nibbles([6])), Some(&leaf(2)));
    }

    #[test]
    fn large_batches_apply_in_parallel_shards() {
        let mut s = MemNodeStore::new();
        let mut u = TrieUpdates::default();
        for i in 0..5000u32 {
            let path = Nibbles::unpack(i.to_be_bytes());
            u.account_nodes.writes.push((path, leaf(i as u8)));
        }
        s.apply(&u).unwrap();
        assert_eq!(s.len(), 5000);
        let mut d = TrieUpdates::default();
        d.account_nodes.deletes = u.account_nodes.writes.iter().map(|(p, _)| *p).step_by(2).collect();
        d.account_nodes.deletes.extend((0..2048u32).map(|i| Nibbles::unpack((i + 100_000).to_be_bytes())));
        s.apply(&d).unwrap();
        assert_eq!(s.len(), 2500);
    }
}
