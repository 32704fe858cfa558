//! The state trie: the account trie plus one storage trie per contract, updated block by block
//! on a persistent thread pool.

use crate::{
    engine::{
        LeafOp, RootChange, UpdateSource, WorkerOutput, get_value, root_of_node, update_trie,
    },
    error::TrieError,
    node::Value,
    state::{HashedAccount, HashedStateChanges, HashedStorageChanges},
    store::{MemNodeStore, NodeStore, StateTrieUpdates, StorageNodeUpdates, TrieId},
};
use alloy_primitives::{B256, U256, map::B256Map};
use alloy_rlp::{Decodable, Encodable};
use alloy_trie::{EMPTY_ROOT_HASH, Nibbles, TrieAccount};
use overdrive_tasks::{Pinning, WorkerPool, worker_pool};
use rayon::prelude::*;
use std::{cmp::Reverse, sync::Arc, time::Instant};

/// Tasks per worker that a trie's updates are cut into, at most: enough for work stealing to even
/// out uneven subtrees, few enough that each task is worth what it costs to start and merge.
/// Against cutting every subtree of 64 updates or more, this was measured faster on small and
/// mid-sized updates and no slower on large ones.
const TASKS_PER_THREAD: usize = 4;

/// Settings of a [`StateTrie`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TrieConfig {
    /// Worker threads of the trie's pool. 1 runs everything on one thread with no splitting.
    pub threads: usize,
    /// A subtree with at least this many pending updates hands its children to the pool, at
    /// the root and at any depth below it — or with more, where this is less than a quarter of
    /// a worker's share of its trie's updates (see `TASKS_PER_THREAD`).
    pub parallel_threshold: usize,
    /// Hash a block's changed nodes in batches, eight per pass where the CPU has AVX-512 and
    /// four where it has AVX2 (see the `keccak` module); on by default exactly there. Without
    /// that CPU support batching only adds work.
    pub batch_hashing: bool,
    /// Pin each worker of the pool [`StateTrie::new`] starts to its own core (when there are
    /// at least as many cores as workers; see `overdrive_tasks::Pinning`). Off by default:
    /// inside a node the cores are shared with the node's own threads, which pinned workers
    /// would fight. A machine running the trie alone (the benchmark) may pin them: unpinned, a
    /// block's second worker can wait milliseconds for a core while another sits idle.
    pub pin_workers: bool,
}

impl Default for TrieConfig {
    fn default() -> Self {
        Self {
            threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
            parallel_threshold: 64,
            batch_hashing: crate::keccak::batched(),
            pin_workers: false,
        }
    }
}

impl TrieConfig {
    /// The default configuration with `threads` workers.
    pub fn with_threads(threads: usize) -> Self {
        Self {
            threads,
            ..Self::default()
        }
    }
}

/// Counters of one [`StateTrie::apply`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TrieStats {
    /// Keccak calls made hashing nodes (keys are hashed before the trie sees them).
    pub keccak_calls: u64,
    /// Nodes re-encoded and written.
    pub dirty_nodes: u64,
    /// Nodes deleted (not counting wiped storage tries).
    pub deleted_nodes: u64,
    /// Storage tries updated or wiped.
    pub storage_tries: u64,
    /// Account leaves updated, created or deleted (requested; unchanged values included).
    pub account_updates: u64,
    /// Storage slots updated (requested).
    pub slot_updates: u64,
}

/// What [`StateTrie::compute`] returns.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StateRootOutput {
    /// The state root after the diff.
    pub root: B256,
    /// The node writes and deletes that take the store from the old state to the new one.
    pub updates: StateTrieUpdates,
    /// Counters.
    pub stats: TrieStats,
}

/// The state trie over a [`NodeStore`], with its own worker pool.
///
/// Cloning shares the pool and clones the store, which for [`MemNodeStore`] is cheap; that is
/// how a test runner forks a side chain from any block's trie.
#[derive(Clone)]
pub struct StateTrie<S = MemNodeStore> {
    store: S,
    config: TrieConfig,
    pool: Arc<WorkerPool>,
    root: B256,
}

impl<S> std::fmt::Debug for StateTrie<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StateTrie")
            .field("root", &self.root)
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

/// How an account leaf changes.
enum AccountOp {
    Delete,
    /// New nonce, balance and code hash; the storage root is the new one if the block
    /// changed the storage trie, otherwise the stored leaf's (or empty for a new account).
    Set(HashedAccount, Option<B256>),
    /// Only the storage root changed.
    StorageRoot(B256),
}

struct KeyedAccountOp {
    address: B256,
    op: AccountOp,
}

impl KeyedAccountOp {
    fn decode_old(&self, old: &[u8]) -> Result<TrieAccount, TrieError> {
        TrieAccount::decode(&mut &old[..]).map_err(|source| TrieError::LeafDecode {
            address: self.address,
            source,
        })
    }
}

impl LeafOp for KeyedAccountOp {
    fn apply(&self, old: Option<&[u8]>, out: &mut Vec<u8>) -> Result<bool, TrieError> {
        let account = match &self.op {
            AccountOp::Delete => return Ok(false),
            AccountOp::Set(account, storage_root) => {
                let storage_root = match (storage_root, old) {
                    (Some(root), _) => *root,
                    (None, Some(old)) => self.decode_old(old)?.storage_root,
                    (None, None) => EMPTY_ROOT_HASH,
                };
                TrieAccount {
                    nonce: account.nonce,
                    balance: account.balance,
                    storage_root,
                    code_hash: account.code_hash,
                }
            }
            AccountOp::StorageRoot(root) => {
                let old = old.ok_or(TrieError::MissingAccount(self.address))?;
                let mut account = self.decode_old(old)?;
                account.storage_root = *root;
                account
            }
        };
        account.encode(out);
        Ok(true)
    }
}

struct SlotOp(U256);

impl LeafOp for SlotOp {
    fn apply(&self, _old: Option<&[u8]>, out: &mut Vec<u8>) -> Result<bool, TrieError> {
        if self.0.is_zero() {
            return Ok(false);
        }
        self.0.encode(out);
        Ok(true)
    }
}

/// Below this many items a sort stays on the calling thread.
const PARALLEL_SORT_MIN: usize = 16_384;

fn sort_by_key<T: Send>(items: &mut [(Nibbles, T)], parallel: bool) {
    if parallel && items.len() >= PARALLEL_SORT_MIN {
        items.par_sort_unstable_by(|a, b| a.0.cmp(&b.0));
    } else {
        items.sort_unstable_by_key(|item| item.0);
    }
}

/// The account trie's updates for `diff`'s accounts, sorted by key, each with the storage root
/// it had (`None`: the stored leaf's, or empty for a new account) until [`with_storage_roots`]
/// sets the new ones.
fn account_ops(diff: &HashedStateChanges, parallel: bool) -> Vec<(Nibbles, KeyedAccountOp)> {
    let mut accounts: Vec<(Nibbles, KeyedAccountOp)> = diff
        .accounts
        .iter()
        .map(|(address, account)| {
            let op = match account {
                None => AccountOp::Delete,
                Some(account) => AccountOp::Set(*account, None),
            };
            let op = KeyedAccountOp {
                address: *address,
                op,
            };
            (Nibbles::unpack(address), op)
        })
        .collect();
    sort_by_key(&mut accounts, parallel);
    accounts
}

