//! A block's changes hashed in rounds while the block executes, ahead of its root.
//!
//! An executor that reports each transaction's state changes as it goes lets the trie commit
//! them a round at a time ([`CompactTrie::commit_round`]), so that when the block ends only
//! what changed since the last round is left to hash ([`Rounds::rest_of`]). The rounds are
//! ordinary commits with their undo batches: until the block's root is known they can all be
//! taken back ([`CompactTrie::take_back_rounds`]), and the block's rows are theirs folded in
//! order, the last write of each path winning ([`Rounds::finish`]). Folded, a path the rounds
//! wrote and then put back as the parent had it is written again with the parent's row, and a
//! row a round added and a later one deleted is deleted, though the parent had none: the
//! database ends up with the same rows as after a single commit.
//!
//! What the rounds committed is checked against the block's own changes, not trusted: a key
//! the rounds changed that the block does not list (the rounds would have to read the
//! parent's value back to undo it), or a storage the rounds wiped that the block does not
//! wipe, leaves no rest, and the caller takes the rounds back and commits the block whole.

use crate::{
    CompactNodes, CompactStorage, CompactTrie, CompactUpdates, HashedStateChanges,
    HashedStorageChanges, NodeStore, StateRootOutput, TrieError,
};
use alloy_primitives::map::B256Map;
use alloy_trie::{BranchNodeCompact, Nibbles};
use std::collections::BTreeMap;

/// The rows of one trie so far: each path's last row, `None` for a delete.
type RowsOf = BTreeMap<Nibbles, Option<BranchNodeCompact>>;

/// The rounds committed so far for one block.
#[derive(Debug, Default)]
pub struct Rounds {
    /// Every round's changes, folded in order.
    applied: HashedStateChanges,
    /// Each round's undo batch, oldest first.
    undo: Vec<StateRootOutput>,
    accounts: RowsOf,
    /// Each storage trie's rows, and whether a round wiped it.
    storages: B256Map<(bool, RowsOf)>,
    dirty_nodes: u64,
}

impl Rounds {
    /// How many rounds were committed.
    pub fn len(&self) -> usize {
        self.undo.len()
    }

    /// Whether no round was committed.
    pub fn is_empty(&self) -> bool {
        self.undo.is_empty()
    }

    /// Nodes the rounds re-encoded and hashed, all rounds together.
    pub fn dirty_nodes(&self) -> u64 {
        self.dirty_nodes
    }

    /// What is left of `block`, the block's whole changes over the parent, once the rounds
    /// are committed: the keys whose value differs from the rounds'. `None` when the rounds
    /// changed what the block does not (see the module docs): they must be taken back.
    pub fn rest_of(&self, block: &HashedStateChanges) -> Option<HashedStateChanges> {
        let applied = &self.applied;
        let deleted = |changes: &HashedStateChanges, address| {
            matches!(changes.accounts.get(address), Some(None))
        };
        for (address, account) in &applied.accounts {
            if !block.accounts.contains_key(address) {
                return None;
            }
            // Storage the rounds dropped with a deleted account comes back only wiped.
            if account.is_none()
                && !deleted(block, address)
                && !block.storages.get(address).is_some_and(|s| s.wiped)
            {
                return None;
            }
        }
        for (address, storage) in &applied.storages {
            if deleted(block, address) {
                // The account goes, and its storage trie with it.
                continue;
            }
            let ours = block.storages.get(address)?;
            if storage.wiped && !ours.wiped {
                return None;
            }
            if storage
                .slots
                .keys()
                .any(|slot| !ours.slots.contains_key(slot))
            {
                return None;
            }
        }
        let mut rest = HashedStateChanges::default();
        for (address, account) in &block.accounts {
            if applied.accounts.get(address) != Some(account) {
                rest.accounts.insert(*address, *account);
            }
        }
        for (address, storage) in &block.storages {
            let done = applied.storages.get(address);
            if storage.wiped && !done.is_some_and(|done| done.wiped) {
                rest.storages.insert(*address, storage.clone());
                continue;
            }
            let slots: B256Map<_> = storage
                .slots
                .iter()
                .filter(|(slot, value)| done.and_then(|done| done.slots.get(*slot)) != Some(value))
                .map(|(slot, value)| (*slot, *value))
                .collect();
            if !slots.is_empty() {
                rest.storages.insert(
                    *address,
                    HashedStorageChanges {
                        wiped: false,
                        slots,
                    },
                );
            }
        }
        Some(rest)
    }

    /// The block's rows and undo batches (oldest first), once `rest` (its last round's rows
    /// and undo batch, from [`CompactTrie::commit_with_undo`]) is committed too.
    pub fn finish(
        mut self,
        rows: CompactUpdates,
        undo: StateRootOutput,
    ) -> (CompactUpdates, Vec<StateRootOutput>) {
        self.fold_rows(rows);
        self.undo.push(undo);
        let nodes = |rows: RowsOf| {
            let mut nodes = CompactNodes::default();
            for (path, row) in rows {
                match row {
                    Some(row) => nodes.updated.push((path, row)),
                    None => nodes.removed.push(path),
                }
            }
            nodes
        };
        let folded = CompactUpdates {
            account: nodes(self.accounts),
            storages: self
                .storages
                .into_iter()
                .map(|(owner, (wiped, rows))| {
                    let storage = CompactStorage {
                        wiped,
                        nodes: nodes(rows),
                    };
                    (owner, storage)
                })
                .collect(),
        };
        (folded, self.undo)
    }

