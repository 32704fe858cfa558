//! The trie's branch nodes in the compact form a database keeps for them: alloy-trie's
//! [`BranchNodeCompact`] at each branch path, with its masks exactly as alloy-trie's
//! `HashBuilder` sets them — the rows of reth's `AccountsTrie` and `StoragesTrie` tables.
//!
//! A branch is kept when a database walking the trie later needs it: when one of its children
//! is a branch (that child's bit is in the hash mask and its hash in the node) or leads, through
//! an extension or directly, to a kept branch (tree mask). A branch whose children are all
//! leaves, or extensions to branches that are not kept, is recomputed from the leaves and has
//! no row. The root has no row either (its hash is the state root).
//!
//! [`CompactTrie::commit`] commits one block's node changes and says which rows to write and
//! which to delete: every rewritten branch that is kept, and every path that held a branch
//! before the block and holds no kept branch after it. A branch's row depends only on the branch
//! and its children, and a changed child changes the branch's reference, so the branches a
//! block rewrites are the only rows that can change. The rows are read on the trie's pool, one
//! job per trie, and per first nibble of the path in a trie the block changed much.

use crate::{
    StateRootOutput, StateTrie, TrieError,
    bounded::{BoundedNodeStore, LeafSource},
    node::{Node, StoredNode},
    store::{ChildNodes, NodeStore, NodeUpdates, StateTrieUpdates, TrieId},
};
use alloy_primitives::{
    B256,
    map::{B256Map, HashMap, HashSet},
};
use alloy_trie::{BranchNodeCompact, Nibbles, TrieMask, nodes::RlpNode};
use rayon::prelude::*;

/// Rows of one trie to write and to delete, each sorted by path.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CompactNodes {
    /// Branch rows to insert or overwrite.
    pub updated: Vec<(Nibbles, BranchNodeCompact)>,
    /// Paths whose rows go (a path may not have had a row: deleting it is a no-op).
    pub removed: Vec<Nibbles>,
}

/// Row changes of one storage trie.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CompactStorage {
    /// Every row of the trie goes before `nodes` apply (the storage was wiped).
    pub wiped: bool,
    /// The rows written and deleted after the wipe.
    pub nodes: CompactNodes,
}

/// One block's row changes in every trie.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CompactUpdates {
    /// The account trie's.
    pub account: CompactNodes,
    /// Storage tries', by hashed address.
    pub storages: B256Map<CompactStorage>,
}

/// Which branches of one trie have a row, as far as a [`CompactTrie`] has looked: a parent's
/// tree mask needs it for every child, and reading it from the children's children would cost
/// a read per child. A branch's answer changes only when the branch is rewritten (its subtree
/// changed), so an answer stays right until a commit writes, deletes or wipes its path.
///
/// Answers are kept by the path without its last nibble, sixteen siblings to an entry: a
/// branch's row asks about all its children, and in a large trie each entry asked for is a
/// cache miss, once per branch instead of once per child.
///
/// Split by the first nibble of the path: a branch's answer reads only paths under its own (its
/// children and where their extensions lead), so the sixteen subtrees under the root are
/// answered in parallel, each with its own map. The root has no row and is never asked.
#[derive(Clone, Debug, Default)]
struct KeptTrie([HashMap<Nibbles, Siblings>; 16]);

/// The answers for the sixteen paths that extend one path by a nibble.
#[derive(Clone, Copy, Debug, Default)]
struct Siblings {
    /// The nibbles answered.
    known: TrieMask,
    /// Of those, the nibbles whose branch has a row.
    kept: TrieMask,
}

/// `path` as its parent path (the key of its [`Siblings`]) and its last nibble; `None` for the
/// root.
fn split_last(path: &Nibbles) -> Option<(Nibbles, u8)> {
    let last = path.last()?;
    Some((path.slice(..path.len() - 1), last))
}

impl KeptTrie {
    /// Drops what `nodes` may have changed.
    fn forget(&mut self, nodes: &NodeUpdates) {
        let mut known = Known {
            maps: &mut self.0,
            first: 0,
        };
        for path in nodes.writes().map(|(path, _)| path).chain(nodes.deletes()) {
            known.remove(path);
        }
    }

    fn retain_shallower(&mut self, depth: usize) {
        // An entry answers paths one nibble longer than its key.
        for map in &mut self.0 {
            map.retain(|parent, _| parent.len() + 1 < depth);
        }
    }
}

/// Part of a [`KeptTrie`] lent to one job: the maps of the first nibbles from `first` on.
struct Known<'a> {
    maps: &'a mut [HashMap<Nibbles, Siblings>],
    first: u8,
}

impl Known<'_> {
    /// The map of `path`'s subtree; none for the root, which is not remembered.
    fn map(&mut self, path: &Nibbles) -> Option<&mut HashMap<Nibbles, Siblings>> {
        let index = path.first()?.checked_sub(self.first)?;
        self.maps.get_mut(usize::from(index))
    }

    fn get(&mut self, path: &Nibbles) -> Option<bool> {
        let (parent, nibble) = split_last(path)?;
        let siblings = self.map(path)?.get(&parent)?;
        siblings
            .known
            .is_bit_set(nibble)
            .then(|| siblings.kept.is_bit_set(nibble))
    }

    fn insert(&mut self, path: Nibbles, kept: bool) {
        let Some((parent, nibble)) = split_last(&path) else {
            return;
        };
        if let Some(map) = self.map(&path) {
            let siblings = map.entry(parent).or_default();
            siblings.known.set_bit(nibble);
            if kept {
                siblings.kept.set_bit(nibble);
            } else {
                siblings.kept.unset_bit(nibble);
            }
        }
    }

    fn remove(&mut self, path: &Nibbles) {
        let Some((parent, nibble)) = split_last(path) else {
            return;
        };
        if let Some(map) = self.map(path)
            && let Some(siblings) = map.get_mut(&parent)
        {
            siblings.known.unset_bit(nibble);
            siblings.kept.unset_bit(nibble);
            if siblings.known.is_empty() {
                map.remove(&parent);
            }
        }
    }
}

