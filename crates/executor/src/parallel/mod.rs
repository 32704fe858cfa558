//! The parallel executor: optimistic (Block-STM style) speculative execution over a
//! multi-version memory, scheduled by a dependency DAG built from hints, with an in-order
//! committer that checks each result against the exact state and commits it through the
//! reference executor's own state and receipt path.
//!
//! Threads: the calling thread is the committer (it also executes transactions while it would
//! otherwise wait); `threads - 1` persistent pool threads execute speculatively, and execute again
//! a result that a later write below it made stale before the committer reaches it
//! (`Scheduler::suspect`), so that stale results do not all fall to the committer's serial re-runs.
//! Committing (state transitions, receipts) is a large share of sequential execution's cost, so
//! overlapping it with execution is as important as executing in parallel.
//!
//! No core waits on serial per-block work where it can be avoided: the first worker builds the
//! hints while the committer runs the system calls and executes the first transactions exactly
//! (nothing is speculated before the hints are published); a block whose hints show one chain
//! over most of it is left to the committer alone; the end-of-block merge of the state
//! transitions into the bundle is split across two threads (`merge.rs`), and the
//! block's speculative data is freed on a pool thread — committed results during the block, in
//! batches, by the pool thread that allocated them (`recycle.rs`).

mod bloom;
mod commit;
mod hints;
mod merge;
mod mv;
mod recycle;
mod sched;
mod spec;
mod transitions;
mod upstream;

pub use commit::CommitStats;

use crate::{
    BlockOutput, ExecuteBlock, ExecutionError, StateReader, evm_env, execution_ctx,
    sequential::{self, block_state},
};
use alloy_evm::{
    EvmFactory,
    block::BlockExecutor as _,
    eth::{EthBlockExecutor, EthEvmFactory, receipt_builder::AlloyReceiptBuilder},
};
use alloy_primitives::{Address, map::HashMap};
use commit::Committer;
use mv::{Location, MvMemory, TxIdx};
use overdrive_primitives::EthereumHardforks;
use overdrive_primitives::{BlockWithSenders, ChainParams};
use overdrive_tasks::{Pinning, worker_pool};
use revm::{database::OnStateHook, primitives::hardfork::SpecId};
use sched::{COMMITTED, Scheduler, lock};
use spec::{NewCode, SpecRun, SpecShared, Speculator};
use std::{
    panic::{AssertUnwindSafe, catch_unwind},
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
};

/// Blocks with fewer transactions than this run sequentially by default: one transaction has
/// nothing to run beside. The gas floor ([`DEFAULT_MIN_GAS_FOR_PARALLEL`]) is what keeps cheap
/// blocks sequential; a block of few transactions above it holds heavy ones, and even two of those
/// gain from running side by side.
pub const DEFAULT_MIN_TXS_FOR_PARALLEL: usize = 2;

/// Blocks whose estimated gas (see [`block_gas_estimate`]) is below this run sequentially by
/// default: the parallel path has a fixed cost per block (hints, multi-version memory, waking the
/// pool), which a block must win back, and this is about where parallel execution breaks even on
/// blocks of transfers, ERC20 transfers and swaps.
pub const DEFAULT_MIN_GAS_FOR_PARALLEL: u64 = 4_000_000;

/// The gas a block's execution is expected to use, known before executing it: the header's
/// `gas_used` when the block has one (a block being validated), otherwise the sum of its
/// transactions' gas limits. It only picks the path; a wrong header value (an invalid block)
/// costs time, never a different output.
pub fn block_gas_estimate(block: &BlockWithSenders) -> u64 {
    use alloy_consensus::Transaction as _;
    if block.header.gas_used > 0 {
        return block.header.gas_used;
    }
    block
        .transactions
        .iter()
        .fold(0u64, |sum, tx| sum.saturating_add(tx.gas_limit()))
}

/// Configuration of a [`ParallelExecutor`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParallelConfig {
    /// Threads executing a block, the calling thread included (it commits). 1 means
    /// sequential.
    pub threads: usize,
    /// Blocks with fewer transactions run on the sequential path (blocks without any always
    /// do).
    pub min_txs_for_parallel: usize,
    /// Blocks whose [`block_gas_estimate`] is lower run on the sequential path.
    pub min_gas_for_parallel: u64,
    /// How blocks are scheduled on the threads. Its default is what a node runs; the other
    /// settings exist so that the differential tests can force each path and the benchmarks
    /// can compare strategies.
    pub scheduling: Scheduling,
}

