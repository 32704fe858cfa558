//! What the executor needs to run a block on overdrive's parallel executor inside reth: the
//! executor itself (one worker pool for the node), the chain spec in overdrive's form, and a
//! way to open reth state providers, one per thread.

use crate::{BlockState, convert};
use alloy_consensus::{TxEnvelope, transaction::Recovered};
use alloy_evm::{EvmEnv, eth::EthBlockExecutionCtx};
use alloy_primitives::B256;
use overdrive_executor::{
    BlockOutput, BundleOverlay, CachedReader, ExecutionError, ParallelConfig, ParallelExecutor,
    PerThreadReader, evm_env,
};
use reth_chainspec::ChainSpec;
use reth_provider::{
    BlockNumReader, DatabaseProviderFactory, LatestStateProvider, ProviderError, ProviderFactory,
    ProviderResult, StageCheckpointReader, StateProviderBox, TryIntoHistoricalStateProvider,
    providers::ProviderNodeTypes,
};
use reth_revm::database::StateProviderDatabase;
use reth_stages_types::StageId;
use revm::database::OnStateHook;
use std::{
    fmt,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

/// Which state a block's reads start from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StateAt {
    /// The state after the block with this hash (a block's parent, canonical or not yet).
    Hash(B256),
    /// The state after the canonical block with this number.
    Number(u64),
}

/// Opens read-only state providers. Each thread of the parallel executor opens its own:
/// reth's providers are `Send` but not `Sync`.
pub trait StateOpener: Send + Sync + fmt::Debug + 'static {
    /// A provider of the state at `at`.
    fn open(&self, at: StateAt) -> ProviderResult<StateProviderBox>;
}

/// The node's provider (`BlockchainProvider`: the database and the blocks not yet persisted).
#[derive(Debug, Clone)]
pub struct ProviderOpener<P>(pub P);

impl<P> StateOpener for ProviderOpener<P>
where
    P: reth_provider::StateProviderFactory
        + DatabaseProviderFactory<
            Provider: StageCheckpointReader + TryIntoHistoricalStateProvider + BlockNumReader,
        > + fmt::Debug
        + Send
        + Sync
        + 'static,
    LatestStateProvider<P::Provider>: reth_provider::StateProvider + Send + 'static,
{
    fn open(&self, at: StateAt) -> ProviderResult<StateProviderBox> {
        match at {
            // A payload's parent, with the blocks not yet persisted.
            StateAt::Hash(hash) => self.0.state_by_block_hash(hash),
            // A batch's base: persisted (the pipeline and backfill run on the database).
            StateAt::Number(number) => database_state_at(&self.0, number),
        }
    }
}

/// The database's state after block `number`. The plain state is at the execution stage's
/// checkpoint, written with it; reth's own choice between the plain state and history goes
/// by the finish stage's, which the pipeline moves only after its last stage, so that a batch
/// after the first would read through history or be refused as not executed yet.
fn database_state_at<F>(factory: &F, number: u64) -> ProviderResult<StateProviderBox>
where
    F: DatabaseProviderFactory<
        Provider: StageCheckpointReader + TryIntoHistoricalStateProvider + BlockNumReader,
    >,
    LatestStateProvider<F::Provider>: reth_provider::StateProvider + Send + 'static,
{
    let provider = factory.database_provider_ro()?;
    let executed = provider
        .get_stage_checkpoint(StageId::Execution)?
        .map_or(0, |checkpoint| checkpoint.block_number);
    if number == executed {
        return Ok(Box::new(LatestStateProvider::new(provider)));
    }
    provider.try_into_history_at_block(number)
}

/// A provider factory of the database alone (the offline commands' and the tests'), without
/// the node's in-memory blocks.
pub struct FactoryOpener<N: ProviderNodeTypes>(pub ProviderFactory<N>);

impl<N: ProviderNodeTypes> fmt::Debug for FactoryOpener<N> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("FactoryOpener")
    }
}

impl<N: ProviderNodeTypes> StateOpener for FactoryOpener<N> {
    fn open(&self, at: StateAt) -> ProviderResult<StateProviderBox> {
        let number = match at {
            StateAt::Hash(hash) => self
                .0
                .provider()?
                .block_number(hash)?
                .ok_or(ProviderError::BlockHashNotFound(hash))?,
            StateAt::Number(number) => number,
        };
        database_state_at(&self.0, number)
    }
}

