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
//! [`BoundedNodeStore::prefetch`]: overdrive_trie::BoundedNodeStore::prefetch

use super::{Shared, TARGET};
use alloy_primitives::{
    Address, B256, U256, keccak256,
    map::{B256Map, HashSet},
};
use overdrive_trie::TrieId;
use reth_engine_tree::tree::state_root_strategy::{StateAccessHint, StateRootSink};
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

struct Batch {
    block: Arc<BlockPrefetch>,
    keys: Keys,
}

/// Where a [`Prefetcher`]'s batches arrive.
pub(super) struct Receiver(mpsc::Receiver<Batch>);

/// The strategy's prefetch thread, which serves the blocks' sinks one batch of keys at a time.
#[derive(Debug)]
pub(super) struct Prefetcher {
    sender: mpsc::Sender<Batch>,
}

impl Prefetcher {
    /// Starts the thread; it ends when the prefetcher and all its sinks are dropped.
    pub(super) fn spawn(shared: Arc<Shared>) -> std::io::Result<Self> {
        let (prefetcher, receiver) = Self::new();
        std::thread::Builder::new()
            .name("overdrive-prefetch".to_string())
            .spawn(move || serve(&shared, &receiver))?;
        Ok(prefetcher)
    }

    /// A prefetcher and the receiving end of its batches, for [`serve`].
    pub(super) fn new() -> (Self, Receiver) {
        let (sender, receiver) = mpsc::channel();
        (Self { sender }, Receiver(receiver))
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
        };
        (sink, block)
    }
}

/// The keys of one block's state updates, sent to the prefetch thread.
pub(super) struct PrefetchSink {
    block: Arc<BlockPrefetch>,
    sender: mpsc::Sender<Batch>,
}

impl PrefetchSink {
    fn send(&self, keys: Keys) {
        if !self.block.stopped() {
            // The thread is gone only when the strategy is: nothing is left to prefetch for.
            let _ = self.sender.send(Batch {
                block: self.block.clone(),
                keys,
            });
        }
    }
}

impl StateRootSink for PrefetchSink {
    fn on_access_hint(&self, hint: StateAccessHint) {
        self.send(Keys::Hashed(hint.accounts, hint.storages));
    }

    fn on_state_update(&self, state: EvmState) {
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
        self.send(Keys::Plain(accounts));
    }

    fn on_hashed_state_update(&self, state: HashedPostState) {
        let storages = state
            .storages
            .into_iter()
            .map(|(address, storage)| (address, storage.storage.into_keys().collect()))
            .collect();
        self.send(Keys::Hashed(state.accounts.into_keys().collect(), storages));
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
        let mut keys = batch.keys.hashed();
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
