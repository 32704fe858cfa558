//! The strategy's parts without a node: the payload builder's root, the catch-up.

use super::*;
use alloy_primitives::{Address, U256, keccak256};
use reth_engine_tree::tree::state_root_strategy::{
    StateRootComputeOutcome, StateRootSink, StateRootTaskError, evm_state_to_hashed_post_state,
};
use revm::state::{Account, AccountInfo, EvmStorageSlot, TransactionId};

const TIP: B256 = B256::repeat_byte(1);

fn slot(n: u64) -> U256 {
    U256::from(n)
}

fn hashed_slot(n: u64) -> B256 {
    keccak256(slot(n).to_be_bytes::<32>())
}

fn info(nonce: u64, balance: u64) -> AccountInfo {
    AccountInfo {
        nonce,
        balance: U256::from(balance),
        ..AccountInfo::default()
    }
}

fn hashed(info: &AccountInfo) -> HashedAccount {
    HashedAccount {
        nonce: info.nonce,
        balance: info.balance,
        code_hash: info.code_hash,
    }
}

/// Forty accounts, each with slot 1 set, as the trie of block `TIP`.
fn genesis() -> HashedStateChanges {
    let mut state = HashedStateChanges::default();
    for i in 0..40u8 {
        let address = keccak256(Address::with_last_byte(i));
        state
            .accounts
            .insert(address, Some(hashed(&info(u64::from(i), 1000))));
        state
            .storages
            .entry(address)
            .or_default()
            .slots
            .insert(hashed_slot(1), U256::from(i) + U256::from(1));
    }
    state
}

fn trie_of(state: &HashedStateChanges) -> StateTrie {
    let mut trie = StateTrie::new(
        overdrive_trie::MemNodeStore::new(),
        TrieConfig::with_threads(2),
    )
    .unwrap();
    trie.apply(state).unwrap();
    trie
}

/// The leaves of a full state (a diff over the empty one).
struct StateLeaves(HashedStateChanges);

impl LeafSource for StateLeaves {
    type Error = ProviderError;

    fn accounts(
        &self,
        prefix: &Nibbles,
        out: &mut Vec<(B256, HashedAccount)>,
    ) -> ProviderResult<()> {
        let start = out.len();
        out.extend(self.0.accounts.iter().filter_map(|(address, account)| {
            let account = (*account)?;
            Nibbles::unpack(address)
                .starts_with(prefix)
                .then_some((*address, account))
        }));
        out[start..].sort_unstable_by_key(|(address, _)| *address);
        Ok(())
    }

    fn storage(
        &self,
        address: B256,
        prefix: &Nibbles,
        out: &mut Vec<(B256, U256)>,
    ) -> ProviderResult<()> {
        let start = out.len();
        if let Some(storage) = self.0.storages.get(&address) {
            out.extend(
                storage
                    .slots
                    .iter()
                    .filter(|(slot, value)| {
                        !value.is_zero() && Nibbles::unpack(*slot).starts_with(prefix)
                    })
                    .map(|(slot, value)| (*slot, *value)),
            );
        }
        out[start..].sort_unstable_by_key(|(slot, _)| *slot);
        Ok(())
    }
}

/// The state of each block the tests' tries stand on: [`genesis`] below the missed blocks of
/// [`chain_and_fork`], and theirs.
fn state_of(block: B256) -> HashedStateChanges {
    let (missed, _) = chain_and_fork();
    let mut path = Vec::new();
    let mut at = block;
    while let Some(m) = missed.iter().find(|m| m.block == at) {
        path.push(m.changes.clone());
        at = m.parent;
    }
    let mut state = genesis();
    for changes in path.into_iter().rev() {
        state.extend(changes);
    }
    state
}

