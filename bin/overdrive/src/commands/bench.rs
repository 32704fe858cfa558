use clap::{Args, Subcommand};
use eyre::WrapErr;
use overdrive_executor::{BlockExecutor, BlockOutput, SequentialExecutor};
use overdrive_primitives::{ChainSpec, MemState, RecoveredBlock};
use overdrive_workload::{WorkloadConfig, WorkloadKind};
use serde::Serialize;
use std::time::{Duration, Instant};

#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// Block execution: every executor on the same generated blocks, in one run.
    Exec(ExecArgs),
}

#[derive(Debug, Args)]
pub struct ExecArgs {
    /// transfer | erc20 | uniswap | hybrid | chained
    #[arg(long, default_value = "erc20")]
    workload: WorkloadKind,
    /// Funded accounts in the generated genesis.
    #[arg(long, default_value_t = 100_000)]
    accounts: usize,
    /// Transactions per block.
    #[arg(long, default_value_t = 6_000)]
    txs: usize,
    /// Blocks to execute (each on the state the previous one left).
    #[arg(long, default_value_t = 5)]
    blocks: usize,
    /// Worker threads of the parallel executor.
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// Timed runs of each executor on each block; the median counts.
    #[arg(long, default_value_t = 3)]
    repeat: usize,
    /// Workload seed.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Hybrid workload: share of transactions touching a hot account or pair.
    #[arg(long, default_value_t = 0.3)]
    hot_share: f64,
    /// Share of transactions sent by a few hot senders.
    #[arg(long, default_value_t = 0.0)]
    sender_skew: f64,
    /// Uniswap workload: number of independent pairs.
    #[arg(long, default_value_t = 300)]
    pairs: usize,
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
    sequential_tx_per_s: f64,
    parallel_tx_per_s: Option<f64>,
    speedup: Option<f64>,
    cpu_ratio: Option<f64>,
    equal: Option<bool>,
}

pub fn run(cmd: BenchCommand) -> eyre::Result<()> {
    match cmd {
        BenchCommand::Exec(args) => exec(args),
    }
}

/// Wall and CPU time of one timed execution.
#[derive(Debug, Clone, Copy, Default)]
struct Timing {
    wall: Duration,
    cpu: Duration,
}

fn process_cpu_time() -> Duration {
    // SAFETY: getrusage only writes into the zeroed struct we pass.
    let usage = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut usage);
        usage
    };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(usage.ru_utime) + tv(usage.ru_stime)
}

/// Runs `executor` on `block` `repeat` times; returns the output and the median timing.
fn timed<E: BlockExecutor>(
    executor: &E,
    spec: &ChainSpec,
    block: &RecoveredBlock,
    state: &MemState,
    repeat: usize,
) -> eyre::Result<(BlockOutput, Timing)> {
    let mut timings = Vec::with_capacity(repeat);
    let mut output = None;
    for _ in 0..repeat.max(1) {
        let (cpu0, wall0) = (process_cpu_time(), Instant::now());
        let out = executor
            .execute(spec, block, state)
            .wrap_err_with(|| format!("{} failed on block {}", executor.name(), block.number()))?;
        timings.push(Timing {
            wall: wall0.elapsed(),
            cpu: process_cpu_time() - cpu0,
        });
        output = Some(out);
    }
    timings.sort_by_key(|t| t.wall);
    let output = output.ok_or_else(|| eyre::eyre!("no run"))?;
    Ok((output, timings[timings.len() / 2]))
}

fn exec(args: ExecArgs) -> eyre::Result<()> {
    let config = WorkloadConfig {
        kind: args.workload,
        accounts: args.accounts,
        txs_per_block: args.txs,
        blocks: args.blocks,
        seed: args.seed,
        hot_share: args.hot_share,
        sender_skew: args.sender_skew,
        pairs: args.pairs,
    };
    let started = Instant::now();
    let workload = overdrive_workload::generate(&config)?;
    tracing::info!(elapsed = ?started.elapsed(), blocks = workload.blocks.len(), "workload generated");

    let spec = &workload.chain_spec;
    let mut state = workload.genesis.clone();
    let (mut seq, mut txs, mut gas) = (Timing::default(), 0usize, 0u64);
    for block in &workload.blocks {
        let (out, t) = timed(&SequentialExecutor, spec, block, &state, args.repeat)?;
        let failed = out.receipts.iter().filter(|r| !r.status()).count();
        if failed > 0 {
            tracing::warn!(block = block.number(), failed, "transactions reverted");
        }
        seq.wall += t.wall;
        seq.cpu += t.cpu;
        txs += block.transactions.len();
        gas += out.gas_used;
        tracing::info!(
            block = block.number(),
            ms = t.wall.as_secs_f64() * 1e3,
            "executed"
        );
        state.apply_bundle(&out.bundle);
    }

    let secs = seq.wall.as_secs_f64();
    let blocks = workload.blocks.len().max(1) as f64;
    println!(
        "{:>12} {:>12} {:>10} {:>10} {:>10}",
        "executor", "tx/s", "MGas/s", "ms/block", "cpu ms"
    );
    println!(
        "{:>12} {:>12.0} {:>10.1} {:>10.2} {:>10.1}",
        "sequential",
        txs as f64 / secs,
        gas as f64 / secs / 1e6,
        secs * 1e3 / blocks,
        seq.cpu.as_secs_f64() * 1e3,
    );
    let report = ExecReport {
        bench: "exec",
        workload: args.workload.to_string(),
        accounts: args.accounts,
        txs: args.txs,
        threads: args.threads,
        sequential_tx_per_s: txs as f64 / secs,
        parallel_tx_per_s: None,
        speedup: None,
        cpu_ratio: None,
        equal: None,
    };
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    }
    Ok(())
}