/// The scheduling strategies of a [`ParallelExecutor`] that can be switched off. None changes
/// a block's output; each is on by default (except [`Scheduling::speculate_all`], a test
/// mode).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Scheduling {
    /// Defer the coinbase fee to commit (every transaction pays it, so eager payment makes
    /// every transaction conflict with every other).
    pub lazy_coinbase: bool,
    /// Credit plain transfers to a recipient that receives several in a block lazily.
    pub lazy_recipients: bool,
    /// Execute a block whose hinted dependencies form one chain over more than half of its
    /// transactions on the committer alone, without speculation.
    pub chain_fallback: bool,
    /// Order the calls of a contract whose calldata the hints cannot decode only once they
    /// conflict often — at least four times, in at least half of those validated — (in the
    /// block, and for [`LEARNED_BLOCKS`] blocks after); `false` orders every such contract's
    /// calls from the start. A contract whose calls conflict now and then (a router) is left
    /// to speculation: re-executing a few calls costs less than running all in one chain.
    pub learn_conflicts: bool,
    /// Speculate every transaction and commit it through validation: the committer never
    /// executes a pending transaction exactly ahead of the workers (it helps speculate
    /// instead), only one whose speculative result failed validation. Slower — the committer
    /// waits for speculation where it would run ahead — and meant for tests, so that a
    /// fixture's one-transaction blocks, which the committer would otherwise execute itself
    /// before a worker gets to them, go through speculation, validation and the speculative
    /// commit.
    pub speculate_all: bool,
    /// Which thread folds each committed transaction's state changes into the block's
    /// transitions, the input of the bundle.
    pub transition_folding: TransitionFolding,
    /// Pool threads check results that a write below them may have made stale, and execute
    /// those again before the committer reaches them (see `Scheduler::suspect`), while such
    /// re-runs pay in the block (see `RERUNS_FREE`). Otherwise the committer re-executes every
    /// stale result itself, in order.
    pub respeculate: bool,
    /// Run every block with transactions on the parallel path, whatever its size, and with
    /// one thread too: then the committer executes every transaction itself, in order, with
    /// no worker to speculate. Off in a node (a small block is faster on the sequential path);
    /// the benchmarks use it to tell the path's scaling over threads apart from what it gains
    /// on one.
    pub force_parallel_path: bool,
}

/// Which thread folds the committed transactions' state changes into the block's transitions (see
/// `transitions.rs`). The committer must update `revm::State`'s cache in order; the fold can wait.
/// On the committer it takes a sizeable share of the committer's time per validated transaction,
/// and the committer's time caps the speedup on many threads. On the pool it costs more in all (the
/// fold reads what another core wrote): on 2 threads, whose worker has no time to spare, it makes
/// blocks slower.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum TransitionFolding {
    /// On the pool when, in the last parallel block, the pool threads had at least
    /// [`POOL_FOLDING_SPARE`] of their time to spare; on the committer otherwise (and in the
    /// first block).
    #[default]
    Auto,
    /// On the committer, in `revm::State::commit`, as the sequential executor does.
    Committer,
    /// On the pool threads, in their spare time, and on every thread at the block's end.
    Pool,
}

/// The share of the pool threads' time that, spare in one parallel block, has the next fold its
/// transitions on the pool under [`TransitionFolding::Auto`]. Folding when there is nothing to
/// execute counts as spare time, so a block that folds on the pool keeps doing so while its
/// threads would otherwise wait.
pub const POOL_FOLDING_SPARE: f64 = 0.25;

/// How many parallel blocks a contract whose calls conflicted often keeps its calls chained from
/// the start of a block. After that they run unordered again until they conflict again: a
/// contract that stopped conflicting is not serialized forever.
pub const LEARNED_BLOCKS: u32 = 16;

/// At most this many contracts are remembered (a block's newly conflicting contracts beyond it
/// are learned within their block only).
const MAX_LEARNED: usize = 4096;

