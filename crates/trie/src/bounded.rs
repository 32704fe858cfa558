//! A node store that keeps only the top of every trie in memory: [`BoundedNodeStore`].
//!
//! Nodes at paths shorter than the store's depth stay in a [`MemNodeStore`]; the nodes below
//! are dropped after each block and rebuilt on demand from the state's leaves, which a
//! [`LeafSource`] reads (inside a node: the hashed state tables with the blocks not yet
//! persisted on top). Only what can be read back is dropped: a node is a function of the
//! leaves under its path. A kept branch that a block re-encodes needs the references of all
//! its children, so a read below the depth rebuilds the whole subtree under the deepest kept
//! path above it, from one range of leaves, once per block.
//!
//! A block reads the state it starts from, then writes its changed nodes (all of them, at any
//! depth) and its reads of the rows that follow see those writes first; only then are the deep
//! ones dropped ([`BoundedNodeStore::evict`]) and the source moved to the new state. A node the
//! block did not rewrite has the same leaves under it before and after the block, so reads
//! between the writes and the eviction can still come from the old state's leaves, except
//! where the block deleted a node or wiped a storage trie, which the store remembers until the
//! eviction.
//!
//! The depth can be given a memory budget ([`BoundedNodeStore::with_budget`]): whenever the
//! nodes kept outgrow it, the depth is lowered one nibble at a time until they fit.

use crate::{
    HashedAccount,
    engine::root_of_node,
    node::{Node, StoredNode, Value},
    store::{ChildNodes, MemNodeStore, NodeStore, NodeUpdates, Replaced, StateTrieUpdates, TrieId},
};
use alloy_primitives::{
    B256, U256,
    map::{HashMap, HashSet},
};
use alloy_rlp::Encodable;
use alloy_trie::{Nibbles, TrieAccount, TrieMask, nodes::RlpNode};
use std::{
    borrow::Cow,
    sync::{
        Arc, Mutex, PoisonError,
        atomic::{AtomicU64, Ordering},
    },
};

/// The deepest path a state trie has (64 nibbles): a depth above it keeps every node.
const FULL_DEPTH: usize = 65;

/// The shallowest depth a budget lowers the store to: the root of each trie and its
/// children. Any shallower and a change anywhere in a trie reads back all of its leaves.
const MIN_BUDGET_DEPTH: usize = 2;

/// Where a [`BoundedNodeStore`] reads the leaves of the state it holds the top of.
///
/// Reads come from several of the trie's worker threads at once.
pub trait LeafSource: Send + Sync {
    /// The source's error.
    type Error: std::error::Error + Send + Sync + 'static;

    /// Appends the accounts whose hashed address starts with `prefix` to `out`, in address
    /// order.
    fn accounts(
        &self,
        prefix: &Nibbles,
        out: &mut Vec<(B256, HashedAccount)>,
    ) -> Result<(), Self::Error>;

    /// Appends the non-zero slots of the account `address` whose hashed slot starts with
    /// `prefix` to `out`, in slot order.
    fn storage(
        &self,
        address: B256,
        prefix: &Nibbles,
        out: &mut Vec<(B256, U256)>,
    ) -> Result<(), Self::Error>;
}

impl<T: LeafSource + ?Sized> LeafSource for Box<T> {
    type Error = T::Error;

    fn accounts(
        &self,
        prefix: &Nibbles,
        out: &mut Vec<(B256, HashedAccount)>,
    ) -> Result<(), Self::Error> {
        (**self).accounts(prefix, out)
    }

    fn storage(
        &self,
        address: B256,
        prefix: &Nibbles,
        out: &mut Vec<(B256, U256)>,
    ) -> Result<(), Self::Error> {
        (**self).storage(address, prefix, out)
    }
}

/// Why a [`BoundedNodeStore`] could not answer a read.
#[derive(Debug, thiserror::Error)]
pub enum BoundedStoreError {
    /// A node below the kept depth was read while no source was set.
    #[error(
        "no leaf source to read {path:?} of {trie:?} from (nodes below depth {depth} are not kept)"
    )]
    NoSource {
        /// The trie.
        trie: TrieId,
        /// The path read.
        path: Nibbles,
        /// The store's depth.
        depth: usize,
    },
    /// The source failed.
    #[error("leaf source: {0}")]
    Source(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// The source gave a key outside the range asked for, or keys out of order.
    #[error(
        "leaf source gave key {key} for prefix {prefix:?} of {trie:?} (outside it, or out of order)"
    )]
    BadLeaves {
        /// The trie.
        trie: TrieId,
        /// The prefix asked for.
        prefix: Nibbles,
        /// The offending key.
        key: B256,
    },
}

