//! `--overdrive.state-root overdrive`: the state root of each block the engine validates,
//! computed by overdrive's parallel trie (`overdrive-trie`) as reth's `StateRootStrategy`.
//!
//! The trie is kept in memory, one copy of it: whole, or with `--overdrive.trie.cache-mb` only
//! its top levels, as many as fit the budget, the nodes below read back from reth's hashed
//! state tables (with the blocks not yet persisted on top) when a block changes them
//! (`leaves`, [`BoundedNodeStore`]). With `--overdrive.trie.prefetch` the engine's stream of
//! each block's state updates is taken while the block executes, to start those reads, or for
//! a whole trie to bring the nodes the root will read into the cache (`prefetch`); with
//! `--overdrive.trie.hash-ahead` a whole trie commits the updates in rounds as they come
//! ([`Rounds`]), and the block's root hashes only what changed since the last round, or, when
//! the rounds changed what the block does not, takes them back and hashes the block whole. At launch
//! it is built from reth's hashed state tables and its root checked against the database
//! head's header; after that it follows the
//! blocks the engine validates: a block whose parent is the trie's block, or one of the last
//! [`StateRootConfig::blocks_kept`] blocks before it, gets its root from the trie (stepped back
//! to the parent first with the undo batches of [`StateTrie::undo_of`]), and reth gets the trie
//! rows to persist from [`CompactTrie::commit`] as its `TrieUpdates`. Any other block (a
//! fork from further back, or every block after a pipeline backfill moved the database past
//! the trie) gets reth's synchronous root and is kept: a trie rebuilt from the database on a
//! thread of its own then follows the kept blocks up to the newest and takes over
//! (`catch_up`). A root that differs from the block header's is checked with reth's
//! synchronous root before the block is judged: if reth's matches the header, reth's is used
//! and overdrive's trie is dropped for the rest of the run (reth's own strategy takes every
//! block), with an error in the log; so is the trie after any error of its own.
//!
//! The payload builder gets its roots from the same trie when it builds on the trie's block
//! (`payload`): the state updates of each executed transaction are folded as they
//! come, and the root is computed when execution ends, without moving the trie. A built block
//! is validated like any other (its state from reth's bundle, not from the builder's stream),
//! so a root the two disagree on is an invalid block, never a wrong database.

use alloy_consensus::BlockHeader;
use alloy_primitives::{B256, KECCAK256_EMPTY as KECCAK_EMPTY, U256};
use alloy_rpc_types_engine::ExecutionData;
use overdrive_trie::{
    BoundedNodeStore, CompactNodes, CompactTrie, CompactUpdates, HashedAccount, HashedStateChanges,
    HashedStorageChanges, LeafSource, Nibbles, Rounds, StateRootOutput, StateTrie, TrieConfig,
    TrieError,
};
use reth_db_api::{cursor::DbCursorRO, tables, transaction::DbTx};
use reth_engine_tree::tree::{
    BasicEngineValidator, StateProviderBuilder, TreeConfig,
    state_root_strategy::{
        DefaultStateRootStrategy, LazyHashedPostState, PayloadStateRootHandle,
        PayloadStateRootJobContext, PreparedStateRootJob, StateRootHintStream, StateRootJob,
        StateRootJobContext, StateRootJobOutcome, StateRootStrategy, StateRootUpdateStream,
    },
};
use reth_ethereum_primitives::EthPrimitives;
use reth_evm::ConfigureEvm;
use reth_node_builder::{
    AddOnsContext, ConfigureEngineEvm, FullNodeComponents,
    rpc::{BasicEngineValidatorBuilder, EngineValidatorBuilder, PayloadValidatorBuilder},
};
use reth_node_ethereum::node::EthereumEngineValidatorBuilder;
use reth_primitives_traits::{NodePrimitives, RecoveredBlock};
use reth_provider::{
    BlockExecutionOutput, BlockNumReader, DBProvider, DatabaseProviderFactory, HeaderProvider,
    ProviderError, ProviderResult, PruneCheckpointReader, StageCheckpointReader, StateRootProvider,
    StorageSettingsCache, TryIntoHistoricalStateProvider,
};
use reth_storage_overlay::{OverlayManager, OverlayStateProviderFactory};
use reth_trie::{
    HashedPostState,
    updates::{StorageTrieUpdates, TrieUpdates},
};
use std::{
    collections::VecDeque,
    sync::{
        Arc, Mutex, PoisonError,
        atomic::{AtomicBool, Ordering},
        mpsc,
    },
    time::{Duration, Instant},
};
use tracing::{debug, error, info, warn};

use crate::OverdriveNode;
use catch_up::{CatchUp, Missed};
use leaves::OverlayLeaves;
use payload::PayloadRootSink;
use prefetch::{BlockPrefetch, Prefetcher};

mod catch_up;
mod leaves;
mod payload;
mod prefetch;
#[cfg(test)]
mod tests;

const TARGET: &str = "overdrive::state_root";