/// The trie of [`genesis`] as block `block`'s, keeping only the root and its children of
/// each trie in memory: every block on it reads the rest back through the tip's leaves.
fn tip_at(block: B256) -> Tip {
    let mut trie = StateTrie::new(BoundedNodeStore::new(2), TrieConfig::with_threads(2)).unwrap();
    trie.apply(&genesis()).unwrap();
    trie.store_mut().evict();
    assert!(trie.store().mem().len() < trie_of(&genesis()).store().len());
    Tip {
        block,
        trie: CompactTrie::new(trie),
        undo: VecDeque::new(),
        limit: 16,
        leaves: Some(Arc::new(|block| Ok(Box::new(StateLeaves(state_of(block)))))),
        reads_at: None,
        ahead: None,
    }
}

fn shared(tip: Tip) -> Arc<Shared> {
    Arc::new(Shared::new(Some(tip), Box::new(|| Ok(tip_at(TIP)))))
}

fn sink(
    tip_block: B256,
) -> (
    PayloadRootSink,
    mpsc::Receiver<Result<StateRootComputeOutcome, StateRootTaskError>>,
) {
    let tip = tip_at(tip_block);
    let (sender, receiver) = mpsc::channel();
    let sink = PayloadRootSink {
        parent: TIP,
        shared: shared(tip),
        folded: Mutex::default(),
        result: Mutex::new(Some(sender)),
    };
    (sink, receiver)
}

/// A transaction's update of `address`: its info from `before` to `after`, and `slots`
/// (slot, old, new) written.
fn touched(before: AccountInfo, after: AccountInfo, slots: &[(u64, u64, u64)]) -> Account {
    let mut account = Account::default().with_info(before);
    account.set_current_info_as_original();
    account
        .with_info(after)
        .with_storage(slots.iter().map(|&(key, old, new)| {
            (
                slot(key),
                EvmStorageSlot::new_changed(U256::from(old), U256::from(new), TransactionId::ZERO),
            )
        }))
        .with_touched_mark()
}

/// The builder's stream of two transactions gives the root and rows of their changes
/// folded, applied to the parent's trie, and leaves the trie at the parent.
#[test]
fn payload_root_folds_each_transactions_updates() {
    let (sink, receiver) = sink(TIP);
    let (a, b) = (Address::with_last_byte(3), Address::with_last_byte(7));
    // A new account and a slot deleted, then `a` written again.
    let fresh = Address::with_last_byte(200);
    sink.on_state_update(
        [
            (
                a,
                touched(info(3, 1000), info(4, 900), &[(1, 4, 9), (2, 0, 5)]),
            ),
            (fresh, touched(AccountInfo::default(), info(0, 100), &[])),
            (b, touched(info(7, 1000), info(7, 1000), &[(1, 8, 0)])),
        ]
        .into_iter()
        .collect(),
    );
    sink.on_state_update(
        [(a, touched(info(4, 900), info(5, 800), &[(2, 5, 6)]))]
            .into_iter()
            .collect(),
    );
    sink.on_updates_finished();
    let outcome = receiver.recv().unwrap().unwrap();

    let mut expected = genesis();
    let (ha, hb) = (keccak256(a), keccak256(b));
    expected.accounts.insert(ha, Some(hashed(&info(5, 800))));
    expected
        .accounts
        .insert(keccak256(fresh), Some(hashed(&info(0, 100))));
    expected.storages.get_mut(&ha).unwrap().slots.extend([
        (hashed_slot(1), U256::from(9)),
        (hashed_slot(2), U256::from(6)),
    ]);
    expected
        .storages
        .get_mut(&hb)
        .unwrap()
        .slots
        .remove(&hashed_slot(1));
    let mut reference = CompactTrie::new(trie_of(&genesis()));
    let changed = reference
        .trie()
        .compute(&changes_between(&genesis(), &expected))
        .unwrap();
    assert_eq!(outcome.state_root, trie_of(&expected).root());
    assert_eq!(outcome.state_root, changed.root);
    assert_eq!(
        *outcome.trie_updates,
        trie_updates(reference.commit(&changed).unwrap())
    );
    let tip = sink.shared.tip();
    let tip = tip.as_ref().unwrap();
    assert_eq!(tip.block, TIP);
    assert_eq!(tip.trie.trie().root(), trie_of(&genesis()).root());
}