/// [`KeptTrie`] of every trie.
#[derive(Clone, Debug, Default)]
struct Kept {
    accounts: KeptTrie,
    storages: B256Map<KeptTrie>,
}

impl Kept {
    /// Forgets the branches at paths of `depth` nibbles or more.
    fn retain_shallower(&mut self, depth: usize) {
        self.accounts.retain_shallower(depth);
        for kept in self.storages.values_mut() {
            kept.retain_shallower(depth);
        }
    }

    /// Drops what `updates` may have changed.
    fn forget(&mut self, updates: &StateTrieUpdates) {
        self.accounts.forget(&updates.account_nodes);
        for (owner, storage) in &updates.storage_tries {
            if storage.wiped {
                self.storages.remove(owner);
            } else if let Some(kept) = self.storages.get_mut(owner) {
                kept.forget(&storage.nodes);
            }
        }
    }
}

/// The rows of part of one trie, read after a batch applied: the whole trie, or, where the
/// batch changed many nodes, the subtree under one nibble of the root; the batch's writes and
/// deletes there, and what is known of the part's branches.
struct ShardRows<'a> {
    trie: TrieId,
    kept: Known<'a>,
    writes: Vec<&'a (Nibbles, StoredNode)>,
    deletes: Vec<&'a Nibbles>,
    before: &'a HashSet<Nibbles>,
}

impl ShardRows<'_> {
    /// The jobs of one trie's rows: one per nibble with a change under it, in nibble order,
    /// where the batch changed at least `threshold` nodes of the trie, otherwise one.
    fn split<'a>(
        trie: TrieId,
        kept: &'a mut KeptTrie,
        nodes: &'a NodeUpdates,
        threshold: usize,
        before: &'a HashSet<Nibbles>,
        jobs: &mut Vec<ShardRows<'a>>,
    ) {
        if nodes.write_count() + nodes.deletes().len() < threshold {
            jobs.push(ShardRows {
                trie,
                kept: Known {
                    maps: &mut kept.0,
                    first: 0,
                },
                writes: nodes.writes().collect(),
                deletes: nodes.deletes().iter().collect(),
                before,
            });
            return;
        }
        let mut writes: [Vec<&(Nibbles, StoredNode)>; 16] = Default::default();
        let mut deletes: [Vec<&Nibbles>; 16] = Default::default();
        // The root's own node has no row and stays out.
        for write in nodes.writes() {
            if let Some(first) = write.0.first() {
                writes[usize::from(first)].push(write);
            }
        }
        for path in nodes.deletes() {
            if let Some(first) = path.first() {
                deletes[usize::from(first)].push(path);
            }
        }
        let shards = kept.0.iter_mut().zip(writes).zip(deletes);
        for (first, ((map, writes), deletes)) in (0u8..).zip(shards) {
            if !writes.is_empty() || !deletes.is_empty() {
                jobs.push(ShardRows {
                    trie,
                    kept: Known {
                        maps: std::slice::from_mut(map),
                        first,
                    },
                    writes,
                    deletes,
                    before,
                });
            }
        }
    }

    fn rows<S: NodeStore + ?Sized>(mut self, store: &S) -> Result<CompactNodes, TrieError> {
        // The batch's written branches are answered again, deepest first, before any parent
        // reads them; forgetting them first keeps a stale answer out even when reading the
        // rows fails half-way.
        let written = self.writes.iter().map(|(path, _)| path);
        for path in written.chain(self.deletes.iter().copied()) {
            self.kept.remove(path);
        }
        let mut lookup = Lookup {
            store,
            kept: self.kept,
            trie: self.trie,
        };
        lookup.rows_after(&self.writes, &self.deletes, self.before)
    }
}

/// A [`StateTrie`] whose commits also give the branch rows they write and delete.
///
/// Every commit goes through [`CompactTrie::commit`], blocks and undo batches alike, so that
/// what it remembers of which branches have a row stays true.
#[derive(Debug)]
pub struct CompactTrie<S = crate::MemNodeStore> {
    trie: StateTrie<S>,
    kept: Kept,
}

impl<S: NodeStore> CompactTrie<S> {
    /// `trie`, with nothing remembered yet.
    pub fn new(trie: StateTrie<S>) -> Self {
        Self {
            trie,
            kept: Kept::default(),
        }
    }

    /// The trie.
    pub fn trie(&self) -> &StateTrie<S> {
        &self.trie
    }

    /// [`StateTrie::commit`], returning the rows the batch writes and deletes (see the
    /// module docs). On an error nothing is committed, or, when reading the rows after
    /// the commit fails, the commit stands and the error says why.
    pub fn commit(&mut self, output: &StateRootOutput) -> Result<CompactUpdates, TrieError> {
        let updates = &output.updates;
        let store = self.trie.store();
        let accounts_before = branches_before(store, TrieId::Account, &updates.account_nodes)?;
        let mut storages_before = B256Map::default();
        for (owner, storage) in &updates.storage_tries {
            // A wiped trie loses every row: none is left to delete one by one.
            let before = if storage.wiped {
                HashSet::default()
            } else {
                branches_before(store, TrieId::Storage(*owner), &storage.nodes)?
            };
            storages_before.insert(*owner, before);
        }
        self.trie.commit(output)?;
        self.rows_of_committed(output, accounts_before, storages_before)
    }