    fn fold_rows(&mut self, rows: CompactUpdates) {
        fn fold(into: &mut RowsOf, nodes: CompactNodes) {
            into.extend(nodes.removed.into_iter().map(|path| (path, None)));
            into.extend(
                nodes
                    .updated
                    .into_iter()
                    .map(|(path, row)| (path, Some(row))),
            );
        }
        fold(&mut self.accounts, rows.account);
        for (owner, storage) in rows.storages {
            let (wiped, rows) = self.storages.entry(owner).or_default();
            if storage.wiped {
                // The wipe drops every row, those of earlier rounds included.
                *wiped = true;
                rows.clear();
            }
            fold(rows, storage.nodes);
        }
    }
}

impl<S: NodeStore> CompactTrie<S> {
    /// Commits `output`, computed from `changes` over the trie, as the next of `rounds`. On an
    /// error the trie may hold part of the round: take the rounds back or drop the trie.
    pub fn commit_round(
        &mut self,
        rounds: &mut Rounds,
        mut changes: HashedStateChanges,
        output: &StateRootOutput,
    ) -> Result<(), TrieError> {
        let (rows, undo) = self.commit_with_undo(output)?;
        rounds.dirty_nodes += output.stats.dirty_nodes;
        rounds.fold_rows(rows);
        rounds.undo.push(undo);
        // What the trie applied: a deleted account's storage goes with it, whatever slots the
        // round lists for it.
        let deleted: Vec<_> = changes
            .accounts
            .iter()
            .filter(|(_, account)| account.is_none())
            .map(|(address, _)| *address)
            .collect();
        for address in deleted {
            changes.storages.remove(&address);
        }
        rounds.applied.extend(changes);
        Ok(())
    }

    /// Takes every round back, newest first: the trie is at the parent again.
    pub fn take_back_rounds(&mut self, rounds: Rounds) -> Result<(), TrieError> {
        for undo in rounds.undo.iter().rev() {
            self.commit_without_rows(undo)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compact::tests::{
        Change, Model, Table, block_diff, blocks_and_keys, expected_rows, write_rows,
    };
    use crate::{HashedAccount, state_trie::tests::trie};
    use alloy_primitives::{B256, U256};
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig { cases: crate::proptest_cases(32), ..ProptestConfig::default() })]

