//! The block's state transitions, folded off the committer.
//!
//! `revm::State::commit` does two things with each changed account: it updates the cache (what
//! every later read of the committed state answers) and it folds the account's change into the
//! block's transition for that account (what the bundle is built from at the end). Only the first
//! must happen on the committer, in order, before the next transaction is validated. The second
//! takes a sizeable share of the committer's time per validated transaction (an ERC20 token's
//! transition is updated by every transfer of the block), and the committer's time is what caps the
//! speedup on many threads (`CommitStats::serial_ns`). So, when the pool has time to spare
//! (`TransitionFolding`), the committer updates the cache and queues each transition here, in a
//! shard chosen by its address; pool threads fold the queues into the shards' transition states
//! while the block runs, and every thread folds what is left at its end. Folding there costs more
//! in all than on the committer (the folding thread reads what another core wrote), which is why it
//! is not done when the pool has no time to spare.
//!
//! Folding in commit order per address is what makes the result equal to `revm::State`'s own:
//! an address always goes to the same shard, the committer queues in commit order, and a
//! shard's queue is taken and folded only while its `folded` lock is held, so batches fold in
//! the order they were queued.

use super::sched::lock;
use alloy_primitives::{
    Address,
    map::{AddressMap, FbBuildHasher, hash_map},
};
use revm::{
    database::{TransitionAccount, TransitionState},
    state::{EvmStorage, EvmStorageSlot, TransactionId},
};
use std::{
    borrow::Cow,
    sync::{
        Mutex,
        atomic::{AtomicUsize, Ordering},
    },
};

/// Shards of the queue and of the folded transitions. More than the threads that fold them, so
/// that two folding threads seldom want the same one.
const SHARDS: usize = 32;

/// Queued transitions above which a worker folds some before its next transaction, rather than
/// only when it has nothing to execute (on two threads the worker is seldom idle before the
/// block's end, and whatever is left then is folded on the block's critical path).
const FOLD_WHEN_QUEUED: usize = 2048;

/// Queued transitions above which the committer, finding its next transaction not yet
/// executed, folds some rather than execute that transaction itself: an exact execution costs
/// more than a speculative one and its validation, and on few threads the folding is work the
/// committer would otherwise leave to the block's end.
const COMMITTER_FOLDS_AT: usize = 64;

/// Transitions the committer buffers before it queues them: one lock per shard and batch
/// instead of one per account, and the shared count touched once per batch.
const WRITE_BATCH: usize = 256;

/// One account's change from one commit, not yet folded.
#[derive(Debug)]
pub(crate) enum Pending {
    /// As `CacheState::apply_evm_state` hands it out: the transaction's own storage map, with
    /// the unchanged slots it read.
    Evm(TransitionAccount<Option<EvmStorage>>),
    /// As `revm::State` folded it into its own, empty transition state: one commit of an exact
    /// execution, a system call, the deferred fees, the post-block balance increments.
    Folded(TransitionAccount),
}

/// One shard, alone on its cache lines (the committer locks queues while pool threads lock
/// others).
#[derive(Debug)]
#[repr(align(128))]
struct Shard {
    /// Transitions committed and not yet folded, in commit order.
    queue: Mutex<Vec<(Address, Pending)>>,
    /// The fold of everything taken from `queue`. Locked before the queue is taken and held
    /// until the batch taken is folded (see the module comment).
    folded: Mutex<TransitionState>,
}

impl Shard {
    /// Takes the queue and folds it into `folded`, this shard's locked map (the lock held
    /// across both keeps batches in queue order); returns how many transitions it folded.
    fn fold_queue(&self, folded: &mut TransitionState) -> usize {
        let batch = std::mem::take(&mut *lock(&self.queue));
        let len = batch.len();
        fold_batch(folded, batch);
        len
    }
}

/// The block's transitions, sharded by address (see the module comment).
#[derive(Debug)]
pub(crate) struct Transitions {
    shards: Box<[Shard]>,
    /// Transitions queued and not yet taken, over all shards; a hint, for when to fold.
    queued: AtomicUsize,
}

