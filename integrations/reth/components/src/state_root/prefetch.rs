//! Reading back, while a block executes, what its root will read from the database.
//!
//! With `--overdrive.trie.cache-mb` the trie keeps only its top levels, and a block's root
//! reads back the subtrees under the keys the block changes. The engine streams each
//! transaction's state updates (and the prewarming's access hints) to the block's state-root
//! job as it executes; a thread of the strategy walks the trie along each key and rebuilds
//! the subtree the root will read ([`BoundedNodeStore::prefetch`]), so that the root, on the
//! block's critical path, finds it ready. The reads are the ones the root would make, from the
//! same state (the parent's): what the prefetch misses, the root reads itself. A whole trie
//! reads nothing back; the walk brings the nodes the root will hash into the cache.
//!
//!
//! With `--overdrive.trie.hash-ahead` the thread does more with a whole trie: it folds the
//! updates that queued while it was busy and commits them as the next round of the block's
//! changes ([`Rounds`]), so that the root is left with what changed since the last round.
//!
//! [`BoundedNodeStore::prefetch`]: overdrive_trie::BoundedNodeStore::prefetch
//! [`Rounds`]: overdrive_trie::Rounds

use super::{Shared, TARGET, changes};
use alloy_primitives::{
    Address, B256, U256, keccak256,
    map::{B256Map, HashSet},
};
use overdrive_trie::{HashedStateChanges, TrieError, TrieId};
use reth_engine_tree::tree::state_root_strategy::{
    StateAccessHint, StateRootSink, evm_state_to_hashed_post_state,
};
use reth_trie::HashedPostState;
use revm::state::EvmState;
use std::sync::{
    Arc,
    atomic::{AtomicBool, Ordering},
    mpsc,
};
use tracing::debug;

/// One block's prefetch: the state it reads (its parent's), and whether the block's root has
/// begun (then what is still queued is dropped).
#[derive(Debug)]
pub(super) struct BlockPrefetch {
    parent: B256,
    stopped: AtomicBool,
}

impl BlockPrefetch {
    /// Drops what is still queued for this block and ends a prefetch under way at its next
    /// key, so that the root takes the trie soon.
    pub(super) fn stop(&self) {
        self.stopped.store(true, Ordering::Relaxed);
    }

    pub(super) fn stopped(&self) -> bool {
        self.stopped.load(Ordering::Relaxed)
    }

    /// The block the executing block builds on.
    pub(super) fn parent(&self) -> B256 {
        self.parent
    }
}

/// Keys of one update, as the engine gives them.
enum Keys {
    /// Addresses and storage slots, hashed on the prefetch thread (not the executing one).
    Plain(Vec<(Address, Vec<U256>)>),
    /// Hashed addresses, and hashed slots by hashed address.
    Hashed(Vec<B256>, B256Map<Vec<B256>>),
}

impl Keys {
    /// The trie keys: each account's in the account trie, each slot's in its account's
    /// storage trie.
    fn hashed(self) -> Vec<(TrieId, B256)> {
        let mut keys = Vec::new();
        match self {
            Self::Plain(accounts) => {
                for (address, slots) in accounts {
                    let hashed = keccak256(address);
                    keys.push((TrieId::Account, hashed));
                    keys.extend(
                        slots
                            .into_iter()
                            .map(|slot| (TrieId::Storage(hashed), keccak256(B256::from(slot)))),
                    );
                }
            }
            Self::Hashed(accounts, storages) => {
                keys.extend(accounts.into_iter().map(|a| (TrieId::Account, a)));
                for (address, slots) in storages {
                    keys.push((TrieId::Account, address));
                    keys.extend(slots.into_iter().map(|s| (TrieId::Storage(address), s)));
                }
            }
        }
        keys
    }
}

/// What a sink sends: the keys of an update to prefetch, or the update itself to hash ahead.
enum Update {
    Keys(Keys),
    /// A transaction's state, hashed on the thread.
    State(EvmState),
    Hashed(HashedPostState),
}

struct Batch {
    block: Arc<BlockPrefetch>,
    update: Update,
}

