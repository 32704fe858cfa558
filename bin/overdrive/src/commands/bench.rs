use super::split::{SplitReference, SplitTiming};
use clap::{Args, Subcommand, ValueEnum};
use eyre::WrapErr;
use overdrive_bench::{process_cpu_time, round};
use overdrive_executor::{
    BlockOutput, ExecuteBlock, ParallelConfig, ParallelExecutor, Scheduling, SequentialExecutor,
    TransitionFolding,
};
use overdrive_primitives::{BlockWithSenders, ChainParams, MemState};
use overdrive_workload::{WorkloadConfig, WorkloadKind};
use serde::Serialize;
use std::time::{Duration, Instant};

/// `--prefault-heap`'s default: more than the heap grew by in any measured run (≈ 320 MiB
/// over the runs of 1-gigagas transfer blocks).
const DEFAULT_PREFAULT_HEAP_MIB: usize = 1024;

/// `--transition-folding`: [`TransitionFolding`] on the command line.
#[derive(Debug, Clone, Copy, ValueEnum)]
enum FoldingArg {
    Auto,
    Committer,
    Pool,
}

impl From<FoldingArg> for TransitionFolding {
    fn from(arg: FoldingArg) -> Self {
        match arg {
            FoldingArg::Auto => Self::Auto,
            FoldingArg::Committer => Self::Committer,
            FoldingArg::Pool => Self::Pool,
        }
    }
}

#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// Block execution: every executor on the same generated blocks, in one run.
    Exec(ExecArgs),
    /// State root: full rebuild, reth-style incremental, and overdrive's trie on 1 and N
    /// threads, on the same ERC20-shaped update sets.
    Trie(TrieArgs),
    /// A node under load: pre-signed transactions sent over JSON-RPC, TPS and latency
    /// measured from the chain; `--compare` runs stock reth and overdrive-reth.
    Load(super::load::LoadArgs),
    /// An exported chain replayed into a fresh node through the Engine API (newPayload,
    /// forkchoiceUpdated), stock reth against overdrive-reth: the validation path's gas/s.
    Replay(super::load::replay::ReplayArgs),
    /// Transaction intake alone (no blocks built): a node's CPU time per accepted
    /// transaction, stock reth (one `eth_sendRawTransaction` each, then with reth's batched
    /// insertion) against `--overdrive.pool` (with `eth_sendRawTransaction` batched, then with
    /// `overdrive_sendRawTransactions`).
    Intake(super::load::intake::IntakeArgs),
    /// The pipeline's state root stage in `import` of an exported chain (from genesis, then
    /// incremental): reth's `MerkleExecute` against `--overdrive.merkle-stage`.
    Merkle(super::load::merkle::MerkleArgs),
}

/// How both benchmarks treat the heap.
#[derive(Debug, Args)]
struct HeapArgs {
    /// MiB of heap to touch and free before measuring, with no freed memory going back to the
    /// OS during the run: the measured blocks run on a warm heap, as a running node's do,
    /// rather than paying page faults for the heap's growth (see `BENCHMARKS.md`). 0 measures
    /// a fresh process's heap with the allocator's usual settings.
    #[arg(long, value_name = "MIB", default_value_t = DEFAULT_PREFAULT_HEAP_MIB,
        value_parser = super::prefault_mib)]
    prefault_heap: usize,
}

impl HeapArgs {
    /// On a warm heap, keeps freed memory with the process for the run. Call it first, before
    /// the set-up starts any thread.
    fn keep_freed_memory(&self) {
        if self.prefault_heap > 0 {
            crate::allocator::keep_freed_memory();
        }
    }
}