impl Default for ParallelConfig {
    fn default() -> Self {
        Self {
            threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
            min_txs_for_parallel: DEFAULT_MIN_TXS_FOR_PARALLEL,
            min_gas_for_parallel: DEFAULT_MIN_GAS_FOR_PARALLEL,
            scheduling: Scheduling::default(),
        }
    }
}

impl Default for Scheduling {
    fn default() -> Self {
        Self {
            lazy_coinbase: true,
            lazy_recipients: true,
            chain_fallback: true,
            learn_conflicts: true,
            speculate_all: false,
            transition_folding: TransitionFolding::Auto,
            respeculate: true,
            force_parallel_path: false,
        }
    }
}

/// The parallel executor. Reusable across blocks; owns a persistent pool of `threads - 1`
/// workers. Output equals [`SequentialExecutor`](crate::SequentialExecutor)'s bit for bit,
/// errors included.
#[derive(Debug)]
pub struct ParallelExecutor {
    config: ParallelConfig,
    /// `None` when `threads <= 1` or the pool could not be started: everything runs
    /// sequentially then.
    pool: Option<overdrive_tasks::WorkerPool>,
    /// Statistics of the last parallel block (for benchmarks and tests).
    last_stats: Mutex<Option<CommitStats>>,
    /// Contracts whose undecoded calls conflicted lately, with how many more parallel blocks
    /// their calls stay chained (see [`LEARNED_BLOCKS`]). Read when a block starts, updated
    /// when it ends.
    learned: Mutex<HashMap<Address, u32>>,
    /// Distinct locations the last parallel block wrote to its multi-version memory, per
    /// thousand transactions: the next block's memory is sized from it (see
    /// [`MvMemory::with_capacity`]).
    written_per_mille: AtomicUsize,
    /// Blocks whose data a pool thread is still freeing after `execute` returned (see
    /// [`ParallelExecutor::wait_for_freeing`]).
    freeing: Arc<AtomicUsize>,
    /// [`TransitionFolding::Auto`]'s choice for the next block: whether the pool threads had
    /// time to spare in the last parallel block.
    fold_on_pool: AtomicBool,
}

/// What a [`ParallelExecutor`] learned from the blocks it executed (see
/// [`ParallelExecutor::learned`]); it changes how later blocks are scheduled, never their
/// output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LearnedSchedule {
    conflicts: HashMap<Address, u32>,
    written_per_mille: usize,
    fold_on_pool: bool,
}

/// One block's data being freed on the pool: counted in [`ParallelExecutor::freeing`] from
/// its start until dropped, however the job ends.
struct Freeing(Arc<AtomicUsize>);

impl Freeing {
    fn start(count: &Arc<AtomicUsize>) -> Self {
        count.fetch_add(1, Ordering::AcqRel);
        Self(Arc::clone(count))
    }
}

impl Drop for Freeing {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl ParallelExecutor {
    /// An executor with its worker pool started.
    pub fn new(config: ParallelConfig) -> Self {
        // One thread on the forced parallel path still takes a pool thread: it frees the
        // block's data after the return, as on more threads.
        let pool = (config.threads > 1 || config.scheduling.force_parallel_path)
            .then(|| {
                // Unpinned: the committer is the calling thread and works while the pool thread
                // does, so a block never waits on a second wake-up (pinning the two was measured to
                // make no difference).
                worker_pool("overdrive-exec", config.threads.max(2) - 1, Pinning::Off)
                    .inspect_err(|e| tracing::warn!(%e, "parallel executor runs sequentially"))
                    .ok()
            })
            .flatten();
        Self {
            config,
            pool,
            last_stats: Mutex::new(None),
            learned: Mutex::new(HashMap::default()),
            written_per_mille: AtomicUsize::new(1_000),
            freeing: Arc::default(),
            fold_on_pool: AtomicBool::new(false),
        }
    }

    /// Waits until the pool has freed the data of every block executed so far.
    ///
    /// A block's multi-version memory, scheduler and caches are freed on a pool thread after
    /// `execute` returns, so that the caller gets the output sooner. A benchmark waits for it after
    /// the parallel run, so that this work counts in that run's CPU time and does not slow down the
    /// next measured run.
    pub fn wait_for_freeing(&self) {
        while self.freeing.load(Ordering::Acquire) > 0 {
            std::thread::sleep(std::time::Duration::from_micros(20));
        }
    }