/// Settings of overdrive's state root.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StateRootConfig {
    /// Threads hashing the trie.
    pub threads: usize,
    /// How many of the last blocks the trie computed it can step back over, for a block that
    /// turns out invalid or a fork from one of them.
    pub blocks_kept: usize,
    /// The most memory the trie's nodes may take, in MiB: the levels that do not fit are read
    /// back from the database when a block changes them. `None`: the whole trie is kept.
    pub cache_mb: Option<usize>,
    /// Whether the trie takes what a block's root needs while the block executes
    /// (`prefetch`).
    pub prefetch: Prefetch,
    /// Whether a whole trie hashes each block's updates in rounds while the block executes
    /// (`prefetch`), leaving only the rest for its root.
    pub hash_ahead: bool,
}

impl Default for StateRootConfig {
    fn default() -> Self {
        Self {
            threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
            blocks_kept: 16,
            cache_mb: None,
            prefetch: Prefetch::default(),
            hash_ahead: false,
        }
    }
}

/// When the trie takes, while a block executes, what the block's root will read: a trie kept
/// to its top levels reads it back from the database, a whole trie brings it into the cache.
/// The reads run on a thread of their own beside execution: worth it where cores are spare, a
/// cost to execution where they are not.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Prefetch {
    /// Where reth streams each block's updates to its own state-root task: on machines with
    /// enough cores for it (reth's engine setting).
    #[default]
    Auto,
    /// Always.
    On,
    /// Never: each root reads what it needs itself.
    Off,
}

/// The leaves of the state at a block, which a trie that keeps only its top levels reads the
/// rest from.
type Leaves = Box<dyn LeafSource<Error = ProviderError>>;

/// Opens the leaves of the state at a block.
type LeavesAt = Arc<dyn Fn(B256) -> ProviderResult<Leaves> + Send + Sync>;

/// overdrive's trie: its top levels, or all of it, in memory.
type Trie = CompactTrie<BoundedNodeStore<Leaves>>;

/// overdrive's trie at the newest block it computed, and how to step back from there.
struct Tip {
    /// The block whose state the trie holds.
    block: B256,
    trie: Trie,
    /// The last blocks committed, newest last: each block, its parent, and the batches that
    /// take the trie from the block back to the parent (applied last to first).
    undo: VecDeque<(B256, B256, Vec<StateRootOutput>)>,
    limit: usize,
    /// Where the levels the trie does not keep are read back from.
    leaves: Option<LeavesAt>,
    /// The block whose leaves the trie reads now (set before a block's reads, which may begin
    /// while the block executes, and cleared when the trie drops what it read).
    reads_at: Option<B256>,
    /// The rounds of a block executing on `block`, hashed ahead of its root
    /// (`--overdrive.trie.hash-ahead`): the trie holds them on top of `block` until the block's
    /// root takes them, or anything else takes them back.
    ahead: Option<(Arc<BlockPrefetch>, Rounds)>,
}

impl std::fmt::Debug for Tip {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tip")
            .field("block", &self.block)
            .field("root", &self.trie.trie().root())
            .field("depth", &self.trie.trie().store().depth())
            .field("undo", &self.undo.len())
            .field("rounds_ahead", &self.ahead.as_ref().map(|(_, r)| r.len()))
            .finish_non_exhaustive()
    }
}

impl Tip {
    /// Whether the trie can be brought to `block`: it is there, or kept undo batches lead back.
    fn reaches(&self, block: B256) -> bool {
        self.block == block || self.undo.iter().any(|(_, parent, _)| *parent == block)
    }

    /// Takes back the rounds hashed ahead for a block that has not ended: the trie is at its
    /// block again. The block hashes nothing more ahead: a round after a gap could change the
    /// storage of an account only a taken-back round created.
    fn take_back_ahead(&mut self) -> Result<(), TrieError> {
        if let Some((block, rounds)) = self.ahead.take() {
            block.stop();
            self.trie.take_back_rounds(rounds)?;
        }
        Ok(())
    }

    /// Steps the trie back to `block`; false when no kept batch leads there.
    fn rewind_to(&mut self, block: B256) -> Result<bool, TrieError> {
        self.take_back_ahead()?;
        if !self.reaches(block) {
            return Ok(false);
        }
        while self.block != block {
            let Some((_, parent, undo)) = self.undo.pop_back() else {
                return Ok(false);
            };
            // The rows of going back are not reth's to write: reth keeps each block's rows
            // with that block, and the next block's rows are taken against the parent.
            for batch in undo.iter().rev() {
                self.trie.commit_without_rows(batch)?;
            }
            self.trie.evict();
            self.reads_at = None;
            self.block = parent;
        }
        Ok(true)
    }

    /// Points the trie at the leaves of its block, for the reads of a block on top (a trie
    /// that keeps every node reads none). Without a source such reads fail with an error.
    fn read_at_block(&mut self) -> Result<(), TrieError> {
        if let Some(leaves) = &self.leaves
            && !self.trie.trie().store().keeps_everything()
            && self.reads_at != Some(self.block)
        {
            let source = leaves(self.block).map_err(|e| TrieError::Store(Box::new(e)))?;
            self.trie.store_mut().set_source(source);
            self.reads_at = Some(self.block);
        }
        Ok(())
    }