/// The nodes of the subtree under one path, rebuilt from its leaves.
type Subtree = HashMap<Nibbles, StoredNode>;

/// Subtrees rebuilt since the source was set, by trie and path; sixteen maps, so that
/// workers rebuilding different subtrees rarely wait for each other.
type Rebuilt = [Mutex<HashMap<(TrieId, Nibbles), Arc<Subtree>>>; 16];

/// A [`NodeStore`] that keeps the nodes above a depth in memory and rebuilds the ones below
/// from a [`LeafSource`] (see the module docs).
#[derive(Debug)]
pub struct BoundedNodeStore<L> {
    mem: MemNodeStore,
    /// Nodes at paths shorter than this stay between blocks.
    depth: usize,
    /// The most bytes the kept nodes may take; `None`: no limit.
    budget: Option<usize>,
    /// The leaves of the state the store holds; `None` between a block and the next.
    source: Option<L>,
    /// Deep paths written since the last eviction (they are in `mem` until it).
    written: Vec<(TrieId, Nibbles)>,
    /// Deep paths deleted since the last eviction.
    deleted: HashSet<(TrieId, Nibbles)>,
    /// Storage tries wiped since the last eviction.
    wiped: HashSet<B256>,
    rebuilt: Rebuilt,
    stats: ReadCounters,
}

/// What a [`BoundedNodeStore`] read from its source since [`BoundedNodeStore::take_reads`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SourceReads {
    /// Subtrees rebuilt (one range of leaves read each).
    pub subtrees: u64,
    /// Leaves read.
    pub leaves: u64,
}

#[derive(Debug, Default)]
struct ReadCounters {
    subtrees: AtomicU64,
    leaves: AtomicU64,
}

impl<L> Default for BoundedNodeStore<L> {
    fn default() -> Self {
        Self::new(FULL_DEPTH)
    }
}

impl<L> BoundedNodeStore<L> {
    /// An empty store keeping the nodes at paths shorter than `depth` (at least 1: the root of
    /// every trie stays, since its hash is the trie's root). A depth above 64 keeps everything
    /// and never reads a source.
    pub fn new(depth: usize) -> Self {
        Self {
            mem: MemNodeStore::new(),
            depth: depth.clamp(1, FULL_DEPTH),
            budget: None,
            source: None,
            written: Vec::new(),
            deleted: HashSet::default(),
            wiped: HashSet::default(),
            rebuilt: Default::default(),
            stats: ReadCounters::default(),
        }
    }

    /// An empty store that keeps every node while they fit in `bytes`, and lowers its depth
    /// at each eviction while they do not, down to the roots and their children (which it
    /// keeps whatever the budget).
    pub fn with_budget(bytes: usize) -> Self {
        Self {
            budget: Some(bytes),
            ..Self::new(FULL_DEPTH)
        }
    }

    /// Paths shorter than this are kept between blocks.
    pub fn depth(&self) -> usize {
        self.depth
    }

    /// Whether every node is kept (nothing is ever read from a source).
    pub fn keeps_everything(&self) -> bool {
        self.depth >= FULL_DEPTH
    }

    /// The nodes in memory.
    pub fn mem(&self) -> &MemNodeStore {
        &self.mem
    }

    /// What was read from the source since the last call.
    pub fn take_reads(&self) -> SourceReads {
        SourceReads {
            subtrees: self.stats.subtrees.swap(0, Ordering::Relaxed),
            leaves: self.stats.leaves.swap(0, Ordering::Relaxed),
        }
    }

    /// Sets the leaves of the state the store holds now, for the reads of the next block.
    pub fn set_source(&mut self, source: L) {
        self.clear_rebuilt();
        self.source = Some(source);
    }

    /// Drops the nodes below the depth that the last blocks wrote, what was rebuilt, and the
    /// source (which described the state before those blocks); then, over budget, lowers the
    /// depth until the kept nodes fit. Call it once the last block's reads are done.
    pub fn evict(&mut self) {
        self.clear_rebuilt();
        self.source = None;
        self.deleted.clear();
        self.wiped.clear();
        if !self.written.is_empty() {
            let mut drop = StateTrieUpdates::default();
            for (trie, path) in self.written.drain(..) {
                match trie {
                    TrieId::Account => drop.account_nodes.push_delete(path),
                    TrieId::Storage(owner) => drop
                        .storage_tries
                        .entry(owner)
                        .or_default()
                        .nodes
                        .push_delete(path),
                }
            }
            let Ok(()) = self.mem.apply(&drop);
        }
        if let Some(budget) = self.budget {
            // The maps keep the room of the nodes just dropped (a block's, or a whole launch
            // part's): give it back before taking it for kept nodes. Under budget it stays, for
            // the next block's writes.
            if self.mem.heap_bytes() > budget {
                self.mem.retain_shallower(self.depth);
            }
            while self.depth > MIN_BUDGET_DEPTH && self.mem.heap_bytes() > budget {
                self.depth = (self.depth - 1)
                    .min(self.mem.max_depth())
                    .max(MIN_BUDGET_DEPTH);
                self.mem.retain_shallower(self.depth);
                tracing::debug!(
                    target: "overdrive::trie",
                    depth = self.depth,
                    memory_mb = self.mem.heap_bytes() >> 20,
                    "Node store over its budget: the nodes below a shallower depth are read back from the leaves"
                );
            }
        }
    }