/// An account destroyed by one transaction and created again by the next keeps only the
/// storage written after the re-creation.
#[test]
fn payload_root_wipes_a_destroyed_accounts_storage() {
    let (sink, receiver) = sink(TIP);
    let a = Address::with_last_byte(5);
    let mut destroyed = touched(info(5, 1000), AccountInfo::default(), &[]);
    destroyed.mark_selfdestruct();
    sink.on_state_update([(a, destroyed)].into_iter().collect());
    sink.on_state_update(
        [(a, touched(AccountInfo::default(), info(1, 0), &[(3, 0, 7)]))]
            .into_iter()
            .collect(),
    );
    sink.on_updates_finished();
    let outcome = receiver.recv().unwrap().unwrap();

    let mut expected = genesis();
    let ha = keccak256(a);
    expected.accounts.insert(ha, Some(hashed(&info(1, 0))));
    expected.storages.insert(
        ha,
        HashedStorageChanges {
            wiped: false,
            slots: [(hashed_slot(3), U256::from(7))].into_iter().collect(),
        },
    );
    assert_eq!(outcome.state_root, trie_of(&expected).root());
}

/// A trie the engine moved on from the payload's parent gives no root: the builder then
/// computes reth's.
#[test]
fn payload_root_refuses_a_trie_past_the_parent() {
    let (sink, receiver) = sink(B256::repeat_byte(2));
    sink.on_updates_finished();
    assert!(receiver.recv().unwrap().is_err());
    // One answer only, however often the stream is finished.
    sink.on_updates_finished();
    assert!(receiver.recv().is_err());
}

/// A missed block over `state` (a full state, updated): account `n`'s nonce set.
fn missed(block: u8, parent: B256, state: &mut HashedStateChanges, n: u8, nonce: u64) -> Missed {
    let mut changes = HashedStateChanges::default();
    changes.accounts.insert(
        keccak256(Address::with_last_byte(n)),
        Some(hashed(&info(nonce, 1))),
    );
    state.extend(changes.clone());
    Missed {
        block: B256::repeat_byte(block),
        parent,
        root: trie_of(state).root(),
        changes,
    }
}

/// Blocks 1 and 3 on the trie's block, a fork 2 beside them.
fn chain_and_fork() -> (VecDeque<Missed>, HashedStateChanges) {
    let (mut main, mut fork) = (genesis(), genesis());
    let first = missed(0x11, TIP, &mut main, 1, 100);
    let side = missed(0x22, TIP, &mut fork, 2, 200);
    let second = missed(0x33, first.block, &mut main, 3, 300);
    ([first, side, second].into_iter().collect(), main)
}

/// A trie rebuilt at the database's head follows the newest missed block's ancestry (not
/// the fork beside it) and replaces the trie, which then steps back over those blocks too.
#[test]
fn a_rebuilt_trie_follows_the_newest_blocks_ancestry() {
    let shared = shared(tip_at(B256::repeat_byte(9)));
    let (missed, state) = chain_and_fork();
    shared.catch_up().missed = missed;
    assert!(shared.catch_up().start());
    assert!(!shared.catch_up().start(), "one rebuild at a time");
    shared.install((shared.rebuild)(), Instant::now());
    let tip = shared.tip();
    let tip = tip.as_ref().unwrap();
    assert_eq!(tip.block, B256::repeat_byte(0x33));
    assert_eq!(tip.trie.trie().root(), trie_of(&state).root());
    assert!(tip.reaches(B256::repeat_byte(0x11)) && tip.reaches(TIP));
    let catch_up = shared.catch_up();
    assert!(catch_up.missed.is_empty() && !catch_up.running);
    assert!(!shared.failed.load(Ordering::Relaxed));
}

