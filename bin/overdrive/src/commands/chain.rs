//! `overdrive chain export`: a generated workload as a valid chain any client can import.

use clap::{Args, Subcommand, ValueEnum};
use overdrive_chain::Fork;
use overdrive_workload::{WorkloadConfig, WorkloadKind};
use std::{path::PathBuf, time::Instant};

#[derive(Debug, Subcommand)]
pub enum ChainCommand {
    /// Write `genesis.json` and `chain.rlp` (sealed blocks, RLP one after the other) for
    /// `reth import --chain genesis.json chain.rlp`.
    Export(ExportArgs),
}

#[derive(Debug, Clone, Copy, Default, ValueEnum)]
enum ForkArg {
    #[default]
    Prague,
    Osaka,
}

#[derive(Debug, Args)]
pub struct ExportArgs {
    /// transfer | erc20 | uniswap | hybrid | chained | allowance | router | compute | exchange
    #[arg(long, default_value = "erc20")]
    workload: WorkloadKind,
    /// Funded accounts in the genesis.
    #[arg(long, default_value_t = 100_000, value_parser = super::positive)]
    accounts: usize,
    /// Blocks.
    #[arg(long, default_value_t = 200, value_parser = super::positive)]
    blocks: usize,
    /// Transactions per block.
    #[arg(long, default_value_t = 6_000, value_parser = super::positive)]
    txs: usize,
    /// Fork rules, active from genesis.
    #[arg(long, value_enum, default_value_t)]
    fork: ForkArg,
    /// Workload seed.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Hybrid workload: share of transactions touching a hot account or pair.
    #[arg(long, default_value_t = 0.3)]
    hot_share: f64,
    /// Uniswap workload: number of independent pairs.
    #[arg(long, default_value_t = 300)]
    pairs: usize,
    /// Output directory.
    #[arg(long)]
    out: PathBuf,
}

pub fn run(command: ChainCommand) -> eyre::Result<()> {
    match command {
        ChainCommand::Export(args) => export(args),
    }
}

fn export(args: ExportArgs) -> eyre::Result<()> {
    let config = WorkloadConfig {
        kind: args.workload,
        accounts: args.accounts,
        txs_per_block: args.txs,
        blocks: args.blocks,
        seed: args.seed,
        hot_share: args.hot_share,
        pairs: args.pairs,
        ..WorkloadConfig::new(args.workload)
    };
    let started = Instant::now();
    let workload = overdrive_workload::generate(&config)?;
    tracing::info!(elapsed = ?started.elapsed(), blocks = workload.blocks.len(), "workload generated");
    let fork = match args.fork {
        ForkArg::Prague => Fork::Prague,
        ForkArg::Osaka => Fork::Osaka,
    };
    let started = Instant::now();
    let chain = overdrive_chain::build(workload, fork)?;
    tracing::info!(elapsed = ?started.elapsed(), "blocks executed and sealed");
    let (genesis, blocks) = overdrive_chain::write(&chain, &args.out)?;
    let head = chain.head();
    println!("genesis     {}", genesis.display());
    println!("chain       {}", blocks.display());
    println!("genesis     hash {}", chain.genesis_header.hash_slow());
    println!(
        "head        block {} hash {} state root {}",
        head.number,
        chain.head_hash(),
        head.state_root
    );
    Ok(())
}