    fn clear_rebuilt(&mut self) {
        for shard in &mut self.rebuilt {
            shard
                .get_mut()
                .unwrap_or_else(PoisonError::into_inner)
                .clear();
        }
    }

    fn is_deep(&self, path: &Nibbles) -> bool {
        path.len() >= self.depth
    }

    /// Records what `nodes` of `trie` wrote and deleted below the depth.
    fn track(&mut self, trie: TrieId, nodes: &NodeUpdates) {
        for path in nodes.deletes().iter().filter(|p| p.len() >= self.depth) {
            self.deleted.insert((trie, *path));
        }
        for (path, _) in nodes.writes().filter(|(p, _)| p.len() >= self.depth) {
            self.deleted.remove(&(trie, *path));
            self.written.push((trie, *path));
        }
    }
}

impl<L: LeafSource> BoundedNodeStore<L> {
    /// Reads back now what a block that changes `key` of `trie` will read below the depth,
    /// so that the block's root finds it rebuilt: called while the block executes (its keys
    /// from the engine's state updates), it takes the reads off the root's critical path.
    ///
    /// The kept nodes are walked along the key. Where the walk gets to the depth, every read
    /// an update of the key makes (the nodes on its way, and the siblings whose references
    /// its kept parent is re-encoded over) comes from one subtree, the one under the key's
    /// first `depth - 1` nibbles; where it stops above the depth (at a leaf, or a branch or
    /// extension the key leaves), the update reads nothing back. Without a source it does
    /// nothing. A store that keeps everything reads nothing back: it brings the nodes on the
    /// key's way, and the references of their children, into the cache instead (a block's
    /// nodes are cold when it arrives, and its root's hashing waits on their misses).
    pub fn prefetch(&self, trie: TrieId, key: B256) -> Result<(), BoundedStoreError> {
        let key = Nibbles::unpack(key);
        if self.keeps_everything() {
            self.warm(trie, &key);
            return Ok(());
        }
        if self.source.is_none() {
            return Ok(());
        }
        let entry = key.slice(..self.depth - 1);
        let mut path = Nibbles::new();
        loop {
            let Ok(Some(stored)) = self.mem.get(trie, &path) else {
                return Ok(());
            };
            match &stored.node {
                Node::Leaf { .. } => return Ok(()),
                Node::Extension { key: rest, .. } => {
                    let next = path.join(rest);
                    if next.len() > entry.len() {
                        // A key that leaves the extension at its last nibble puts the branch
                        // it leads to right under a new branch, which reads it.
                        if key.starts_with(&next.slice(..next.len() - 1)) {
                            break;
                        }
                        return Ok(());
                    }
                    if !key.starts_with(&next) {
                        return Ok(());
                    }
                    path = next;
                }
                Node::Branch { state_mask, .. } => {
                    // Its children are below the depth: whichever the key falls under, the
                    // branch is re-encoded over all of their references.
                    if path.len() == entry.len() {
                        break;
                    }
                    let nibble = key.get_unchecked(path.len());
                    if !state_mask.is_bit_set(nibble) {
                        return Ok(());
                    }
                    path.push_unchecked(nibble);
                }
            }
        }
        self.subtree(trie, &entry).map(drop)
    }

    /// Walks the nodes in memory along `key` (64 nibbles), loading each and hinting the
    /// references of its children into the cache: what an update of the key reads.
    fn warm(&self, trie: TrieId, key: &Nibbles) {
        let mut path = Nibbles::new();
        while let Ok(Some(stored)) = self.mem.get(trie, &path) {
            match &stored.node {
                Node::Leaf { .. } => return,
                Node::Extension { key: rest, .. } => {
                    let next = path.join(rest);
                    if next.len() >= key.len() || !key.starts_with(&next) {
                        return;
                    }
                    path = next;
                }
                Node::Branch { state_mask, .. } => {
                    let Some(nibble) = key.get(path.len()) else {
                        return;
                    };
                    let mut child = TrieMask::default();
                    child.set_bit(nibble);
                    self.mem.prefetch_children(trie, &path, child);
                    if !state_mask.is_bit_set(nibble) {
                        return;
                    }
                    path.push_unchecked(nibble);
                }
            }
        }
    }

