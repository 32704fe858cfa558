//! The reference roots: a full alloy-trie [`HashBuilder`] build over the sorted leaf set, the
//! definition every faster root in overdrive is tested against.

use crate::state::HashedStateChanges;
use alloy_primitives::{B256, U256, keccak256, map::HashMap};
use alloy_trie::{BranchNodeCompact, EMPTY_ROOT_HASH, HashBuilder, Nibbles, TrieAccount, TrieMask};
use overdrive_primitives::MemState;
use std::collections::BTreeMap;

/// Root of a trie over already-hashed (or raw, equal-length) keys. `leaves` must be sorted by
/// key with unique keys none of which is a prefix of another; values are stored as given.
pub fn root_of_sorted<'a>(leaves: impl IntoIterator<Item = (Nibbles, &'a [u8])>) -> B256 {
    let mut builder = HashBuilder::default();
    for (key, value) in leaves {
        builder.add_leaf(key, value);
    }
    builder.root()
}

/// Root over hashed keys and their encoded values, already in key order.
fn root_of_map(sorted: &BTreeMap<B256, Vec<u8>>) -> B256 {
    root_of_sorted(
        sorted
            .iter()
            .map(|(k, v)| (Nibbles::unpack(k), v.as_slice())),
    )
}

/// Storage root over hashed slots; zero values are absent.
pub fn hashed_storage_root(slots: impl IntoIterator<Item = (B256, U256)>) -> B256 {
    let sorted: BTreeMap<B256, Vec<u8>> = slots
        .into_iter()
        .filter(|(_, v)| !v.is_zero())
        .map(|(k, v)| (k, alloy_rlp::encode(v)))
        .collect();
    root_of_map(&sorted)
}

/// Storage root of plain slots: keys are hashed with keccak, zero values are absent.
pub fn storage_root(storage: &HashMap<U256, U256>) -> B256 {
    hashed_storage_root(
        storage
            .iter()
            .map(|(k, v)| (keccak256(k.to_be_bytes::<32>()), *v)),
    )
}

/// State root over hashed addresses and complete trie accounts.
pub fn hashed_state_root(accounts: impl IntoIterator<Item = (B256, TrieAccount)>) -> B256 {
    let sorted: BTreeMap<B256, Vec<u8>> = accounts
        .into_iter()
        .map(|(k, a)| (k, alloy_rlp::encode(a)))
        .collect();
    root_of_map(&sorted)
}

/// State root of a full in-memory state.
pub fn state_root(state: &MemState) -> B256 {
    hashed_state_root(state.accounts.iter().map(|(address, account)| {
        let info = &account.info;
        let root = storage_root(&account.storage);
        (
            keccak256(address),
            TrieAccount {
                nonce: info.nonce,
                balance: info.balance,
                storage_root: root,
                code_hash: info.code_hash,
            },
        )
    }))
}

/// State root of a hashed full state, given as a diff against the empty trie (as
/// [`HashedStateChanges::from_state`] makes): deleted accounts and zero slots are absent.
pub fn post_state_root(state: &HashedStateChanges) -> B256 {
    hashed_state_root(state.accounts.iter().filter_map(|(address, account)| {
        let account = account.as_ref()?;
        let root = state.storages.get(address).map_or(EMPTY_ROOT_HASH, |s| {
            hashed_storage_root(s.slots.iter().map(|(k, v)| (*k, *v)))
        });
        Some((
            *address,
            TrieAccount {
                nonce: account.nonce,
                balance: account.balance,
                storage_root: root,
                code_hash: account.code_hash,
            },
        ))
    }))
}

/// Every branch node a full build produces, by path, with the root hash: what an independent
/// builder says the stored trie must contain. `leaves` as in [`root_of_sorted`].
///
/// The `HashBuilder` of reth's alloy-trie version reports only the branches with a tree or hash
/// mask (those reth stores); the others, whose masks are both empty, follow from the keys: a
/// branch stands at the longest common prefix of every two neighbouring keys, with one child per
/// next nibble of the keys below it.
pub fn branch_nodes<'a>(
    leaves: impl IntoIterator<Item = (Nibbles, &'a [u8])>,
) -> (B256, BTreeMap<Nibbles, BranchNodeCompact>) {
    let mut builder = HashBuilder::default().with_updates(true);
    let mut keys: Vec<Nibbles> = Vec::new();
    for (key, value) in leaves {
        builder.add_leaf(key, value);
        keys.push(key);
    }
    let root = builder.root();
    let (_, stored) = builder.split();
    let mut nodes: BTreeMap<Nibbles, BranchNodeCompact> = BTreeMap::new();
    for pair in keys.windows(2) {
        let common = pair[0].common_prefix_length(&pair[1]);
        let path = pair[0].slice(..common);
        let node = nodes.entry(path).or_insert_with(|| {
            BranchNodeCompact::new(
                TrieMask::default(),
                TrieMask::default(),
                TrieMask::default(),
                Vec::new(),
                None,
            )
        });
        node.state_mask.set_bit(pair[0].get_unchecked(common));
        node.state_mask.set_bit(pair[1].get_unchecked(common));
    }
    for (path, node) in stored {
        debug_assert_eq!(
            nodes.get(&path).map(|n| n.state_mask),
            Some(node.state_mask)
        );
        nodes.insert(path, node);
    }
    (root, nodes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloy_primitives::Address;

    #[test]
    fn empty_is_empty_root() {
        assert_eq!(state_root(&MemState::default()), EMPTY_ROOT_HASH);
        assert_eq!(storage_root(&HashMap::default()), EMPTY_ROOT_HASH);
        assert_eq!(
            storage_root(&HashMap::from_iter([(U256::from(1), U256::ZERO)])),
            EMPTY_ROOT_HASH
        );
    }

    #[test]
    fn matches_alloy_trie_root_helpers() {
        let storage: HashMap<U256, U256> = (1..50u64)
            .map(|i| (U256::from(i * 7), U256::from(i * i)))
            .collect();
        assert_eq!(
            storage_root(&storage),
            alloy_trie::root::storage_root_unhashed(
                storage
                    .iter()
                    .map(|(k, v)| (B256::from(k.to_be_bytes::<32>()), *v))
            )
        );
        let mut state = MemState::default();
        for i in 0..30u8 {
            let slots = if i % 3 == 0 {
                storage.clone()
            } else {
                HashMap::default()
            };
            state.insert_account(
                Address::repeat_byte(i),
                U256::from(i),
                u64::from(i),
                None,
                slots,
            );
        }
        let expected =
            alloy_trie::root::state_root_unhashed(state.accounts.iter().map(|(a, acc)| {
                (
                    *a,
                    TrieAccount {
                        nonce: acc.info.nonce,
                        balance: acc.info.balance,
                        storage_root: storage_root(&acc.storage),
                        code_hash: acc.info.code_hash,
                    },
                )
            }));
        assert_eq!(state_root(&state), expected);
        assert_eq!(
            post_state_root(&HashedStateChanges::from_state(&state)),
            expected
        );
    }

    #[test]
    fn single_account_root_is_hash_of_its_leaf() {
        // One account: the trie is a single leaf holding the whole hashed key.
        let mut state = MemState::default();
        state.insert_account(Address::ZERO, U256::ZERO, 0, None, HashMap::default());
        let account = alloy_rlp::encode(TrieAccount::default());
        let leaf =
            alloy_trie::nodes::LeafNode::new(Nibbles::unpack(keccak256(Address::ZERO)), account);
        assert_eq!(state_root(&state), keccak256(alloy_rlp::encode(&leaf)));
    }
}
