//! TEMPORARY: replaced by overdrive_trie::reference once that lands.
use alloy_primitives::{B256, U256, keccak256};
use alloy_trie::{HashBuilder, Nibbles, TrieAccount};
use overdrive_primitives::MemState;

pub fn state_root(state: &MemState) -> B256 {
    let mut leaves: Vec<(B256, Vec<u8>)> = state
        .accounts
        .iter()
        .map(|(a, acc)| {
            let mut slots: Vec<(B256, U256)> =
                acc.storage.iter().map(|(k, v)| (keccak256(B256::from(*k)), *v)).collect();
            slots.sort();
            let mut hb = HashBuilder::default();
            for (k, v) in slots {
                hb.add_leaf(Nibbles::unpack(k), &alloy_rlp::encode(v));
            }
            let ta = TrieAccount {
                nonce: acc.info.nonce,
                balance: acc.info.balance,
                storage_root: hb.root(),
                code_hash: acc.info.code_hash,
            };
            (keccak256(a), alloy_rlp::encode(ta))
        })
        .collect();
    leaves.sort();
    let mut hb = HashBuilder::default();
    for (k, v) in leaves {
        hb.add_leaf(Nibbles::unpack(k), &v);
    }
    hb.root()
}