    /// An executor with `threads` threads and the default thresholds.
    pub fn with_threads(threads: usize) -> Self {
        Self::new(ParallelConfig {
            threads,
            ..Default::default()
        })
    }

    /// The configuration.
    pub fn config(&self) -> &ParallelConfig {
        &self.config
    }

    /// What the committer did on the last block executed in parallel.
    pub fn last_stats(&self) -> Option<CommitStats> {
        *lock(&self.last_stats)
    }

    /// The contracts whose calls the next block chains from its start, because they
    /// conflicted often in one of the last [`LEARNED_BLOCKS`] parallel blocks.
    pub fn learned_conflicts(&self) -> Vec<Address> {
        let mut learned: Vec<Address> = lock(&self.learned).keys().copied().collect();
        learned.sort_unstable();
        learned
    }

    /// A copy of what the executor carries from one block to the next: the contracts whose
    /// calls it chains ([`Self::learned_conflicts`]) and the multi-version memory's size hint.
    pub fn learned(&self) -> LearnedSchedule {
        LearnedSchedule {
            conflicts: lock(&self.learned).clone(),
            written_per_mille: self.written_per_mille.load(Ordering::Relaxed),
            fold_on_pool: self.fold_on_pool.load(Ordering::Relaxed),
        }
    }

    /// Replaces what the executor carries to the next block with `learned`. A benchmark that
    /// runs one block several times restores it before each run, so that no run profits from
    /// what an earlier run of the same block taught (a node never sees a block twice).
    pub fn restore_learned(&self, learned: LearnedSchedule) {
        *lock(&self.learned) = learned.conflicts;
        self.written_per_mille
            .store(learned.written_per_mille, Ordering::Relaxed);
        self.fold_on_pool
            .store(learned.fold_on_pool, Ordering::Relaxed);
    }

    /// Ages what was learned by one block and adds the contracts whose calls were chained in
    /// `hints`' block for conflicting often.
    fn learn(&self, hints: Option<&hints::BlockHints>) {
        let mut learned = lock(&self.learned);
        learned.retain(|_, left| {
            *left -= 1;
            *left > 0
        });
        for contract in hints.into_iter().flat_map(|h| h.conflicted()) {
            if learned.len() < MAX_LEARNED || learned.contains_key(&contract) {
                learned.insert(contract, LEARNED_BLOCKS);
            }
        }
    }

    /// Whether `block` is large enough for the parallel path to pay for its set-up.
    fn worth_parallel(&self, block: &BlockWithSenders) -> bool {
        if self.config.scheduling.force_parallel_path {
            return !block.transactions.is_empty();
        }
        block.transactions.len() >= self.config.min_txs_for_parallel.max(1)
            && block_gas_estimate(block) >= self.config.min_gas_for_parallel
    }