        /// Each block's changes cut into rounds, committed round by round as an executor
        /// reports them and then the rest of the block: the root, the trie's nodes and the rows
        /// written equal those of the block committed whole, after every block; the undo
        /// batches take the trie back to the parent; a block without deletes or wipes always
        /// leaves a rest; and rounds taken back leave the parent's trie.
        #[test]
        fn rounds_then_the_rest_equal_the_block_whole(
            (addresses, blocks) in blocks_and_keys(),
            cuts in prop::collection::vec(0..120usize, 0..6),
        ) {
            let mut model = Model::new();
            let mut whole = CompactTrie::new(trie(2, 2));
            let mut ahead = CompactTrie::new(trie(2, 2));
            let mut table = Table::new();
            for changes in &blocks {
                let parent_root = ahead.trie().root();
                let mut cuts: Vec<usize> = cuts.iter().map(|c| c % (changes.len() + 1)).collect();
                cuts.sort_unstable();
                cuts.dedup();
                // Each round as the executor reports it: the changes of its transactions.
                let mut rounds = Rounds::default();
                let mut reported = model.clone();
                let mut from = 0;
                for &to in &cuts {
                    let round = block_diff(&mut reported, &addresses, &changes[from..to]);
                    let output = ahead.trie().compute(&round).unwrap();
                    ahead.commit_round(&mut rounds, round, &output).unwrap();
                    from = to;
                }
                let block = block_diff(&mut model, &addresses, changes);
                let output = whole.trie().compute(&block).unwrap();
                let rows = whole.commit(&output).unwrap();
                let simple = changes.iter().all(|c| matches!(c, Change::Account(..) | Change::Slot(..)));
                let Some(rest) = rounds.rest_of(&block) else {
                    prop_assert!(!simple, "a block of sets alone left no rest");
                    ahead.take_back_rounds(rounds).unwrap();
                    prop_assert_eq!(ahead.trie().root(), parent_root);
                    ahead.commit(&ahead.trie().compute(&block).unwrap()).unwrap();
                    write_rows(&mut table, &rows);
                    continue;
                };
                let last = ahead.trie().compute(&rest).unwrap();
                prop_assert_eq!(last.root, output.root);
                let (last_rows, last_undo) = ahead.commit_with_undo(&last).unwrap();
                let (folded, undo) = rounds.finish(last_rows, last_undo);
                let mut folded_table = table.clone();
                write_rows(&mut folded_table, &folded);
                write_rows(&mut table, &rows);
                prop_assert_eq!(&folded_table, &table);
                prop_assert_eq!(&table, &expected_rows(&model));
                prop_assert_eq!(snapshot(&ahead), snapshot(&whole));

                // Back to the parent and forward again through the whole block's batch.
                for batch in undo.iter().rev() {
                    ahead.commit_without_rows(batch).unwrap();
                }
                prop_assert_eq!(ahead.trie().root(), parent_root);
                ahead.commit_without_rows(&output).unwrap();
                prop_assert_eq!(snapshot(&ahead), snapshot(&whole));
            }
        }
    }

    /// The rounds changed what the block, as its executor reports it at the end, does not:
    /// only taking them back is right, since the parent's values are not at hand.
    #[test]
    fn rounds_that_changed_what_the_block_does_not_leave_no_rest() {
        let (address, slot) = (B256::repeat_byte(1), B256::repeat_byte(2));
        let account = Some(HashedAccount {
            nonce: 1,
            balance: U256::from(7),
            code_hash: alloy_trie::KECCAK_EMPTY,
        });
        let storage = |wiped, slots: &[(B256, u64)]| HashedStorageChanges {
            wiped,
            slots: slots.iter().map(|(k, v)| (*k, U256::from(*v))).collect(),
        };
        let changes = |account: Option<Option<HashedAccount>>,
                       storage: Option<HashedStorageChanges>| {
            HashedStateChanges {
                accounts: account.map(|a| (address, a)).into_iter().collect(),
                storages: storage.map(|s| (address, s)).into_iter().collect(),
            }
        };
        let rounds = |applied| Rounds {
            applied,
            ..Rounds::default()
        };
        // A slot set and then put back, which the block leaves out.
        let set = rounds(changes(None, Some(storage(false, &[(slot, 5)]))));
        assert_eq!(set.rest_of(&changes(Some(account), None)), None);
        // A wipe the block does not make.
        let wiped = rounds(changes(Some(account), Some(storage(true, &[]))));
        assert_eq!(
            wiped.rest_of(&changes(Some(account), Some(storage(false, &[(slot, 1)])))),
            None
        );
        // An account the block does not change.
        let touched = rounds(changes(Some(account), None));
        assert_eq!(touched.rest_of(&HashedStateChanges::default()), None);
        // An account deleted and created again: the block must wipe its storage.
        let deleted = rounds(changes(Some(None), None));
        assert_eq!(deleted.rest_of(&changes(Some(account), None)), None);
        let recreated = changes(Some(account), Some(storage(true, &[(slot, 3)])));
        assert_eq!(deleted.rest_of(&recreated), Some(recreated.clone()));
        // What the rounds got right is not hashed again.
        let done = rounds(changes(Some(account), Some(storage(false, &[(slot, 5)]))));
        let block = changes(
            Some(account),
            Some(storage(false, &[(slot, 5), (address, 6)])),
        );
        assert_eq!(
            done.rest_of(&block),
            Some(changes(None, Some(storage(false, &[(address, 6)]))))
        );
    }

    /// A round that deleted an account and then wrote its storage (as folded transactions
    /// report it: the write changes no account info): the trie drops that storage with the
    /// account, and so do the rounds' records, so a block that re-creates the account with the
    /// same slot hashes the slot again and gets the block's root.
    #[test]
    fn slots_of_an_account_a_round_deleted_are_not_counted_done() {
        let (address, slot) = (B256::repeat_byte(1), B256::repeat_byte(2));
        let account = HashedAccount {
            nonce: 1,
            balance: U256::from(7),
            code_hash: alloy_trie::KECCAK_EMPTY,
        };
        let storage = |wiped, value: u64| HashedStorageChanges {
            wiped,
            slots: [(slot, U256::from(value))].into_iter().collect(),
        };
        let with = |account, storage| HashedStateChanges {
            accounts: [(address, account)].into_iter().collect(),
            storages: [(address, storage)].into_iter().collect(),
        };
        let parent = with(Some(account), storage(false, 5));
        let mut ahead = CompactTrie::new(trie(2, 2));
        ahead
            .commit(&ahead.trie().compute(&parent).unwrap())
            .unwrap();
        let mut whole = CompactTrie::new(trie(2, 2));
        whole
            .commit(&whole.trie().compute(&parent).unwrap())
            .unwrap();

        let mut rounds = Rounds::default();
        let round = with(None, storage(false, 9));
        let output = ahead.trie().compute(&round).unwrap();
        ahead.commit_round(&mut rounds, round, &output).unwrap();
        let block = with(Some(account), storage(true, 9));
        let rest = rounds
            .rest_of(&block)
            .expect("the block re-creates the account wiped");
        assert_eq!(
            rest.storages[&address].slots.get(&slot),
            Some(&U256::from(9))
        );
        let root = ahead.trie().compute(&rest).unwrap().root;
        assert_eq!(root, whole.trie().compute(&block).unwrap().root);
    }

    fn snapshot(trie: &CompactTrie) -> Vec<(crate::TrieId, Vec<(Nibbles, crate::StoredNode)>)> {
        crate::undo::tests::snapshot(trie.trie())
    }
}