/// How a block was executed, for the log and the ExEx.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(usize)]
pub enum ExecutedBy {
    /// overdrive's executor, on several threads.
    Parallel,
    /// overdrive's executor on one thread: the block was too small to split.
    OverdriveSequential,
    /// reth's executor: the block could not take overdrive's path (see the log for why).
    Reth,
}

impl ExecutedBy {
    /// The label used in logs and metrics.
    pub fn label(self) -> &'static str {
        match self {
            Self::Parallel => "parallel",
            Self::OverdriveSequential => "overdrive-sequential",
            Self::Reth => "reth",
        }
    }
}

/// One executed block, as the ExEx reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockRecord {
    /// The block's number.
    pub number: u64,
    /// Its parent's hash (with the number, it names the block before its hash is known).
    pub parent_hash: B256,
    /// Transactions.
    pub transactions: usize,
    /// Gas used.
    pub gas_used: u64,
    /// Who executed it.
    pub executed_by: ExecutedBy,
    /// Wall time of the execution.
    pub elapsed: Duration,
}

/// Recent block records, for the ExEx to pick up by number and parent, and a count of all
/// blocks by executor. Bounded: a record nobody picks up (no ExEx, or a block that was never
/// committed) is dropped after [`BlockLog::CAPACITY`] newer ones.
#[derive(Debug, Default)]
pub struct BlockLog {
    records: Mutex<std::collections::VecDeque<BlockRecord>>,
    /// Blocks executed so far, by [`ExecutedBy`] (in its order).
    counts: [std::sync::atomic::AtomicU64; 3],
}

impl BlockLog {
    /// Records kept at most.
    pub const CAPACITY: usize = 1024;

    /// Adds a record.
    pub fn push(&self, record: BlockRecord) {
        self.counts[record.executed_by as usize].fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut records = self.records.lock().unwrap_or_else(|e| e.into_inner());
        if records.len() == Self::CAPACITY {
            records.pop_front();
        }
        records.push_back(record);
    }

    /// A copy of the records kept.
    pub fn records(&self) -> Vec<BlockRecord> {
        let records = self.records.lock().unwrap_or_else(|e| e.into_inner());
        records.iter().copied().collect()
    }

    /// Takes the latest record of the block with this number and parent, if any.
    pub fn take(&self, number: u64, parent_hash: B256) -> Option<BlockRecord> {
        let mut records = self.records.lock().unwrap_or_else(|e| e.into_inner());
        let at = records
            .iter()
            .rposition(|r| r.number == number && r.parent_hash == parent_hash)?;
        records.remove(at)
    }

    /// Blocks executed so far by `executor`.
    pub fn count(&self, executor: ExecutedBy) -> u64 {
        self.counts[executor as usize].load(std::sync::atomic::Ordering::Relaxed)
    }

    /// One line saying how many blocks each executor ran.
    pub fn summary(&self) -> String {
        format!(
            "{} blocks on overdrive's parallel executor, {} on it alone (too small to split), {} on reth's",
            self.count(ExecutedBy::Parallel),
            self.count(ExecutedBy::OverdriveSequential),
            self.count(ExecutedBy::Reth)
        )
    }
}

/// Why a block took reth's path instead of overdrive's.
#[derive(Debug, thiserror::Error)]
pub enum Ineligible {
    /// The EVM environment overdrive derives from the block differs from reth's (a chain spec
    /// it does not model, e.g. a custom blob schedule).
    #[error("its EVM environment differs from reth's")]
    Environment,
    /// The base state cannot be named (a batch whose first block is unknown).
    #[error("the state it reads cannot be located: {0}")]
    Base(String),
    /// overdrive's executor rejected it (reth's runs it again for reth's own error).
    #[error("overdrive's executor rejected it: {0}")]
    Rejected(ExecutionError),
}

/// A block [`ParallelBlocks::execute`] did not execute: why, and its transactions, back for
/// reth's executor.
pub type NotExecuted = (Ineligible, Vec<Recovered<TxEnvelope>>);