    /// [`CompactTrie::commit`] of a batch that only adds nodes where the trie has none (a
    /// trie built part by part, each part under paths no earlier part used), without reading
    /// what the paths held before: its rows, and the trie remembers which of the new branches
    /// have one while their children are at hand (a store that keeps only the top levels drops
    /// them at its next eviction).
    pub fn commit_new(&mut self, output: &StateRootOutput) -> Result<CompactUpdates, TrieError> {
        self.trie.commit(output)?;
        self.rows_of_committed(output, HashSet::default(), B256Map::default())
    }

    /// [`CompactTrie::commit`], also returning the batch that takes it back
    /// ([`StateTrie::commit_with_undo`]): the old nodes give both the undo batch and the paths
    /// that held a branch.
    pub fn commit_with_undo(
        &mut self,
        output: &StateRootOutput,
    ) -> Result<(CompactUpdates, StateRootOutput), TrieError> {
        let started = std::time::Instant::now();
        let undo = self.trie.commit_with_undo(output)?;
        let applied = started.elapsed();
        // The undo batch writes back every old node the batch replaces: its branches are the
        // paths that held one.
        let accounts_before = branches_in(&undo.updates.account_nodes);
        let storages_before = undo
            .updates
            .storage_tries
            .iter()
            .map(|(owner, storage)| {
                let before = if storage.wiped {
                    HashSet::default()
                } else {
                    branches_in(&storage.nodes)
                };
                (*owner, before)
            })
            .collect();
        let rows = self.rows_of_committed(output, accounts_before, storages_before)?;
        tracing::debug!(
            target: "overdrive::trie",
            ?applied,
            rows = ?started.elapsed().saturating_sub(applied),
            "Batch committed with its undo batch"
        );
        Ok((rows, undo))
    }

    /// The rows of `output`, committed just now; `*_before` are the paths that held a branch
    /// before it.
    fn rows_of_committed(
        &mut self,
        output: &StateRootOutput,
        accounts_before: HashSet<Nibbles>,
        storages_before: B256Map<HashSet<Nibbles>>,
    ) -> Result<CompactUpdates, TrieError> {
        let updates = &output.updates;
        let mut compact = CompactUpdates::default();
        // The storage tries' answers are taken out of the map for the parallel jobs to borrow
        // one each, and put back after.
        let mut storages: Vec<(B256, KeptTrie)> = updates
            .storage_tries
            .iter()
            .map(|(owner, storage)| {
                compact.storages.insert(
                    *owner,
                    CompactStorage {
                        wiped: storage.wiped,
                        nodes: CompactNodes::default(),
                    },
                );
                // A wiped trie's answers all go.
                let kept = self
                    .kept
                    .storages
                    .remove(owner)
                    .filter(|_| !storage.wiped)
                    .unwrap_or_default();
                (*owner, kept)
            })
            .collect();
        let empty = HashSet::default();
        let mut jobs = Vec::new();
        // A trie with as many changes as make a subtree's hashing parallel is split.
        let threshold = self.trie.config().parallel_threshold;
        ShardRows::split(
            TrieId::Account,
            &mut self.kept.accounts,
            &updates.account_nodes,
            threshold,
            &accounts_before,
            &mut jobs,
        );
        for (owner, kept) in &mut storages {
            let nodes = &updates.storage_tries[owner].nodes;
            let before = storages_before.get(owner).unwrap_or(&empty);
            let trie = TrieId::Storage(*owner);
            ShardRows::split(trie, kept, nodes, threshold, before, &mut jobs);
        }
        let trie = &self.trie;
        let shards: Vec<_> = trie.install(|| {
            jobs.into_par_iter()
                .map(|job| (job.trie, job.rows(trie.store())))
                .collect()
        });
        self.kept.storages.extend(storages);
        // Shards come in nibble order within each trie, so their rows join sorted.
        for (id, rows) in shards {
            let rows = rows?;
            let nodes = match id {
                TrieId::Account => &mut compact.account,
                TrieId::Storage(owner) => match compact.storages.get_mut(&owner) {
                    Some(storage) => &mut storage.nodes,
                    None => continue,
                },
            };
            nodes.updated.extend(rows.updated);
            nodes.removed.extend(rows.removed);
        }
        Ok(compact)
    }

    /// The trie's node store, to be changed only in ways that keep the nodes it holds for the
    /// trie's state (see [`StateTrie::store_mut`]).
    pub fn store_mut(&mut self) -> &mut S {
        self.trie.store_mut()
    }

    /// [`StateTrie::commit`] without reading rows: for a batch whose rows nobody writes, such
    /// as one taking back a block that was committed only for its rows.
    pub fn commit_without_rows(&mut self, output: &StateRootOutput) -> Result<(), TrieError> {
        self.kept.forget(&output.updates);
        self.trie.commit(output)
    }
}

impl<L: LeafSource> CompactTrie<BoundedNodeStore<L>> {
    /// Drops the nodes the store keeps only until the block's reads are done
    /// ([`BoundedNodeStore::evict`]), and what the trie remembers of the branches there.
    pub fn evict(&mut self) {
        self.trie.store_mut().evict();
        let depth = self.trie.store().depth();
        if !self.trie.store().keeps_everything() {
            self.kept.retain_shallower(depth);
        }
    }
}

/// The non-root paths `nodes` writes a branch at.
fn branches_in(nodes: &NodeUpdates) -> HashSet<Nibbles> {
    nodes
        .writes()
        .filter(|(path, stored)| !path.is_empty() && matches!(stored.node, Node::Branch { .. }))
        .map(|(path, _)| *path)
        .collect()
}

