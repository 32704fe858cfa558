//! A single trie over raw keys of any length up to 32 bytes, on the same engine as the state
//! trie. Keys may be prefixes of one another (their values then sit in branch nodes), which is
//! what the ethereum/tests `TrieTests` vectors exercise.

use crate::{
    engine::{
        LeafOp, RootChange, UpdateSource, WorkerOutput, get_value, root_of_node, update_trie,
    },
    error::TrieError,
    store::{MemNodeStore, NodeStore, StateTrieUpdates, TrieId},
};
use alloy_primitives::B256;
use alloy_trie::Nibbles;
use std::collections::BTreeMap;

/// A trie over raw byte keys, kept in the account namespace of its store.
#[derive(Clone, Debug)]
pub struct RawTrie<S = MemNodeStore> {
    store: S,
    root: B256,
}

struct RawOp<'a>(Option<&'a [u8]>);

impl LeafOp for RawOp<'_> {
    fn apply(&self, _old: Option<&[u8]>, out: &mut Vec<u8>) -> Result<bool, TrieError> {
        match self.0 {
            Some(value) if !value.is_empty() => {
                out.extend_from_slice(value);
                Ok(true)
            }
            _ => Ok(false),
        }
    }
}

fn key_nibbles(key: &[u8]) -> Result<Nibbles, TrieError> {
    if key.len() > 32 {
        return Err(TrieError::KeyTooLong(key.len()));
    }
    Ok(Nibbles::unpack(key))
}

impl<S: NodeStore> RawTrie<S> {
    /// Opens the trie held by `store`.
    pub fn new(store: S) -> Result<Self, TrieError> {
        let root = root_of_node(
            store
                .get(TrieId::Account, &Nibbles::new())
                .map_err(TrieError::store)?
                .as_deref(),
        );
        Ok(Self { root, store })
    }

    /// The root hash.
    pub fn root(&self) -> B256 {
        self.root
    }

    /// The node store.
    pub fn store(&self) -> &S {
        &self.store
    }