    fn execute_parallel<DB: StateReader>(
        &self,
        pool: &rayon::ThreadPool,
        spec: &ChainParams,
        block: &BlockWithSenders,
        db: &DB,
        hook: Option<Box<dyn OnStateHook>>,
    ) -> Result<(BlockOutput, CommitStats), ExecutionError> {
        let started = std::time::Instant::now();
        let env = evm_env(spec, block);
        let coinbase = block.header.beneficiary;
        let cancun = spec.is_cancun_active_at_timestamp(block.header.timestamp);
        // Before Spurious Dragon a touched empty account survives, and the rebase of a lazily
        // paid fee assumes post-EIP-161 semantics; such old blocks pay the fee eagerly.
        let lazy_ok = env.cfg_env.spec.is_enabled_in(SpecId::SPURIOUS_DRAGON);
        let mut hint_job = Some(HintJob {
            coinbase,
            lazy_recipients: self.config.scheduling.lazy_recipients && lazy_ok,
            chain_fallback: self.config.scheduling.chain_fallback,
            learned: self
                .config
                .scheduling
                .learn_conflicts
                .then(|| lock(&self.learned).keys().copied().collect()),
        });

        let mut state = block_state(db, block);
        // Every commit on the committer's state (system calls, exact and validated
        // transactions, deferred fees, post-block changes) reaches the hook in order.
        state.set_state_hook(hook);
        let n = block.transactions.len();
        // The shards share the block state's hasher (see `Transitions::new`).
        let hasher = state
            .transition_state
            .as_ref()
            .map(|t| t.transitions.hasher().clone())
            .unwrap_or_default();
        let fold_on_pool = match self.config.scheduling.transition_folding {
            TransitionFolding::Auto => self.fold_on_pool.load(Ordering::Relaxed),
            TransitionFolding::Committer => false,
            TransitionFolding::Pool => true,
        };
        // Unused unless the pool folds: then without room, which would cost megabytes a block.
        let transitions = transitions::Transitions::new(if fold_on_pool { n } else { 0 }, &hasher);
        let evm = EthEvmFactory::default().create_evm(&mut state, env.clone());
        let mut executor = EthBlockExecutor::new(
            evm,
            execution_ctx(block),
            spec,
            AlloyReceiptBuilder::default(),
        );

        // Room for the locations the last block wrote per transaction, and a quarter more; at
        // least one per four transactions, so that a block after one that wrote next to nothing
        // (a chain left to the committer) does not grow its maps from empty.
        let expected =
            (n.saturating_mul(self.written_per_mille.load(Ordering::Relaxed)) / 800).max(n / 4);
        let mv = MvMemory::with_capacity(expected, n);
        let new_code = NewCode::default();
        let shared = SpecShared {
            db,
            mv: &mv,
            new_code: &new_code,
            coinbase,
            lazy_coinbase: self.config.scheduling.lazy_coinbase && lazy_ok,
        };
        let sched = Scheduler::new(
            n,
            std::thread::current(),
            self.config.scheduling.respeculate,
        );
        let workers = self.config.threads.saturating_sub(1);

        let mut stats = None;
        // Whether the committed transitions were still queued at the block's end (not handed
        // back to `revm::State` by a switch to sequential).
        let mut queued = fold_on_pool;
        let recycler = recycle::Recycler::default();
        let committed = pool.in_place_scope(|scope| {
            for index in 0..workers {
                let (sched, shared, env, recycler) = (&sched, &shared, env.clone(), &recycler);
                let transitions = &transitions;
                // The first worker (the only one to find the job) builds the hints while the
                // committer runs the system calls and starts executing the first transactions
                // exactly: both cores are busy from the start.
                let hint_job = hint_job.take();
                scope.spawn(move |_| {
                    let run = catch_unwind(AssertUnwindSafe(|| {
                        let ctx = WorkerCtx {
                            sched,
                            shared,
                            block,
                            recycler,
                            transitions: fold_on_pool.then_some(transitions),
                            index,
                        };
                        worker(ctx, env, hint_job);
                    }));
                    if let Err(panic) = run {
                        sched.record_panic(panic_message(panic.as_ref()));
                    }
                });
            }
            let run = catch_unwind(AssertUnwindSafe(|| {
                // The system calls before the transactions run exactly, on the committed state.
                // Their writes (two system contracts' storage) are not visible to speculation; a
                // transaction that reads them fails validation and is re-executed exactly.
                executor.apply_pre_execution_changes()?;
                let start_ns = started.elapsed().as_nanos() as u64;
                let mut committer = Committer {
                    executor: &mut executor,
                    block,
                    sched: &sched,
                    shared: &shared,
                    speculator: Speculator::new(&shared, env.clone()),
                    cancun,
                    stats: CommitStats::default(),
                    fees: Default::default(),
                    recycler: &recycler,
                    spent: Vec::new(),
                    presize: None,
                    // With no worker, nothing else would ever execute a transaction.
                    speculate_all: self.config.scheduling.speculate_all && workers > 0,
                    transitions: fold_on_pool.then(|| transitions.writer()),
                };
                let result = committer.run();
                stats = Some(CommitStats {
                    start_ns,
                    ..committer.stats
                });
                queued = committer.transitions.is_some();
                recycler.give_all(&mut committer.spent);
                result
            }));
            // Whatever happened, the workers stop now.
            sched.stop();
            match run {
                Ok(result) => result,
                Err(panic) => Err(ExecutionError::WorkerPanic(panic_message(panic.as_ref()))),
            }
        });
        if let Some(message) = sched.panic_message() {
            return Err(ExecutionError::WorkerPanic(message));
        }
        if self.config.scheduling.learn_conflicts {
            self.learn(sched.hints());
        }
        if let Some(per_mille) = (mv.locations() * 1_000).checked_div(n) {
            self.written_per_mille.store(per_mille, Ordering::Relaxed);
        }
        // A block that went sequential says nothing about the pool's spare time.
        let pool_ns = started.elapsed().as_nanos() as f64 * workers as f64;
        if !sched.is_sequential() && pool_ns > 0.0 {
            let spare = sched.spare_ns() as f64 / pool_ns;
            self.fold_on_pool
                .store(spare >= POOL_FOLDING_SPARE, Ordering::Relaxed);
        }
        committed?;
        let finishing = std::time::Instant::now();
        let result = executor.apply_post_execution_changes()?;
        let block_transitions = state.transition_state.get_or_insert_with(Default::default);
        let folded = if queued {
            // The post-block changes (system calls, the DAO drain, balance increments) are
            // folded by `revm::State` together, as one commit's (see
            // `Transitions::push_folded`). That equals folding them one by one: they change
            // storage in different system contracts, and the balance changes carry no
            // storage. The one case that folds differently, an account destroyed and changed
            // again within them, needs an empty account, which has no storage to clear.
            transitions.push_folded(block_transitions);
            transitions.fold_all(pool)
        } else {
            vec![std::mem::take(block_transitions)]
        };
        let (bundle, transitions) = merge::merge_and_take(pool, &mut state, folded);
        let stats = stats.map(|s| CommitStats {
            finish_ns: finishing.elapsed().as_nanos() as u64,
            pool_spare_ns: sched.spare_ns(),
            pool_folded: queued,
            respeculated: sched.respeculated(),
            ..s
        });
        *lock(&self.last_stats) = stats;
        // Freeing the block's speculative data and caches takes time the caller need not wait for:
        // the pool thread does it while this one returns.
        let cache = std::mem::take(&mut state.cache);
        let freeing = Freeing::start(&self.freeing);
        pool.spawn(move || {
            drop((mv, sched, new_code, cache, transitions, recycler));
            drop(freeing);
        });
        let output = BlockOutput {
            receipts: result.receipts,
            gas_used: result.gas_used,
            blob_gas_used: result.blob_gas_used,
            requests: result.requests,
            bundle,
        };
        Ok((output, stats.unwrap_or_default()))
    }