#[derive(Debug, Args)]
pub struct TrieArgs {
    /// Accounts in the state (the token's storage holds one balance slot per account).
    #[arg(long, default_value_t = 100_000)]
    accounts: usize,
    /// Measured blocks (one more warms up).
    #[arg(long, default_value_t = 10, value_parser = super::positive)]
    blocks: usize,
    /// Threads of overdrive's parallel run.
    #[arg(long, default_value_t = 2, value_parser = super::positive)]
    threads: usize,
    /// Token transfers per block (each changes a sender account and two token slots).
    #[arg(long, default_value_t = 6_000, value_parser = super::positive)]
    transfers: usize,
    /// Seed of the state and the update sets.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Leave the tries' workers unpinned (by default each is pinned to its own core when
    /// there are enough cores).
    #[arg(long)]
    no_pin: bool,
    /// After each block, also measure `threads` one-thread tries side by side, each on its own
    /// core and its own copy of the state, against the same one after another: what the cores
    /// give for this work here, the yardstick of (d). Adds `co_run_speedup` to the JSON.
    #[arg(long)]
    co_run_reference: bool,
    /// Keep one copy of the trie instead of two: (c) and (d) take turns on one store, each
    /// applying the block right after its own trie took the store back to the block's
    /// pre-state (an untimed apply of the previous values). Halves the tries' memory: 10M
    /// accounts fit in 24 GiB with it. Implies `--evict-caches`.
    #[arg(long, conflicts_with = "co_run_reference")]
    one_store: bool,
    /// Before (c) and before (d), every core writes twice its share of each cache, so that
    /// both start with nothing of the trie in any cache.
    #[arg(long)]
    evict_caches: bool,
    #[command(flatten)]
    heap: HeapArgs,
    /// Print a JSON object as the last line.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
pub struct ExecArgs {
    /// transfer | erc20 | uniswap | hybrid | chained | allowance | router | compute | exchange
    #[arg(long, default_value = "erc20")]
    workload: WorkloadKind,
    /// Funded accounts in the generated genesis.
    #[arg(long, default_value_t = 100_000)]
    accounts: usize,
    /// Transactions per block.
    #[arg(long, default_value_t = 6_000, value_parser = super::positive)]
    txs: usize,
    /// Instead of `--txs`: fill each block with about this much gas (1000000000 for the
    /// 1-gigagas mega-block). The transactions per block follow from the gas a sample block of
    /// the workload uses, executed first.
    #[arg(long, conflicts_with = "txs")]
    block_gas: Option<u64>,
    /// Blocks to execute (each on the state the previous one left).
    #[arg(long, default_value_t = 5, value_parser = super::positive)]
    blocks: usize,
    /// Worker threads of the parallel executor.
    #[arg(long, default_value_t = 2, value_parser = super::positive)]
    threads: usize,
    /// Timed runs of each executor on each block, in an order that rotates; the median counts.
    #[arg(long, default_value_t = 3, value_parser = super::positive)]
    repeat: usize,
    /// Untimed runs of each executor on the first block before measuring (cold instruction
    /// caches and thread start-up would otherwise land in block 1's timings).
    #[arg(long, default_value_t = 1, help_heading = "Experiments")]
    warmup: usize,
    #[command(flatten)]
    heap: HeapArgs,
    /// Workload seed.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Hybrid workload: share of transactions touching a hot account or pair.
    #[arg(long, default_value_t = 0.3, help_heading = "Experiments")]
    hot_share: f64,
    /// Share of transactions sent by a few hot senders.
    #[arg(long, default_value_t = 0.0, help_heading = "Experiments")]
    sender_skew: f64,
    /// Uniswap workload: number of independent pairs.
    #[arg(long, default_value_t = 300)]
    pairs: usize,
    /// Blocks with fewer transactions take the parallel executor's sequential path.
    #[arg(long, default_value_t = overdrive_executor::DEFAULT_MIN_TXS_FOR_PARALLEL, help_heading = "Experiments")]
    min_parallel_txs: usize,
    /// Blocks whose gas (the header's gas used, else the sum of the transactions' gas limits)
    /// is lower take the parallel executor's sequential path.
    #[arg(long, default_value_t = overdrive_executor::DEFAULT_MIN_GAS_FOR_PARALLEL, help_heading = "Experiments")]
    min_parallel_gas: u64,
    /// Which thread folds the committed state changes into the block's transitions: `auto`
    /// (the pool when its threads had a quarter of their time to spare in the last parallel
    /// block), `committer` or `pool`.
    #[arg(long, value_enum, default_value_t = FoldingArg::Auto, help_heading = "Experiments")]
    transition_folding: FoldingArg,
    /// Leave every stale speculative result to the committer's exact re-run, instead of
    /// having pool threads find and execute such results again first.
    #[arg(long, help_heading = "Experiments")]
    no_respeculate: bool,
    /// Also measure an ideal partitioned executor on every block: the block cut into
    /// `--threads` parts that share no sender and no plain-transfer recipient, each run
    /// sequentially on its own state, one after another and then at once (see `split.rs`).
    /// Two more runs per repeat, alternating with the measured pair; the speedup is measured
    /// as without it.
    #[arg(long, help_heading = "Experiments")]
    split_reference: bool,
    /// Print a JSON object as the last line.
    #[arg(long)]
    json: bool,
}

/// The `--json` line of `bench exec`. Field names are a published contract.
#[derive(Debug, Serialize)]
struct ExecReport {
    bench: &'static str,
    workload: String,
    accounts: usize,
    txs: usize,
    threads: usize,
    gas_per_block: u64,
    sequential_tx_per_s: f64,
    parallel_tx_per_s: Option<f64>,
    /// Sequential time over parallel: the parallel executor against reth's own executor
    /// (alloy-evm `EthBlockExecutor` over `revm::State`), what a node gains.
    speedup: Option<f64>,
    /// The parallel executor on one thread, forced onto its parallel path (the committer
    /// executes every transaction), over the same on `threads` threads: what the threads
    /// add, apart from what the parallel path gains on one thread. Absent with one thread.
    #[serde(skip_serializing_if = "Option::is_none")]
    scaling: Option<f64>,
    cpu_ratio: Option<f64>,
    equal: Option<bool>,
    /// Blocks whose transactions ran on more than one thread (some committed results came
    /// from pool threads).
    parallel_blocks: usize,
    /// Blocks on the parallel path that the committer ran alone (a chain, or workers that
    /// never got ahead). The rest fell below the parallel thresholds (`--min-parallel-txs`,
    /// `--min-parallel-gas`) and ran sequentially.
    committer_alone_blocks: usize,
    /// Transactions that reverted, over all blocks: the generated workloads expect none, so a
    /// figure over mostly failing transactions is recognised as such.
    reverted: usize,
    /// With `--split-reference`: the same blocks cut into `threads` parts that share no
    /// sender, run one after another over run at once (an ideal partitioned executor's
    /// speedup, without its merge).
    #[serde(skip_serializing_if = "Option::is_none")]
    split_speedup: Option<f64>,
    /// When every block took the parallel path: the sequential time over the committing
    /// thread's serial time ([`overdrive_executor::CommitStats::serial_ns`]), the speedup
    /// that no thread count can pass while the committer does this much per block (Amdahl's
    /// bound), measured on this run's thread count.
    #[serde(skip_serializing_if = "Option::is_none")]
    committer_bound: Option<f64>,
    /// Blocks whose every parallel run folded the state transitions on the pool (see
    /// `--transition-folding`).
    pool_folded_blocks: usize,
    /// Per block, from each block's last parallel run: speculative results that failed
    /// validation (each executed again by the committer, serially), and results the pool
    /// executed again first (`--no-respeculate` turns that off).
    invalid_per_block: f64,
    respeculated_per_block: f64,
}

pub fn run(cmd: BenchCommand) -> eyre::Result<()> {
    match cmd {
        BenchCommand::Exec(args) => exec(args),
        BenchCommand::Trie(args) => trie(args),
        BenchCommand::Load(args) => super::load::run(args),
        BenchCommand::Replay(args) => super::load::replay::run(args),
        BenchCommand::Intake(args) => super::load::intake::run(args),
        BenchCommand::Merkle(args) => super::load::merkle::run(args),
    }
}

fn trie(args: TrieArgs) -> eyre::Result<()> {
    args.heap.keep_freed_memory();
    let config = overdrive_bench::trie::TrieBenchConfig {
        accounts: args.accounts,
        blocks: args.blocks,
        threads: args.threads,
        transfers: args.transfers,
        seed: args.seed,
        pin_workers: !args.no_pin,
        prefault_heap_mib: args.heap.prefault_heap,
        co_run_reference: args.co_run_reference,
        one_store: args.one_store,
        evict_caches: args.evict_caches,
    };
    let report = overdrive_bench::trie::run(&config)?;
    println!("{report}");
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    }
    if !report.roots_equal {
        eyre::bail!("state roots differ between the four methods");
    }
    Ok(())
}

