//! A serial incremental root in the manner of reth's `StateRoot`, the baseline the trie is
//! measured against: the stored trie keeps only branch nodes (as alloy-trie's
//! [`BranchNodeCompact`], with the hashes of branch children); a walk descends the stored
//! nodes along the changed keys, hands the hash of every untouched subtree that has one to a
//! [`HashBuilder`], and re-feeds it every leaf of the touched regions from the sorted leaf set.

use alloy_primitives::B256;
use alloy_trie::{BranchNodeCompact, HashBuilder, Nibbles};
use std::{collections::BTreeMap, ops::Bound};

/// One trie's stored branch nodes, by path.
#[derive(Clone, Debug, Default)]
pub(crate) struct StoredBranches {
    nodes: BTreeMap<Nibbles, BranchNodeCompact>,
    root: Option<B256>,
}

impl StoredBranches {
    /// Builds the stored nodes of a full trie over `leaves`.
    pub(crate) fn build<V>(
        leaves: &BTreeMap<B256, V>,
        mut encode: impl FnMut(&B256, &V, &mut Vec<u8>),
    ) -> Self {
        let mut builder = HashBuilder::default().with_updates(true);
        let mut buf = Vec::with_capacity(128);
        for (key, value) in leaves {
            buf.clear();
            encode(key, value, &mut buf);
            builder.add_leaf(Nibbles::unpack(key), &buf);
        }
        let root = builder.root();
        let (_, nodes) = builder.split();
        Self {
            nodes: nodes.into_iter().collect(),
            root: Some(root),
        }
    }

    /// The new root after the keys in `changed` (sorted, unique; present in `leaves` with
    /// their new values, or absent when deleted) changed, updating the stored nodes.
    pub(crate) fn update<V>(
        &mut self,
        leaves: &BTreeMap<B256, V>,
        changed: &[Nibbles],
        encode: impl FnMut(&B256, &V, &mut Vec<u8>),
    ) -> B256 {
        if changed.is_empty()
            && let Some(root) = self.root
        {
            return root;
        }
        let mut walk = Walk {
            leaves,
            changed,
            builder: HashBuilder::default().with_updates(true),
            cursor: Some(B256::ZERO),
            visited: Vec::new(),
            buf: Vec::with_capacity(128),
            encode,
        };
        let first = self.nodes.iter().next().map(|(k, v)| (*k, v));
        if let Some((path, node)) = first {
            walk.visit(&self.nodes, path, node);
        }
        walk.emit_until(None);
        let root = walk.builder.root();
        let (_, updated) = walk.builder.split();
        for path in &walk.visited {
            self.nodes.remove(path);
        }
        self.nodes.extend(updated);
        self.root = Some(root);
        root
    }
}

struct Walk<'a, V, F> {
    leaves: &'a BTreeMap<B256, V>,
    changed: &'a [Nibbles],
    builder: HashBuilder,
    /// The smallest leaf key not yet handed to the builder or skipped; `None` past the end.
    cursor: Option<B256>,
    visited: Vec<Nibbles>,
    buf: Vec<u8>,
    encode: F,
}

fn lower_bound(prefix: &Nibbles) -> B256 {
    let mut bytes = [0u8; 32];
    prefix.pack_to(&mut bytes);
    B256::from(bytes)
}

impl<V, F: FnMut(&B256, &V, &mut Vec<u8>)> Walk<'_, V, F> {
    fn prefix_changed(&self, prefix: &Nibbles) -> bool {
        let at = self.changed.partition_point(|k| k < prefix);
        self.changed.get(at).is_some_and(|k| k.starts_with(prefix))
    }

    /// Hands the builder every leaf from the cursor up to (not including) the subtree at
    /// `bound`, or to the end.
    fn emit_until(&mut self, bound: Option<&Nibbles>) {
        let Some(from) = self.cursor else { return };
        for (key, value) in self.leaves.range(from..) {
            let nibbles = Nibbles::unpack(key);
            if bound.is_some_and(|b| nibbles >= *b) {
                self.cursor = Some(*key);
                return;
            }
            self.buf.clear();
            (self.encode)(key, value, &mut self.buf);
            self.builder.add_leaf(nibbles, &self.buf);
        }
        self.cursor = None;
    }

    /// Moves the cursor past every leaf under `prefix`.
    fn skip(&mut self, prefix: &Nibbles) {
        self.cursor = match prefix.increment() {
            Some(next) => self
                .leaves
                .range((Bound::Included(lower_bound(&next)), Bound::Unbounded))
                .next()
                .map(|(k, _)| *k),
            None => None,
        };
    }

    fn visit(
        &mut self,
        nodes: &BTreeMap<Nibbles, BranchNodeCompact>,
        path: Nibbles,
        node: &BranchNodeCompact,
    ) {
        self.visited.push(path);
        for nibble in node.state_mask.iter() {
            let mut child = path;
            child.push_unchecked(nibble);
            if node.hash_mask.is_bit_set(nibble) && !self.prefix_changed(&child) {
                self.emit_until(Some(&child));
                self.builder.add_branch(
                    child,
                    node.hash_for_nibble(nibble),
                    node.tree_mask.is_bit_set(nibble),
                );
                self.skip(&child);
            } else if node.tree_mask.is_bit_set(nibble) {
                let below = nodes
                    .range(child..)
                    .next()
                    .filter(|(k, _)| k.starts_with(&child));
                if let Some((k, n)) = below {
                    self.visit(nodes, *k, n);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloy_primitives::{U256, keccak256};
    use overdrive_trie::reference;
    use proptest::prelude::*;

    fn encode(_: &B256, v: &U256, out: &mut Vec<u8>) {
        alloy_rlp::Encodable::encode(v, out);
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

        /// The baseline must be right for its timing to mean anything.
        #[test]
        fn incremental_matches_full_build(
            initial in prop::collection::btree_map(0u16..600, 1u64..1000, 0..300),
            blocks in prop::collection::vec(prop::collection::vec((0u16..600, 0u64..1000), 1..80), 1..5),
        ) {
            let key = |k: u16| keccak256(k.to_be_bytes());
            let mut leaves: BTreeMap<B256, U256> = initial.iter().map(|(k, v)| (key(*k), U256::from(*v))).collect();
            let mut stored = StoredBranches::build(&leaves, encode);
            for block in blocks {
                let mut changed: Vec<Nibbles> = Vec::new();
                for (k, v) in block {
                    if v == 0 { leaves.remove(&key(k)); } else { leaves.insert(key(k), U256::from(v)); }
                    changed.push(Nibbles::unpack(key(k)));
                }
                changed.sort_unstable();
                changed.dedup();
                let root = stored.update(&leaves, &changed, encode);
                prop_assert_eq!(root, reference::hashed_storage_root(leaves.iter().map(|(k, v)| (*k, *v))));
                let rebuilt = StoredBranches::build(&leaves, encode);
                prop_assert_eq!(&stored.nodes, &rebuilt.nodes);
            }
        }
    }
}