/// The shard of `address`: addresses are uniform in every byte but the ones a test picks
/// (`0x…01`), which differ in the last ones.
fn shard_of(address: &Address) -> usize {
    let tail = u64::from_le_bytes(address.0[12..20].try_into().unwrap_or_default());
    let head = u64::from_le_bytes(address.0[0..8].try_into().unwrap_or_default());
    ((tail ^ head).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 58) as usize % SHARDS
}

impl Transitions {
    /// Transitions for a block of `txs` transactions. Every shard's map shares `hasher`, so
    /// that the end-of-block merge, walking the shards in table order into one map with the
    /// same hasher, writes that map in order (see `merge.rs`).
    pub(crate) fn new(txs: usize, hasher: &FbBuildHasher<20>) -> Self {
        // About two changed accounts per transaction, as `block_state` sizes `revm::State`'s.
        let per_shard = txs * 2 / SHARDS;
        Self {
            shards: (0..SHARDS)
                .map(|_| Shard {
                    queue: Mutex::new(Vec::new()),
                    folded: Mutex::new(TransitionState {
                        transitions: AddressMap::with_capacity_and_hasher(
                            per_shard,
                            hasher.clone(),
                        ),
                    }),
                })
                .collect(),
            queued: AtomicUsize::new(0),
        }
    }

    /// The committer's side: it queues through this, in commit order.
    pub(crate) fn writer(&self) -> Writer<'_> {
        Writer {
            transitions: self,
            buffers: (0..SHARDS).map(|_| Vec::new()).collect(),
            buffered: 0,
        }
    }

    /// Queues the transitions `revm::State` folded into its own transition state, emptying it.
    /// It must have folded one commit only since it was last emptied, so that each entry is
    /// that commit's change (see [`Pending::Folded`]). Nothing may be buffered in a
    /// [`Writer`] meanwhile.
    pub(crate) fn push_folded(&self, state: &mut TransitionState) {
        let mut writer = self.writer();
        writer.push_folded(state);
        writer.flush();
    }

    /// Whether a worker should fold before its next transaction.
    pub(crate) fn worth_folding(&self) -> bool {
        self.queued.load(Ordering::Relaxed) >= FOLD_WHEN_QUEUED
    }

    /// Whether the committer should fold rather than execute its next transaction itself.
    pub(crate) fn committer_should_fold(&self) -> bool {
        self.queued.load(Ordering::Relaxed) >= COMMITTER_FOLDS_AT
    }

    /// Folds the queues of the shards no other thread is folding, starting at `start`; true if
    /// anything was folded.
    pub(crate) fn fold_some(&self, start: usize) -> bool {
        let mut any = false;
        for i in 0..SHARDS {
            let shard = &self.shards[(start + i) % SHARDS];
            let Ok(mut folded) = shard.folded.try_lock() else {
                continue;
            };
            let count = shard.fold_queue(&mut folded);
            if count > 0 {
                self.queued.fetch_sub(count, Ordering::Relaxed);
                any = true;
            }
        }
        any
    }

    /// Folds every queue, on the calling thread and `pool`'s, and takes the shards' transition
    /// states.
    pub(crate) fn fold_all(&self, pool: &rayon::ThreadPool) -> Vec<TransitionState> {
        let next = AtomicUsize::new(0);
        let fold_shards = || {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(shard) = self.shards.get(i) else {
                    break;
                };
                shard.fold_queue(&mut lock(&shard.folded));
            }
        };
        if self.queued.load(Ordering::Relaxed) >= FOLD_WHEN_QUEUED {
            pool.in_place_scope(|scope| {
                for _ in 0..pool.current_num_threads() {
                    scope.spawn(|_| fold_shards());
                }
                fold_shards();
            });
        } else {
            // Waking the pool costs more than folding a few transitions.
            fold_shards();
        }
        self.queued.store(0, Ordering::Relaxed);
        self.take_states()
    }

    /// Folds every queue on the calling thread into `state`: from then on `revm::State` folds
    /// the block's transitions itself, as when the block goes sequential. What `state` holds
    /// is queued first (one commit's, as [`Self::push_folded`] requires).
    pub(crate) fn fold_into(&self, state: &mut TransitionState) {
        self.push_folded(state);
        for shard in &self.shards {
            let mut folded = lock(&shard.folded);
            shard.fold_queue(&mut folded);
            state.transitions.extend(folded.transitions.drain());
        }
        self.queued.store(0, Ordering::Relaxed);
    }

    fn take_states(&self) -> Vec<TransitionState> {
        self.shards
            .iter()
            .map(|shard| std::mem::take(&mut *lock(&shard.folded)))
            .collect()
    }

    /// Sizes `address`'s transition storage for `slots` slots, if its transition exists and no
    /// other thread is folding its shard; true if it was sized.
    pub(crate) fn reserve_storage(&self, address: Address, slots: usize) -> bool {
        let Ok(mut folded) = self.shards[shard_of(&address)].folded.try_lock() else {
            return false;
        };
        match folded.transitions.get_mut(&address) {
            Some(transition) => {
                transition.storage.reserve(slots);
                true
            }
            None => false,
        }
    }
}