    /// `changes`' root and node changes over the trie's block.
    fn compute(&mut self, changes: &HashedStateChanges) -> Result<StateRootOutput, TrieError> {
        self.take_back_ahead()?;
        self.read_at_block()?;
        self.trie.trie().compute(changes)
    }

    /// Drops the nodes the trie keeps only for the block's reads, counting what was read back.
    fn settle(&mut self) {
        self.trie.evict();
        self.reads_at = None;
        let reads = self.trie.trie().store().take_reads();
        if reads.subtrees > 0 {
            metrics::counter!("overdrive_state_root_subtrees_read_total").increment(reads.subtrees);
            metrics::counter!("overdrive_state_root_leaves_read_total").increment(reads.leaves);
        }
    }

    /// Commits `output` as `block`'s, keeping the batch that takes it back; returns the rows,
    /// and how long dropping what the block read back took.
    fn advance(
        &mut self,
        block: B256,
        output: &StateRootOutput,
    ) -> Result<(CompactUpdates, Duration), TrieError> {
        let committed = self.trie.commit_with_undo(output);
        let started = Instant::now();
        self.settle();
        let evicted = started.elapsed();
        let (rows, undo) = committed?;
        self.push(block, vec![undo]);
        Ok((rows, evicted))
    }

    /// Makes `block` the trie's, with the batches that take it back to the trie's block.
    fn push(&mut self, block: B256, undo: Vec<StateRootOutput>) {
        self.undo.push_back((block, self.block, undo));
        if self.undo.len() > self.limit {
            self.undo.pop_front();
        }
        self.block = block;
    }

    /// Commits `changes`, the next round of the block `of` executing on the trie's block
    /// (rounds of any other block are taken back first). False, with nothing committed, when
    /// the block's root began while the round was hashed (the root then hashes the round's
    /// changes with the rest, sooner than the round would commit them), or when the block can
    /// no longer hash ahead, which stops it: the trie is not at its parent, or the round does
    /// not apply (its rounds are taken back; the root hashes the block whole).
    fn commit_round(
        &mut self,
        of: &Arc<BlockPrefetch>,
        changes: HashedStateChanges,
    ) -> Result<bool, TrieError> {
        if !self.ahead.as_ref().is_some_and(|(b, _)| Arc::ptr_eq(b, of)) {
            self.take_back_ahead()?;
        }
        if self.block != of.parent() {
            of.stop();
            return Ok(false);
        }
        let output = match self.trie.trie().compute(&changes) {
            Ok(output) => output,
            Err(error) => {
                // Nothing was written: the rounds so far go back, and the root decides.
                debug!(target: TARGET, %error, "A round could not be hashed ahead: the block is hashed whole");
                of.stop();
                self.take_back_ahead()?;
                return Ok(false);
            }
        };
        if of.stopped() {
            return Ok(false);
        }
        let (_, rounds) = self
            .ahead
            .get_or_insert_with(|| (of.clone(), Rounds::default()));
        self.trie.commit_round(rounds, changes, &output)?;
        Ok(true)
    }

    /// `block`'s root from the rounds hashed ahead of it (`of`'s) and the rest of `changes`,
    /// the block's whole changes, committed when it is `expected`. `None`, with the rounds
    /// taken back, when there are none, when they changed what the block does not, or when the
    /// root is not `expected` (the caller then computes the block whole, as without rounds).
    fn finish_ahead(
        &mut self,
        of: &Arc<BlockPrefetch>,
        block: B256,
        changes: &HashedStateChanges,
        expected: B256,
    ) -> Result<Option<(B256, CompactUpdates, AheadStats)>, TrieError> {
        let ours = self.ahead.take_if(|(b, _)| Arc::ptr_eq(b, of));
        let Some((_, rounds)) = ours else {
            return Ok(None);
        };
        let started = Instant::now();
        let Some(rest) = rounds.rest_of(changes) else {
            debug!(target: TARGET, %block, "The rounds hashed ahead changed what the block does not: the block is hashed whole");
            self.trie.take_back_rounds(rounds)?;
            return Ok(None);
        };
        let checked = started.elapsed();
        let output = self.trie.trie().compute(&rest)?;
        let computed = started.elapsed();
        if output.root != expected {
            // The block whole decides whether the block or the rounds were wrong.
            warn!(target: TARGET, %block, root = %output.root, %expected, "The root from the rounds hashed ahead differs from the header's: the block is hashed whole");
            self.trie.take_back_rounds(rounds)?;
            return Ok(None);
        }
        let (count, ahead_nodes) = (rounds.len(), rounds.dirty_nodes());
        let (rows, undo) = self.trie.commit_with_undo(&output)?;
        let (rows, undo) = rounds.finish(rows, undo);
        let stats = AheadStats {
            rounds: count,
            ahead_nodes,
            rest_nodes: output.stats.dirty_nodes,
            check: checked,
            compute: computed - checked,
            rows: started.elapsed() - computed,
        };
        self.push(block, undo);
        Ok(Some((output.root, rows, stats)))
    }