/// A rebuilt trie that cannot reach the newest missed block leaves the trie it would
/// replace, and the missed blocks for the next rebuild; one whose root differs from a
/// missed block's header is a failed trie.
#[test]
fn a_rebuilt_trie_is_installed_only_when_it_reaches_the_newest_block() {
    let old = B256::repeat_byte(9);
    let shared = shared(tip_at(old));
    let (mut missed, _) = chain_and_fork();
    missed.pop_front();
    shared.catch_up().missed = missed;
    shared.install((shared.rebuild)(), Instant::now());
    assert_eq!(shared.tip().as_ref().unwrap().block, old);
    assert_eq!(shared.catch_up().missed.len(), 2);

    let (mut missed, _) = chain_and_fork();
    missed.back_mut().unwrap().root = B256::repeat_byte(7);
    shared.catch_up().missed = missed;
    shared.install((shared.rebuild)(), Instant::now());
    assert!(shared.tip().is_none());
    assert!(shared.failed.load(Ordering::Relaxed));
    // No rebuild starts once the trie failed.
    shared.catch_up_in_background();
    assert!(!shared.catch_up().running);
}

/// The diff that takes the full state `before` to the full state `after`.
fn changes_between(before: &HashedStateChanges, after: &HashedStateChanges) -> HashedStateChanges {
    let mut diff = HashedStateChanges::default();
    for (address, account) in &after.accounts {
        if before.accounts.get(address) != Some(account) {
            diff.accounts.insert(*address, *account);
        }
    }
    for (address, storage) in &after.storages {
        let old = before.storages.get(address);
        let mut slots: alloy_primitives::map::B256Map<U256> = storage
            .slots
            .iter()
            .filter(|(slot, value)| old.and_then(|o| o.slots.get(*slot)) != Some(*value))
            .map(|(slot, value)| (*slot, *value))
            .collect();
        if let Some(old) = old {
            for slot in old.slots.keys().filter(|s| !storage.slots.contains_key(*s)) {
                slots.insert(*slot, U256::ZERO);
            }
        }
        if !slots.is_empty() {
            diff.storages.insert(
                *address,
                HashedStorageChanges {
                    wiped: false,
                    slots,
                },
            );
        }
    }
    diff
}

/// A block's updates streamed while it executes are read back on the parent's trie before its
/// root: the root then reads nothing more, and is the root of the block's state.
#[test]
fn a_blocks_updates_are_read_back_before_its_root() {
    let shared = shared(tip_at(TIP));
    if let Some(tip) = shared.tip().as_ref() {
        tip.trie.trie().store().take_reads();
    }
    let (update, _) = stream_update_of_3(&shared);

    let mut guard = shared.tip();
    let tip = guard.as_mut().unwrap();
    let read = tip.trie.trie().store().take_reads();
    assert!(read.subtrees > 0 && read.leaves > 0, "{read:?}");
    let output = tip
        .compute(&changes(&evm_state_to_hashed_post_state(update)))
        .unwrap();
    assert_eq!(
        tip.trie.trie().store().take_reads(),
        overdrive_trie::SourceReads::default()
    );
    assert_eq!(output.root, trie_of(&state_after_update_of_3()).root());
}

/// Streams the update of account 3 (nonce 4, balance 900, slot 1 set to 9) to a block on
/// `TIP`, and serves the prefetch of it on `shared`'s trie; the update and the block.
fn stream_update_of_3(shared: &Shared) -> (revm::state::EvmState, Arc<prefetch::BlockPrefetch>) {
    let (prefetcher, receiver) = Prefetcher::new(false);
    let (sink, block) = prefetcher.sink(TIP);
    let update = update_of_3();
    sink.on_state_update(update.clone());
    drop((sink, prefetcher));
    prefetch::serve(shared, &receiver);
    (update, block)
}

/// A transaction's update of account 3: nonce 4, balance 900, slot 1 set to 9.
fn update_of_3() -> revm::state::EvmState {
    let a = Address::with_last_byte(3);
    [(a, touched(info(3, 1000), info(4, 900), &[(1, 4, 9)]))]
        .into_iter()
        .collect()
}

