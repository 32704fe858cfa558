//! Taking a committed block back: [`StateTrie::undo_of`] reads, before a batch is committed,
//! the nodes it overwrites and deletes, as a batch that restores them. A node that keeps one
//! trie in memory and follows a chain steps back with it when a block it committed is dropped
//! (invalid for another reason, or reorganised away), instead of copying the trie per block.

use crate::{
    StateRootOutput, StateTrie, TrieError,
    node::Node,
    store::{
        NodeStore, NodeUpdates, Replaced, ReplacedNodes, StateTrieUpdates, StorageNodeUpdates,
        TrieId,
    },
};
use alloy_trie::Nibbles;
use rayon::prelude::*;

/// The batch that puts `paths` of `trie` back as they are now.
fn undo_nodes<S: NodeStore + ?Sized>(
    store: &S,
    trie: TrieId,
    paths: Vec<&Nibbles>,
) -> Result<NodeUpdates, TrieError> {
    let mut undo = NodeUpdates::default();
    for path in paths {
        match store.get(trie, path).map_err(TrieError::store)? {
            Some(old) => undo.push_write(*path, old.into_owned()),
            None => undo.push_delete(*path),
        }
    }
    Ok(undo)
}

/// The batch that puts back what `replaced` notes each path held.
fn nodes_back(replaced: ReplacedNodes) -> NodeUpdates {
    let mut undo = NodeUpdates::default();
    for (path, old) in replaced {
        match old {
            Some(old) => undo.push_write(path, old),
            None => undo.push_delete(path),
        }
    }
    undo
}

/// Every node of `trie` as writes, walked from its root.
fn all_nodes<S: NodeStore + ?Sized>(store: &S, trie: TrieId) -> Result<NodeUpdates, TrieError> {
    let mut nodes = NodeUpdates::default();
    let mut pending = vec![Nibbles::new()];
    while let Some(path) = pending.pop() {
        let Some(stored) = store.get(trie, &path).map_err(TrieError::store)? else {
            if path.is_empty() {
                break;
            }
            return Err(TrieError::MissingNode { trie, path });
        };
        let stored = stored.into_owned();
        match &stored.node {
            Node::Branch { state_mask, .. } => {
                for nibble in state_mask.iter() {
                    let mut child = path;
                    child.push_unchecked(nibble);
                    pending.push(child);
                }
            }
            Node::Extension { key, .. } => pending.push(path.join(key)),
            Node::Leaf { .. } => {}
        }
        nodes.push_write(path, stored);
    }
    Ok(nodes)
}