/// Where a [`Prefetcher`]'s batches arrive.
pub(super) struct Receiver(mpsc::Receiver<Batch>);

/// The strategy's prefetch thread, which serves the blocks' sinks one batch of keys at a time,
/// or hashes their updates ahead.
#[derive(Debug)]
pub(super) struct Prefetcher {
    sender: mpsc::Sender<Batch>,
    hash_ahead: bool,
}

impl Prefetcher {
    /// Starts the thread; it ends when the prefetcher and all its sinks are dropped.
    pub(super) fn spawn(shared: Arc<Shared>, hash_ahead: bool) -> std::io::Result<Self> {
        let (prefetcher, receiver) = Self::new(hash_ahead);
        std::thread::Builder::new()
            .name("overdrive-prefetch".to_string())
            .spawn(move || {
                if hash_ahead {
                    hash_ahead_of_roots(&shared, &receiver);
                } else {
                    serve(&shared, &receiver);
                }
            })?;
        Ok(prefetcher)
    }

    /// A prefetcher and the receiving end of its batches, for [`serve`] or, to hash ahead,
    /// [`hash_ahead_of_roots`].
    pub(super) fn new(hash_ahead: bool) -> (Self, Receiver) {
        let (sender, receiver) = mpsc::channel();
        (Self { sender, hash_ahead }, Receiver(receiver))
    }

    /// A sink for the updates of a block on `parent`, and the handle its root stops it with.
    pub(super) fn sink(&self, parent: B256) -> (PrefetchSink, Arc<BlockPrefetch>) {
        let block = Arc::new(BlockPrefetch {
            parent,
            stopped: AtomicBool::new(false),
        });
        let sink = PrefetchSink {
            block: block.clone(),
            sender: self.sender.clone(),
            hash_ahead: self.hash_ahead,
        };
        (sink, block)
    }
}

/// The keys of one block's state updates, sent to the prefetch thread.
pub(super) struct PrefetchSink {
    block: Arc<BlockPrefetch>,
    sender: mpsc::Sender<Batch>,
    /// Whether the updates go whole, to hash ahead, or as their keys, to prefetch.
    hash_ahead: bool,
}

impl PrefetchSink {
    fn send(&self, update: Update) {
        if !self.block.stopped() {
            // The thread is gone only when the strategy is: nothing is left to prefetch for.
            let _ = self.sender.send(Batch {
                block: self.block.clone(),
                update,
            });
        }
    }
}

impl StateRootSink for PrefetchSink {
    fn on_access_hint(&self, hint: StateAccessHint) {
        // Hashing ahead needs values: a hint of what will be read has none.
        if !self.hash_ahead {
            self.send(Update::Keys(Keys::Hashed(hint.accounts, hint.storages)));
        }
    }

    fn on_state_update(&self, state: EvmState) {
        if self.hash_ahead {
            self.send(Update::State(state));
            return;
        }
        let accounts = state
            .into_iter()
            .filter(|(_, account)| account.is_touched())
            .map(|(address, account)| {
                let slots = account
                    .storage
                    .into_iter()
                    .filter(|(_, slot)| slot.is_changed())
                    .map(|(key, _)| key)
                    .collect();
                (address, slots)
            })
            .collect();
        self.send(Update::Keys(Keys::Plain(accounts)));
    }

    fn on_hashed_state_update(&self, state: HashedPostState) {
        if self.hash_ahead {
            self.send(Update::Hashed(state));
            return;
        }
        let storages = state
            .storages
            .into_iter()
            .map(|(address, storage)| (address, storage.storage.into_keys().collect()))
            .collect();
        self.send(Update::Keys(Keys::Hashed(
            state.accounts.into_keys().collect(),
            storages,
        )));
    }

    fn on_updates_finished(&self) {}
}