    /// The rows `output` would write over the trie's block, leaving the trie where it is (it is
    /// committed and taken back).
    fn rows_of(&mut self, output: &StateRootOutput) -> Result<CompactUpdates, TrieError> {
        let (rows, undo) = self.trie.commit_with_undo(output)?;
        let taken_back = self.trie.commit_without_rows(&undo);
        self.settle();
        taken_back?;
        Ok(rows)
    }
}

/// How much of a block's hashing its rounds did ahead of its root.
#[derive(Debug, Clone, Copy)]
struct AheadStats {
    rounds: usize,
    /// Nodes the rounds hashed.
    ahead_nodes: u64,
    /// Nodes hashed after the block ended.
    rest_nodes: u64,
    /// Comparing the rounds with the block's changes.
    check: Duration,
    /// Hashing the rest.
    compute: Duration,
    /// Committing the rest and folding the rounds' rows with its own.
    rows: Duration,
}

/// Builds overdrive's trie of the database's head.
type Rebuild = Box<dyn Fn() -> eyre::Result<Tip> + Send + Sync>;

/// What the strategy and its jobs share.
struct Shared {
    /// overdrive's trie; `None` once it failed, or while none could be built.
    tip: Mutex<Option<Tip>>,
    /// The trie failed: none is trusted again in this run.
    failed: AtomicBool,
    catch_up: Mutex<CatchUp>,
    rebuild: Rebuild,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared")
            .field("tip", &self.tip)
            .field("failed", &self.failed)
            .field("catch_up", &self.catch_up)
            .finish_non_exhaustive()
    }
}

impl Shared {
    fn new(tip: Option<Tip>, rebuild: Rebuild) -> Self {
        Self {
            tip: Mutex::new(tip),
            failed: AtomicBool::new(false),
            catch_up: Mutex::default(),
            rebuild,
        }
    }

    fn tip(&self) -> std::sync::MutexGuard<'_, Option<Tip>> {
        self.tip.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn catch_up(&self) -> std::sync::MutexGuard<'_, CatchUp> {
        self.catch_up.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Drops overdrive's trie, so that reth's strategy takes every block from now on: it
    /// failed on `block`, and no root of it is trusted again in this run.
    fn give_up(&self, tip: &mut Option<Tip>, block: B256, why: &str) {
        error!(
            target: TARGET,
            %block,
            why,
            "overdrive's state root failed: reth's root is used, and overdrive's trie is dropped for the rest of the run"
        );
        metrics::counter!("overdrive_state_root_failures_total").increment(1);
        self.failed.store(true, Ordering::Relaxed);
        *tip = None;
    }
}

/// The strategy: overdrive's trie for blocks whose parent it reaches, reth's otherwise.
#[derive(Debug)]
pub struct OverdriveStateRoot {
    default: DefaultStateRootStrategy,
    shared: Arc<Shared>,
    /// Takes what a block's root will need while the block executes, or hashes its updates
    /// ahead.
    prefetcher: Option<Prefetcher>,
}

impl OverdriveStateRoot {
    /// Builds the trie of the database's head from reth's hashed state tables and checks its
    /// root against the head's header. When that fails (a pipeline stopped between its hashing
    /// and merkle stages leaves hashed tables ahead of the head), the node starts without a
    /// trie. Then, as whenever the trie no longer reaches the chain (after a pipeline backfill,
    /// or a reorg deeper than the blocks it keeps), the strategy builds it again from `factory`
    /// in the background once the engine validates blocks.
    pub fn load<F>(factory: F, mut config: StateRootConfig, leaves: Option<LeavesAt>) -> Self
    where
        F: DatabaseProviderFactory<Provider: DBProvider + BlockNumReader + HeaderProvider>
            + Send
            + Sync
            + 'static,
    {
        if config.hash_ahead && config.cache_mb.is_some() {
            // Rounds write the trie without reading back the levels a budget drops.
            warn!(target: TARGET, "Hashing ahead needs the whole trie: off with a memory budget");
            config.hash_ahead = false;
        }
        let tip = build_tip(&factory, config, leaves.clone())
            .inspect_err(|error| {
                warn!(target: TARGET, %error, "Could not build overdrive's trie at launch: reth's state root until it is rebuilt");
            })
            .ok();
        let shared = Arc::new(Shared::new(
            tip,
            Box::new(move || build_tip(&factory, config, leaves.clone())),
        ));
        let prefetcher = (config.prefetch != Prefetch::Off || config.hash_ahead)
            .then(|| {
                Prefetcher::spawn(shared.clone(), config.hash_ahead)
                    .inspect_err(|error| {
                        warn!(target: TARGET, %error, "Could not start the prefetch thread: each root reads what it needs itself");
                    })
                    .ok()
            })
            .flatten();
        Self {
            default: DefaultStateRootStrategy::default(),
            shared,
            prefetcher,
        }
    }
}