/// `accounts` (sorted by key) with the changed storage roots set: on the account's update if
/// it has one, otherwise as an update of the storage root alone, merged in in key order.
fn with_storage_roots(
    mut accounts: Vec<(Nibbles, KeyedAccountOp)>,
    storage_roots: &B256Map<B256>,
) -> Vec<(Nibbles, KeyedAccountOp)> {
    let mut root_only: Vec<(Nibbles, KeyedAccountOp)> = Vec::new();
    for (address, root) in storage_roots {
        let key = Nibbles::unpack(address);
        match accounts.binary_search_by(|(k, _)| k.cmp(&key)) {
            Ok(i) => {
                // A deleted account keeps its `Delete`: its storage trie goes with it (and is
                // not a storage job, so it has no new root).
                if let AccountOp::Set(_, storage_root) = &mut accounts[i].1.op {
                    *storage_root = Some(*root);
                }
            }
            Err(_) => root_only.push((
                key,
                KeyedAccountOp {
                    address: *address,
                    op: AccountOp::StorageRoot(*root),
                },
            )),
        }
    }
    if root_only.is_empty() {
        return accounts;
    }
    root_only.sort_unstable_by_key(|(key, _)| *key);
    // Two sorted lists with distinct keys (a root-only update is of an address without an
    // account update): one merge pass, not a sort of the whole.
    let mut merged = Vec::with_capacity(accounts.len() + root_only.len());
    let mut rest = root_only.into_iter().peekable();
    for item in accounts {
        while let Some(next) = rest.next_if(|(key, _)| *key < item.0) {
            merged.push(next);
        }
        merged.push(item);
    }
    merged.extend(rest);
    merged
}

/// The root of the account trie `store` holds.
fn stored_root<S: NodeStore>(store: &S) -> Result<B256, TrieError> {
    Ok(root_of_node(
        store
            .get(TrieId::Account, &Nibbles::new())
            .map_err(TrieError::store)?
            .as_deref(),
    ))
}

struct StorageResult {
    address: B256,
    wiped: bool,
    root: RootChange,
    out: WorkerOutput,
}

impl<S: NodeStore> StateTrie<S> {
    /// Opens the trie held by `store` with a new pool of `config.threads` workers.
    pub fn new(store: S, config: TrieConfig) -> Result<Self, TrieError> {
        let pinning = if config.pin_workers {
            Pinning::Cores
        } else {
            Pinning::Off
        };
        let pool = worker_pool("overdrive-trie", config.threads, pinning)?;
        Self::with_pool(store, config, Arc::new(pool))
    }

    /// Opens the trie held by `store` on an existing pool (shared with other tries).
    pub fn with_pool(
        store: S,
        config: TrieConfig,
        pool: Arc<WorkerPool>,
    ) -> Result<Self, TrieError> {
        if config.parallel_threshold < 2 {
            return Err(TrieError::InvalidConfig(format!(
                "parallel_threshold must be at least 2, got {}",
                config.parallel_threshold
            )));
        }
        let root = stored_root(&store)?;
        Ok(Self {
            store,
            config,
            pool,
            root,
        })
    }