/// The row of the branch at `path` of `trie` (whose children are `state_mask`), or `None` when
/// the branch has none.
pub fn compact_branch<S: NodeStore + ?Sized>(
    store: &S,
    trie: TrieId,
    path: &Nibbles,
    state_mask: TrieMask,
) -> Result<Option<BranchNodeCompact>, TrieError> {
    let mut kept = KeptTrie::default();
    Lookup {
        store,
        kept: Known {
            maps: &mut kept.0,
            first: 0,
        },
        trie,
    }
    .row(path, state_mask)
}

/// Reads of one trie's nodes for its rows, with what is known of which branches have one.
struct Lookup<'a, S: ?Sized> {
    store: &'a S,
    kept: Known<'a>,
    trie: TrieId,
}

impl<S: NodeStore + ?Sized> Lookup<'_, S> {
    /// The row of the branch at `path`, remembered as kept or not.
    fn row(
        &mut self,
        path: &Nibbles,
        state_mask: TrieMask,
    ) -> Result<Option<BranchNodeCompact>, TrieError> {
        let trie = self.trie;
        let children = children_of(self.store, trie, path, state_mask)?;
        // The kinds of the children come from the store's summary of them, not from each
        // child's node: sixteen nodes are sixteen cache misses in a large trie.
        let hash_mask = children.branches();
        let mut tree_mask = TrieMask::default();
        let mut hashes = Vec::with_capacity(hash_mask.count_ones() as usize);
        // Children whose row is not known yet: branches here, and the branches extensions
        // lead to.
        let mut unknown = Vec::new();
        for nibble in TrieMask::new(hash_mask.get() | children.extensions().get()).iter() {
            let mut child = *path;
            child.push_unchecked(nibble);
            let below = if hash_mask.is_bit_set(nibble) {
                let reference = children.reference(nibble).and_then(RlpNode::as_hash);
                hashes.push(reference.ok_or(TrieError::MalformedNode {
                    trie,
                    path: child,
                    reason: "a branch whose encoding is shorter than a hash",
                })?);
                child
            } else {
                match children.node(nibble) {
                    Some(Node::Extension { key, .. }) => child.join(key),
                    _ => return Err(TrieError::MissingNode { trie, path: child }),
                }
            };
            match self.kept.get(&below) {
                Some(true) => tree_mask.set_bit(nibble),
                Some(false) => {}
                None => unknown.push((nibble, below)),
            }
        }
        drop(children);
        for (nibble, below) in unknown {
            let mask = self.branch_mask(&below)?;
            if self.is_kept(&below, mask)? {
                tree_mask.set_bit(nibble);
            }
        }
        let row = (!tree_mask.is_empty() || !hash_mask.is_empty())
            .then(|| BranchNodeCompact::new(state_mask, tree_mask, hash_mask, hashes, None));
        self.kept.insert(*path, row.is_some());
        Ok(row)
    }

    /// Whether the branch at `path` has a row: a child is a branch, or an extension to a
    /// branch that has one.
    fn is_kept(&mut self, path: &Nibbles, state_mask: TrieMask) -> Result<bool, TrieError> {
        if let Some(kept) = self.kept.get(path) {
            return Ok(kept);
        }
        let trie = self.trie;
        let children = children_of(self.store, trie, path, state_mask)?;
        let mut kept = !children.branches().is_empty();
        let mut extensions = Vec::new();
        if !kept {
            for nibble in children.extensions().iter() {
                let mut child = *path;
                child.push_unchecked(nibble);
                match children.node(nibble) {
                    Some(Node::Extension { key, .. }) => extensions.push(child.join(key)),
                    _ => return Err(TrieError::MissingNode { trie, path: child }),
                }
            }
        }
        drop(children);
        if !kept {
            for below in extensions {
                let mask = self.branch_mask(&below)?;
                if self.is_kept(&below, mask)? {
                    kept = true;
                    break;
                }
            }
        }
        self.kept.insert(*path, kept);
        Ok(kept)
    }

    /// The children of the branch at `path` (where an extension leads, or a branch child).
    fn branch_mask(&self, path: &Nibbles) -> Result<TrieMask, TrieError> {
        let trie = self.trie;
        match self
            .store
            .get(trie, path)
            .map_err(TrieError::store)?
            .as_deref()
            .map(|stored| &stored.node)
        {
            Some(Node::Branch { state_mask, .. }) => Ok(*state_mask),
            Some(_) => Err(TrieError::MalformedNode {
                trie,
                path: *path,
                reason: "an extension over a non-branch",
            }),
            None => Err(TrieError::MissingNode { trie, path: *path }),
        }
    }

    /// The rows a batch's `writes` and `deletes` leave, after it applied: the kept branches it
    /// wrote (deepest first, so that a parent finds its written children's answer), and the
    /// paths of `before` (branches before the batch) that hold no kept branch now.
    fn rows_after(
        &mut self,
        writes: &[&(Nibbles, StoredNode)],
        deletes: &[&Nibbles],
        before: &HashSet<Nibbles>,
    ) -> Result<CompactNodes, TrieError> {
        let mut branches: Vec<(Nibbles, TrieMask)> = Vec::new();
        let mut rows = CompactNodes::default();
        for (path, stored) in writes.iter().copied() {
            if path.is_empty() {
                continue;
            }
            match &stored.node {
                Node::Branch { state_mask, .. } => branches.push((*path, *state_mask)),
                Node::Extension { .. } | Node::Leaf { .. } => {
                    if before.contains(path) {
                        rows.removed.push(*path);
                    }
                }
            }
        }
        branches.sort_unstable_by_key(|(path, _)| std::cmp::Reverse(path.len()));
        for (path, state_mask) in branches {
            match self.row(&path, state_mask)? {
                Some(row) => rows.updated.push((path, row)),
                None if before.contains(&path) => rows.removed.push(path),
                None => {}
            }
        }
        rows.removed.extend(
            deletes
                .iter()
                .copied()
                .filter(|path| before.contains(*path)),
        );
        rows.updated.sort_unstable_by_key(|(path, _)| *path);
        rows.removed.sort_unstable();
        Ok(rows)
    }
}