    /// Executes `block` as [`ExecuteBlock::execute`] does, and says what the committer did
    /// when the block took the parallel path (`None`: it ran sequentially). Unlike
    /// [`Self::last_stats`], the statistics belong to this call when several threads share the
    /// executor.
    pub fn execute_with_stats<DB: StateReader>(
        &self,
        spec: &ChainParams,
        block: &BlockWithSenders,
        state: &DB,
    ) -> Result<(BlockOutput, Option<CommitStats>), ExecutionError> {
        self.execute_with_state_hook(spec, block, state, None)
    }

    /// [`Self::execute_with_stats`], handing `hook` every state change committed during the
    /// block as it is committed, in the order and form `revm::State::commit` hands its own
    /// state hook: the system calls', each transaction's (as the committer commits it, while
    /// later ones still execute), the deferred coinbase fees', the post-block changes'. A node's
    /// state-root task can so hash the block's changes while the block executes, as it does
    /// for the sequential executor. A block that fails part-way leaves the hook with the
    /// changes committed until then.
    pub fn execute_with_state_hook<DB: StateReader>(
        &self,
        spec: &ChainParams,
        block: &BlockWithSenders,
        state: &DB,
        hook: Option<Box<dyn OnStateHook>>,
    ) -> Result<(BlockOutput, Option<CommitStats>), ExecutionError> {
        // A panic anywhere (a state reader's, the system calls', the scheduler's, an exact
        // execution's) rejects the block on either path; the block's state is dropped with it,
        // so nothing partial survives. A speculative execution's panic only sends its
        // transaction to the exact path (`Speculator::run`).
        let started = std::time::Instant::now();
        let pool = self.pool.as_ref().filter(|_| self.worth_parallel(block));
        let result = catch_unwind(AssertUnwindSafe(|| match pool {
            Some(pool) => self
                .execute_parallel(pool, spec, block, state, hook)
                .map(|(output, stats)| (output, Some(stats))),
            None => sequential::execute_block_with_hook(spec, block, state, hook)
                .map(|output| (output, None)),
        }))
        .unwrap_or_else(|panic| Err(ExecutionError::WorkerPanic(panic_message(panic.as_ref()))));
        let (recorded, stats) = match result {
            Ok((output, stats)) => (Ok(output), stats),
            Err(e) => (Err(e), None),
        };
        crate::metrics::record_block(
            self.name(),
            if pool.is_some() {
                "parallel"
            } else {
                "sequential"
            },
            block.transactions.len(),
            &recorded,
            started.elapsed(),
        );
        if let Some(stats) = &stats {
            crate::metrics::record_commit(stats);
        }
        recorded.map(|output| (output, stats))
    }
}

/// What the hint-building worker needs besides the block.
#[derive(Debug)]
struct HintJob {
    coinbase: Address,
    lazy_recipients: bool,
    chain_fallback: bool,
    /// Contracts whose undecoded calls are chained from the start (`None`: all of them).
    learned: Option<hints::LearnedConflicts>,
}

/// What a pool thread shares with the block's other threads.
struct WorkerCtx<'a, DB> {
    sched: &'a Scheduler,
    shared: &'a SpecShared<'a, DB>,
    block: &'a BlockWithSenders,
    recycler: &'a recycle::Recycler,
    /// The block's transitions, when the pool folds them.
    transitions: Option<&'a transitions::Transitions>,
    /// This worker's place among the pool threads (where its folding starts).
    index: usize,
}