/// The genesis state after the update of account 3 the prefetch tests stream: nonce 4, balance
/// 900, slot 1 set to 9.
fn state_after_update_of_3() -> HashedStateChanges {
    let mut state = genesis();
    let address = keccak256(Address::with_last_byte(3));
    state.accounts.insert(address, Some(hashed(&info(4, 900))));
    state
        .storages
        .get_mut(&address)
        .unwrap()
        .slots
        .insert(hashed_slot(1), U256::from(9));
    state
}

/// On a whole trie the prefetch walks the block's keys without a source to read from (a read
/// would fail and stop the block's prefetch), and the root after it is the block's.
#[test]
fn a_whole_trie_prefetches_without_reading() {
    let mut trie =
        StateTrie::new(BoundedNodeStore::default(), TrieConfig::with_threads(2)).unwrap();
    trie.apply(&genesis()).unwrap();
    let shared = shared(Tip {
        leaves: None,
        trie: CompactTrie::new(trie),
        ..tip_at(TIP)
    });
    let (update, block) = stream_update_of_3(&shared);
    assert!(!block.stopped(), "the prefetch failed");

    let mut guard = shared.tip();
    let tip = guard.as_mut().unwrap();
    let output = tip
        .compute(&changes(&evm_state_to_hashed_post_state(update)))
        .unwrap();
    assert_eq!(output.root, trie_of(&state_after_update_of_3()).root());
}

/// Nothing is read for a block whose root began, nor while the trie is at another block than
/// the block's parent.
#[test]
fn a_prefetch_reads_only_for_the_tries_block_before_the_root() {
    for (tip, stopped) in [(TIP, true), (B256::repeat_byte(9), false)] {
        let shared = shared(tip_at(tip));
        let (prefetcher, receiver) = Prefetcher::new(false);
        let (sink, block) = prefetcher.sink(TIP);
        sink.on_state_update(update_of_3());
        if stopped {
            block.stop();
        }
        drop((sink, prefetcher));
        prefetch::serve(&shared, &receiver);
        let guard = shared.tip();
        let reads = guard.as_ref().unwrap().trie.trie().store().take_reads();
        assert_eq!(reads, overdrive_trie::SourceReads::default());
    }
}

/// The genesis trie whole, as block `TIP`'s.
fn whole_tip() -> Tip {
    let mut trie =
        StateTrie::new(BoundedNodeStore::default(), TrieConfig::with_threads(2)).unwrap();
    trie.apply(&genesis()).unwrap();
    Tip {
        leaves: None,
        trie: CompactTrie::new(trie),
        ..tip_at(TIP)
    }
}

/// Streams `updates` (each a transaction's) of a block on `TIP` to the thread hashing ahead,
/// which commits them on `shared`'s trie; the block.
fn hash_ahead(shared: &Shared, updates: &[revm::state::EvmState]) -> Arc<prefetch::BlockPrefetch> {
    let (prefetcher, receiver) = Prefetcher::new(true);
    let (sink, block) = prefetcher.sink(TIP);
    for update in updates {
        sink.on_state_update(update.clone());
    }
    drop((sink, prefetcher));
    prefetch::hash_ahead_of_roots(shared, &receiver);
    block
}