/// overdrive's parallel executor set up for one node.
#[derive(Debug)]
pub struct ParallelBlocks {
    executor: ParallelExecutor,
    spec: overdrive_primitives::ChainParams,
    opener: Arc<dyn StateOpener>,
    log: Arc<BlockLog>,
    /// Whether the environment mismatch was logged (once is enough).
    warned: std::sync::atomic::AtomicBool,
    /// Whether reth's state hook hears each change as the committer commits it (see
    /// [`Self::stream_state_hook`]).
    stream: bool,
}

impl ParallelBlocks {
    /// An executor of `threads` threads (all cores when `None`) for `spec`, reading through
    /// `opener`.
    pub fn new(
        spec: &ChainSpec,
        threads: Option<usize>,
        opener: Arc<dyn StateOpener>,
        log: Arc<BlockLog>,
    ) -> Self {
        let mut config = ParallelConfig::default();
        if let Some(threads) = threads {
            config.threads = threads;
        }
        Self::with_config(spec, config, opener, log)
    }

    /// [`Self::new`] with every setting of the parallel executor given (tests force the
    /// parallel path on small blocks with it).
    pub fn with_config(
        spec: &ChainSpec,
        config: ParallelConfig,
        opener: Arc<dyn StateOpener>,
        log: Arc<BlockLog>,
    ) -> Self {
        // Streamed updates are hashed by reth's state-root task while the block executes: that
        // pays where a core is left to it, and takes CPU from the executor where its threads
        // fill the machine (measured on 2 cores with 2 threads: slower than the folded
        // hand-over at the block's end).
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let stream = config.threads < cores;
        Self {
            executor: ParallelExecutor::new(config),
            spec: convert::chain_spec(spec),
            opener,
            log,
            warned: Default::default(),
            stream,
        }
    }

    /// Whether reth's state hook (its state-root task) hears each change while the block
    /// executes, as the committer commits it, or the whole block folded once it is done. By
    /// default it streams when the executor's threads leave a core free.
    pub fn stream_state_hook(mut self, stream: bool) -> Self {
        self.stream = stream;
        self
    }

    /// Where records of executed blocks go.
    pub fn log(&self) -> &Arc<BlockLog> {
        &self.log
    }

    /// Executes one block on `state` and adds its changes there (see
    /// [`BlockState::apply_block`]); returns its output without the bundle.
    ///
    /// `env` and `ctx` are what reth's executor was created with. The block reads the state
    /// `state` reads: its database, at the first block it executed's parent, and the bundle of
    /// the blocks since. Nothing changes on `state` when this fails, and the transactions come
    /// back with the reason (reth's executor runs them then).
    pub fn execute(
        &self,
        env: &EvmEnv,
        ctx: &EthBlockExecutionCtx<'_>,
        transactions: Vec<Recovered<TxEnvelope>>,
        state: &mut dyn BlockState,
    ) -> Result<(BlockOutput, ExecutedBy), NotExecuted> {
        let started = Instant::now();
        let block = convert::block(env, ctx, transactions);
        self.execute_block(&block, env, ctx, state, started)
            .map_err(|why| (why, block.transactions))
    }