/// A pool thread's loop for one block: take a transaction, execute it speculatively, publish
/// its writes, continue with a dependant it released (chains stay on one thread). With a
/// `hint_job`, it first builds and publishes the block's hints.
/// Before a new transaction it takes a stale result back to run it again, if one is queued
/// (see `Scheduler::suspect`). Between transactions, and when it has none, it folds
/// committed transitions.
fn worker<DB: StateReader>(
    ctx: WorkerCtx<'_, DB>,
    env: alloy_evm::EvmEnv,
    hint_job: Option<HintJob>,
) {
    let WorkerCtx {
        sched,
        shared,
        block,
        recycler,
        transitions,
        index,
    } = ctx;
    if let Some(job) = hint_job {
        let hints = hints::build(
            &block.transactions,
            job.coinbase,
            job.lazy_recipients,
            job.learned.as_ref(),
        );
        // A block that is mostly one chain gains nothing from speculation on any number of
        // threads, while speculating it costs a re-execution per link: leave it to the
        // committer alone.
        if job.chain_fallback && hints.longest_chain * 2 > block.transactions.len() {
            sched.go_sequential();
            return;
        }
        sched.set_hints(hints);
    }
    let mut speculator = Speculator::new(shared, env);
    let mut next = None;
    while !sched.stopped() && !sched.is_sequential() {
        recycler.free_returned();
        // A backlog is folded before the next transaction. That is not spare time: a pool
        // whose threads fold only so is too busy to keep folding for the committer.
        if let Some(transitions) = transitions
            && transitions.worth_folding()
        {
            transitions.fold_some(index);
        }
        // A stale result near the committer comes before speculating further ahead.
        let (next_tx, previous, rerun) = match next.take() {
            Some(j) => (Some(j), Vec::new(), false),
            None => match take_stale(sched, shared.mv) {
                Some((j, previous)) => (Some(j), previous, true),
                None => (sched.next_task(), Vec::new(), false),
            },
        };
        let Some(j) = next_tx else {
            // Nothing to execute: fold the committed transitions (spare time, see
            // `Scheduler::spare_ns`), or wait.
            if let Some(transitions) = transitions {
                let since = std::time::Instant::now();
                sched.wake_waiting_committer();
                if transitions.fold_some(index) {
                    sched.add_spare(since);
                    continue;
                }
            }
            sched.idle_wait();
            continue;
        };
        let Some(hints) = sched.hints() else {
            // Unreachable: `next_task` hands out nothing before the hints are published.
            break;
        };
        let tx = &block.transactions[j as usize];
        let outcome = loop {
            let (lazy, publish) = (hints.lazy_recipient[j as usize], hints.publish[j as usize]);
            match speculator.run(j, tx, lazy, publish, &previous) {
                SpecRun::Done(mut outcome) => {
                    outcome.rerun = rerun;
                    break outcome;
                }
                SpecRun::Blocked(writer) => {
                    // The committer is re-executing `writer`; its new values come within
                    // microseconds.
                    while sched.status(writer) != COMMITTED {
                        if sched.stopped() {
                            return;
                        }
                        std::thread::yield_now();
                    }
                }
            }
        };
        next = sched.finish(j, outcome, true);
        sched.suspect(&speculator.next_writers);
    }
}