/// overdrive's trie of the database's head, built from reth's hashed state tables, its root
/// checked against the head's header.
///
/// Built sixteen parts one after another, the accounts under each first nibble with their
/// storage, so that a trie with a memory budget drops the levels it does not keep after each
/// part instead of holding the whole trie once.
fn build_tip<F>(factory: &F, config: StateRootConfig, leaves: Option<LeavesAt>) -> eyre::Result<Tip>
where
    F: DatabaseProviderFactory<Provider: DBProvider + BlockNumReader + HeaderProvider>,
{
    let started = Instant::now();
    let provider = factory.database_provider_ro()?;
    let head = provider.best_block_number()?;
    let header = provider
        .sealed_header(head)?
        .ok_or(ProviderError::HeaderNotFound(head.into()))?;
    info!(target: TARGET, head, cache_mb = ?config.cache_mb, prefetch = ?config.prefetch, "Building overdrive's trie from the hashed state");
    let store = match config.cache_mb {
        Some(mb) => BoundedNodeStore::with_budget(mb << 20),
        None => BoundedNodeStore::default(),
    };
    let mut trie: Trie = CompactTrie::new(StateTrie::new(
        store,
        TrieConfig::with_threads(config.threads),
    )?);
    let (mut accounts, mut storages) = (0, 0);
    for nibble in 0..16 {
        let part = read_hashed_state(provider.tx_ref(), nibble)?;
        accounts += part.accounts.len();
        storages += part.storages.len();
        if let Some(leaves) = &leaves
            && !trie.trie().store().keeps_everything()
        {
            // The parts built so far, for the reads of a node an earlier part left below
            // the kept levels (where this part joins the account trie).
            let built = BuiltParts {
                leaves: leaves(header.hash())?,
                below: nibble,
            };
            trie.store_mut().set_source(Box::new(built));
        }
        let output = trie.trie().compute(&part)?;
        // With its rows (not written: the database has them), so that the trie learns which
        // of its branches have one while their children are at hand. Otherwise each block's
        // rows learn it for the untouched siblings of the branches the block changes, reading
        // their children: in a trie of millions of accounts most of a block's paths were never
        // read before, and that cost more than hashing the block.
        trie.commit_new(&output)?;
        trie.evict();
    }
    let root = trie.trie().root();
    if root != header.state_root() {
        eyre::bail!(
            "overdrive's trie of block {head} has root {root}, the header says {}: the database's hashed state and its head disagree",
            header.state_root()
        );
    }
    drop(provider);
    let store = trie.trie().store();
    info!(
        target: TARGET,
        head,
        accounts,
        storage_tries = storages,
        nodes = store.mem().len(),
        memory_mb = store.mem().heap_bytes() >> 20,
        kept_depth = store.depth(),
        elapsed = ?started.elapsed(),
        "Built overdrive's trie"
    );
    Ok(Tip {
        block: header.hash(),
        trie,
        undo: VecDeque::new(),
        limit: config.blocks_kept,
        leaves,
        reads_at: None,
        ahead: None,
    })
}

/// The leaves of the accounts under the first nibbles below `below` (the parts of a trie
/// built so far), with all their storage.
struct BuiltParts {
    leaves: Leaves,
    below: u8,
}

impl LeafSource for BuiltParts {
    type Error = ProviderError;

    fn accounts(
        &self,
        prefix: &Nibbles,
        out: &mut Vec<(B256, HashedAccount)>,
    ) -> ProviderResult<()> {
        let start = out.len();
        self.leaves.accounts(prefix, out)?;
        // In address order: the accounts of the parts built so far come first.
        let built = out[start..].partition_point(|(address, _)| address[0] >> 4 < self.below);
        out.truncate(start + built);
        Ok(())
    }

    fn storage(
        &self,
        address: B256,
        prefix: &Nibbles,
        out: &mut Vec<(B256, U256)>,
    ) -> ProviderResult<()> {
        self.leaves.storage(address, prefix, out)
    }
}

/// The accounts of the hashed state tables whose hashed address starts with `nibble`, and
/// their slots, as one diff over a trie without them.
fn read_hashed_state<TX: DbTx>(tx: &TX, nibble: u8) -> Result<HashedStateChanges, ProviderError> {
    let mut state = HashedStateChanges::default();
    let mut start = B256::ZERO;
    start.0[0] = nibble << 4;
    let in_part = |address: &B256| address[0] >> 4 == nibble;
    let mut accounts = tx.cursor_read::<tables::HashedAccounts>()?;
    for row in accounts.walk(Some(start))? {
        let (address, account) = row?;
        if !in_part(&address) {
            break;
        }
        state.accounts.insert(
            address,
            Some(HashedAccount {
                nonce: account.nonce,
                balance: account.balance,
                code_hash: account.bytecode_hash.unwrap_or(KECCAK_EMPTY),
            }),
        );
    }
    let mut slots = tx.cursor_dup_read::<tables::HashedStorages>()?;
    for row in slots.walk(Some(start))? {
        let (address, entry) = row?;
        if !in_part(&address) {
            break;
        }
        state
            .storages
            .entry(address)
            .or_default()
            .slots
            .insert(entry.key, entry.value);
    }
    Ok(state)
}