    /// Sets (`Some`) or deletes (`None`, or an empty value, as geth does) keys; a later item
    /// for the same key wins. Returns the node changes, already written to the store.
    pub fn update<K, V>(
        &mut self,
        items: impl IntoIterator<Item = (K, Option<V>)>,
    ) -> Result<StateTrieUpdates, TrieError>
    where
        K: AsRef<[u8]>,
        V: AsRef<[u8]>,
    {
        let mut latest: BTreeMap<Nibbles, Option<V>> = BTreeMap::new();
        for (key, value) in items {
            latest.insert(key_nibbles(key.as_ref())?, value);
        }
        let ops: Vec<(Nibbles, RawOp<'_>)> = latest
            .iter()
            .map(|(key, value)| (*key, RawOp(value.as_ref().map(AsRef::as_ref))))
            .collect();
        let ctx = UpdateSource {
            store: &self.store,
            trie: TrieId::Account,
            split_at: usize::MAX,
            defer: crate::keccak::batched(),
        };
        let mut out = WorkerOutput::new(ctx.defer);
        let change = update_trie(&ctx, &ops, false, &mut out)?;
        let updates = StateTrieUpdates {
            account_nodes: out.nodes,
            ..Default::default()
        };
        self.store.apply(&updates).map_err(TrieError::store)?;
        if let RootChange::Changed(root) = change {
            self.root = root;
        }
        Ok(updates)
    }

    /// The value under `key`.
    pub fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, TrieError> {
        let ctx = UpdateSource {
            store: &self.store,
            trie: TrieId::Account,
            split_at: usize::MAX,
            defer: false,
        };
        Ok(get_value(&ctx, &key_nibbles(key)?)?.map(|v| v.to_vec()))
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::{
        node::{Node, StoredNode},
        reference,
    };
    use alloy_primitives::keccak256;
    use alloy_rlp::{Encodable, Header};
    use alloy_trie::{BranchNodeCompact, EMPTY_ROOT_HASH, TrieMask, nodes::RlpNode};
    use proptest::prelude::*;
    use std::path::PathBuf;

    // ---- ethereum/tests TrieTests -------------------------------------------------------

    fn vectors_dir() -> PathBuf {
        PathBuf::from(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../../shared/fixtures/ethereum-tests/TrieTests"
        ))
    }

    /// geth's convention: a `0x` string is hex, anything else is its UTF-8 bytes.
    fn decode_str(s: &str) -> Vec<u8> {
        match s.strip_prefix("0x") {
            Some(hex_digits) => {
                hex::decode(hex_digits).unwrap_or_else(|e| panic!("bad hex {s}: {e}"))
            }
            None => s.as_bytes().to_vec(),
        }
    }

    type Op = (Vec<u8>, Option<Vec<u8>>);

    /// The operations of one vector, in file order, with keys hashed for the secure variants.
    fn vector_ops(input: &serde_json::Value, secure: bool) -> Vec<Op> {
        let key = |k: &str| {
            let raw = decode_str(k);
            if secure {
                keccak256(&raw).to_vec()
            } else {
                raw
            }
        };
        let value = |v: &serde_json::Value| v.as_str().map(decode_str);
        match input {
            serde_json::Value::Array(items) => items
                .iter()
                .map(|item| {
                    let pair = item.as_array().expect("[key, value] pair");
                    (key(pair[0].as_str().expect("string key")), value(&pair[1]))
                })
                .collect(),
            serde_json::Value::Object(map) => map.iter().map(|(k, v)| (key(k), value(v))).collect(),
            other => panic!("unexpected vector input {other}"),
        }
    }

    fn root_one_by_one(ops: &[Op]) -> B256 {
        let mut trie = RawTrie::new(MemNodeStore::new()).unwrap();
        for (k, v) in ops {
            trie.update([(k, v.as_ref())]).unwrap();
        }
        trie.root()
    }

    fn root_batched(ops: &[Op]) -> (B256, MemNodeStore) {
        let mut trie = RawTrie::new(MemNodeStore::new()).unwrap();
        trie.update(ops.iter().map(|(k, v)| (k, v.as_ref())))
            .unwrap();
        (trie.root(), trie.store().clone())
    }

    #[test]
    fn ethereum_trie_tests() {
        let dir = vectors_dir();
        let files = [
            ("trietest.json", false),
            ("trietest_secureTrie.json", true),
            ("trieanyorder.json", false),
            ("trieanyorder_secureTrie.json", true),
            ("hex_encoded_securetrie_test.json", true),
        ];
        let mut checked = 0;
        for (file, secure) in files {
            let path = dir.join(file);
            let text = std::fs::read_to_string(&path)
                .unwrap_or_else(|e| panic!("TrieTests vectors missing at {}: {e}", path.display()));
            let tests: BTreeMap<String, serde_json::Value> =
                serde_json::from_str(&text).expect("valid JSON");
            assert!(!tests.is_empty(), "{file} holds no vectors");
            for (name, test) in tests {
                let expected: B256 = test["root"]
                    .as_str()
                    .expect("root")
                    .parse()
                    .expect("root hash");
                let ops = vector_ops(&test["in"], secure);
                assert_eq!(root_one_by_one(&ops), expected, "{file}/{name} one by one");
                let (batched, store) = root_batched(&ops);
                assert_eq!(batched, expected, "{file}/{name} batched");
                if test["in"].is_object() {
                    // Any order means any order: reversed and rotated inserts give the same root
                    // and the same stored nodes.
                    let mut reversed = ops.clone();
                    reversed.reverse();
                    assert_eq!(
                        root_one_by_one(&reversed),
                        expected,
                        "{file}/{name} reversed"
                    );
                    for shift in 1..ops.len() {
                        let mut rotated = ops.clone();
                        rotated.rotate_left(shift);
                        let mut trie = RawTrie::new(MemNodeStore::new()).unwrap();
                        for (k, v) in &rotated {
                            trie.update([(k, v.as_ref())]).unwrap();
                        }
                        assert_eq!(trie.root(), expected, "{file}/{name} rotated {shift}");
                        assert_eq!(
                            trie.store().nodes(TrieId::Account),
                            store.nodes(TrieId::Account)
                        );
                    }
                }
                checked += 1;
            }
        }
        assert!(checked >= 20, "only {checked} vectors checked");
    }

    #[test]
    fn vector_values_read_back() {
        let mut trie = RawTrie::new(MemNodeStore::new()).unwrap();
        trie.update([
            ("do", Some("verb")),
            ("dog", Some("puppy")),
            ("doge", Some("coin")),
            ("horse", Some("stallion")),
        ])
        .unwrap();
        assert_eq!(trie.get(b"do").unwrap().as_deref(), Some(&b"verb"[..]));
        assert_eq!(trie.get(b"doge").unwrap().as_deref(), Some(&b"coin"[..]));
        assert_eq!(trie.get(b"d").unwrap(), None);
        assert_eq!(trie.get(b"dogs").unwrap(), None);
        assert!(matches!(
            trie.get(&[0u8; 33]),
            Err(TrieError::KeyTooLong(33))
        ));
        trie.update([("do", None::<&str>), ("dog", Some(""))])
            .unwrap();
        assert_eq!(trie.get(b"do").unwrap(), None);
        assert_eq!(trie.get(b"dog").unwrap(), None);
        trie.update([("doge", None::<&str>), ("horse", None)])
            .unwrap();
        assert_eq!(trie.root(), EMPTY_ROOT_HASH);
        assert!(trie.store().is_empty());
    }

    // ---- an independent naive root for keys of any length --------------------------------

    fn naive_hex_prefix(nibbles: &[u8], leaf: bool) -> Vec<u8> {
        let flag = if leaf { 2 } else { 0 } + (nibbles.len() % 2) as u8;
        let mut all = vec![flag];
        if nibbles.len().is_multiple_of(2) {
            all.push(0);
        }
        all.extend_from_slice(nibbles);
        all.chunks(2).map(|c| (c[0] << 4) | c[1]).collect()
    }

    fn naive_list(items: &[Vec<u8>]) -> Vec<u8> {
        let payload: usize = items.iter().map(Vec::len).sum();
        let mut out = Vec::new();
        Header {
            list: true,
            payload_length: payload,
        }
        .encode(&mut out);
        for item in items {
            out.extend_from_slice(item);
        }
        out
    }

    fn naive_string(bytes: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        bytes.encode(&mut out);
        out
    }

    fn naive_ref(node: Vec<u8>) -> Vec<u8> {
        if node.len() < 32 {
            node
        } else {
            naive_string(keccak256(&node).as_slice())
        }
    }

    /// RLP of the node over `entries` (key nibbles, value), all sharing `depth` nibbles.
    fn naive_node(entries: &[(Vec<u8>, Vec<u8>)], depth: usize) -> Vec<u8> {
        if let [(key, value)] = entries {
            return naive_list(&[
                naive_string(&naive_hex_prefix(&key[depth..], true)),
                naive_string(value),
            ]);
        }
        let shared = (depth..)
            .take_while(|&i| {
                entries
                    .iter()
                    .all(|(k, _)| k.len() > i && k[i] == entries[0].0[i])
            })
            .count();
        if shared > 0 {
            let child = naive_ref(naive_node(entries, depth + shared));
            let key = naive_hex_prefix(&entries[0].0[depth..depth + shared], false);
            return naive_list(&[naive_string(&key), child]);
        }
        let mut items = Vec::new();
        for nibble in 0..16u8 {
            let group: Vec<_> = entries
                .iter()
                .filter(|(k, _)| k.len() > depth && k[depth] == nibble)
                .cloned()
                .collect();
            items.push(if group.is_empty() {
                vec![0x80]
            } else {
                naive_ref(naive_node(&group, depth + 1))
            });
        }
        let value = entries
            .iter()
            .find(|(k, _)| k.len() == depth)
            .map_or(&[][..], |(_, v)| v.as_slice());
        items.push(naive_string(value));
        naive_list(&items)
    }

    fn naive_root(map: &BTreeMap<Vec<u8>, Vec<u8>>) -> B256 {
        if map.is_empty() {
            return EMPTY_ROOT_HASH;
        }
        let entries: Vec<(Vec<u8>, Vec<u8>)> = map
            .iter()
            .map(|(k, v)| {
                (
                    k.iter().flat_map(|b| [b >> 4, b & 0x0f]).collect(),
                    v.clone(),
                )
            })
            .collect();
        keccak256(naive_node(&entries, 0))
    }

    #[test]
    fn naive_root_agrees_with_vectors_sample() {
        let map = BTreeMap::from([
            (b"do".to_vec(), b"verb".to_vec()),
            (b"horse".to_vec(), b"stallion".to_vec()),
            (b"doge".to_vec(), b"coin".to_vec()),
            (b"dog".to_vec(), b"puppy".to_vec()),
        ]);
        let expected: B256 = "0x5991bb8c6514148a29db676a14ac506cd2cd5775ace63c30a4fe457715e9ac84"
            .parse()
            .unwrap();
        assert_eq!(naive_root(&map), expected);
    }

    // ---- the stored branch nodes against alloy-trie's HashBuilder ------------------------

    /// Checks that the branch nodes of `nodes` are exactly the branch nodes a full
    /// `HashBuilder` build of `leaves` produces: same paths, same child masks, same hashes of
    /// hashed children. `leaves` must have equal-length keys.
    pub(crate) fn assert_branches_match_hash_builder(
        nodes: &BTreeMap<Nibbles, StoredNode>,
        leaves: &BTreeMap<Nibbles, Vec<u8>>,
        root: B256,
    ) {
        let (expected_root, expected) =
            reference::branch_nodes(leaves.iter().map(|(k, v)| (*k, v.as_slice())));
        assert_eq!(root, expected_root, "root");
        let ours: BTreeMap<Nibbles, alloy_trie::TrieMask> = nodes
            .iter()
            .filter_map(|(p, n)| match n.node {
                Node::Branch { state_mask, .. } => Some((*p, state_mask)),
                _ => None,
            })
            .collect();
        assert_eq!(
            ours.keys().collect::<Vec<_>>(),
            expected.keys().collect::<Vec<_>>(),
            "branch paths"
        );
        for (path, compact) in &expected {
            let BranchNodeCompact {
                state_mask,
                hash_mask,
                ..
            } = compact;
            assert_eq!(&ours[path], state_mask, "state mask at {path:?}");
            for nibble in hash_mask.iter() {
                let mut child = *path;
                child.push(nibble);
                let stored = &nodes[&child];
                assert_eq!(
                    stored.reference.as_hash(),
                    Some(compact.hash_for_nibble(nibble)),
                    "child {nibble} at {path:?}"
                );
            }
        }
        // Every stored reference is the one its node encodes to.
        for (path, stored) in nodes {
            let children: Vec<alloy_trie::nodes::RlpNode> = match stored.node {
                Node::Branch { state_mask, .. } => state_mask
                    .iter()
                    .map(|n| {
                        let mut child = *path;
                        child.push(n);
                        nodes[&child].reference.clone()
                    })
                    .collect(),
                _ => Vec::new(),
            };
            assert_eq!(
                stored.node.reference(&children),
                stored.reference,
                "reference at {path:?}"
            );
        }
    }

    // ---- property tests -----------------------------------------------------------------

    fn small_key(max_len: usize) -> impl Strategy<Value = Vec<u8>> {
        prop::collection::vec(
            prop::sample::select(vec![0x00u8, 0x01, 0x10, 0x11, 0xab]),
            0..=max_len,
        )
    }

    fn small_value() -> impl Strategy<Value = Option<Vec<u8>>> {
        prop_oneof![
            1 => Just(None),
            2 => prop::collection::vec(any::<u8>(), 1..4).prop_map(Some),
            2 => prop::collection::vec(any::<u8>(), 30..40).prop_map(Some),
        ]
    }

    /// Values long enough that every node above them is hashed, never inlined: reth's
    /// alloy-trie `HashBuilder` reads the child hashes of a stored branch assuming that (as
    /// holds for Ethereum's 32-byte keys) and panics on an inlined child branch.
    fn hashed_value() -> impl Strategy<Value = Option<Vec<u8>>> {
        prop_oneof![
            1 => Just(None),
            4 => prop::collection::vec(any::<u8>(), 32..40).prop_map(Some),
        ]
    }

    type Batch = Vec<(Vec<u8>, Option<Vec<u8>>)>;

    fn batches(max_len: usize) -> impl Strategy<Value = Vec<Batch>> {
        prop::collection::vec(
            prop::collection::vec((small_key(max_len), small_value()), 1..12),
            1..8,
        )
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: crate::proptest_cases(96), ..ProptestConfig::default() })]

        /// Keys of different lengths (prefixes of each other, the empty key included) against
        /// the naive definition, batch by batch; the final nodes equal a fresh build's.
        #[test]
        fn variable_length_keys_match_naive_root(batches in batches(3)) {
            let mut trie = RawTrie::new(MemNodeStore::new()).unwrap();
            let mut model = BTreeMap::new();
            for batch in &batches {
                trie.update(batch.iter().map(|(k, v)| (k, v.as_ref()))).unwrap();
                for (k, v) in batch {
                    match v {
                        Some(v) => { model.insert(k.clone(), v.clone()); }
                        None => { model.remove(k); }
                    }
                }
                prop_assert_eq!(trie.root(), naive_root(&model));
            }
            let mut fresh = RawTrie::new(MemNodeStore::new()).unwrap();
            fresh.update(model.iter().map(|(k, v)| (k, Some(v)))).unwrap();
            prop_assert_eq!(trie.store().nodes(TrieId::Account), fresh.store().nodes(TrieId::Account));
            for (k, v) in &model {
                prop_assert_eq!(trie.get(k).unwrap(), Some(v.clone()));
            }
        }

        /// Equal-length keys from a tiny alphabet (deep extensions, inline nodes, collapses)
        /// against alloy-trie's HashBuilder: root and every branch node.
        #[test]
        fn fixed_length_keys_match_hash_builder(batches in prop::collection::vec(
            prop::collection::vec((prop::collection::vec(prop::sample::select(vec![0x00u8, 0x01, 0x10]), 3), hashed_value()), 1..16),
            1..8,
        )) {
            let mut trie = RawTrie::new(MemNodeStore::new()).unwrap();
            let mut model: BTreeMap<Nibbles, Vec<u8>> = BTreeMap::new();
            for batch in &batches {
                trie.update(batch.iter().map(|(k, v)| (k, v.as_ref()))).unwrap();
                for (k, v) in batch {
                    match v {
                        Some(v) => { model.insert(Nibbles::unpack(k), v.clone()); }
                        None => { model.remove(&Nibbles::unpack(k)); }
                    }
                }
                assert_branches_match_hash_builder(&trie.store().nodes(TrieId::Account), &model, trie.root());
            }
        }
    }

    // ---- malformed stored nodes ------------------------------------------------------------

    fn nibbles(n: &[u8]) -> Nibbles {
        Nibbles::from_nibbles(n)
    }

    /// A trie over a store holding exactly `nodes`, written as a corrupted database would
    /// hand them back.
    fn corrupted(nodes: Vec<(Nibbles, StoredNode)>) -> RawTrie {
        let mut updates = StateTrieUpdates::default();
        for (path, node) in nodes {
            updates.account_nodes.push_write(path, node);
        }
        let mut store = MemNodeStore::new();
        store.apply(&updates).unwrap();
        RawTrie::new(store).unwrap()
    }

    fn leaf(key: Nibbles) -> StoredNode {
        StoredNode::new(
            Node::Leaf {
                key,
                value: crate::node::Value::new(b"v"),
            },
            &[],
        )
    }

    fn hash_ref() -> RlpNode {
        RlpNode::word_rlp(&B256::repeat_byte(7))
    }

    fn assert_malformed<T: std::fmt::Debug>(result: Result<T, TrieError>, expected: &str) {
        match result {
            Err(TrieError::MalformedNode { reason, .. }) => assert_eq!(reason, expected),
            other => panic!("expected a malformed-node error ({expected}), got {other:?}"),
        }
    }

    /// An extension with an empty key is its own child: before the check, an update recursed
    /// until the stack overflowed and a lookup looped forever.
    #[test]
    fn extension_with_empty_key_is_an_error() {
        let node = Node::Extension {
            key: Nibbles::new(),
            child: hash_ref(),
        };
        let mut trie = corrupted(vec![(Nibbles::new(), StoredNode::new(node, &[]))]);
        assert_malformed(trie.get(&[0x12; 32]), "extension with an empty key");
        assert_malformed(
            trie.update([([0x12u8; 32], Some(b"x"))]),
            "extension with an empty key",
        );
    }

    /// A key that runs past 64 nibbles made `Nibbles::join` or a collapse's prepend panic.
    #[test]
    fn keys_past_64_nibbles_are_errors() {
        // A root branch over a leaf whose key is one nibble too long and a good leaf.
        let long = leaf(Nibbles::unpack([0x34; 32]));
        let good = leaf(Nibbles::unpack([0x56; 32]).slice(1..));
        let branch = StoredNode::new(
            Node::Branch {
                state_mask: TrieMask::new(0b11),
                value: None,
            },
            &[long.reference.clone(), good.reference.clone()],
        );
        let mut key_under_0 = [0x34u8; 32];
        key_under_0[0] = 0x03;
        let mut key_under_1 = [0x56u8; 32];
        key_under_1[0] = 0x16;
        let nodes = vec![
            (Nibbles::new(), branch),
            (nibbles(&[0]), long),
            (nibbles(&[1]), good),
        ];
        let reason = "leaf key runs past 64 nibbles";
        assert_malformed(corrupted(nodes.clone()).get(&key_under_0), reason);
        assert_malformed(
            corrupted(nodes.clone()).update([(key_under_0, Some(b"x"))]),
            reason,
        );
        // Deleting the good leaf leaves the long one to merge into the root.
        let mut trie = corrupted(nodes.clone());
        assert_eq!(trie.get(&key_under_1).unwrap(), Some(b"v".to_vec()));
        assert_malformed(trie.update([(key_under_1, None::<&[u8]>)]), reason);
        // Nothing was written: the good leaf is still there.
        assert_eq!(trie.get(&key_under_1).unwrap(), Some(b"v".to_vec()));
    }

    /// An extension reaching 64 nibbles leaves its branch no room for children; pushing a
    /// child nibble onto a full path is undefined behaviour in `Nibbles`.
    #[test]
    fn extension_to_full_depth_is_an_error() {
        let node = Node::Extension {
            key: Nibbles::unpack([0x78; 32]),
            child: hash_ref(),
        };
        let branch = StoredNode::new(
            Node::Branch {
                state_mask: TrieMask::new(0b1),
                value: Some(crate::node::Value::new(b"w")),
            },
            &[hash_ref()],
        );
        let nodes = vec![
            (Nibbles::new(), StoredNode::new(node, &[])),
            (Nibbles::unpack([0x78; 32]), branch),
        ];
        let reason = "extension runs to 64 nibbles";
        assert_malformed(corrupted(nodes.clone()).get(&[0x78; 32]), reason);
        assert_malformed(
            corrupted(nodes).update([([0x78u8; 32], Some(b"x"))]),
            reason,
        );
    }

    #[test]
    fn extension_over_a_leaf_is_an_error() {
        let node = Node::Extension {
            key: nibbles(&[1, 2]),
            child: hash_ref(),
        };
        let nodes = vec![
            (Nibbles::new(), StoredNode::new(node, &[])),
            (nibbles(&[1, 2]), leaf(Nibbles::unpack([0x9a; 31]))),
        ];
        let mut key = [0x9au8; 32];
        key[0] = 0x12;
        assert_malformed(
            corrupted(nodes).update([(key, Some(b"x"))]),
            "extension child is not a branch",
        );
    }
}