    fn execute_block(
        &self,
        block: &overdrive_primitives::BlockWithSenders,
        env: &EvmEnv,
        ctx: &EthBlockExecutionCtx<'_>,
        state: &mut dyn BlockState,
        started: Instant,
    ) -> Result<(BlockOutput, ExecutedBy), Ineligible> {
        if evm_env(&self.spec, block) != *env {
            if !self.warned.swap(true, std::sync::atomic::Ordering::Relaxed) {
                tracing::warn!(
                    target: "overdrive::exec",
                    block = block.header.number,
                    "overdrive's executor derives another EVM environment than reth's for this \
                     chain (a chain spec it does not model, such as a custom blob schedule): \
                     such blocks run on reth's executor"
                );
            }
            return Err(Ineligible::Environment);
        }
        // A state that executed earlier blocks keeps their changes in its bundle, one revert
        // entry a block, over a database at the first one's parent.
        let earlier = state.bundle().reverts.len() as u64;
        let at = if earlier == 0 {
            StateAt::Hash(ctx.parent_hash)
        } else {
            let first = block.header.number.checked_sub(earlier).ok_or_else(|| {
                Ineligible::Base(format!(
                    "block {} follows {earlier} blocks",
                    block.header.number
                ))
            })?;
            StateAt::Number(first.saturating_sub(1))
        };
        // Opened here first: a parent reth cannot find (a payload on a side chain) sends the
        // block to reth's executor before anything starts.
        let opener = &self.opener;
        let current = opener
            .open(at)
            .map_err(|e| Ineligible::Base(format!("{at:?}: {e}")))?;
        let base = PerThreadReader::with_current(
            || opener.open(at).map(StateProviderDatabase::new),
            StateProviderDatabase::new(current),
        );
        let prepared = started.elapsed();
        // One thread reads each location once anyway (its `revm::State` caches it); several
        // read it on the thread that speculates and again on the committer.
        // reth's state hook (its state-root task) hears each change as overdrive's committer
        // commits it, as it would from reth's executor, so that the root is hashed while the
        // block executes; it is back on reth's state once the block is done, however it ends.
        let hook = if self.stream {
            SharedHook::take_from(state)
        } else {
            SharedHook(None)
        };
        let result = if self.executor.config().threads > 1 {
            let reader = BundleOverlay::new(state.bundle(), CachedReader::new(base));
            self.executor
                .execute_with_state_hook(&self.spec, block, &reader, hook.forwarder())
        } else {
            let reader = BundleOverlay::new(state.bundle(), base);
            self.executor
                .execute_with_state_hook(&self.spec, block, &reader, hook.forwarder())
        };
        let (mut output, stats) = match result {
            Ok(done) => done,
            Err(rejected) => {
                hook.put_back(state);
                return Err(Ineligible::Rejected(rejected));
            }
        };
        let executed = started.elapsed();
        let bundle = std::mem::take(&mut output.bundle);
        // A streamed hook heard the block already: it stays out while the bundle goes in;
        // otherwise `apply_block` hands it the block's changes folded.
        state.apply_block(bundle);
        hook.put_back(state);
        tracing::debug!(
            target: "overdrive::exec",
            block = block.header.number,
            txs = block.transactions.len(),
            prepare_us = prepared.as_micros() as u64,
            execute_us = (executed - prepared).as_micros() as u64,
            apply_us = (started.elapsed() - executed).as_micros() as u64,
            validated = stats.map(|s| s.validated),
            exact = stats.map(|s| s.exact),
            "block executed"
        );
        let executed_by = if stats.is_some() {
            ExecutedBy::Parallel
        } else {
            ExecutedBy::OverdriveSequential
        };
        self.log.push(BlockRecord {
            number: block.header.number,
            parent_hash: block.header.parent_hash,
            transactions: block.transactions.len(),
            gas_used: output.gas_used,
            executed_by,
            elapsed: started.elapsed(),
        });
        Ok((output, executed_by))
    }
}

/// reth's state hook, lent to overdrive's executor for one block: the executor's `revm::State`
/// needs an owned `'static` hook, so it gets a forwarder to this one, which goes back to reth's
/// state afterwards (on any path: a forwarder the executor still holds forwards to nothing).
struct SharedHook(Option<LentHook>);

/// The lent hook; `None` once it went back.
type LentHook = Arc<Mutex<Option<Box<dyn OnStateHook>>>>;

impl SharedHook {
    fn take_from(state: &mut dyn BlockState) -> Self {
        Self(
            state
                .take_state_hook()
                .map(|hook| Arc::new(Mutex::new(Some(hook)))),
        )
    }

    /// A hook that hands every update to the lent one, while it is lent.
    fn forwarder(&self) -> Option<Box<dyn OnStateHook>> {
        let shared = Arc::clone(self.0.as_ref()?);
        Some(Box::new(move |update: revm::state::EvmState| {
            if let Some(hook) = shared.lock().unwrap_or_else(|p| p.into_inner()).as_mut() {
                hook.on_state(update);
            }
        }))
    }

    fn put_back(self, state: &mut dyn BlockState) {
        if let Some(shared) = self.0 {
            let hook = shared.lock().unwrap_or_else(|p| p.into_inner()).take();
            state.set_state_hook(hook);
        }
    }
}