/// The committer's buffer of transitions not yet queued, by shard.
#[derive(Debug)]
pub(crate) struct Writer<'a> {
    transitions: &'a Transitions,
    buffers: Box<[Vec<(Address, Pending)>]>,
    buffered: usize,
}

impl<'a> Writer<'a> {
    /// The transitions this writes to.
    pub(crate) fn shared(&self) -> &'a Transitions {
        self.transitions
    }

    /// Buffers one commit's change of `address`, and queues the buffer when it is full.
    pub(crate) fn push(&mut self, address: Address, pending: Pending) {
        self.buffers[shard_of(&address)].push((address, pending));
        self.buffered += 1;
        if self.buffered >= WRITE_BATCH {
            self.flush();
        }
    }

    /// See [`Transitions::push_folded`].
    pub(crate) fn push_folded(&mut self, state: &mut TransitionState) {
        for (address, transition) in state.transitions.drain() {
            self.push(address, Pending::Folded(transition));
        }
    }

    /// Queues everything buffered.
    pub(crate) fn flush(&mut self) {
        if self.buffered == 0 {
            return;
        }
        for (shard, buffer) in self.transitions.shards.iter().zip(self.buffers.iter_mut()) {
            if !buffer.is_empty() {
                lock(&shard.queue).append(buffer);
            }
        }
        self.transitions
            .queued
            .fetch_add(self.buffered, Ordering::Relaxed);
        self.buffered = 0;
    }
}