/// reth's hashed post state as the trie's diff. A destroyed account's storage goes with it.
fn changes(state: &HashedPostState) -> HashedStateChanges {
    let mut changes = HashedStateChanges::default();
    for (address, account) in &state.accounts {
        changes.accounts.insert(
            *address,
            account.map(|account| HashedAccount {
                nonce: account.nonce,
                balance: account.balance,
                code_hash: account.bytecode_hash.unwrap_or(KECCAK_EMPTY),
            }),
        );
    }
    for (address, storage) in &state.storages {
        if matches!(state.accounts.get(address), Some(None)) {
            continue;
        }
        changes.storages.insert(
            *address,
            HashedStorageChanges {
                wiped: storage.wiped,
                slots: storage.storage.clone(),
            },
        );
    }
    changes
}

/// The trie's rows as reth's trie updates.
fn trie_updates(rows: CompactUpdates) -> TrieUpdates {
    let nodes = |nodes: CompactNodes| {
        (
            nodes.updated.into_iter().collect(),
            nodes.removed.into_iter().collect(),
        )
    };
    let (account_nodes, removed_nodes) = nodes(rows.account);
    TrieUpdates {
        account_nodes,
        removed_nodes,
        storage_tries: rows
            .storages
            .into_iter()
            .map(|(address, storage)| {
                let (storage_nodes, removed_nodes) = nodes(storage.nodes);
                let updates = StorageTrieUpdates {
                    is_deleted: storage.wiped,
                    storage_nodes,
                    removed_nodes,
                };
                (address, updates)
            })
            .collect(),
    }
}

impl<N, P, Evm> StateRootStrategy<N, P, Evm> for OverdriveStateRoot
where
    N: NodePrimitives,
    Evm: ConfigureEvm<Primitives = N>,
    P: DatabaseProviderFactory + Clone + Send + Sync + 'static,
    P::Provider: BlockNumReader
        + PruneCheckpointReader
        + StageCheckpointReader
        + StorageSettingsCache
        + TryIntoHistoricalStateProvider
        + 'static,
    DefaultStateRootStrategy: StateRootStrategy<N, P, Evm>,
{
    fn prepare(
        &self,
        ctx: StateRootJobContext<'_, N, P, Evm>,
    ) -> ProviderResult<PreparedStateRootJob<N>> {
        let parent = ctx.env().parent_hash;
        let reached = self
            .shared
            .tip()
            .as_ref()
            .is_some_and(|tip| tip.reaches(parent));
        if !reached {
            if self.shared.failed.load(Ordering::Relaxed) {
                metrics::counter!("overdrive_state_root_blocks_total", "root" => "reth")
                    .increment(1);
                return self.default.prepare(ctx);
            }
            // reth's synchronous root, the block kept for a rebuilt trie to follow.
            debug!(target: TARGET, %parent, "overdrive's trie does not reach the parent: reth's state root");
        }
        let mut job = OverdriveRootJob {
            parent,
            shared: self.shared.clone(),
            provider_builder: ctx.provider_builder(),
            prefetch: None,
        };
        let Some(prefetcher) = self.prefetcher.as_ref().filter(|_| reached) else {
            return Ok(PreparedStateRootJob::new(Box::new(job), None));
        };
        // The block's updates, and the prewarming's hints, to take what its root will read.
        let (sink, block) = prefetcher.sink(parent);
        job.prefetch = Some(block);
        let sink = Arc::new(sink);
        let updates = StateRootUpdateStream::new(sink.clone());
        let prepared = PreparedStateRootJob::new(Box::new(job), None)
            .with_hint_stream(StateRootHintStream::new(sink));
        Ok(if ctx.parallel_bal_execution() {
            prepared.with_hashed_update_stream(updates)
        } else {
            prepared.with_execution_hook(updates.into_state_hook())
        })
    }

    fn prepare_payload_builder(
        &self,
        ctx: PayloadStateRootJobContext<'_, N, P>,
    ) -> ProviderResult<Option<PayloadStateRootHandle>> {
        let parent = ctx.parent_hash();
        // Only on the trie's own block: stepping the trie back for a payload would lose the
        // blocks the engine validated after the parent.
        let at_parent = self
            .shared
            .tip()
            .as_ref()
            .is_some_and(|tip| tip.block == parent);
        if !at_parent {
            metrics::counter!("overdrive_state_root_payloads_total", "root" => "reth").increment(1);
            return self.default.prepare_payload_builder(ctx);
        }
        let (sender, receiver) = mpsc::channel();
        let sink = PayloadRootSink {
            parent,
            shared: self.shared.clone(),
            folded: Mutex::default(),
            result: Mutex::new(Some(sender)),
        };
        let hook = StateRootUpdateStream::new(Arc::new(sink)).into_state_hook();
        Ok(Some(PayloadStateRootHandle::new(
            "overdrive",
            Some(hook),
            receiver,
            None,
        )))
    }
}

/// One block's root from overdrive's trie, brought to its parent; reth's synchronous root
/// when the trie does not reach the parent (the block then kept for a rebuilt trie).
struct OverdriveRootJob<N: NodePrimitives, P> {
    parent: B256,
    shared: Arc<Shared>,
    provider_builder: StateProviderBuilder<N, P>,
    /// The block's prefetch, stopped when the root begins.
    prefetch: Option<Arc<BlockPrefetch>>,
}