/// A block of two transactions hashed ahead, the first in a round while the block executes:
/// its root is the block's, its rows are those of the block committed whole, and the trie
/// steps back to the parent through the rounds' undo batches.
#[test]
fn a_block_hashed_ahead_ends_with_the_rows_of_the_block_whole() {
    let (a, b) = (Address::with_last_byte(3), Address::with_last_byte(7));
    let first = update_of_3();
    let second: revm::state::EvmState = [
        (
            a,
            touched(info(4, 900), info(4, 800), &[(1, 9, 10), (2, 0, 5)]),
        ),
        (b, touched(info(7, 1000), info(8, 1100), &[])),
    ]
    .into_iter()
    .collect();
    let shared = shared(whole_tip());
    let block = hash_ahead(&shared, std::slice::from_ref(&first));
    let mut guard = shared.tip();
    let tip = guard.as_mut().unwrap();
    assert_eq!(tip.ahead.as_ref().map(|(_, rounds)| rounds.len()), Some(1));
    assert_ne!(tip.trie.trie().root(), trie_of(&genesis()).root());

    // The block's changes as reth's bundle gives them at the end.
    let mut state = evm_state_to_hashed_post_state(first);
    state.extend(evm_state_to_hashed_post_state(second));
    let block_changes = changes(&state);
    let mut after = genesis();
    after.extend(block_changes.clone());
    let expected = trie_of(&after).root();
    let next = B256::repeat_byte(0x44);
    let (root, rows, ahead) = tip
        .finish_ahead(&block, next, &block_changes, expected)
        .unwrap()
        .expect("the rounds are the block's");
    assert_eq!((root, ahead.rounds), (expected, 1));
    assert!(ahead.ahead_nodes > 0 && ahead.rest_nodes > 0);
    assert_eq!((tip.block, tip.trie.trie().root()), (next, expected));

    let mut whole = whole_tip();
    let output = whole.compute(&block_changes).unwrap();
    let (whole_rows, _) = whole.advance(next, &output).unwrap();
    assert_eq!(rows, whole_rows);

    assert!(tip.rewind_to(TIP).unwrap());
    assert_eq!(tip.trie.trie().root(), trie_of(&genesis()).root());
}

/// Rounds that changed what the block does not (a slot the block leaves as the parent had
/// it) are taken back and the block hashed whole; so are the rounds of a block whose root
/// has not begun when the trie is used for another (here a payload's root).
#[test]
fn rounds_the_block_does_not_take_are_taken_back() {
    let a = Address::with_last_byte(3);
    let first = update_of_3();
    let shared = shared(whole_tip());
    let block = hash_ahead(&shared, std::slice::from_ref(&first));
    let mut guard = shared.tip();
    let tip = guard.as_mut().unwrap();
    let mut put_back = HashedStateChanges::default();
    put_back
        .accounts
        .insert(keccak256(a), Some(hashed(&info(4, 900))));
    let mut after = genesis();
    after.extend(put_back.clone());
    let expected = trie_of(&after).root();
    let finished = tip.finish_ahead(&block, B256::repeat_byte(0x44), &put_back, expected);
    assert!(finished.unwrap().is_none());
    assert!(tip.ahead.is_none());
    assert_eq!(
        (tip.block, tip.trie.trie().root()),
        (TIP, trie_of(&genesis()).root())
    );
    drop(guard);

    hash_ahead(&shared, &[first]);
    let mut guard = shared.tip();
    let tip = guard.as_mut().unwrap();
    assert!(tip.ahead.is_some());
    let output = tip.compute(&put_back).unwrap();
    assert!(tip.ahead.is_none());
    assert_eq!(output.root, expected);
}

/// A round that cannot apply (here the storage of an account the trie does not hold, as a
/// round after a gap in the stream would write) is not a failure of the trie: the block stops
/// hashing ahead, its rounds go back, and its root will hash it whole.
#[test]
fn a_round_that_cannot_apply_stops_the_block_not_the_trie() {
    let stranger = Address::with_last_byte(200);
    let unchanged = info(0, 0);
    let storage_only: revm::state::EvmState = [(
        stranger,
        touched(unchanged.clone(), unchanged, &[(1, 0, 3)]),
    )]
    .into_iter()
    .collect();
    let shared = shared(whole_tip());
    let block = hash_ahead(&shared, &[update_of_3(), storage_only]);
    assert!(block.stopped());
    assert!(!shared.failed.load(Ordering::Relaxed));
    let guard = shared.tip();
    let tip = guard.as_ref().expect("the trie is kept");
    assert!(tip.ahead.is_none());
    assert_eq!(tip.trie.trie().root(), trie_of(&genesis()).root());
}