/// Wall and CPU time of one timed execution.
#[derive(Debug, Clone, Copy, Default)]
struct Timing {
    wall: Duration,
    cpu: Duration,
}

impl Timing {
    fn add(&mut self, other: Self) {
        self.wall += other.wall;
        self.cpu += other.cpu;
    }
}

/// One timed execution of `block` by `executor`.
fn timed_once<E: ExecuteBlock>(
    executor: &E,
    spec: &ChainParams,
    block: &BlockWithSenders,
    state: &MemState,
) -> eyre::Result<(BlockOutput, Timing)> {
    let (cpu0, wall0) = (process_cpu_time(), Instant::now());
    let out = executor
        .execute(spec, block, state)
        .wrap_err_with(|| format!("{} failed on block {}", executor.name(), block.number()))?;
    let timing = Timing {
        wall: wall0.elapsed(),
        cpu: process_cpu_time() - cpu0,
    };
    Ok((out, timing))
}

/// What [`timed_runs`] measured on one block.
struct Pair {
    /// The sequential executor's output (of the last run).
    output: BlockOutput,
    seq: Timing,
    par: Timing,
    /// The parallel executor forced onto one thread, when measured (see [`timed_runs`]).
    one: Option<Timing>,
    /// Whether every parallel run's output (the one-thread runs' included) equalled the
    /// sequential run's beside it.
    equal: bool,
    /// Whether the parallel executor took its parallel path (not its small-block fallback).
    parallel_path: bool,
    /// Whether, in every run, pool threads speculated some of the committed transactions
    /// ([`overdrive_executor::CommitStats::multi_threaded`]): not a block the committer ran
    /// alone.
    multi_threaded: bool,
    /// The median split-reference measurement (by concurrent wall), when one was asked for.
    split: Option<SplitTiming>,
    /// The committing thread's median serial time over the runs that took the parallel path
    /// ([`overdrive_executor::CommitStats::serial_ns`]).
    committer_serial: Duration,
    /// Whether every parallel run folded its transitions on the pool
    /// ([`overdrive_executor::CommitStats::pool_folded`]).
    pool_folded: bool,
}