/// The children of the branch at `path` of `trie`, every one of `state_mask` there.
fn children_of<'s, S: NodeStore + ?Sized>(
    store: &'s S,
    trie: TrieId,
    path: &Nibbles,
    state_mask: TrieMask,
) -> Result<ChildNodes<'s>, TrieError> {
    let children = store
        .get_child_nodes(trie, path, state_mask)
        .map_err(TrieError::store)?;
    match state_mask.iter().find(|nibble| !children.has(*nibble)) {
        Some(nibble) => {
            let mut child = *path;
            child.push_unchecked(nibble);
            Err(TrieError::MissingNode { trie, path: child })
        }
        None => Ok(children),
    }
}

/// The paths of `nodes` (written or deleted) that hold a branch now, before the batch applies.
fn branches_before<S: NodeStore + ?Sized>(
    store: &S,
    trie: TrieId,
    nodes: &NodeUpdates,
) -> Result<HashSet<Nibbles>, TrieError> {
    let mut branches = HashSet::default();
    for path in nodes
        .writes()
        .map(|(path, _)| path)
        .chain(nodes.deletes())
        .filter(|path| !path.is_empty())
    {
        let node = store.get(trie, path).map_err(TrieError::store)?;
        if let Some(Node::Branch { .. }) = node.as_deref().map(|stored| &stored.node) {
            branches.insert(*path);
        }
    }
    Ok(branches)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::{
        HashedAccount, HashedStateChanges, HashedStorageChanges, reference,
        state_trie::tests::{apply_block, op, trie},
    };
    use alloy_primitives::{B256, U256, keccak256};
    use alloy_trie::{EMPTY_ROOT_HASH, KECCAK_EMPTY, TrieAccount};
    use overdrive_primitives::MemState;
    use proptest::prelude::*;
    use std::collections::{BTreeMap, BTreeSet};

    /// The rows of every trie, as a database holds them.
    pub(crate) type Table = BTreeMap<(TrieId, Nibbles), BranchNodeCompact>;

    /// The state as a model: accounts by hashed address, each with its slots.
    pub(crate) type Model = BTreeMap<B256, (HashedAccount, BTreeMap<B256, U256>)>;

    /// Writes one block's rows as a database does: a wiped trie's rows go, then the deletes,
    /// then the writes.
    pub(crate) fn write_rows(table: &mut Table, rows: &CompactUpdates) {
        write_nodes(table, TrieId::Account, &rows.account);
        for (owner, storage) in &rows.storages {
            let trie = TrieId::Storage(*owner);
            if storage.wiped {
                table.retain(|(t, _), _| *t != trie);
            }
            write_nodes(table, trie, &storage.nodes);
        }
    }

    fn write_nodes(table: &mut Table, trie: TrieId, nodes: &CompactNodes) {
        assert!(nodes.updated.is_sorted_by_key(|(path, _)| *path));
        assert!(nodes.removed.is_sorted());
        for path in &nodes.removed {
            table.remove(&(trie, *path));
        }
        for (path, row) in &nodes.updated {
            table.insert((trie, *path), row.clone());
        }
    }

    /// The rows a HashBuilder build of `leaves` keeps (branches with a tree or hash mask, the
    /// root's aside), added to `table` under `trie`.
    fn hash_builder_rows(table: &mut Table, trie: TrieId, leaves: &BTreeMap<Nibbles, Vec<u8>>) {
        let (_, nodes) = reference::branch_nodes(leaves.iter().map(|(k, v)| (*k, v.as_slice())));
        for (path, node) in nodes {
            let kept = !node.tree_mask.is_empty() || !node.hash_mask.is_empty();
            if kept && !path.is_empty() {
                table.insert((trie, path), node);
            }
        }
    }

    /// What a HashBuilder build of the whole model keeps, in every trie.
    pub(crate) fn expected_rows(model: &Model) -> Table {
        let mut table = Table::new();
        let mut accounts = BTreeMap::new();
        for (address, (account, slots)) in model {
            let slots: BTreeMap<Nibbles, Vec<u8>> = slots
                .iter()
                .map(|(slot, value)| (Nibbles::unpack(slot), alloy_rlp::encode(value)))
                .collect();
            hash_builder_rows(&mut table, TrieId::Storage(*address), &slots);
            let storage_root = if slots.is_empty() {
                EMPTY_ROOT_HASH
            } else {
                reference::root_of_sorted(slots.iter().map(|(k, v)| (*k, v.as_slice())))
            };
            let leaf = TrieAccount {
                nonce: account.nonce,
                balance: account.balance,
                storage_root,
                code_hash: account.code_hash,
            };
            accounts.insert(Nibbles::unpack(address), alloy_rlp::encode(leaf));
        }
        hash_builder_rows(&mut table, TrieId::Account, &accounts);
        table
    }

    /// `diff` applied to the model as the trie applies it.
    fn apply_to_model(model: &mut Model, diff: &HashedStateChanges) {
        for (address, account) in &diff.accounts {
            match account {
                None => {
                    model.remove(address);
                }
                Some(account) => model.entry(*address).or_default().0 = *account,
            }
        }
        for (address, storage) in &diff.storages {
            let slots = &mut model.get_mut(address).expect("storage of a live account").1;
            if storage.wiped {
                slots.clear();
            }
            for (slot, value) in &storage.slots {
                if value.is_zero() {
                    slots.remove(slot);
                } else {
                    slots.insert(*slot, *value);
                }
            }
        }
    }

    /// Hashed keys that share prefixes of up to 13 nibbles within three families, so that the
    /// tries grow extensions and branches at many depths (keccak keys alone give a shallow,
    /// full top).
    fn key() -> impl Strategy<Value = B256> {
        (0..3u8, 0..14usize, any::<[u8; 32]>()).prop_map(|(family, shared, tail)| {
            let prefix = keccak256([family]);
            let mut key = B256::from(tail);
            for i in 0..shared {
                let nibble = (prefix[i / 2] >> (4 * (1 - i % 2))) & 0xf;
                let byte = &mut key.0[i / 2];
                *byte = if i % 2 == 0 {
                    (*byte & 0x0f) | (nibble << 4)
                } else {
                    (*byte & 0xf0) | nibble
                };
            }
            key
        })
    }

    #[derive(Clone, Debug)]
    pub(crate) enum Change {
        /// The account's nonce set (created if new).
        Account(usize, u64),
        /// The account deleted, with its storage.
        Delete(usize),
        /// A slot set (zero deletes it); the account is created if new.
        Slot(usize, B256, u16),
        /// The account's storage wiped (self-destruct and re-create).
        Wipe(usize),
    }

    fn change(accounts: usize, slots: Vec<B256>) -> impl Strategy<Value = Change> {
        prop_oneof![
            2 => (0..accounts, any::<u64>()).prop_map(|(a, nonce)| Change::Account(a, nonce)),
            1 => (0..accounts).prop_map(Change::Delete),
            12 => (0..accounts, prop::sample::select(slots), prop_oneof![1 => Just(0u16), 4 => 1..u16::MAX])
                .prop_map(|(a, slot, value)| Change::Slot(a, slot, value)),
            1 => (0..accounts).prop_map(Change::Wipe),
        ]
    }

    /// One block of changes over `model` as the diff an executor reports (final values of
    /// the touched keys, `wiped` when the storage was dropped during the block).
    pub(crate) fn block_diff(
        model: &mut Model,
        addresses: &[B256],
        changes: &[Change],
    ) -> HashedStateChanges {
        let mut touched: BTreeMap<B256, (bool, BTreeSet<B256>)> = BTreeMap::new();
        let mut accounts_changed = BTreeSet::new();
        let create = |model: &mut Model, address: B256, accounts_changed: &mut BTreeSet<B256>| {
            model.entry(address).or_insert_with(|| {
                accounts_changed.insert(address);
                let account = HashedAccount {
                    nonce: 1,
                    balance: U256::ZERO,
                    code_hash: KECCAK_EMPTY,
                };
                (account, BTreeMap::new())
            });
        };
        for change in changes {
            match *change {
                Change::Account(a, nonce) => {
                    let address = addresses[a];
                    create(model, address, &mut accounts_changed);
                    model.get_mut(&address).unwrap().0.nonce = nonce;
                    accounts_changed.insert(address);
                    touched.entry(address).or_default();
                }
                Change::Delete(a) => {
                    let address = addresses[a];
                    if model.remove(&address).is_some() {
                        accounts_changed.insert(address);
                        touched.entry(address).or_default().0 = true;
                    }
                }
                Change::Slot(a, slot, value) => {
                    let address = addresses[a];
                    create(model, address, &mut accounts_changed);
                    let slots = &mut model.get_mut(&address).unwrap().1;
                    if value == 0 {
                        slots.remove(&slot);
                    } else {
                        slots.insert(slot, U256::from(value));
                    }
                    touched.entry(address).or_default().1.insert(slot);
                }
                Change::Wipe(a) => {
                    let address = addresses[a];
                    if let Some((_, slots)) = model.get_mut(&address) {
                        slots.clear();
                        touched.entry(address).or_default().0 = true;
                    }
                }
            }
        }
        let mut diff = HashedStateChanges::default();
        for (address, (wiped, slots)) in touched {
            let Some((account, stored)) = model.get(&address) else {
                diff.accounts.insert(address, None);
                continue;
            };
            if accounts_changed.contains(&address) {
                diff.accounts.insert(address, Some(*account));
            }
            if wiped || !slots.is_empty() {
                let slots = slots
                    .into_iter()
                    .map(|slot| (slot, stored.get(&slot).copied().unwrap_or_default()))
                    .collect();
                diff.storages
                    .insert(address, HashedStorageChanges { wiped, slots });
            }
        }
        diff
    }

    pub(crate) fn blocks_and_keys() -> impl Strategy<Value = (Vec<B256>, Vec<Vec<Change>>)> {
        (
            prop::collection::vec(key(), 6),
            prop::collection::vec(key(), 1..400),
        )
            .prop_flat_map(|(addresses, slots)| {
                let blocks = prop::collection::vec(
                    prop::collection::vec(change(addresses.len(), slots), 1..120),
                    1..8,
                );
                (Just(addresses), blocks)
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: crate::proptest_cases(32), ..ProptestConfig::default() })]

        /// Blocks of inserts, updates, deletes, wipes and re-created accounts over keys with
        /// long shared prefixes: after every block, the rows written and deleted so far equal
        /// the rows a HashBuilder build of the whole state keeps, on one thread and on several,
        /// each trie's rows read whole or split by first nibble.
        #[test]
        fn rows_equal_a_fresh_build_after_every_block(
            (addresses, blocks) in blocks_and_keys(),
            threads in 1..4usize,
            threshold in prop_oneof![Just(2usize), Just(16), Just(1 << 20)],
        ) {
            let mut model = Model::new();
            let mut trie = CompactTrie::new(trie(threads, threshold));
            let mut table = Table::new();
            for changes in &blocks {
                let diff = block_diff(&mut model, &addresses, changes);
                let output = trie.trie().compute(&diff).unwrap();
                let rows = trie.commit(&output).unwrap();
                write_rows(&mut table, &rows);
                prop_assert_eq!(&table, &expected_rows(&model));
            }
        }

        /// Blocks committed, then taken back newest first with their undo batches, then new
        /// blocks on top, every commit through the same trie: the rows written so far equal a
        /// fresh build's at every step (what the trie remembers of which branches have a row
        /// follows the undo batches too).
        #[test]
        fn rows_follow_undo_batches(
            (addresses, blocks) in blocks_and_keys(),
            back in 1..4usize,
        ) {
            let mut model = Model::new();
            let mut trie = CompactTrie::new(trie(2, 2));
            let mut table = Table::new();
            let mut history = Vec::new();
            for changes in &blocks {
                let diff = block_diff(&mut model, &addresses, changes);
                let output = trie.trie().compute(&diff).unwrap();
                let (rows, undo) = trie.commit_with_undo(&output).unwrap();
                history.push((undo, model.clone()));
                write_rows(&mut table, &rows);
                prop_assert_eq!(&table, &expected_rows(&model));
            }
            for _ in 0..back.min(history.len()) {
                let (undo, _) = history.pop().unwrap();
                write_rows(&mut table, &trie.commit(&undo).unwrap());
                // Back to the state after the block before (kept with it), or the empty one.
                model = history.last().map(|(_, model)| model.clone()).unwrap_or_default();
                prop_assert_eq!(&table, &expected_rows(&model));
            }
            for changes in blocks.iter().rev() {
                let diff = block_diff(&mut model, &addresses, changes);
                let output = trie.trie().compute(&diff).unwrap();
                write_rows(&mut table, &trie.commit(&output).unwrap());
                prop_assert_eq!(&table, &expected_rows(&model));
            }
        }

        /// The same over the trie tests' random blocks of accounts and slots by keccak keys.
        #[test]
        fn rows_of_blocks_taken_back_leave_the_next_rows_right(
            (addresses, blocks) in blocks_and_keys(),
        ) {
            let mut model = Model::new();
            let mut trie = CompactTrie::new(trie(2, 2));
            let mut table = Table::new();
            for (i, changes) in blocks.iter().enumerate() {
                // A block built on this state for its rows and dropped (a payload): its rows
                // are right, and taking it back without rows leaves nothing behind.
                let root = trie.trie().root();
                let mut dropped = model.clone();
                let diff = block_diff(&mut dropped, &addresses, &blocks[blocks.len() - 1 - i]);
                let output = trie.trie().compute(&diff).unwrap();
                let (rows, undo) = trie.commit_with_undo(&output).unwrap();
                let mut dropped_table = table.clone();
                write_rows(&mut dropped_table, &rows);
                prop_assert_eq!(&dropped_table, &expected_rows(&dropped));
                trie.commit_without_rows(&undo).unwrap();
                prop_assert_eq!(trie.trie().root(), root);

                let diff = block_diff(&mut model, &addresses, changes);
                let output = trie.trie().compute(&diff).unwrap();
                write_rows(&mut table, &trie.commit(&output).unwrap());
                prop_assert_eq!(&table, &expected_rows(&model));
            }
        }

        #[test]
        fn rows_equal_a_fresh_build_over_keccak_keys(
            blocks in prop::collection::vec(prop::collection::vec(op(24, 40), 1..30), 1..6),
        ) {
            let mut state = MemState::default();
            let mut model = Model::new();
            let mut trie = CompactTrie::new(trie(2, 2));
            let mut table = Table::new();
            for ops in &blocks {
                let diff = apply_block(&mut state, ops);
                apply_to_model(&mut model, &diff);
                let output = trie.trie().compute(&diff).unwrap();
                write_rows(&mut table, &trie.commit(&output).unwrap());
                prop_assert_eq!(&table, &expected_rows(&model));
            }
        }
    }

    /// The accounts and storage of `diff` under the first nibble `nibble`.
    pub(crate) fn part_of(diff: &HashedStateChanges, nibble: u8) -> HashedStateChanges {
        HashedStateChanges {
            accounts: diff
                .accounts
                .iter()
                .filter(|(address, _)| address[0] >> 4 == nibble)
                .map(|(address, account)| (*address, *account))
                .collect(),
            storages: diff
                .storages
                .iter()
                .filter(|(address, _)| address[0] >> 4 == nibble)
                .map(|(address, storage)| (*address, storage.clone()))
                .collect(),
        }
    }

    /// Answers kept by parent path: siblings share an entry without mixing their answers, a
    /// path is unknown again once removed (the entry goes with its last answer), the root is
    /// never remembered, and the levels a bounded store drops are forgotten.
    #[test]
    fn answers_of_siblings_share_an_entry() {
        let mut trie = KeptTrie::default();
        let mut known = Known {
            maps: &mut trie.0,
            first: 0,
        };
        let path = |nibbles: &[u8]| Nibbles::from_nibbles(nibbles);
        known.insert(path(&[3, 1]), true);
        known.insert(path(&[3, 2]), false);
        known.insert(path(&[3, 2, 7]), true);
        known.insert(Nibbles::default(), true);
        assert_eq!(known.get(&path(&[3, 1])), Some(true));
        assert_eq!(known.get(&path(&[3, 2])), Some(false));
        assert_eq!(known.get(&path(&[3, 3])), None);
        assert_eq!(known.get(&path(&[3, 2, 7])), Some(true));
        assert_eq!(known.get(&Nibbles::default()), None);
        known.insert(path(&[3, 1]), false);
        assert_eq!(known.get(&path(&[3, 1])), Some(false));
        known.remove(&path(&[3, 1]));
        assert_eq!(known.get(&path(&[3, 1])), None);
        assert_eq!(known.get(&path(&[3, 2])), Some(false));
        known.remove(&path(&[3, 2]));
        assert!(!known.maps[3].contains_key(&path(&[3])));
        trie.retain_shallower(3);
        let mut known = Known {
            maps: &mut trie.0,
            first: 0,
        };
        assert_eq!(known.get(&path(&[3, 2, 7])), None);
        // A job lent the maps from nibble 3 on answers nothing before it.
        let mut lent = Known {
            maps: &mut trie.0[3..],
            first: 3,
        };
        lent.insert(path(&[4, 0]), true);
        lent.insert(path(&[2, 0]), true);
        assert_eq!(lent.get(&path(&[4, 0])), Some(true));
        assert_eq!(lent.get(&path(&[2, 0])), None);
        assert!(trie.0[2].is_empty());
    }

    /// A state built sixteen parts one after another, by first nibble, each committed with
    /// [`CompactTrie::commit_new`]: the rows of all parts are the rows of the whole state.
    #[test]
    fn a_trie_built_in_parts_writes_the_rows_of_the_whole() {
        let keys: Vec<B256> = (0u8..=200).map(|i| keccak256([i])).collect();
        let changes: Vec<Change> = (0..keys.len())
            .flat_map(|a| {
                let slot = keccak256([a as u8, 1]);
                [Change::Account(a, 1), Change::Slot(a, slot, 5)]
            })
            .chain((0..300u16).map(|i| Change::Slot(0, keccak256(i.to_be_bytes()), 7)))
            .collect();
        let mut model = Model::new();
        let diff = block_diff(&mut model, &keys, &changes);
        let mut trie = CompactTrie::new(trie(2, 2));
        let mut table = Table::new();
        for nibble in 0..16 {
            let output = trie.trie().compute(&part_of(&diff, nibble)).unwrap();
            write_rows(&mut table, &trie.commit_new(&output).unwrap());
        }
        assert_eq!(table, expected_rows(&model));
    }

    /// A row's masks for each shape of child: a branch child that is kept (hash and tree bit),
    /// a branch child over leaves only (hash bit), an extension to a kept branch (tree bit),
    /// an extension to a branch over leaves (neither), and a leaf (neither).
    #[test]
    fn masks_follow_the_children() {
        let key = |hex: &str| {
            let mut bytes = [0u8; 32];
            let nibbles: Vec<u8> = hex
                .bytes()
                .map(|c| (c as char).to_digit(16).unwrap() as u8)
                .collect();
            for (i, nibble) in nibbles.iter().enumerate() {
                bytes[i / 2] |= nibble << (4 * (1 - i % 2));
            }
            B256::from(bytes)
        };
        // Under 1: a branch whose child 0 is a branch (kept: it has a branch child).
        // Under 2: a branch over two leaves. Under 3: an extension 33 to a branch with a
        // branch child. Under 4: an extension 44 to a branch over leaves. Under 5: a leaf.
        let slots = [
            "1000", "1001", "1010", "1100", "20", "21", "33300", "33301", "33310", "44400",
            "44410", "5",
        ];
        let mut diff = HashedStateChanges::default();
        let owner = B256::repeat_byte(7);
        diff.accounts.insert(
            owner,
            Some(HashedAccount {
                nonce: 1,
                balance: U256::ZERO,
                code_hash: KECCAK_EMPTY,
            }),
        );
        diff.storages.insert(
            owner,
            HashedStorageChanges {
                wiped: false,
                slots: slots.iter().map(|s| (key(s), U256::from(1))).collect(),
            },
        );
        let mut trie = CompactTrie::new(trie(1, 64));
        let output = trie.trie().compute(&diff).unwrap();
        let rows = trie.commit(&output).unwrap();
        let rows: BTreeMap<Nibbles, BranchNodeCompact> = rows.storages[&owner]
            .nodes
            .updated
            .iter()
            .cloned()
            .collect();
        let mut model = Model::new();
        apply_to_model(&mut model, &diff);
        let expected: BTreeMap<Nibbles, BranchNodeCompact> = expected_rows(&model)
            .into_iter()
            .filter(|((trie, _), _)| *trie == TrieId::Storage(owner))
            .map(|((_, path), row)| (path, row))
            .collect();
        assert_eq!(rows, expected);
        // The root is not a row; its children decide what sits under each nibble.
        let path = |hex: &str| {
            Nibbles::from_nibbles(
                hex.bytes()
                    .map(|c| (c as char).to_digit(16).unwrap() as u8)
                    .collect::<Vec<_>>(),
            )
        };
        assert!(rows.contains_key(&path("1")), "{rows:?}");
        assert_eq!(rows[&path("1")].hash_mask, TrieMask::new(0b01));
        assert_eq!(rows[&path("1")].tree_mask, TrieMask::new(0b01));
        assert!(!rows.contains_key(&path("2")));
        assert!(rows.contains_key(&path("333")));
        assert!(!rows.contains_key(&path("444")));
        let row = trie
            .trie()
            .store()
            .get(TrieId::Storage(owner), &Nibbles::new())
            .unwrap()
            .map(|stored| stored.into_owned().node);
        let Some(Node::Branch { state_mask, .. }) = row else {
            panic!("the root is a branch")
        };
        let root = compact_branch(
            trie.trie().store(),
            TrieId::Storage(owner),
            &Nibbles::new(),
            state_mask,
        )
        .unwrap()
        .unwrap();
        assert_eq!(root.hash_mask, TrieMask::new(0b00110));
        assert_eq!(root.tree_mask, TrieMask::new(0b01010));
    }
}