    /// The node at a deep `path` that is not in memory: from the subtree rebuilt under the
    /// path's first `depth - 1` nibbles, the deepest kept path above it (a kept branch
    /// re-encoded needs the references of all its children, so they are rebuilt together).
    fn rebuilt_node(
        &self,
        trie: TrieId,
        path: &Nibbles,
    ) -> Result<Option<StoredNode>, BoundedStoreError> {
        if self.deleted.contains(&(trie, *path)) {
            return Ok(None);
        }
        if let TrieId::Storage(owner) = trie
            && self.wiped.contains(&owner)
        {
            return Ok(None);
        }
        // The subtree under the kept path above: its top may not be a node of the trie (a
        // node higher up may span the path), but every node below the top is where its
        // leaves diverge or under a branch there, in the trie as in the subtree.
        let entry = path.slice(..self.depth - 1);
        let subtree = self.subtree(trie, &entry)?;
        Ok(subtree.get(path).cloned())
    }

    /// The subtree under `entry` built from the source's leaves, rebuilt once per source.
    fn subtree(&self, trie: TrieId, entry: &Nibbles) -> Result<Arc<Subtree>, BoundedStoreError> {
        let shard = &self.rebuilt[shard_of(trie, entry)];
        let key = (trie, *entry);
        if let Some(subtree) = shard
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&key)
        {
            return Ok(subtree.clone());
        }
        let source = self.source.as_ref().ok_or(BoundedStoreError::NoSource {
            trie,
            path: *entry,
            depth: self.depth,
        })?;
        let leaves = self.leaves(source, trie, entry)?;
        self.stats.subtrees.fetch_add(1, Ordering::Relaxed);
        self.stats
            .leaves
            .fetch_add(leaves.len() as u64, Ordering::Relaxed);
        let mut subtree = Subtree::default();
        if !leaves.is_empty() {
            build(*entry, &leaves, &mut subtree);
        }
        let subtree = Arc::new(subtree);
        // Two workers may rebuild the same subtree at once: both get the same nodes.
        shard
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(key, subtree.clone());
        Ok(subtree)
    }

    /// The leaves under `prefix` of `trie`, as the trie keeps them (an account's with its
    /// storage root, from the storage trie's root node in memory).
    fn leaves(
        &self,
        source: &L,
        trie: TrieId,
        prefix: &Nibbles,
    ) -> Result<Vec<(Nibbles, Value)>, BoundedStoreError> {
        let source_error = |e: L::Error| BoundedStoreError::Source(Box::new(e));
        let mut leaves = Vec::new();
        let mut out = Vec::new();
        match trie {
            TrieId::Account => {
                let mut accounts = Vec::new();
                source
                    .accounts(prefix, &mut accounts)
                    .map_err(source_error)?;
                check_keys(trie, prefix, accounts.iter().map(|(k, _)| *k))?;
                for (address, account) in accounts {
                    let Ok(root) = self.mem.get(TrieId::Storage(address), &Nibbles::new());
                    let leaf = TrieAccount {
                        nonce: account.nonce,
                        balance: account.balance,
                        storage_root: root_of_node(root.as_deref()),
                        code_hash: account.code_hash,
                    };
                    out.clear();
                    leaf.encode(&mut out);
                    leaves.push((Nibbles::unpack(address), Value::new(&out)));
                }
            }
            TrieId::Storage(owner) => {
                let mut slots = Vec::new();
                source
                    .storage(owner, prefix, &mut slots)
                    .map_err(source_error)?;
                check_keys(trie, prefix, slots.iter().map(|(k, _)| *k))?;
                for (slot, value) in slots.into_iter().filter(|(_, v)| !v.is_zero()) {
                    out.clear();
                    value.encode(&mut out);
                    leaves.push((Nibbles::unpack(slot), Value::new(&out)));
                }
            }
        }
        Ok(leaves)
    }
}

/// Which map of [`Rebuilt`] a subtree goes to.
fn shard_of(trie: TrieId, entry: &Nibbles) -> usize {
    let owner = match trie {
        TrieId::Account => 0,
        TrieId::Storage(owner) => owner[0],
    };
    let last = entry.last().unwrap_or(0);
    usize::from((owner ^ last) & 0xf)
}

/// Checks that `keys` are sorted, unique and under `prefix`: a subtree built from anything
/// else would be a wrong node, not an error.
fn check_keys(
    trie: TrieId,
    prefix: &Nibbles,
    keys: impl Iterator<Item = B256>,
) -> Result<(), BoundedStoreError> {
    let mut last: Option<B256> = None;
    for key in keys {
        if last.is_some_and(|last| last >= key) || !Nibbles::unpack(key).starts_with(prefix) {
            return Err(BoundedStoreError::BadLeaves {
                trie,
                prefix: *prefix,
                key,
            });
        }
        last = Some(key);
    }
    Ok(())
}