/// Milliseconds to the microsecond, for the logs.
fn ms(d: Duration) -> f64 {
    round(d.as_secs_f64() * 1e3, 3)
}

/// The median (by wall time) of `timings`.
fn median(mut timings: Vec<Timing>) -> Timing {
    timings.sort_by_key(|t| t.wall);
    timings.get(timings.len() / 2).copied().unwrap_or_default()
}

/// One timed run of a [`ParallelExecutor`], its pool's freeing of the block's data included:
/// that CPU time belongs to this run, and it must not overlap the next measured one.
fn timed_parallel(
    executor: &ParallelExecutor,
    spec: &ChainParams,
    block: &BlockWithSenders,
    state: &MemState,
) -> eyre::Result<(BlockOutput, Option<overdrive_executor::CommitStats>, Timing)> {
    let (cpu0, wall0) = (process_cpu_time(), Instant::now());
    let (out, stats) = executor
        .execute_with_stats(spec, block, state)
        .wrap_err_with(|| format!("{} failed on block {}", executor.name(), block.number()))?;
    let wall = wall0.elapsed();
    executor.wait_for_freeing();
    let timing = Timing {
        wall,
        cpu: process_cpu_time() - cpu0,
    };
    Ok((out, stats, timing))
}

/// Runs the sequential executor, the parallel executor and, when given, the parallel executor
/// forced onto one thread (`one`) on `block`, `repeat` times each, and returns the output,
/// median timings and whether every output was equal to the sequential one beside it (a
/// difference in any run is a difference).
///
/// The order rotates from one repeat to the next (sequential first, then parallel first, then
/// the one-thread run first, ...), so that neither a change in the machine's speed during the
/// measurement (another tenant of a shared host) nor what one run leaves in the caches and the
/// allocator falls on one executor only. The first repeat runs the sequential executor first:
/// it sets the header's gas used before the parallel executor sees the block (the generated
/// headers leave it at zero, a block a node validates carries it, and the parallel executor's
/// small-block fallback reads it).
///
/// With a `split` reference, each repeat measures it after the others, so that it sees the
/// machine as they did.
fn timed_runs(
    parallel: &ParallelExecutor,
    one: Option<&ParallelExecutor>,
    spec: &ChainParams,
    block: &mut BlockWithSenders,
    state: &MemState,
    repeat: usize,
    split: Option<&SplitReference>,
) -> eyre::Result<Pair> {
    let (mut seq, mut par, mut ones, mut splits) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut serial = Vec::new();
    let (mut output, mut equal, mut parallel_path, mut multi_threaded, mut pool_folded) =
        (None, true, true, true, true);
    // Each run starts from what the executor knew before the block: a repeat must not
    // schedule by what an earlier run of this very block taught it.
    let learned = (parallel.learned(), one.map(ParallelExecutor::learned));
    let runners = if one.is_some() { 3 } else { 2 };
    for r in 0..repeat.max(1) {
        parallel.restore_learned(learned.0.clone());
        if let (Some(one), Some(learned)) = (one, &learned.1) {
            one.restore_learned(learned.clone());
        }
        let mut outputs = Vec::new();
        for k in 0..runners {
            match (r + k) % runners {
                0 => {
                    let (out, s) = timed_once(&SequentialExecutor, spec, block, state)?;
                    block.header.gas_used = out.gas_used;
                    seq.push(s);
                    output = Some(out);
                }
                1 => {
                    let (out, stats, p) = timed_parallel(parallel, spec, block, state)?;
                    par.push(p);
                    parallel_path &= stats.is_some();
                    multi_threaded &= stats.is_some_and(|s| s.multi_threaded());
                    pool_folded &= stats.is_some_and(|s| s.pool_folded);
                    serial.extend(stats.map(|s| Duration::from_nanos(s.serial_ns())));
                    outputs.push(out);
                }
                _ => {
                    let one = one.ok_or_else(|| eyre::eyre!("no one-thread executor"))?;
                    let (out, _, o) = timed_parallel(one, spec, block, state)?;
                    ones.push(o);
                    outputs.push(out);
                }
            }
        }
        let reference = output
            .as_ref()
            .ok_or_else(|| eyre::eyre!("no sequential run"))?;
        equal &= outputs.iter().all(|out| out == reference);
        drop(outputs);
        if let Some(split) = split {
            splits.push(split.measure(spec, state)?);
        }
    }
    splits.sort_by_key(|s| s.concurrent);
    serial.sort();
    Ok(Pair {
        output: output.ok_or_else(|| eyre::eyre!("no run"))?,
        seq: median(seq),
        par: median(par),
        one: (!ones.is_empty()).then(|| median(ones)),
        equal,
        parallel_path,
        multi_threaded,
        split: splits.get(splits.len() / 2).copied(),
        committer_serial: serial.get(serial.len() / 2).copied().unwrap_or_default(),
        pool_folded,
    })
}