/// Folds `batch`, in order, into `state` exactly as `TransitionState::add_transition` folds
/// each commit's changes in `revm::State`.
fn fold_batch(state: &mut TransitionState, batch: Vec<(Address, Pending)>) {
    for (address, pending) in batch {
        match pending {
            Pending::Evm(transition) => {
                state.add_transition(address, transition.map_storage(|s| s.map(Cow::Owned)));
            }
            Pending::Folded(transition) => match state.transitions.entry(address) {
                // What `add_transition` would have inserted for the commit's own change.
                hash_map::Entry::Vacant(entry) => {
                    entry.insert(transition);
                }
                // The commit's change again as the EVM's storage: `update` reads a slot's
                // original and present value, and skips the unchanged ones, which a folded
                // transition no longer holds.
                hash_map::Entry::Occupied(entry) => {
                    entry.into_mut().update(transition.map_storage(|storage| {
                        Some(Cow::Owned(
                            storage
                                .into_iter()
                                .map(|(key, slot)| {
                                    (
                                        key,
                                        EvmStorageSlot::new_changed(
                                            slot.previous_or_original_value,
                                            slot.present_value,
                                            TransactionId::ZERO,
                                        ),
                                    )
                                })
                                .collect(),
                        ))
                    }));
                }
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloy_primitives::{U256, keccak256};
    use revm::{
        Database, DatabaseCommit,
        bytecode::Bytecode,
        database::{InMemoryDB, State},
        state::{Account, EvmState},
    };

    fn address(i: usize) -> Address {
        if i.is_multiple_of(4) {
            // Small addresses, as tests and precompiles have: they differ in the last bytes.
            Address::with_last_byte(i as u8)
        } else {
            Address::from_slice(&keccak256(i.to_be_bytes()).0[..20])
        }
    }

    /// One commit's changes over some of `n` accounts, as an EVM would hand them out after
    /// reading `state`: balance changes, storage writes whose values cycle (so that a slot
    /// goes back to its value at the block's start), self-destructs and creations.
    fn changes(state: &mut State<InMemoryDB>, round: usize, n: usize) -> EvmState {
        let mut out = EvmState::default();
        for i in (0..n).filter(|i| !(i + round).is_multiple_of(3)) {
            let info = state.basic(address(i)).unwrap();
            let existed = info.is_some();
            let mut account = Account::from(info.unwrap_or_default());
            account.mark_touch();
            match (i * 7 + round) % 11 {
                0 if existed => {
                    account.mark_selfdestruct();
                    out.insert(address(i), account);
                    continue;
                }
                1 if !existed => {
                    let code = Bytecode::new_raw(vec![0x60, round as u8].into());
                    account.info.code_hash = code.hash_slow();
                    account.info.code = Some(code);
                    account.info.nonce = 1;
                    account.mark_created();
                }
                // Touched, unchanged.
                2 => {}
                _ => account.info.balance += U256::from(round + 1),
            }
            for s in 0..(i % 4) * 3 {
                let slot = U256::from(s);
                let original = state.storage(address(i), slot).unwrap();
                let present = U256::from((round + s + i) % 3);
                account.storage.insert(
                    slot,
                    EvmStorageSlot::new_changed(original, present, TransactionId::ZERO),
                );
            }
            out.insert(address(i), account);
        }
        out
    }

    fn db(n: usize) -> State<InMemoryDB> {
        crate::parallel::merge::tests::funded_state((0..n).step_by(2).map(address), 3)
    }

    /// Queued and folded, by either path and with a hand-back to `revm::State` midway, the
    /// transitions equal those `revm::State::commit` folds itself.
    #[test]
    fn folding_equals_revm_commit() {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .build()
            .unwrap();
        let n = 160;
        for hand_back_at in [None, Some(9)] {
            let mut reference = db(n);
            let mut ours = db(n);
            let transitions = Transitions::new(n, &FbBuildHasher::default());
            let mut writer = transitions.writer();
            let mut queuing = true;
            for round in 0..24 {
                let evm_state = changes(&mut reference, round, n);
                reference.commit(evm_state.clone());
                // What the EVM's reads load into the committer's cache before its commit.
                for (address, account) in &evm_state {
                    ours.basic(*address).unwrap();
                    for slot in account.storage.keys() {
                        ours.storage(*address, *slot).unwrap();
                    }
                }
                if Some(round) == hand_back_at {
                    writer.flush();
                    transitions
                        .fold_into(ours.transition_state.get_or_insert_with(Default::default));
                    queuing = false;
                }
                if !queuing {
                    ours.commit(evm_state);
                } else if round % 4 == 3 {
                    // A commit through `revm::State`, as an exact execution's.
                    ours.commit(evm_state);
                    writer.push_folded(ours.transition_state.as_mut().unwrap());
                } else {
                    for (address, transition) in ours.cache.apply_evm_state(evm_state, |_, _| {}) {
                        let transition = transition.map_storage(|s| s.map(Cow::into_owned));
                        writer.push(address, Pending::Evm(transition));
                    }
                }
                if round % 5 == 0 {
                    transitions.fold_some(round);
                }
            }
            let expected = reference.transition_state.take().unwrap().transitions;
            let mut got = ours.transition_state.take().unwrap().transitions;
            writer.flush();
            for state in transitions.fold_all(&pool) {
                for (address, transition) in state.transitions {
                    assert!(got.insert(address, transition).is_none(), "{address} twice");
                }
            }
            assert_eq!(got.len(), expected.len(), "hand back at {hand_back_at:?}");
            for (address, transition) in &expected {
                assert_eq!(
                    got.get(address),
                    Some(transition),
                    "{address}, hand back at {hand_back_at:?}"
                );
            }
            assert!(
                expected.values().any(|t| t.storage_was_destroyed),
                "the changes destroy some storage"
            );
        }
    }
}