    /// Runs `f` on the trie's pool, where the trie's own parallel work runs.
    pub(crate) fn install<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        self.pool.install(f)
    }

    /// The current state root.
    pub fn root(&self) -> B256 {
        self.root
    }

    /// The configuration.
    pub fn config(&self) -> TrieConfig {
        self.config
    }

    /// The node store.
    pub fn store(&self) -> &S {
        &self.store
    }

    /// The node store, to be changed only in ways that keep the nodes it gives for the
    /// trie's state (a [`crate::BoundedNodeStore`]'s source and eviction): the trie keeps its
    /// root apart.
    pub fn store_mut(&mut self) -> &mut S {
        &mut self.store
    }

    /// Moves the trie onto `store` (the root is read from it) and gives back the store it
    /// had, keeping the pool: two tries with different pools can take turns on one store
    /// without either keeping a copy of the nodes. On an error the trie keeps its store and
    /// `store` is dropped.
    pub fn replace_store(&mut self, store: S) -> Result<S, TrieError> {
        self.root = stored_root(&store)?;
        Ok(std::mem::replace(&mut self.store, store))
    }

    /// Gives the node store back.
    pub fn into_store(self) -> S {
        self.store
    }

    /// Applies a diff: computes the new root, writes the node changes to the store, and
    /// returns both. On error nothing is written.
    pub fn apply(&mut self, diff: &HashedStateChanges) -> Result<StateRootOutput, TrieError> {
        let output = self.compute(diff)?;
        self.commit(&output)?;
        Ok(output)
    }

    /// Writes the node changes of an output of [`StateTrie::compute`] made against the
    /// current state, and moves the root.
    pub fn commit(&mut self, output: &StateRootOutput) -> Result<(), TrieError> {
        let store = &mut self.store;
        self.pool
            .install(|| store.apply(&output.updates))
            .map_err(TrieError::store)?;
        self.root = output.root;
        Ok(())
    }

    /// [`StateTrie::commit`] through [`NodeStore::apply_replacing`]: what the batch replaced,
    /// or `None` when the store cannot take it out (then nothing changed).
    pub(crate) fn commit_replacing(
        &mut self,
        output: &StateRootOutput,
    ) -> Result<Option<crate::store::Replaced>, TrieError> {
        let store = &mut self.store;
        let replaced = self
            .pool
            .install(|| store.apply_replacing(&output.updates))
            .map_err(TrieError::store)?;
        if replaced.is_some() {
            self.root = output.root;
        }
        Ok(replaced)
    }

    /// Computes the root and node changes of `diff` without writing them.
    pub fn compute(&self, diff: &HashedStateChanges) -> Result<StateRootOutput, TrieError> {
        let started = Instant::now();
        let output = self.compute_on_pool(diff)?;
        crate::metrics::record_root(&output.stats, started.elapsed(), self.config.threads);
        Ok(output)
    }

    fn compute_on_pool(&self, diff: &HashedStateChanges) -> Result<StateRootOutput, TrieError> {
        let parallel = self.config.threads > 1;
        self.pool.install(|| {
            let mut stats = TrieStats::default();
            let mut updates = StateTrieUpdates::default();

            // Storage tries first, largest first so the big ones start before the pool fills
            // with small ones; the account leaves need their new roots. The account updates
            // are built and sorted beside them (only their storage roots depend on the storage
            // tries, and those are set afterwards): that work fills the other threads while the
            // storage phase prepares its keys on one, and leaves less to do between the phases.
            let (results, accounts) = if parallel {
                rayon::join(
                    || self.storage_tries(diff, parallel),
                    || account_ops(diff, parallel),
                )
            } else {
                (
                    self.storage_tries(diff, parallel),
                    account_ops(diff, parallel),
                )
            };
            let results = results?;

            let mut storage_roots: B256Map<B256> = B256Map::default();
            for result in results {
                stats.keccak_calls += result.out.keccak_calls;
                if let RootChange::Changed(root) = result.root {
                    storage_roots.insert(result.address, root);
                }
                if result.wiped || !result.out.nodes.is_empty() {
                    updates.storage_tries.insert(
                        result.address,
                        StorageNodeUpdates {
                            wiped: result.wiped,
                            nodes: result.out.nodes,
                        },
                    );
                }
            }
            for (address, account) in &diff.accounts {
                if account.is_none()
                    && self
                        .store
                        .get(TrieId::Storage(*address), &Nibbles::new())
                        .map_err(TrieError::store)?
                        .is_some()
                {
                    updates.storage_tries.insert(
                        *address,
                        StorageNodeUpdates {
                            wiped: true,
                            ..Default::default()
                        },
                    );
                }
            }

            let accounts = with_storage_roots(accounts, &storage_roots);
            let ctx = UpdateSource {
                store: &self.store,
                trie: TrieId::Account,
                split_at: self.split_at(accounts.len()),
                defer: self.config.batch_hashing,
            };
            let mut out = WorkerOutput::new(ctx.defer);
            let root = match update_trie(&ctx, &accounts, false, &mut out)? {
                RootChange::Unchanged => self.root,
                RootChange::Changed(root) => root,
            };
            stats.keccak_calls += out.keccak_calls;
            updates.account_nodes = out.nodes;

            stats.dirty_nodes = updates.writes() as u64;
            stats.deleted_nodes = updates.deletes() as u64;
            stats.storage_tries = updates.storage_tries.len() as u64;
            stats.account_updates = accounts.len() as u64;
            stats.slot_updates = diff.storages.values().map(|s| s.slots.len() as u64).sum();
            Ok(StateRootOutput {
                root,
                updates,
                stats,
            })
        })
    }

    /// The number of pending updates from which a subtree of a trie with `updates` updates
    /// hands its children to the pool: the configured threshold, or a share of the trie if
    /// larger, so that a trie is cut into at most about [`TASKS_PER_THREAD`] tasks per worker
    /// and no finer.
    fn split_at(&self, updates: usize) -> usize {
        if self.config.threads <= 1 {
            return usize::MAX;
        }
        let share = updates / (self.config.threads * TASKS_PER_THREAD);
        self.config.parallel_threshold.max(share)
    }

    /// The new roots and node changes of the storage tries `diff` changes, largest first
    /// (those of deleted accounts excepted: the account trie drops them whole).
    fn storage_tries(
        &self,
        diff: &HashedStateChanges,
        parallel: bool,
    ) -> Result<Vec<StorageResult>, TrieError> {
        let mut jobs: Vec<(&B256, &HashedStorageChanges)> = diff
            .storages
            .iter()
            .filter(|(address, storage)| {
                !matches!(diff.accounts.get(*address), Some(None))
                    && (storage.wiped || !storage.slots.is_empty())
            })
            .collect();
        jobs.sort_unstable_by_key(|(address, storage)| (Reverse(storage.slots.len()), **address));
        let run =
            |(address, storage): &(&B256, &HashedStorageChanges)| -> Result<StorageResult, TrieError> {
                let mut slots: Vec<(Nibbles, SlotOp)> = storage
                    .slots
                    .iter()
                    .map(|(slot, value)| (Nibbles::unpack(slot), SlotOp(*value)))
                    .collect();
                sort_by_key(&mut slots, parallel);
                let ctx = UpdateSource {
                    store: &self.store,
                    trie: TrieId::Storage(**address),
                    split_at: self.split_at(slots.len()),
                    defer: self.config.batch_hashing,
                };
                let mut out = WorkerOutput::new(ctx.defer);
                let root = update_trie(&ctx, &slots, storage.wiped, &mut out)?;
                Ok(StorageResult {
                    address: **address,
                    wiped: storage.wiped,
                    root,
                    out,
                })
            };
        if parallel {
            jobs.par_iter().with_max_len(1).map(run).collect()
        } else {
            jobs.iter().map(run).collect()
        }
    }

    /// The stored account under a hashed address.
    pub fn account(&self, hashed_address: B256) -> Result<Option<TrieAccount>, TrieError> {
        let Some(value) = self.leaf(TrieId::Account, hashed_address)? else {
            return Ok(None);
        };
        TrieAccount::decode(&mut &value[..])
            .map(Some)
            .map_err(|source| TrieError::LeafDecode {
                address: hashed_address,
                source,
            })
    }

    /// The value stored under a hashed key of one trie, read through the store.
    fn leaf(&self, trie: TrieId, hashed_key: B256) -> Result<Option<Value>, TrieError> {
        let ctx = UpdateSource {
            store: &self.store,
            trie,
            split_at: usize::MAX,
            defer: false,
        };
        get_value(&ctx, &Nibbles::unpack(hashed_key))
    }

    /// The storage root of the account under a hashed address (empty for none).
    pub fn storage_root(&self, hashed_address: B256) -> Result<B256, TrieError> {
        Ok(self
            .account(hashed_address)?
            .map_or(EMPTY_ROOT_HASH, |a| a.storage_root))
    }

    /// The stored value of a hashed slot of a hashed address (`None` when zero).
    pub fn storage(
        &self,
        hashed_address: B256,
        hashed_slot: B256,
    ) -> Result<Option<U256>, TrieError> {
        let Some(value) = self.leaf(TrieId::Storage(hashed_address), hashed_slot)? else {
            return Ok(None);
        };
        U256::decode(&mut &value[..])
            .map(Some)
            .map_err(|source| TrieError::LeafDecode {
                address: hashed_address,
                source,
            })
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::{raw::tests::assert_branches_match_hash_builder, reference, store::NodeUpdates};
    use alloy_primitives::{Address, keccak256, map::HashMap};
    use overdrive_primitives::{MemAccount, MemState};
    use proptest::prelude::*;
    use revm::{
        database::{AccountStatus, BundleState},
        primitives::KECCAK_EMPTY,
        state::AccountInfo,
    };
    use std::collections::{BTreeMap, BTreeSet};

    #[derive(Clone, Debug)]
    pub(crate) enum Op {
        SetAccount {
            addr: u8,
            nonce: u8,
            balance: u16,
            code: bool,
        },
        DeleteAccount {
            addr: u8,
        },
        SetSlot {
            addr: u8,
            slot: u8,
            value: u16,
        },
        /// Self-destruct: the account goes, with its storage.
        Destroy {
            addr: u8,
        },
        /// Self-destruct then re-create in the same block with new storage.
        Recreate {
            addr: u8,
            slots: Vec<(u8, u16)>,
        },
    }

    pub(crate) fn op(addrs: u8, slots: u8) -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => (0..addrs, any::<u8>(), any::<u16>(), any::<bool>())
                .prop_map(|(addr, nonce, balance, code)| Op::SetAccount { addr, nonce, balance, code }),
            1 => (0..addrs).prop_map(|addr| Op::DeleteAccount { addr }),
            8 => (0..addrs, 0..slots, prop_oneof![1 => Just(0u16), 3 => 1..u16::MAX])
                .prop_map(|(addr, slot, value)| Op::SetSlot { addr, slot, value }),
            1 => (0..addrs).prop_map(|addr| Op::Destroy { addr }),
            1 => (0..addrs, prop::collection::vec((0..slots, 1..u16::MAX), 0..6))
                .prop_map(|(addr, slots)| Op::Recreate { addr, slots }),
        ]
    }

    fn address(i: u8) -> Address {
        Address::with_last_byte(i)
    }

    fn info(nonce: u64, balance: u64, code: bool) -> AccountInfo {
        let code_hash = if code {
            keccak256([1, 2, 3])
        } else {
            KECCAK_EMPTY
        };
        AccountInfo {
            nonce,
            balance: U256::from(balance),
            code_hash,
            code: None,
            account_id: None,
        }
    }

    /// Applies one block's ops to the model and returns the block's diff, built the way an
    /// executor's bundle reports it: final values of touched keys, `wiped` when the account
    /// was destroyed during the block. An existing account whose slots alone changed is left
    /// out of the accounts (a storage-only change: only its storage root moves).
    pub(crate) fn apply_block(model: &mut MemState, ops: &[Op]) -> HashedStateChanges {
        let mut touched: BTreeMap<Address, (bool, BTreeSet<U256>)> = BTreeMap::new();
        // Accounts whose nonce, balance, code or existence an op changed.
        let mut account_changed: BTreeSet<Address> = BTreeSet::new();
        for op in ops {
            match op {
                Op::SetAccount {
                    addr,
                    nonce,
                    balance,
                    code,
                } => {
                    let a = model.accounts.entry(address(*addr)).or_default();
                    a.info = info(u64::from(*nonce), u64::from(*balance), *code);
                    touched.entry(address(*addr)).or_default();
                    account_changed.insert(address(*addr));
                }
                Op::DeleteAccount { addr } | Op::Destroy { addr } => {
                    model.accounts.remove(&address(*addr));
                    touched.entry(address(*addr)).or_default().0 = true;
                    account_changed.insert(address(*addr));
                }
                Op::SetSlot { addr, slot, value } => {
                    let a = model.accounts.entry(address(*addr)).or_insert_with(|| {
                        account_changed.insert(address(*addr));
                        MemAccount {
                            info: info(1, 0, true),
                            storage: HashMap::default(),
                        }
                    });
                    let slot = U256::from(*slot);
                    if *value == 0 {
                        a.storage.remove(&slot);
                    } else {
                        a.storage.insert(slot, U256::from(*value));
                    }
                    touched.entry(address(*addr)).or_default().1.insert(slot);
                }
                Op::Recreate { addr, slots } => {
                    let entry = touched.entry(address(*addr)).or_default();
                    entry.0 = true;
                    account_changed.insert(address(*addr));
                    let a = model.accounts.entry(address(*addr)).or_default();
                    a.info = info(1, 7, true);
                    a.storage.clear();
                    for (slot, value) in slots {
                        a.storage.insert(U256::from(*slot), U256::from(*value));
                        entry.1.insert(U256::from(*slot));
                    }
                }
            }
        }
        let mut diff = HashedStateChanges::default();
        for (addr, (wiped, slots)) in touched {
            let hashed = keccak256(addr);
            let Some(account) = model.accounts.get(&addr) else {
                diff.accounts.insert(hashed, None);
                continue;
            };
            if account_changed.contains(&addr) {
                diff.accounts
                    .insert(hashed, Some(HashedAccount::from(&account.info)));
            }
            if wiped || !slots.is_empty() {
                let slots = slots
                    .iter()
                    .map(|s| {
                        (
                            keccak256(s.to_be_bytes::<32>()),
                            account.storage.get(s).copied().unwrap_or_default(),
                        )
                    })
                    .collect();
                diff.storages
                    .insert(hashed, HashedStorageChanges { wiped, slots });
            }
        }
        diff
    }

    /// A store with only the required methods, as a database store might start: the trie
    /// must work through the trait's default `get_children`. It keeps nodes as the bytes a
    /// database would (`StoredNode::to_bytes`) and replays each block's updates strictly: a
    /// delete of a node that is not there is an error, so the updates alone must carry a store
    /// from block to block.
    #[derive(Clone, Default)]
    struct MinimalStore(BTreeMap<(TrieId, Nibbles), Vec<u8>>);

    #[derive(Debug, thiserror::Error)]
    #[error("replay: {0}")]
    struct ReplayError(String);

    impl MinimalStore {
        fn nodes(&self, trie: TrieId) -> BTreeMap<Nibbles, crate::StoredNode> {
            self.0
                .iter()
                .filter(|((t, _), _)| *t == trie)
                .map(|((_, path), bytes)| (*path, crate::StoredNode::from_bytes(bytes).unwrap()))
                .collect()
        }

        fn tries(&self) -> BTreeSet<TrieId> {
            self.0.keys().map(|(trie, _)| *trie).collect()
        }

        fn replay(&mut self, trie: TrieId, nodes: &NodeUpdates) -> Result<(), ReplayError> {
            for path in nodes.deletes() {
                if self.0.remove(&(trie, *path)).is_none() {
                    return Err(ReplayError(format!(
                        "delete of absent {path:?} in {trie:?}"
                    )));
                }
            }
            for (path, node) in nodes.writes() {
                self.0.insert((trie, *path), node.to_bytes());
            }
            Ok(())
        }
    }

    impl NodeStore for MinimalStore {
        type Error = ReplayError;

        fn get(
            &self,
            trie: TrieId,
            path: &Nibbles,
        ) -> Result<Option<std::borrow::Cow<'_, crate::StoredNode>>, Self::Error> {
            self.0
                .get(&(trie, *path))
                .map(|bytes| {
                    crate::StoredNode::from_bytes(bytes)
                        .map(std::borrow::Cow::Owned)
                        .map_err(|e| ReplayError(e.to_string()))
                })
                .transpose()
        }

        fn apply(&mut self, updates: &StateTrieUpdates) -> Result<(), Self::Error> {
            self.replay(TrieId::Account, &updates.account_nodes)?;
            for (owner, storage) in &updates.storage_tries {
                let trie = TrieId::Storage(*owner);
                if storage.wiped {
                    self.0.retain(|(t, _), _| *t != trie);
                }
                self.replay(trie, &storage.nodes)?;
            }
            Ok(())
        }
    }

    /// A trie over a fresh store; batched hashing where the machine supports it.
    pub(crate) fn trie(threads: usize, threshold: usize) -> StateTrie {
        trie_hashing(threads, threshold, crate::keccak::batched())
    }

    fn trie_hashing(threads: usize, threshold: usize, batch_hashing: bool) -> StateTrie {
        StateTrie::new(
            MemNodeStore::new(),
            TrieConfig {
                threads,
                parallel_threshold: threshold,
                batch_hashing,
                ..TrieConfig::default()
            },
        )
        .unwrap()
    }

    fn assert_disjoint(nodes: &NodeUpdates) {
        let written: BTreeSet<Nibbles> = nodes.writes().map(|(p, _)| *p).collect();
        assert_eq!(written.len(), nodes.write_count(), "a path written twice");
        assert!(
            nodes.deletes().iter().all(|p| !written.contains(p)),
            "a path both written and deleted"
        );
    }

    fn check_output(output: &StateRootOutput) {
        assert!(
            output.stats.keccak_calls <= output.stats.dirty_nodes,
            "{:?}",
            output.stats
        );
        assert_disjoint(&output.updates.account_nodes);
        for storage in output.updates.storage_tries.values() {
            assert_disjoint(&storage.nodes);
        }
    }

    /// The stored nodes equal those of a fresh build of `model`, and every branch equals what
    /// alloy-trie's HashBuilder builds from the leaves.
    fn assert_nodes_match_fresh_build(trie: &StateTrie, model: &MemState) {
        let mut fresh = super::tests::trie(1, 64);
        fresh.apply(&HashedStateChanges::from_state(model)).unwrap();
        assert_eq!(fresh.root(), trie.root());
        let (ours, theirs) = (trie.store(), fresh.store());
        assert_eq!(
            ours.nodes(TrieId::Account),
            theirs.nodes(TrieId::Account),
            "account trie nodes"
        );
        assert_eq!(
            ours.storage_owners(),
            theirs.storage_owners(),
            "storage tries"
        );
        for owner in ours.storage_owners() {
            assert_eq!(
                ours.nodes(TrieId::Storage(owner)),
                theirs.nodes(TrieId::Storage(owner)),
                "storage {owner}"
            );
        }

        let mut account_leaves = BTreeMap::new();
        for (addr, account) in &model.accounts {
            let hashed = keccak256(addr);
            let slots: BTreeMap<Nibbles, Vec<u8>> = account
                .storage
                .iter()
                .map(|(k, v)| {
                    (
                        Nibbles::unpack(keccak256(k.to_be_bytes::<32>())),
                        alloy_rlp::encode(v),
                    )
                })
                .collect();
            let storage_root = reference::storage_root(&account.storage);
            assert_branches_match_hash_builder(
                &ours.nodes(TrieId::Storage(hashed)),
                &slots,
                storage_root,
            );
            let info = &account.info;
            let leaf = TrieAccount {
                nonce: info.nonce,
                balance: info.balance,
                storage_root,
                code_hash: info.code_hash,
            };
            account_leaves.insert(Nibbles::unpack(hashed), alloy_rlp::encode(leaf));
        }
        assert_branches_match_hash_builder(
            &ours.nodes(TrieId::Account),
            &account_leaves,
            trie.root(),
        );
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: crate::proptest_cases(48), ..ProptestConfig::default() })]

        /// Multi-block sequences of inserts, updates, deletes, self-destructs and re-creates:
        /// every block's root equals the HashBuilder root of the model state; after the last
        /// block the stored nodes equal a fresh build's; one thread and many threads (split
        /// at every level) write the same nodes, whether they hash node by node or in batches.
        #[test]
        fn blocks_match_reference(blocks in prop::collection::vec(prop::collection::vec(op(24, 40), 1..30), 1..6)) {
            let mut model = MemState::default();
            let mut serial = trie_hashing(1, 64, false);
            let mut serial_batched = trie_hashing(1, 64, true);
            let mut parallel = trie_hashing(4, 2, true);
            let mut minimal = StateTrie::new(
                MinimalStore::default(),
                TrieConfig { threads: 2, parallel_threshold: 2, batch_hashing: false, pin_workers: false },
            )
            .unwrap();
            let mut diffs = Vec::with_capacity(blocks.len());
            for ops in &blocks {
                let diff = apply_block(&mut model, ops);
                diffs.push(diff.clone());
                let a = serial.apply(&diff).unwrap();
                let b = parallel.apply(&diff).unwrap();
                let c = minimal.apply(&diff).unwrap();
                let d = serial_batched.apply(&diff).unwrap();
                check_output(&a);
                check_output(&b);
                check_output(&d);
                let expected = reference::state_root(&model);
                prop_assert_eq!(a.root, expected);
                prop_assert_eq!(b.root, expected);
                prop_assert_eq!(c.root, expected);
                prop_assert_eq!(d.root, expected);
                for other in [&b, &c, &d] {
                    prop_assert_eq!(a.stats.dirty_nodes, other.stats.dirty_nodes);
                    prop_assert_eq!(a.stats.keccak_calls, other.stats.keccak_calls);
                }
            }
            // The first block applied alone, then the rest folded into one diff (`extend`,
            // starting from the second block's own diff rather than an empty one): the same
            // root as applying every block in turn.
            if let [first, second, rest @ ..] = diffs.as_slice() {
                let mut folded = second.clone();
                for diff in rest {
                    folded.extend(diff.clone());
                }
                let mut split = trie_hashing(2, 2, true);
                split.apply(first).unwrap();
                prop_assert_eq!(split.apply(&folded).unwrap().root, reference::state_root(&model));
            }
            prop_assert_eq!(minimal.store().nodes(TrieId::Account), serial.store().nodes(TrieId::Account));
            let storage_tries: BTreeSet<TrieId> = serial.store().storage_owners().into_iter().map(TrieId::Storage).collect();
            let mut minimal_tries = minimal.store().tries();
            minimal_tries.remove(&TrieId::Account);
            prop_assert_eq!(&minimal_tries, &storage_tries);
            for owner in serial.store().storage_owners() {
                let id = TrieId::Storage(owner);
                prop_assert_eq!(serial_batched.store().nodes(id), serial.store().nodes(id));
                prop_assert_eq!(parallel.store().nodes(id), serial.store().nodes(id));
                prop_assert_eq!(minimal.store().nodes(id), serial.store().nodes(id));
            }
            prop_assert_eq!(serial_batched.store().nodes(TrieId::Account), serial.store().nodes(TrieId::Account));
            prop_assert_eq!(parallel.store().nodes(TrieId::Account), serial.store().nodes(TrieId::Account));
            assert_nodes_match_fresh_build(&serial, &model);
            assert_nodes_match_fresh_build(&parallel, &model);
            for (addr, account) in &model.accounts {
                let stored = serial.account(keccak256(addr)).unwrap().unwrap();
                prop_assert_eq!(stored.nonce, account.info.nonce);
                for (slot, value) in &account.storage {
                    let got = parallel.storage(keccak256(addr), keccak256(slot.to_be_bytes::<32>())).unwrap();
                    prop_assert_eq!(got, Some(*value));
                }
            }
        }
    }

    #[test]
    fn storage_roots_join_the_sorted_account_updates() {
        let account = HashedAccount {
            nonce: 1,
            balance: U256::from(7),
            code_hash: KECCAK_EMPTY,
        };
        let address = |i: u8| B256::repeat_byte(i);
        let mut diff = HashedStateChanges::default();
        diff.accounts.insert(address(0x20), Some(account));
        diff.accounts.insert(address(0x40), None);
        diff.accounts.insert(address(0x60), Some(account));
        let accounts = account_ops(&diff, false);
        let roots: B256Map<B256> = [0x10, 0x40, 0x50, 0x60, 0x70]
            .into_iter()
            .map(|i| (address(i), B256::repeat_byte(i + 1)))
            .collect();
        let merged = with_storage_roots(accounts, &roots);
        let keys: Vec<B256> = merged.iter().map(|(_, op)| op.address).collect();
        assert_eq!(
            keys,
            [0x10, 0x20, 0x40, 0x50, 0x60, 0x70].map(address).to_vec()
        );
        assert!(merged.windows(2).all(|w| w[0].0 < w[1].0));
        for (key, op) in &merged {
            assert_eq!(*key, Nibbles::unpack(op.address));
            let byte = op.address.0[0];
            match (&op.op, byte) {
                (AccountOp::StorageRoot(root), 0x10 | 0x50 | 0x70) => {
                    assert_eq!(*root, B256::repeat_byte(byte + 1));
                }
                (AccountOp::Set(_, None), 0x20) | (AccountOp::Delete, 0x40) => {}
                (AccountOp::Set(_, Some(root)), 0x60) => assert_eq!(*root, B256::repeat_byte(0x61)),
                _ => panic!("unexpected update at {byte:#x}"),
            }
        }
    }

    #[test]
    fn empty_trie_and_noop_diffs() {
        let mut t = trie(2, 2);
        assert_eq!(t.root(), EMPTY_ROOT_HASH);
        let out = t.apply(&HashedStateChanges::default()).unwrap();
        assert_eq!(out.root, EMPTY_ROOT_HASH);
        assert!(out.updates.is_empty());

        let mut model = MemState::default();
        let diff = apply_block(
            &mut model,
            &[
                Op::SetSlot {
                    addr: 1,
                    slot: 1,
                    value: 5,
                },
                Op::SetAccount {
                    addr: 2,
                    nonce: 1,
                    balance: 1,
                    code: false,
                },
            ],
        );
        t.apply(&diff).unwrap();
        // Re-applying the same values changes nothing and hashes nothing.
        let again = t.apply(&diff).unwrap();
        assert_eq!(again.root, reference::state_root(&model));
        assert_eq!(again.stats.dirty_nodes, 0);
        assert_eq!(again.stats.keccak_calls, 0);
        // Deleting everything gives the empty root and an empty store.
        let diff = apply_block(
            &mut model,
            &[Op::DeleteAccount { addr: 1 }, Op::DeleteAccount { addr: 2 }],
        );
        let out = t.apply(&diff).unwrap();
        assert_eq!(out.root, EMPTY_ROOT_HASH);
        assert!(t.store().is_empty(), "{} nodes left", t.store().len());
    }

    #[test]
    fn storage_change_of_missing_account_is_an_error_and_writes_nothing() {
        let mut model = MemState::default();
        let mut t = trie(2, 2);
        t.apply(&apply_block(
            &mut model,
            &[Op::SetAccount {
                addr: 1,
                nonce: 1,
                balance: 1,
                code: false,
            }],
        ))
        .unwrap();
        let before = t.root();
        let ghost = keccak256(address(9));
        let mut diff = HashedStateChanges::default();
        diff.storages.insert(
            ghost,
            HashedStorageChanges {
                wiped: false,
                slots: B256Map::from_iter([(B256::ZERO, U256::from(1))]),
            },
        );
        assert!(matches!(t.apply(&diff), Err(TrieError::MissingAccount(a)) if a == ghost));
        assert_eq!(t.root(), before);
        assert!(t.store().storage_owners().is_empty());
    }

    /// The bug a peer shipped: self-destruct then re-create of a contract in one block must
    /// keep only the new storage. Driven through a revm bundle, as an executor reports it.
    #[test]
    fn destroy_and_recreate_in_one_block_via_bundle() {
        let contract = address(1);
        let mut model = MemState::default();
        let old_storage: HashMap<U256, U256> =
            (1..20u64).map(|i| (U256::from(i), U256::from(i))).collect();
        model.accounts.insert(
            contract,
            MemAccount {
                info: info(1, 10, true),
                storage: old_storage.clone(),
            },
        );
        model.accounts.insert(
            address(2),
            MemAccount {
                info: info(3, 30, false),
                storage: HashMap::default(),
            },
        );
        let mut t = trie(2, 2);
        t.apply(&HashedStateChanges::from_state(&model)).unwrap();
        assert_eq!(t.root(), reference::state_root(&model));

        let new_slot = |k: u64, v: u64| (U256::from(k), (U256::ZERO, U256::from(v)));
        let mut bundle = BundleState::new(
            [
                (
                    contract,
                    Some(info(1, 10, true)),
                    Some(info(1, 99, true)),
                    HashMap::from_iter([new_slot(3, 33), new_slot(50, 5)]),
                ),
                (
                    address(2),
                    Some(info(3, 30, false)),
                    None,
                    HashMap::default(),
                ),
            ],
            Vec::<Vec<(Address, Option<Option<AccountInfo>>, Vec<(U256, U256)>)>>::new(),
            [],
        );
        bundle.state.get_mut(&contract).unwrap().status = AccountStatus::DestroyedChanged;
        model.apply_bundle(&bundle);
        assert_eq!(model.accounts[&contract].storage.len(), 2);

        let out = t.apply(&HashedStateChanges::from_bundle(&bundle)).unwrap();
        assert_eq!(out.root, reference::state_root(&model));
        assert!(out.updates.storage_tries[&keccak256(contract)].wiped);
        assert_nodes_match_fresh_build(&t, &model);

        // Without the wipe the old slots would survive and the root would differ.
        let mut kept = model.clone();
        kept.accounts
            .get_mut(&contract)
            .unwrap()
            .storage
            .extend(old_storage.into_iter().filter(|(k, _)| *k != U256::from(3)));
        assert_ne!(reference::state_root(&kept), out.root);
    }

    /// Two blocks' diffs folded with `HashedStateChanges::extend` give the root of applying them
    /// in order, when the first deletes an account with storage and the second re-creates it:
    /// the re-created account starts with empty storage (`from_bundle` records the deletion as
    /// `None` alone, with no wipe, so the fold must add it).
    #[test]
    fn folded_delete_then_recreate_drops_old_storage() {
        let contract = address(1);
        let mut model = MemState::default();
        model.accounts.insert(
            contract,
            MemAccount {
                info: info(1, 10, true),
                storage: (1..20u64).map(|i| (U256::from(i), U256::from(i))).collect(),
            },
        );
        let mut t = trie(2, 2);
        t.apply(&HashedStateChanges::from_state(&model)).unwrap();

        let deleted = BundleState::new(
            [(contract, Some(info(1, 10, true)), None, HashMap::default())],
            Vec::<Vec<(Address, Option<Option<AccountInfo>>, Vec<(U256, U256)>)>>::new(),
            [],
        );
        model.apply_bundle(&deleted);
        let recreated = BundleState::new(
            [(
                contract,
                None,
                Some(info(1, 5, true)),
                HashMap::from_iter([(U256::from(50), (U256::ZERO, U256::from(5)))]),
            )],
            Vec::<Vec<(Address, Option<Option<AccountInfo>>, Vec<(U256, U256)>)>>::new(),
            [],
        );
        model.apply_bundle(&recreated);
        assert_eq!(model.accounts[&contract].storage.len(), 1);

        let mut folded = HashedStateChanges::from_bundle(&deleted);
        folded.extend(HashedStateChanges::from_bundle(&recreated));
        let mut in_order = t.clone();
        in_order
            .apply(&HashedStateChanges::from_bundle(&deleted))
            .unwrap();
        let expected = reference::state_root(&model);
        assert_eq!(
            in_order
                .apply(&HashedStateChanges::from_bundle(&recreated))
                .unwrap()
                .root,
            expected
        );
        assert_eq!(t.apply(&folded).unwrap().root, expected);
        assert_nodes_match_fresh_build(&t, &model);
    }

    #[test]
    fn clones_fork_independently() {
        let mut model = MemState::default();
        let ops: Vec<Op> = (0..40)
            .map(|i| Op::SetSlot {
                addr: i % 5,
                slot: i,
                value: u16::from(i) + 1,
            })
            .collect();
        let mut base = trie(2, 4);
        base.apply(&apply_block(&mut model, &ops)).unwrap();

        let (mut left_model, mut right_model) = (model.clone(), model.clone());
        let mut left = base.clone();
        let mut right = base.clone();
        left.apply(&apply_block(
            &mut left_model,
            &[
                Op::Destroy { addr: 1 },
                Op::SetSlot {
                    addr: 2,
                    slot: 3,
                    value: 0,
                },
            ],
        ))
        .unwrap();
        right
            .apply(&apply_block(
                &mut right_model,
                &[Op::Recreate {
                    addr: 1,
                    slots: vec![(9, 9)],
                }],
            ))
            .unwrap();
        assert_eq!(left.root(), reference::state_root(&left_model));
        assert_eq!(right.root(), reference::state_root(&right_model));
        assert_eq!(base.root(), reference::state_root(&model));
        assert_nodes_match_fresh_build(&base, &model);
        assert_nodes_match_fresh_build(&left, &left_model);
        assert_nodes_match_fresh_build(&right, &right_model);
    }

    #[test]
    fn tries_take_turns_on_one_store() {
        let mut model = MemState::default();
        let block = |model: &mut MemState, round: u8| {
            let ops: Vec<Op> = (0..30)
                .map(|i| Op::SetSlot {
                    addr: i % 4,
                    slot: i.wrapping_mul(round),
                    value: u16::from(i) + u16::from(round),
                })
                .collect();
            apply_block(model, &ops)
        };
        let mut one = trie(1, 4);
        let mut two = trie(2, 4);
        one.apply(&block(&mut model, 1)).unwrap();
        let first = one.root();

        // `two` takes the store `one` built and finds its root there; `one` is left with the
        // empty store it was handed.
        let store = one.replace_store(MemNodeStore::new()).unwrap();
        assert_eq!(one.root(), EMPTY_ROOT_HASH);
        two.replace_store(store).unwrap();
        assert_eq!(two.root(), first);
        two.apply(&block(&mut model, 2)).unwrap();
        assert_eq!(two.root(), reference::state_root(&model));

        let store = two.replace_store(MemNodeStore::new()).unwrap();
        one.replace_store(store).unwrap();
        one.apply(&block(&mut model, 3)).unwrap();
        assert_eq!(one.root(), reference::state_root(&model));
        assert_nodes_match_fresh_build(&one, &model);
    }

    /// A few thousand accounts and one large contract over several blocks, on eight threads
    /// with a low split threshold, so that the recursive parallel split cuts every trie two
    /// levels deep (the split follows the threads: see `StateTrie::split_at`).
    #[test]
    fn larger_state_over_blocks() {
        use rand::{Rng, SeedableRng, rngs::SmallRng};
        let mut rng = SmallRng::seed_from_u64(7);
        let mut model = big_state(3_000, 2_000);
        let config = TrieConfig {
            threads: 8,
            parallel_threshold: 16,
            ..TrieConfig::default()
        };
        let mut t = StateTrie::new(MemNodeStore::new(), config).unwrap();
        t.apply(&HashedStateChanges::from_state(&model)).unwrap();
        assert_eq!(t.root(), reference::state_root(&model));
        let token = Address::from_word(B256::ZERO);
        for _ in 0..4 {
            let mut diff = HashedStateChanges::default();
            for _ in 0..400 {
                let i: u64 = rng.random_range(0..4000);
                let addr = Address::from_word(B256::from(U256::from(i)));
                if rng.random_bool(0.1) && i != 0 {
                    model.accounts.remove(&addr);
                    diff.accounts.insert(keccak256(addr), None);
                } else {
                    let a = model.accounts.entry(addr).or_default();
                    a.info = info(rng.random(), rng.random(), i == 0);
                    diff.accounts
                        .insert(keccak256(addr), Some(HashedAccount::from(&a.info)));
                }
            }
            let storage = diff.storages.entry(keccak256(token)).or_default();
            let contract = model.accounts.get_mut(&token).expect("token never deleted");
            for _ in 0..800 {
                let slot = U256::from(rng.random_range(0..2500u64));
                let value = if rng.random_bool(0.2) {
                    U256::ZERO
                } else {
                    U256::from(rng.random::<u32>())
                };
                if value.is_zero() {
                    contract.storage.remove(&slot);
                } else {
                    contract.storage.insert(slot, value);
                }
                storage
                    .slots
                    .insert(keccak256(slot.to_be_bytes::<32>()), value);
            }
            let out = t.apply(&diff).unwrap();
            check_output(&out);
            assert_eq!(out.root, reference::state_root(&model));
        }
        assert_nodes_match_fresh_build(&t, &model);
    }

    /// `threads` unpinned workers (tests run side by side) splitting from `threshold` updates.
    fn unpinned(threads: usize, threshold: usize) -> TrieConfig {
        TrieConfig {
            threads,
            parallel_threshold: threshold,
            pin_workers: false,
            ..TrieConfig::default()
        }
    }

    /// A state of `accounts` accounts, the first a contract with `slots` slots.
    fn big_state(accounts: u64, slots: u64) -> MemState {
        let mut model = MemState::default();
        for i in 0..accounts {
            let storage = if i == 0 {
                (0..slots)
                    .map(|s| (U256::from(s), U256::from(s + 1)))
                    .collect()
            } else {
                HashMap::default()
            };
            model.accounts.insert(
                Address::from_word(B256::from(U256::from(i))),
                MemAccount {
                    info: info(i, i, i == 0),
                    storage,
                },
            );
        }
        model
    }

    /// The stored paths of `trie` that are a prefix of one of `keys`: the nodes a change of
    /// those keys' values (and nothing else) must rewrite, and the only ones.
    fn nodes_above(store: &MemNodeStore, trie: TrieId, keys: &BTreeSet<B256>) -> usize {
        let keys: Vec<Nibbles> = keys.iter().map(Nibbles::unpack).collect();
        store
            .nodes(trie)
            .keys()
            .filter(|path| keys.iter().any(|key| key.starts_with(path)))
            .count()
    }

    /// Only the changed paths are re-encoded: when values change and no key comes or goes, a
    /// block writes exactly the stored nodes above the changed keys (a node rewritten beside
    /// them, or one missed, fails this), split over four workers from eight updates.
    #[test]
    fn only_the_nodes_above_changed_keys_are_written() {
        use rand::{Rng, SeedableRng, rngs::SmallRng};
        let mut rng = SmallRng::seed_from_u64(11);
        let mut model = big_state(5_000, 3_000);
        let mut t = StateTrie::new(MemNodeStore::new(), unpinned(4, 8)).unwrap();
        // More than 4,096 new keys: the first build takes the parallel build path.
        t.apply(&HashedStateChanges::from_state(&model)).unwrap();
        assert_nodes_match_fresh_build(&t, &model);
        let token = Address::from_word(B256::ZERO);
        let hashed_token = keccak256(token);
        for changed in [1usize, 2, 40, 700] {
            let mut diff = HashedStateChanges::default();
            let mut account_keys = BTreeSet::new();
            for _ in 0..changed {
                let addr =
                    Address::from_word(B256::from(U256::from(rng.random_range(1..5_000u64))));
                let a = model.accounts.get_mut(&addr).unwrap();
                a.info.balance += U256::from(1);
                diff.accounts
                    .insert(keccak256(addr), Some(HashedAccount::from(&a.info)));
                account_keys.insert(keccak256(addr));
            }
            let mut slot_keys = BTreeSet::new();
            let contract = model.accounts.get_mut(&token).unwrap();
            let storage = diff.storages.entry(hashed_token).or_default();
            for _ in 0..changed {
                let slot = U256::from(rng.random_range(0..3_000u64));
                let value = contract.storage[&slot] + U256::from(1);
                contract.storage.insert(slot, value);
                let key = keccak256(slot.to_be_bytes::<32>());
                storage.slots.insert(key, value);
                slot_keys.insert(key);
            }
            // The contract's leaf changes with its storage root.
            account_keys.insert(hashed_token);
            let expected_accounts = nodes_above(t.store(), TrieId::Account, &account_keys);
            let expected_slots = nodes_above(t.store(), TrieId::Storage(hashed_token), &slot_keys);
            let out = t.apply(&diff).unwrap();
            check_output(&out);
            assert_eq!(out.root, reference::state_root(&model), "{changed} changed");
            let slots = &out.updates.storage_tries[&hashed_token].nodes;
            assert_eq!(
                (out.updates.account_nodes.write_count(), slots.write_count()),
                (expected_accounts, expected_slots),
                "{changed} changed: nodes written (accounts, slots)"
            );
            assert!(out.updates.account_nodes.deletes().is_empty() && slots.deletes().is_empty());
            assert_eq!(
                out.stats.dirty_nodes,
                (expected_accounts + expected_slots) as u64
            );
        }
    }

    /// Fails reads under one path, as a database store can.
    #[derive(Clone)]
    struct FailingStore {
        inner: MemNodeStore,
        trie: TrieId,
        under: Nibbles,
    }

    #[derive(Debug, thiserror::Error)]
    #[error("read failed")]
    struct ReadFailed;

    impl NodeStore for FailingStore {
        type Error = ReadFailed;

        fn get(
            &self,
            trie: TrieId,
            path: &Nibbles,
        ) -> Result<Option<std::borrow::Cow<'_, crate::StoredNode>>, Self::Error> {
            if trie == self.trie && path.starts_with(&self.under) {
                return Err(ReadFailed);
            }
            Ok(self
                .inner
                .get(trie, path)
                .unwrap_or_else(|never| match never {})
                .map(|n| std::borrow::Cow::Owned(n.into_owned())))
        }

        fn apply(&mut self, updates: &StateTrieUpdates) -> Result<(), Self::Error> {
            self.inner
                .apply(updates)
                .unwrap_or_else(|never| match never {});
            Ok(())
        }
    }

    /// A store error inside one of many parallel tasks, in either trie, fails the whole block
    /// with the store's error and writes nothing; the next block, clear of the failing path,
    /// goes on from the old root.
    #[test]
    fn a_store_error_in_a_parallel_task_fails_the_block_and_writes_nothing() {
        let model = big_state(5_000, 3_000);
        let mut built = trie(1, 64);
        built
            .apply(&HashedStateChanges::from_state(&model))
            .unwrap();
        let hashed_token = keccak256(Address::from_word(B256::ZERO));
        for failing in [TrieId::Account, TrieId::Storage(hashed_token)] {
            // A path two levels down that exists, in the middle of the key space.
            let under = Nibbles::from_nibbles([0x7, 0x3]);
            assert!(
                built
                    .store()
                    .nodes(failing)
                    .keys()
                    .any(|p| p.starts_with(&under))
            );
            let store = FailingStore {
                inner: built.store().clone(),
                trie: failing,
                under,
            };
            let mut t = StateTrie::new(store, unpinned(4, 8)).unwrap();
            assert_eq!(t.root(), built.root());
            let before_accounts = t.store().inner.nodes(TrieId::Account);
            let before_slots = t.store().inner.nodes(TrieId::Storage(hashed_token));
            let mut diff = HashedStateChanges::default();
            // Only the account trie's own keys count for it, only the slots for the storage.
            let mut touches_failing = false;
            let mut next = model.clone();
            // Every fifth account and slot: a thousand and six hundred updates, split four ways
            // and deeper.
            for i in (0..5_000u64).step_by(5) {
                let addr = Address::from_word(B256::from(U256::from(i)));
                let a = next.accounts.get_mut(&addr).unwrap();
                a.info.nonce += 1;
                diff.accounts
                    .insert(keccak256(addr), Some(HashedAccount::from(&a.info)));
                touches_failing |= failing == TrieId::Account
                    && Nibbles::unpack(keccak256(addr)).starts_with(&under);
            }
            let storage = diff.storages.entry(hashed_token).or_default();
            for slot in (0..3_000u64).step_by(5) {
                let key = keccak256(U256::from(slot).to_be_bytes::<32>());
                storage.slots.insert(key, U256::from(slot + 7));
                touches_failing |=
                    failing != TrieId::Account && Nibbles::unpack(key).starts_with(&under);
            }
            assert!(
                touches_failing,
                "{failing:?}: the block must reach the failing path"
            );
            let result = t.apply(&diff);
            assert!(
                matches!(result, Err(TrieError::Store(_))),
                "{failing:?}: {result:?}"
            );
            assert_eq!(t.root(), built.root());
            assert_eq!(t.store().inner.nodes(TrieId::Account), before_accounts);
            assert_eq!(
                t.store().inner.nodes(TrieId::Storage(hashed_token)),
                before_slots
            );
            // A block that stays clear of the failing path (another first nibble) still applies.
            let addr = (1..5_000u64)
                .map(|i| Address::from_word(B256::from(U256::from(i))))
                .find(|a| Nibbles::unpack(keccak256(a)).get_unchecked(0) != under.get_unchecked(0))
                .unwrap();
            let mut ok_model = model.clone();
            let a = ok_model.accounts.get_mut(&addr).unwrap();
            a.info.nonce += 1;
            let mut diff = HashedStateChanges::default();
            diff.accounts
                .insert(keccak256(addr), Some(HashedAccount::from(&a.info)));
            let out = t.apply(&diff).unwrap();
            assert_eq!(out.root, reference::state_root(&ok_model));
        }
    }

    #[test]
    fn split_follows_the_threads() {
        let trie = |threads| StateTrie::new(MemNodeStore::new(), unpinned(threads, 64)).unwrap();
        assert_eq!(trie(1).split_at(12_000), usize::MAX);
        let two = trie(2);
        assert_eq!(two.split_at(100), 64);
        assert_eq!(two.split_at(12_000), 1_500);
        assert_eq!(trie(16).split_at(12_000), 187);
    }

    #[test]
    fn bad_config_is_rejected() {
        let config = TrieConfig {
            threads: 2,
            parallel_threshold: 1,
            ..TrieConfig::default()
        };
        assert!(matches!(
            StateTrie::new(MemNodeStore::new(), config),
            Err(TrieError::InvalidConfig(_))
        ));
    }
}