/// The prefetch thread: each batch's keys read back under the trie's lock, while the trie is
/// at the batch's block's parent (a block whose root began, or a trie that moved, is skipped).
pub(super) fn serve(shared: &Shared, receiver: &Receiver) {
    // Keys already read for the block being served: the same accounts and slots come back in
    // many transactions.
    let mut serving: Option<Arc<BlockPrefetch>> = None;
    let mut seen: HashSet<(TrieId, B256)> = HashSet::default();
    while let Ok(batch) = receiver.0.recv() {
        if batch.block.stopped() {
            continue;
        }
        if !serving
            .as_ref()
            .is_some_and(|b| Arc::ptr_eq(b, &batch.block))
        {
            serving = Some(batch.block.clone());
            seen.clear();
        }
        let Update::Keys(keys) = batch.update else {
            continue;
        };
        let mut keys = keys.hashed();
        keys.retain(|key| seen.insert(*key));
        if keys.is_empty() {
            continue;
        }
        let mut guard = shared.tip();
        let Some(tip) = guard.as_mut().filter(|tip| tip.block == batch.block.parent) else {
            continue;
        };
        if let Err(error) = tip.read_at_block() {
            debug!(target: TARGET, %error, "Prefetch stopped: the root reads what it needs itself");
            batch.block.stop();
            continue;
        }
        let store = tip.trie.trie().store();
        let mut done = 0;
        for (trie, key) in keys {
            if batch.block.stopped() {
                break;
            }
            if let Err(error) = store.prefetch(trie, key) {
                debug!(target: TARGET, %error, "Prefetch stopped: the root reads what it needs itself");
                batch.block.stop();
                break;
            }
            done += 1;
        }
        metrics::counter!("overdrive_state_root_prefetched_keys_total").increment(done);
    }
}

/// The thread hashing ahead: each block's updates folded as they come, and whenever none is
/// queued, what was folded committed as the block's next round while the trie is at the
/// block's parent. A failed round drops the trie, as a failed root does.
pub(super) fn hash_ahead_of_roots(shared: &Shared, receiver: &Receiver) {
    let mut pending: Option<(Arc<BlockPrefetch>, HashedStateChanges)> = None;
    loop {
        // Waits only when nothing is folded; otherwise a round begins once the queue is empty
        // (or closed: the folded updates are committed first).
        let next = if pending.is_some() {
            receiver.0.try_recv().ok()
        } else {
            match receiver.0.recv() {
                Ok(batch) => Some(batch),
                Err(_) => return,
            }
        };
        let Some(batch) = next else {
            if let Some((block, changes)) = pending.take() {
                commit_round(shared, &block, changes);
            }
            continue;
        };
        if batch.block.stopped() {
            continue;
        }
        let update = match batch.update {
            Update::State(state) => changes(&evm_state_to_hashed_post_state(state)),
            Update::Hashed(state) => changes(&state),
            Update::Keys(_) => continue,
        };
        match &mut pending {
            Some((block, folded)) if Arc::ptr_eq(block, &batch.block) => folded.extend(update),
            // A newer block: the one folded so far has ended, or will not.
            _ => {
                if let Some((block, _)) = &pending {
                    block.stop();
                }
                pending = Some((batch.block, update));
            }
        }
    }
}

fn commit_round(shared: &Shared, block: &Arc<BlockPrefetch>, changes: HashedStateChanges) {
    let mut guard = shared.tip();
    // A block whose root began takes its rounds as they are.
    if block.stopped() {
        return;
    }
    let Some(tip) = guard.as_mut() else {
        return;
    };
    let started = std::time::Instant::now();
    let keys = changes.accounts.len()
        + changes
            .storages
            .values()
            .map(|s| s.slots.len())
            .sum::<usize>();
    // The one writer of the trie besides the root: a panic half way through a commit would
    // leave a trie no root can trust.
    let committed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        tip.commit_round(block, changes)
    }))
    .unwrap_or_else(|_| Err(TrieError::Store("a round hashed ahead panicked".into())));
    match committed {
        Ok(true) => {
            metrics::counter!("overdrive_state_root_rounds_total").increment(1);
            debug!(target: TARGET, keys, elapsed = ?started.elapsed(), "Hashed a round ahead");
        }
        Ok(false) => {}
        Err(error) => {
            block.stop();
            shared.give_up(
                &mut guard,
                block.parent,
                &format!("a round hashed ahead failed: {error}"),
            );
        }
    }
}