impl<N, P> OverdriveRootJob<N, P>
where
    N: NodePrimitives,
    P: DatabaseProviderFactory + Clone + 'static,
    P::Provider: BlockNumReader
        + PruneCheckpointReader
        + StageCheckpointReader
        + StorageSettingsCache
        + TryIntoHistoricalStateProvider
        + 'static,
{
    /// reth's synchronous root over the parent's state (what reth's strategy computes on a
    /// machine too small for its sparse-trie task).
    fn reths(&self, state: &HashedPostState) -> ProviderResult<StateRootJobOutcome> {
        let provider = self.provider_builder.clone().build()?;
        let (root, updates) = provider.state_root_with_updates(state.clone())?;
        Ok(StateRootJobOutcome::new(root, Arc::new(updates)))
    }
}

impl<N, P> StateRootJob<N> for OverdriveRootJob<N, P>
where
    N: NodePrimitives,
    P: DatabaseProviderFactory + Clone + Send + 'static,
    P::Provider: BlockNumReader
        + PruneCheckpointReader
        + StageCheckpointReader
        + StorageSettingsCache
        + TryIntoHistoricalStateProvider
        + 'static,
{
    fn name(&self) -> &'static str {
        "overdrive"
    }

    fn finish(
        &mut self,
        block: &RecoveredBlock<N::Block>,
        _output: Arc<BlockExecutionOutput<N::Receipt>>,
        hashed_state: &LazyHashedPostState,
    ) -> ProviderResult<StateRootJobOutcome> {
        if let Some(prefetch) = &self.prefetch {
            prefetch.stop();
        }
        let started = Instant::now();
        let state = hashed_state.get();
        let expected = block.header().state_root();
        let reths = |job: &Self| {
            metrics::counter!("overdrive_state_root_blocks_total", "root" => "reth").increment(1);
            job.reths(state)
        };
        let shared = self.shared.clone();
        let hashed = started.elapsed();
        // A round hashed ahead holds the trie until it ends.
        let mut guard = shared.tip();
        let waited = started.elapsed() - hashed;
        let ours = match guard.as_mut() {
            Some(tip) => (|| -> Result<Option<Result<_, B256>>, TrieError> {
                let changes = changes(state);
                let prepared = started.elapsed();
                if let Some(prefetch) = &self.prefetch
                    && let Some((root, rows, ahead)) =
                        tip.finish_ahead(prefetch, block.hash(), &changes, expected)?
                {
                    debug!(
                        target: TARGET,
                        block = %block.hash(),
                        rounds = ahead.rounds,
                        ahead_nodes = ahead.ahead_nodes,
                        rest_nodes = ahead.rest_nodes,
                        hashed_state = ?hashed,
                        ?waited,
                        prepare = ?prepared,
                        check = ?ahead.check,
                        compute = ?ahead.compute,
                        rows = ?ahead.rows,
                        rest = ?started.elapsed().saturating_sub(prepared),
                        "overdrive's state root, hashed ahead"
                    );
                    metrics::counter!("overdrive_state_root_blocks_hashed_ahead_total")
                        .increment(1);
                    return Ok(Some(Ok((root, rows))));
                }
                if !tip.rewind_to(self.parent)? {
                    return Ok(None);
                }
                let output = tip.compute(&changes)?;
                if output.root != expected {
                    return Ok(Some(Err(output.root)));
                }
                let computed = started.elapsed();
                let (rows, evict) = tip.advance(block.hash(), &output)?;
                // The block's hashed state (reth's, which it may compute only now) and its
                // changes as the trie takes them; then the trie's own work.
                debug!(
                    target: TARGET,
                    block = %block.hash(),
                    dirty_nodes = output.stats.dirty_nodes,
                    keccak_calls = output.stats.keccak_calls,
                    hashed_state = ?hashed,
                    ?waited,
                    prepare = ?prepared,
                    compute = ?computed.saturating_sub(prepared),
                    rows = ?started.elapsed().saturating_sub(computed + evict),
                    ?evict,
                    "overdrive's state root"
                );
                Ok(Some(Ok((output.root, rows))))
            })(),
            // Failed since `prepare`, or not built yet.
            None => Ok(None),
        };
        match ours {
            Ok(Some(Ok((root, rows)))) => {
                metrics::counter!("overdrive_state_root_blocks_total", "root" => "overdrive")
                    .increment(1);
                Ok(StateRootJobOutcome::new(root, Arc::new(trie_updates(rows))))
            }
            Ok(None) => {
                drop(guard);
                let reths = reths(self)?;
                if reths.state_root == expected && !shared.failed.load(Ordering::Relaxed) {
                    shared.catch_up().record(Missed {
                        block: block.hash(),
                        parent: self.parent,
                        root: expected,
                        changes: changes(state),
                    });
                    shared.catch_up_in_background();
                }
                Ok(reths)
            }
            Ok(Some(Err(root))) => {
                let reths = reths(self)?;
                // A root that reth's count gets wrong too is an invalid block, and the trie
                // stays at the parent; otherwise overdrive's trie is wrong.
                if reths.state_root == expected {
                    shared.give_up(
                        &mut guard,
                        block.hash(),
                        &format!("its root {root} differs from reth's"),
                    );
                }
                Ok(reths)
            }
            Err(error) => {
                shared.give_up(&mut guard, block.hash(), &error.to_string());
                drop(guard);
                reths(self)
            }
        }
    }
}