/// Transactions per block that use about `gas` in a block of `config`'s workload, from the
/// average gas of a sample block executed sequentially.
fn txs_for_gas(config: &WorkloadConfig, gas: u64) -> eyre::Result<usize> {
    eyre::ensure!(gas > 0, "--block-gas must be at least 1");
    let sample = overdrive_workload::generate(&WorkloadConfig {
        txs_per_block: 1_000,
        blocks: 1,
        ..config.clone()
    })?;
    let block = sample
        .blocks
        .first()
        .ok_or_else(|| eyre::eyre!("empty sample workload"))?;
    let out = SequentialExecutor.execute(&sample.chain_spec, block, &sample.genesis)?;
    let per_tx = (out.gas_used / block.transactions.len().max(1) as u64).max(1);
    Ok(usize::try_from(gas.div_ceil(per_tx))?)
}

fn exec(args: ExecArgs) -> eyre::Result<()> {
    args.heap.keep_freed_memory();
    let mut config = WorkloadConfig {
        kind: args.workload,
        accounts: args.accounts,
        txs_per_block: args.txs,
        blocks: args.blocks,
        seed: args.seed,
        hot_share: args.hot_share,
        sender_skew: args.sender_skew,
        pairs: args.pairs,
    };
    if let Some(gas) = args.block_gas {
        config.txs_per_block = txs_for_gas(&config, gas)?;
        tracing::info!(
            gas,
            txs_per_block = config.txs_per_block,
            "mega-block: transactions per block from a sample block's gas"
        );
    }
    let started = Instant::now();
    let mut workload = overdrive_workload::generate(&config)?;
    tracing::info!(elapsed = ?started.elapsed(), blocks = workload.blocks.len(), "workload generated");

    if args.heap.prefault_heap > 0 {
        let (mib, elapsed) = overdrive_bench::prefault_heap(args.heap.prefault_heap);
        tracing::info!(mib, ?elapsed, "heap prefaulted");
    }

    let spec = &workload.chain_spec;
    let parallel = ParallelExecutor::new(ParallelConfig {
        threads: args.threads,
        min_txs_for_parallel: args.min_parallel_txs,
        min_gas_for_parallel: args.min_parallel_gas,
        scheduling: Scheduling {
            transition_folding: args.transition_folding.into(),
            respeculate: !args.no_respeculate,
            ..Scheduling::default()
        },
    });
    // `scaling`'s reference: the same executor, on the parallel path, on one thread.
    let one = (args.threads > 1).then(|| {
        let config = parallel.config().clone();
        ParallelExecutor::new(ParallelConfig {
            threads: 1,
            scheduling: Scheduling {
                force_parallel_path: true,
                ..config.scheduling
            },
            ..config
        })
    });
    let mut state = workload.genesis.clone();
    let Some(first) = workload.blocks.first() else {
        eyre::bail!("the workload has no blocks");
    };
    let mut equal = true;
    // Warm-up runs teach the executor nothing: the first measured block is new to it.
    for executor in std::iter::once(&parallel).chain(one.as_ref()) {
        let learned = executor.learned();
        for _ in 0..args.warmup {
            let seq_out = SequentialExecutor.execute(spec, first, &state)?;
            equal &= executor.execute(spec, first, &state)? == seq_out;
            executor.wait_for_freeing();
        }
        executor.restore_learned(learned);
    }
    if !equal {
        tracing::error!("parallel output differs from sequential in a warm-up run");
    }
    let (mut seq, mut par, mut one_thread) = (Timing::default(), Timing::default(), None);
    let (mut txs, mut gas, mut reverted) = (0usize, 0u64, 0usize);
    // Blocks on the parallel path, and those of them whose transactions ran on more than one
    // thread (the others the committer ran alone).
    let (mut parallel_path_blocks, mut parallel_blocks) = (0usize, 0usize);
    if args.threads <= 1 {
        tracing::info!(
            "one thread: the parallel executor runs the sequential executor, no machinery"
        );
    }
    let mut round_trips = overdrive_bench::RoundTrips::default();
    let mut split_sum: Option<SplitTiming> = None;
    let mut committer_serial = Duration::ZERO;
    let mut pool_folded_blocks = 0;
    let (mut invalid, mut respeculated) = (0usize, 0usize);
    let mut split = if args.split_reference {
        SplitReference::new(args.threads)?
    } else {
        None
    };
    for block in &mut workload.blocks {
        // What a hand-off between the two cores costs right now (untimed; see
        // `core_round_trip`).
        let round_trip = round_trips.measure();
        // Same block, same pre-state, the two executors alternating in this process.
        if let Some(split) = split.as_mut() {
            split.cut(block, &state);
        }
        let pair = timed_runs(
            &parallel,
            one.as_ref(),
            spec,
            block,
            &state,
            args.repeat,
            split.as_ref(),
        )?;
        if let Some(o) = pair.one {
            one_thread.get_or_insert_with(Timing::default).add(o);
        }
        if let Some(c) = pair.split {
            let sum = split_sum.get_or_insert_with(SplitTiming::default);
            sum.serial += c.serial;
            sum.concurrent += c.concurrent;
            tracing::info!(
                block = block.number(),
                serial_ms = ms(c.serial),
                concurrent_ms = ms(c.concurrent),
                "split reference"
            );
        }
        let (out, t, p, block_equal) = (pair.output, pair.seq, pair.par, pair.equal);
        committer_serial += pair.committer_serial;
        pool_folded_blocks += usize::from(pair.pool_folded);
        if pair.parallel_path {
            parallel_path_blocks += 1;
            if pair.multi_threaded {
                parallel_blocks += 1;
            } else {
                tracing::info!(
                    block = block.number(),
                    "the committer ran the block alone (no pool thread's result committed)"
                );
            }
        } else if args.threads > 1 {
            tracing::warn!(
                block = block.number(),
                "below the parallel thresholds: the parallel executor ran it sequentially"
            );
        }
        if !block_equal {
            tracing::error!(
                block = block.number(),
                "parallel output differs from sequential"
            );
        }
        equal &= block_equal;
        let failed = out.receipts.iter().filter(|r| !r.status()).count();
        if failed > 0 {
            tracing::warn!(block = block.number(), failed, "transactions reverted");
        }
        reverted += failed;
        seq.add(t);
        par.add(p);
        txs += block.transactions.len();
        gas += out.gas_used;
        tracing::info!(
            block = block.number(),
            sequential_ms = ms(t.wall),
            parallel_ms = ms(p.wall),
            one_thread_ms = pair.one.map(|o| ms(o.wall)),
            core_round_trip_ns = round_trip.map(|t| t.as_nanos() as u64),
            "executed"
        );
        if let Some(stats) = parallel.last_stats() {
            invalid += stats.invalid;
            respeculated += stats.respeculated;
            // Where the committing thread's time went: the serial part of the parallel path.
            tracing::debug!(
                block = block.number(),
                validated = stats.validated,
                exact = stats.exact,
                invalid = stats.invalid,
                respeculated = stats.respeculated,
                helped = stats.helped,
                commit_ms = ms(Duration::from_nanos(stats.commit_ns)),
                exact_ms = ms(Duration::from_nanos(stats.exact_ns)),
                help_ms = ms(Duration::from_nanos(stats.help_ns)),
                wait_ms = ms(Duration::from_nanos(stats.wait_ns)),
                start_ms = ms(Duration::from_nanos(stats.start_ns)),
                finish_ms = ms(Duration::from_nanos(stats.finish_ns)),
                "committer"
            );
        }
        state.apply_bundle(&out.bundle);
    }

    let blocks = workload.blocks.len().max(1) as f64;
    println!(
        "{:>12} {:>12} {:>10} {:>10} {:>10}",
        "executor", "tx/s", "MGas/s", "ms/block", "cpu ms"
    );
    let rows = [
        ("sequential", Some(seq)),
        ("parallel", Some(par)),
        ("1 thread", one_thread),
    ];
    for (name, t) in rows.into_iter().filter_map(|(n, t)| t.map(|t| (n, t))) {
        let secs = t.wall.as_secs_f64();
        println!(
            "{:>12} {:>12.0} {:>10.1} {:>10.2} {:>10.1}",
            name,
            txs as f64 / secs,
            gas as f64 / secs / 1e6,
            secs * 1e3 / blocks,
            t.cpu.as_secs_f64() * 1e3,
        );
    }
    let speedup = seq.wall.as_secs_f64() / par.wall.as_secs_f64();
    let cpu_ratio = par.cpu.as_secs_f64() / seq.cpu.as_secs_f64();
    let scaling = one_thread.map(|o| o.wall.as_secs_f64() / par.wall.as_secs_f64());
    println!(
        "speedup {speedup:.2}x over reth's executor (alloy-evm EthBlockExecutor), cpu ratio \
         {cpu_ratio:.2}, threads {}, outputs {}",
        args.threads,
        if equal { "equal" } else { "DIFFER" },
    );
    if let Some(scaling) = scaling {
        println!(
            "scaling {scaling:.2}x over the same executor on one thread (its parallel path, \
             the committer alone)"
        );
    }
    println!(
        "{parallel_blocks} of {} ran on more than one thread; {} on the parallel path by the \
         committer alone; {} below the parallel thresholds",
        super::count(workload.blocks.len(), "block"),
        parallel_path_blocks - parallel_blocks,
        workload.blocks.len() - parallel_path_blocks,
    );
    if let Some(summary) = round_trips.summary() {
        println!("{summary}");
    }
    let split_speedup = split_sum.map(|c| c.serial.as_secs_f64() / c.concurrent.as_secs_f64());
    if let Some(split) = split_speedup {
        println!(
            "split reference {split:.2}x (the blocks cut into {} parts that share no sender \
             and no plain-transfer recipient, each sequential on its own state: one after \
             another over at once)",
            args.threads,
        );
    }
    // Only where every block's serial time was measured: a sequential block has none.
    let committer_bound = (parallel_path_blocks == workload.blocks.len()
        && !committer_serial.is_zero())
    .then(|| seq.wall.as_secs_f64() / committer_serial.as_secs_f64());
    if let Some(bound) = committer_bound {
        println!(
            "committer bound {bound:.2}x (sequential time over the committing thread's serial \
             time, {:.2} ms/block: no thread count passes it)",
            committer_serial.as_secs_f64() * 1e3 / blocks,
        );
    }
    if parallel_path_blocks > 0 {
        println!(
            "state transitions folded on the pool in {pool_folded_blocks} of \
             {parallel_path_blocks} blocks on the parallel path (--transition-folding {})",
            match args.transition_folding {
                FoldingArg::Auto => "auto",
                FoldingArg::Committer => "committer",
                FoldingArg::Pool => "pool",
            },
        );
    }
    let (invalid_per_block, respeculated_per_block) =
        (invalid as f64 / blocks, respeculated as f64 / blocks);
    if parallel_path_blocks > 0 {
        println!(
            "per block: {invalid_per_block:.1} speculative results failed validation, \
             {respeculated_per_block:.1} found stale and executed again by the pool{}",
            if args.no_respeculate {
                " (--no-respeculate)"
            } else {
                ""
            },
        );
    }
    let report = ExecReport {
        bench: "exec",
        workload: args.workload.to_string(),
        accounts: args.accounts,
        txs: config.txs_per_block,
        threads: args.threads,
        gas_per_block: (gas as f64 / blocks) as u64,
        sequential_tx_per_s: round(txs as f64 / seq.wall.as_secs_f64(), 0),
        parallel_tx_per_s: Some(round(txs as f64 / par.wall.as_secs_f64(), 0)),
        speedup: Some(round(speedup, 3)),
        scaling: scaling.map(|s| round(s, 3)),
        cpu_ratio: Some(round(cpu_ratio, 3)),
        equal: Some(equal),
        parallel_blocks,
        committer_alone_blocks: parallel_path_blocks - parallel_blocks,
        reverted,
        split_speedup: split_speedup.map(|s| round(s, 3)),
        committer_bound: committer_bound.map(|b| round(b, 3)),
        pool_folded_blocks,
        invalid_per_block: round(invalid_per_block, 2),
        respeculated_per_block: round(respeculated_per_block, 2),
    };
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    }
    if !equal {
        eyre::bail!("parallel output differs from sequential");
    }
    Ok(())
}