/// The lowest suspect whose result the multi-version memory now shows stale, taken back for
/// this thread to execute again, with the locations its stale run published. Suspects found
/// current are dropped: a later write below them queues them again.
fn take_stale(sched: &Scheduler, mv: &MvMemory) -> Option<(TxIdx, Vec<Location>)> {
    while let Some(tx) = sched.next_suspect() {
        if let Some(mut stale) = sched.reclaim(tx, |o| spec::stale_in(mv, tx, &o.reads)) {
            if let Some(hints) = sched.hints() {
                hints.call_checked(tx, true);
            }
            // Its allocations may be another thread's; freed here all the same (rare).
            return Some((tx, std::mem::take(&mut stale.written)));
        }
    }
    None
}

fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".to_string())
}

impl ExecuteBlock for ParallelExecutor {
    fn name(&self) -> &'static str {
        "parallel"
    }

    fn execute<DB: StateReader>(
        &self,
        spec: &ChainParams,
        block: &BlockWithSenders,
        state: &DB,
    ) -> Result<BlockOutput, ExecutionError> {
        self.execute_with_stats(spec, block, state)
            .map(|(output, _)| output)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The cascade re-speculation breaks: transaction 1 ran on transaction 0's speculative
    /// value; the committer's exact run of 0 writes another, which names 1 a suspect, and a
    /// pool thread finds it stale and takes it back with the location it published.
    #[test]
    fn an_exact_rewrite_below_hands_a_stale_result_back_to_the_pool() {
        use alloy_primitives::U256;
        use mv::MvValue;
        use sched::{DONE, RUNNING};
        use spec::{Read, SpecOutcome};
        let (mv, sched) = (
            MvMemory::new(),
            Scheduler::new(8, std::thread::current(), true),
        );
        let slot = Location::Storage(Address::repeat_byte(1), U256::from(1));
        let value = |v: u64| [(slot, MvValue::Storage(U256::from(v)))];
        let mut next = Vec::new();
        for (tx, reads, wrote) in [(0, vec![], 1), (1, vec![1], 2), (2, vec![2], 3)] {
            assert!(sched.try_claim(tx));
            mv.write(tx, 0, &value(wrote), &[], &mut next);
            let mut outcome = SpecOutcome::failed(
                reads
                    .into_iter()
                    .map(|v| Read::Storage {
                        address: Address::repeat_byte(1),
                        slot: U256::from(1),
                        value: U256::from(v),
                        base: false,
                    })
                    .collect(),
                std::thread::current().id(),
            );
            outcome.written = vec![slot];
            sched.finish(tx, outcome, false);
        }
        // In order, nobody above had written yet.
        assert!(next.is_empty());
        assert!(take_stale(&sched, &mv).is_none());
        // The same value again (an exact run that agrees) makes 1 a suspect, found current.
        mv.write(0, 1, &value(1), &[], &mut next);
        assert_eq!(next, [1]);
        sched.suspect(&next);
        assert!(take_stale(&sched, &mv).is_none());
        assert_eq!(sched.status(1), DONE);
        // Another value: 1 is stale, and back to RUNNING for this thread.
        next.clear();
        mv.write(0, 1, &value(7), &[], &mut next);
        sched.suspect(&next);
        assert_eq!(take_stale(&sched, &mv), Some((1, vec![slot])));
        assert_eq!(sched.status(1), RUNNING);
        assert_eq!(sched.respeculated(), 1);
    }

    #[test]
    fn executor_is_send_and_sync() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<ParallelExecutor>();
    }

    #[test]
    fn one_thread_runs_without_a_pool() {
        let executor = ParallelExecutor::with_threads(1);
        assert!(executor.pool.is_none());
        assert_eq!(executor.name(), "parallel");
    }
}