impl<S: NodeStore> StateTrie<S> {
    /// The output that, committed after `output`, takes the store and the root back to what
    /// they are now: the old nodes of every path `output` writes or deletes, and the whole old
    /// trie of every storage trie it wipes. Read before `output` is committed.
    pub fn undo_of<'a>(&self, output: &'a StateRootOutput) -> Result<StateRootOutput, TrieError> {
        let store = self.store();
        let updates = &output.updates;
        // The reads are spread over the pool by trie, and in a trie with as many changes as
        // make a subtree's hashing parallel by the path's first nibble (the root's own path
        // with the first nibble's), and joined back in that order: splitting a few reads costs
        // more than it saves, and a block changes many small storage tries.
        let threshold = self.config().parallel_threshold;
        let mut jobs: Vec<(TrieId, Vec<&Nibbles>)> = Vec::new();
        let mut split = |trie, nodes: &'a NodeUpdates| {
            let paths = nodes.writes().map(|(path, _)| path).chain(nodes.deletes());
            if nodes.write_count() + nodes.deletes().len() < threshold {
                jobs.push((trie, paths.collect()));
                return;
            }
            let mut shards: [Vec<&Nibbles>; 16] = Default::default();
            for path in paths {
                shards[usize::from(path.first().unwrap_or(0))].push(path);
            }
            jobs.extend(
                shards
                    .into_iter()
                    .filter(|paths| !paths.is_empty())
                    .map(|paths| (trie, paths)),
            );
        };
        split(TrieId::Account, &updates.account_nodes);
        for (owner, storage) in &updates.storage_tries {
            if !storage.wiped {
                split(TrieId::Storage(*owner), &storage.nodes);
            }
        }
        let shards: Vec<(TrieId, Result<NodeUpdates, TrieError>)> = self.install(|| {
            jobs.into_par_iter()
                .map(|(trie, paths)| (trie, undo_nodes(store, trie, paths)))
                .collect()
        });
        let mut undo = StateTrieUpdates::default();
        for (owner, storage) in &updates.storage_tries {
            let nodes = if storage.wiped {
                // Whatever the batch wrote after its wipe goes with this wipe.
                all_nodes(store, TrieId::Storage(*owner))?
            } else {
                NodeUpdates::default()
            };
            let wiped = storage.wiped;
            undo.storage_tries
                .insert(*owner, StorageNodeUpdates { wiped, nodes });
        }
        for (trie, nodes) in shards {
            let mut nodes = nodes?;
            let joined = match trie {
                TrieId::Account => &mut undo.account_nodes,
                TrieId::Storage(owner) => match undo.storage_tries.get_mut(&owner) {
                    Some(storage) => &mut storage.nodes,
                    None => continue,
                },
            };
            joined.append(&mut nodes);
        }
        Ok(StateRootOutput {
            root: self.root(),
            updates: undo,
            stats: Default::default(),
        })
    }

    /// [`StateTrie::commit`] of `output`, returning its [`StateTrie::undo_of`]: from the nodes
    /// the store takes out as it writes, where it can ([`NodeStore::apply_replacing`]),
    /// instead of reading them all first.
    pub fn commit_with_undo(
        &mut self,
        output: &StateRootOutput,
    ) -> Result<StateRootOutput, TrieError> {
        let root = self.root();
        let Some(replaced) = self.commit_replacing(output)? else {
            let undo = self.undo_of(output)?;
            self.commit(output)?;
            return Ok(undo);
        };
        let Replaced {
            accounts,
            mut storages,
            wiped,
        } = replaced;
        let mut undo = StateTrieUpdates {
            account_nodes: nodes_back(accounts),
            ..Default::default()
        };
        for (owner, storage) in &output.updates.storage_tries {
            let nodes = if storage.wiped {
                all_nodes(&wiped, TrieId::Storage(*owner))?
            } else {
                nodes_back(storages.remove(owner).unwrap_or_default())
            };
            let wiped = storage.wiped;
            undo.storage_tries
                .insert(*owner, StorageNodeUpdates { wiped, nodes });
        }
        Ok(StateRootOutput {
            root,
            updates: undo,
            stats: Default::default(),
        })
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use crate::{
        StateTrie,
        state_trie::tests::{apply_block, op, trie},
        store::TrieId,
    };
    use alloy_primitives::B256;
    use overdrive_primitives::MemState;
    use proptest::prelude::*;
    use std::collections::{BTreeMap, BTreeSet};

    pub(crate) fn snapshot(
        trie: &StateTrie,
    ) -> Vec<(TrieId, Vec<(alloy_trie::Nibbles, crate::StoredNode)>)> {
        let store = trie.store();
        let mut tries = vec![(
            TrieId::Account,
            store.nodes(TrieId::Account).into_iter().collect(),
        )];
        for owner in store.storage_owners() {
            let id = TrieId::Storage(owner);
            let nodes: Vec<_> = store.nodes(id).into_iter().collect();
            if !nodes.is_empty() {
                tries.push((id, nodes));
            }
        }
        tries
    }

    /// The node a batch leaves at each path it changes (`None`: deleted).
    pub(crate) type PathOutcomes =
        BTreeMap<(TrieId, alloy_trie::Nibbles), Option<crate::StoredNode>>;

    /// What a batch leaves at each path it changes (a write's node, or none for a delete) and
    /// the storage tries it wipes: the same for two batches that make the same changes in any
    /// order (each path changed once).
    pub(crate) fn outcome(updates: &crate::StateTrieUpdates) -> (PathOutcomes, BTreeSet<B256>) {
        let mut paths = PathOutcomes::new();
        let mut add = |trie, nodes: &crate::NodeUpdates| {
            for path in nodes.deletes() {
                paths.insert((trie, *path), None);
            }
            for (path, node) in nodes.writes() {
                paths.insert((trie, *path), Some(node.clone()));
            }
        };
        add(TrieId::Account, &updates.account_nodes);
        let mut wiped = BTreeSet::new();
        for (owner, storage) in &updates.storage_tries {
            add(TrieId::Storage(*owner), &storage.nodes);
            if storage.wiped {
                wiped.insert(*owner);
            }
        }
        (paths, wiped)
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: crate::proptest_cases(32), ..ProptestConfig::default() })]

        /// Blocks committed one after the other (each with the undo batch the store takes out as
        /// it writes, equal to the one read before), then undone newest first: after each undo the
        /// root and every node are those of the block before (wipes and re-created accounts
        /// included), and the trie goes on from there as if the undone blocks never came.
        #[test]
        fn undo_steps_back_block_by_block(
            blocks in prop::collection::vec(prop::collection::vec(op(24, 40), 1..30), 2..6),
        ) {
            let mut model = MemState::default();
            let mut trie = trie(2, 2);
            let mut history = vec![(trie.root(), snapshot(&trie))];
            let mut undos = Vec::new();
            let mut diffs = Vec::new();
            for ops in &blocks {
                let diff = apply_block(&mut model, ops);
                let output = trie.compute(&diff).unwrap();
                // The nodes the store takes out as it writes are the ones read before.
                let read = trie.undo_of(&output).unwrap();
                let taken = trie.commit_with_undo(&output).unwrap();
                prop_assert_eq!(taken.root, read.root);
                prop_assert_eq!(outcome(&taken.updates), outcome(&read.updates));
                // Each path once: the order of a batch's changes does not matter.
                let changes = output.updates.writes() + output.updates.deletes();
                prop_assert_eq!(outcome(&output.updates).0.len(), changes);
                undos.push(taken);
                history.push((trie.root(), snapshot(&trie)));
                diffs.push(diff);
            }
            history.pop();
            while let Some(undo) = undos.pop() {
                trie.commit(&undo).unwrap();
                let (root, nodes) = history.pop().unwrap();
                prop_assert_eq!(trie.root(), root);
                prop_assert_eq!(snapshot(&trie), nodes);
            }
            let mut fresh = super::super::state_trie::tests::trie(1, 64);
            for diff in &diffs {
                prop_assert_eq!(trie.apply(diff).unwrap().root, fresh.apply(diff).unwrap().root);
            }
            prop_assert_eq!(snapshot(&trie), snapshot(&fresh));
        }
    }
}