/// Builds the subtree of `leaves` (sorted, unique, 64-nibble keys under `path`, at least one)
/// as if `path` were a node's place, adding every node to `out`; returns the reference of the
/// node at `path`.
fn build(path: Nibbles, leaves: &[(Nibbles, Value)], out: &mut Subtree) -> RlpNode {
    let (node, children) = match leaves {
        [(key, value)] => (
            Node::Leaf {
                key: key.slice(path.len()..),
                value: value.clone(),
            },
            Vec::new(),
        ),
        [(first, _), .., (last, _)] if first.common_prefix_length(last) > path.len() => {
            let fork = first.slice(..first.common_prefix_length(last));
            let child = build(fork, leaves, out);
            let key = fork.slice(path.len()..);
            (Node::Extension { key, child }, Vec::new())
        }
        _ => {
            let at = path.len();
            let mut state_mask = TrieMask::default();
            let mut children = Vec::with_capacity(16);
            let mut rest = leaves;
            while let Some((key, _)) = rest.first() {
                let nibble = key.get_unchecked(at);
                let end = rest
                    .iter()
                    .position(|(k, _)| k.get_unchecked(at) != nibble)
                    .unwrap_or(rest.len());
                let mut child = path;
                child.push_unchecked(nibble);
                children.push(build(child, &rest[..end], out));
                state_mask.set_bit(nibble);
                rest = &rest[end..];
            }
            (
                Node::Branch {
                    state_mask,
                    value: None,
                },
                children,
            )
        }
    };
    let reference = node.reference(&children);
    out.insert(
        path,
        StoredNode {
            node,
            reference: reference.clone(),
        },
    );
    reference
}

impl<L: LeafSource> NodeStore for BoundedNodeStore<L> {
    type Error = BoundedStoreError;