/// Describes the strategy's metrics (for the Prometheus endpoint's help text).
pub fn describe_metrics() {
    metrics::describe_counter!(
        "overdrive_state_root_blocks_total",
        "Blocks whose state root the engine took from overdrive's trie or from reth's strategy, by `root`"
    );
    metrics::describe_counter!(
        "overdrive_state_root_payloads_total",
        "Payloads whose state root the builder took from overdrive's trie or from reth's, by `root`"
    );
    metrics::describe_counter!(
        "overdrive_state_root_catch_ups_total",
        "Times overdrive's trie was rebuilt from the database and caught up with the chain, after it stopped reaching it"
    );
    metrics::describe_counter!(
        "overdrive_state_root_failures_total",
        "Blocks on which overdrive's trie failed (a root unlike reth's, or an error): the trie is then dropped"
    );
    metrics::describe_counter!(
        "overdrive_state_root_subtrees_read_total",
        "Subtrees below the levels overdrive's trie keeps (--overdrive.trie.cache-mb) read back from the hashed state"
    );
    metrics::describe_counter!(
        "overdrive_state_root_leaves_read_total",
        "Leaves (accounts and slots) read from the hashed state to rebuild those subtrees"
    );
    metrics::describe_counter!(
        "overdrive_state_root_rounds_total",
        "Rounds of executing blocks' state updates overdrive's trie hashed ahead of their roots (--overdrive.trie.hash-ahead)"
    );
    metrics::describe_counter!(
        "overdrive_state_root_blocks_hashed_ahead_total",
        "Blocks whose root overdrive's trie took from rounds hashed while they executed and the rest after (--overdrive.trie.hash-ahead)"
    );
    metrics::describe_counter!(
        "overdrive_state_root_prefetched_keys_total",
        "Keys of executing blocks whose subtrees overdrive's trie read back before the block's root (--overdrive.trie.prefetch)"
    );
}

/// reth's engine validator builder, with overdrive's state root installed when it is on.
#[derive(Debug, Clone, Default)]
pub struct OverdriveEngineValidatorBuilder {
    inner: BasicEngineValidatorBuilder<EthereumEngineValidatorBuilder>,
    state_root: Option<StateRootConfig>,
    /// Whether reth's sparse-trie task runs whatever the core count.
    state_root_task: bool,
}

impl OverdriveEngineValidatorBuilder {
    /// reth's builder, with overdrive's state root when `state_root` is set.
    pub fn new(state_root: Option<StateRootConfig>) -> Self {
        Self {
            inner: BasicEngineValidatorBuilder::default(),
            state_root,
            state_root_task: false,
        }
    }

    /// Runs reth's sparse-trie state-root task (and so streams each transaction's state
    /// updates to the state root) also below the five cores reth asks for.
    pub const fn with_state_root_task(mut self, on: bool) -> Self {
        self.state_root_task = on;
        self
    }
}

impl<N> EngineValidatorBuilder<N> for OverdriveEngineValidatorBuilder
where
    N: FullNodeComponents<Types = OverdriveNode, Evm: ConfigureEngineEvm<ExecutionData>>,
{
    type EngineValidator = BasicEngineValidator<
        N::Provider,
        N::Evm,
        <EthereumEngineValidatorBuilder as PayloadValidatorBuilder<N>>::Validator,
    >;

    async fn build_tree_validator(
        self,
        ctx: &AddOnsContext<'_, N>,
        tree_config: TreeConfig,
        overlay_manager: OverlayManager<EthPrimitives>,
    ) -> eyre::Result<Self::EngineValidator> {
        let tree_config = if self.state_root_task {
            tree_config.with_has_enough_parallelism(true)
        } else {
            tree_config
        };
        let enough_parallelism = tree_config.has_enough_parallelism();
        let validator = self
            .inner
            .build_tree_validator(ctx, tree_config, overlay_manager.clone())
            .await?;
        let Some(mut config) = self.state_root else {
            return Ok(validator);
        };
        if config.prefetch == Prefetch::Auto {
            config.prefetch = if enough_parallelism {
                Prefetch::On
            } else {
                Prefetch::Off
            };
        }
        let provider = ctx.node.provider().clone();
        // The state at a block as reth's own state-root jobs read it: the database, and the
        // blocks the engine holds in memory up to that block on top.
        let leaves: LeavesAt = {
            let provider = provider.clone();
            Arc::new(move |block| {
                let factory = OverlayStateProviderFactory::new(
                    provider.clone(),
                    overlay_manager.overlay_builder(block),
                );
                let leaves: Leaves = Box::new(OverlayLeaves::open(&factory, config.threads)?);
                Ok(leaves)
            })
        };
        let strategy = tokio::task::spawn_blocking(move || {
            OverdriveStateRoot::load(provider, config, Some(leaves))
        })
        .await?;
        let strategy: Arc<dyn StateRootStrategy<EthPrimitives, N::Provider, N::Evm>> =
            Arc::new(strategy);
        Ok(validator.with_state_root_strategy(strategy))
    }
}