    fn get(
        &self,
        trie: TrieId,
        path: &Nibbles,
    ) -> Result<Option<Cow<'_, StoredNode>>, BoundedStoreError> {
        let Ok(node) = self.mem.get(trie, path);
        if node.is_some() || !self.is_deep(path) {
            return Ok(node);
        }
        Ok(self.rebuilt_node(trie, path)?.map(Cow::Owned))
    }

    fn get_child_nodes(
        &self,
        trie: TrieId,
        path: &Nibbles,
        nibbles: TrieMask,
    ) -> Result<ChildNodes<'_>, BoundedStoreError> {
        if path.len() + 1 < self.depth {
            let Ok(children) = self.mem.get_child_nodes(trie, path, nibbles);
            return Ok(children);
        }
        let mut mask = TrieMask::default();
        let mut refs = Vec::with_capacity(nibbles.count_ones() as usize);
        let mut nodes = Vec::with_capacity(refs.capacity());
        for nibble in nibbles.iter() {
            let mut child = *path;
            child.push_unchecked(nibble);
            if let Some(stored) = self.get(trie, &child)? {
                let stored = stored.into_owned();
                mask.set_bit(nibble);
                refs.push(stored.reference);
                nodes.push(stored.node);
            }
        }
        Ok(ChildNodes::new(mask, Cow::Owned(refs), Cow::Owned(nodes)))
    }

    fn prefetch_children(&self, trie: TrieId, path: &Nibbles, nibbles: TrieMask) {
        if path.len() + 1 < self.depth {
            self.mem.prefetch_children(trie, path, nibbles);
        }
    }

    fn apply(&mut self, updates: &StateTrieUpdates) -> Result<(), BoundedStoreError> {
        if !self.keeps_everything() {
            self.track(TrieId::Account, &updates.account_nodes);
            for (owner, storage) in &updates.storage_tries {
                if storage.wiped {
                    self.wiped.insert(*owner);
                }
                self.track(TrieId::Storage(*owner), &storage.nodes);
            }
        }
        let Ok(()) = self.mem.apply(updates);
        Ok(())
    }

    fn apply_replacing(
        &mut self,
        updates: &StateTrieUpdates,
    ) -> Result<Option<Replaced>, BoundedStoreError> {
        // Below the depth the old nodes are not in memory: they are read first.
        if !self.keeps_everything() {
            return Ok(None);
        }
        let Ok(replaced) = self.mem.apply_replacing(updates);
        Ok(replaced)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        CompactTrie, StateRootOutput, StateTrie, TrieConfig,
        compact::tests::{Model, Table, block_diff, blocks_and_keys, expected_rows, write_rows},
    };
    use proptest::prelude::*;
    use std::convert::Infallible;

    /// The leaves of a model state.
    #[derive(Clone, Debug)]
    struct ModelLeaves(Arc<Model>);

    impl LeafSource for ModelLeaves {
        type Error = Infallible;

        fn accounts(
            &self,
            prefix: &Nibbles,
            out: &mut Vec<(B256, HashedAccount)>,
        ) -> Result<(), Infallible> {
            out.extend(
                self.0
                    .iter()
                    .filter(|(k, _)| Nibbles::unpack(*k).starts_with(prefix))
                    .map(|(k, (account, _))| (*k, *account)),
            );
            Ok(())
        }

        fn storage(
            &self,
            address: B256,
            prefix: &Nibbles,
            out: &mut Vec<(B256, U256)>,
        ) -> Result<(), Infallible> {
            if let Some((_, slots)) = self.0.get(&address) {
                out.extend(
                    slots
                        .iter()
                        .filter(|(k, _)| Nibbles::unpack(*k).starts_with(prefix))
                        .map(|(k, v)| (*k, *v)),
                );
            }
            Ok(())
        }
    }

    type Bounded = CompactTrie<BoundedNodeStore<ModelLeaves>>;

    fn config(threads: usize) -> TrieConfig {
        TrieConfig {
            threads,
            parallel_threshold: 2,
            ..TrieConfig::default()
        }
    }

    fn bounded(store: BoundedNodeStore<ModelLeaves>, threads: usize) -> Bounded {
        CompactTrie::new(StateTrie::new(store, config(threads)).unwrap())
    }

    fn full(threads: usize) -> CompactTrie {
        CompactTrie::new(StateTrie::new(MemNodeStore::new(), config(threads)).unwrap())
    }

    /// One block on both tries: the bounded one reading `before`'s leaves. Both must give the
    /// same output; returns it with the bounded trie's rows and undo batch.
    fn step(
        bounded: &mut Bounded,
        full: &mut CompactTrie,
        before: &Model,
        diff: &crate::HashedStateChanges,
    ) -> (StateRootOutput, crate::CompactUpdates, StateRootOutput) {
        bounded
            .store_mut()
            .set_source(ModelLeaves(Arc::new(before.clone())));
        let output = bounded.trie().compute(diff).unwrap();
        let expected = full.trie().compute(diff).unwrap();
        assert_eq!(output.root, expected.root);
        assert_eq!(output.updates, expected.updates);
        let (rows, undo) = bounded.commit_with_undo(&output).unwrap();
        let (expected_rows, expected_undo) = full.commit_with_undo(&expected).unwrap();
        assert_eq!(rows, expected_rows);
        assert_eq!(
            crate::undo::tests::outcome(&undo.updates),
            crate::undo::tests::outcome(&expected_undo.updates)
        );
        bounded.evict();
        (output, rows, undo)
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: crate::proptest_cases(32), ..ProptestConfig::default() })]

        /// Blocks of inserts, updates, deletes, wipes and re-created accounts over keys with
        /// long shared prefixes, on a store that keeps only the nodes above `depth`: every
        /// root, node batch, row and undo batch equals the in-memory trie's, and so do the
        /// blocks taken back with the undo batches and new blocks after them.
        #[test]
        fn a_bounded_store_gives_what_the_full_one_gives(
            (addresses, blocks) in blocks_and_keys(),
            depth in 1..8usize,
            threads in 1..4usize,
            back in 1..4usize,
        ) {
            let mut model = Model::new();
            let mut bounded = bounded(BoundedNodeStore::new(depth), threads);
            let mut full = full(threads);
            let mut table = Table::new();
            let mut history = Vec::new();
            for changes in &blocks {
                let before = model.clone();
                let diff = block_diff(&mut model, &addresses, changes);
                let (_, rows, undo) = step(&mut bounded, &mut full, &before, &diff);
                write_rows(&mut table, &rows);
                prop_assert_eq!(&table, &expected_rows(&model));
                prop_assert!(bounded.trie().store().mem().count_from(depth) == 0);
                history.push((undo, before));
            }
            for _ in 0..back.min(history.len()) {
                let (undo, before) = history.pop().unwrap();
                bounded.store_mut().set_source(ModelLeaves(Arc::new(model.clone())));
                bounded.commit_without_rows(&undo).unwrap();
                bounded.evict();
                full.commit_without_rows(&undo).unwrap();
                prop_assert_eq!(bounded.trie().root(), full.trie().root());
                model = before;
            }
            for changes in blocks.iter().rev() {
                let before = model.clone();
                let diff = block_diff(&mut model, &addresses, changes);
                step(&mut bounded, &mut full, &before, &diff);
            }
        }

        /// Each block's keys prefetched before its root: the root then reads nothing back
        /// itself (the prefetch found every subtree the update needs), and gives the full
        /// trie's output. A store that keeps everything (depth 65) only walks its nodes.
        #[test]
        fn a_prefetched_block_reads_nothing_more(
            (addresses, blocks) in blocks_and_keys(),
            depth in prop_oneof![1..8usize, Just(FULL_DEPTH)],
        ) {
            let mut model = Model::new();
            let mut bounded = bounded(BoundedNodeStore::new(depth), 2);
            let mut full = full(2);
            for changes in &blocks {
                let before = model.clone();
                let diff = block_diff(&mut model, &addresses, changes);
                bounded.store_mut().set_source(ModelLeaves(Arc::new(before.clone())));
                let store = bounded.trie().store();
                for address in diff.accounts.keys().chain(diff.storages.keys()) {
                    store.prefetch(TrieId::Account, *address).unwrap();
                }
                for (owner, storage) in &diff.storages {
                    for slot in storage.slots.keys() {
                        store.prefetch(TrieId::Storage(*owner), *slot).unwrap();
                    }
                }
                store.take_reads();
                let output = bounded.trie().compute(&diff).unwrap();
                prop_assert_eq!(bounded.trie().store().take_reads(), SourceReads::default());
                let expected = full.trie().compute(&diff).unwrap();
                prop_assert_eq!(output.root, expected.root);
                prop_assert_eq!(&output.updates, &expected.updates);
                bounded.commit(&output).unwrap();
                full.commit(&expected).unwrap();
                bounded.evict();
            }
        }

        /// A budget lowers the depth until the kept nodes fit (or only the roots and their
        /// children are left), and the trie goes on giving the full trie's roots and rows.
        #[test]
        fn a_budget_lowers_the_depth(
            (addresses, blocks) in blocks_and_keys(),
            budget in 0..20_000usize,
        ) {
            let mut model = Model::new();
            let mut bounded = bounded(BoundedNodeStore::with_budget(budget), 2);
            let mut full = full(2);
            for changes in &blocks {
                let before = model.clone();
                let diff = block_diff(&mut model, &addresses, changes);
                step(&mut bounded, &mut full, &before, &diff);
                let store = bounded.trie().store();
                prop_assert!(store.depth() == 2 || store.mem().heap_bytes() <= budget);
            }
        }
    }

    /// 256 accounts created in one block on a trie that keeps only the root and its children,
    /// and on the full trie; the model state and the accounts' keys.
    fn two_levels_of_256_accounts() -> (Bounded, CompactTrie, Model, Vec<B256>) {
        let mut model = Model::new();
        let keys: Vec<B256> = (0u8..=255)
            .map(|i| alloy_primitives::keccak256([i]))
            .collect();
        let created: Vec<_> = (0..keys.len())
            .map(|a| crate::compact::tests::Change::Account(a, 1))
            .collect();
        let mut trie = bounded(BoundedNodeStore::new(2), 2);
        let mut full = full(2);
        let diff = block_diff(&mut model, &keys, &created);
        step(&mut trie, &mut full, &Model::new(), &diff);
        assert_eq!(
            trie.trie().store().mem().len(),
            17,
            "the root and its children are kept"
        );
        // (The undo batch looked for the new nodes in the empty state before.)
        trie.trie().store().take_reads();
        (trie, full, model, keys)
    }

    /// What reading back the subtree under the first nibble of `key` reads.
    fn subtree_under_first_nibble(keys: &[B256], key: B256) -> SourceReads {
        let under = Nibbles::unpack(key).slice(..1);
        let leaves = keys
            .iter()
            .filter(|k| Nibbles::unpack(*k).starts_with(&under))
            .count() as u64;
        SourceReads {
            subtrees: 1,
            leaves,
        }
    }

    /// Accounts created in one block, then one of them changed: with only the root and its
    /// children kept, the change reads back the one subtree under the account's first nibble.
    #[test]
    fn a_change_reads_back_the_subtree_it_falls_in() {
        let (mut trie, mut full, mut model, keys) = two_levels_of_256_accounts();
        let before = model.clone();
        let diff = block_diff(
            &mut model,
            &keys,
            &[crate::compact::tests::Change::Account(7, 9)],
        );
        step(&mut trie, &mut full, &before, &diff);
        assert_eq!(
            trie.trie().store().take_reads(),
            subtree_under_first_nibble(&keys, keys[7])
        );
    }

    /// The same change prefetched: the prefetch reads the one subtree, the root nothing.
    #[test]
    fn a_prefetch_reads_what_the_change_will() {
        let (mut trie, full, mut model, keys) = two_levels_of_256_accounts();
        let store = trie.trie().store();
        store.prefetch(TrieId::Account, keys[7]).unwrap();
        assert_eq!(store.take_reads(), SourceReads::default(), "no source yet");
        trie.store_mut()
            .set_source(ModelLeaves(Arc::new(model.clone())));
        let store = trie.trie().store();
        store.prefetch(TrieId::Account, keys[7]).unwrap();
        assert_eq!(
            store.take_reads(),
            subtree_under_first_nibble(&keys, keys[7])
        );
        // A storage trie that does not exist has nothing to read back.
        store
            .prefetch(TrieId::Storage(keys[7]), B256::ZERO)
            .unwrap();
        assert_eq!(store.take_reads(), SourceReads::default());

        let diff = block_diff(
            &mut model,
            &keys,
            &[crate::compact::tests::Change::Account(7, 9)],
        );
        let output = trie.trie().compute(&diff).unwrap();
        assert_eq!(trie.trie().store().take_reads(), SourceReads::default());
        assert_eq!(output.root, full.trie().compute(&diff).unwrap().root);
    }

    /// A trie built in parts with [`CompactTrie::commit_new`] knows which of its kept
    /// branches have a row: a block's rows read nothing back beyond what its root read. Built
    /// without rows, the rows of the first blocks read back the subtrees of the untouched
    /// siblings of the branches they change, to learn it.
    #[test]
    fn a_trie_built_with_rows_knows_its_kept_branches() {
        use crate::compact::tests::{Change, part_of};
        let keys: Vec<B256> = (0u16..4096)
            .map(|i| alloy_primitives::keccak256(i.to_be_bytes()))
            .collect();
        let created: Vec<_> = (0..keys.len()).map(|a| Change::Account(a, 1)).collect();
        let mut model = Model::new();
        let diff = block_diff(&mut model, &keys, &created);
        let rows_reads = |with_rows: bool| {
            let mut trie = bounded(BoundedNodeStore::new(3), 2);
            for nibble in 0..16 {
                let built: Model = model
                    .iter()
                    .filter(|(address, _)| address[0] >> 4 < nibble)
                    .map(|(address, state)| (*address, state.clone()))
                    .collect();
                trie.store_mut().set_source(ModelLeaves(Arc::new(built)));
                let output = trie.trie().compute(&part_of(&diff, nibble)).unwrap();
                if with_rows {
                    trie.commit_new(&output).unwrap();
                } else {
                    trie.commit_without_rows(&output).unwrap();
                }
                trie.evict();
            }
            let mut after = model.clone();
            let block = block_diff(&mut after, &keys, &[Change::Account(7, 9)]);
            trie.store_mut()
                .set_source(ModelLeaves(Arc::new(model.clone())));
            let output = trie.trie().compute(&block).unwrap();
            trie.trie().store().take_reads();
            let rows = trie.commit(&output).unwrap();
            (trie.trie().store().take_reads(), rows)
        };
        let (reads, rows) = rows_reads(true);
        assert_eq!(reads, SourceReads::default());
        let (reads, rows_learnt) = rows_reads(false);
        assert!(reads.subtrees > 0, "{reads:?}");
        assert_eq!(rows, rows_learnt);
    }

    #[test]
    fn a_deep_read_without_a_source_is_an_error() {
        let mut model = Model::new();
        let keys: Vec<B256> = (0u8..40)
            .map(|i| alloy_primitives::keccak256([i]))
            .collect();
        let changes: Vec<_> = (0..keys.len())
            .map(|a| crate::compact::tests::Change::Account(a, 1))
            .collect();
        let diff = block_diff(&mut model, &keys, &changes);
        let mut trie = bounded(BoundedNodeStore::new(1), 1);
        trie.store_mut().set_source(ModelLeaves(Arc::default()));
        let output = trie.trie().compute(&diff).unwrap();
        trie.commit(&output).unwrap();
        trie.evict();
        let diff = block_diff(
            &mut model,
            &keys,
            &[crate::compact::tests::Change::Account(3, 9)],
        );
        let error = trie.trie().compute(&diff).unwrap_err();
        assert!(error.to_string().contains("no leaf source"), "{error}");
    }

    #[test]
    fn leaves_out_of_order_are_an_error() {
        let keys = [B256::repeat_byte(2), B256::repeat_byte(1)];
        let error = check_keys(TrieId::Account, &Nibbles::new(), keys.into_iter()).unwrap_err();
        assert!(matches!(error, BoundedStoreError::BadLeaves { .. }));
        let outside = [B256::repeat_byte(0x11)];
        let prefix = Nibbles::from_nibbles([2]);
        assert!(check_keys(TrieId::Account, &prefix, outside.into_iter()).is_err());
    }
}
