//! Times workload generation: `cargo run --release -p overdrive-workload --example generate --
//! [kind] [accounts] [txs_per_block] [blocks] [pairs]` (defaults: erc20 100000 6000 5 300).

use overdrive_workload::{WorkloadConfig, WorkloadKind, generate};
use std::time::Instant;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let number = |i: usize, default: usize| -> Result<usize, Box<dyn std::error::Error>> {
        Ok(args
            .get(i)
            .map(|s| s.parse())
            .transpose()?
            .unwrap_or(default))
    };
    let kind: WorkloadKind = args
        .first()
        .map(|s| s.parse())
        .transpose()?
        .unwrap_or(WorkloadKind::Erc20);
    let cfg = WorkloadConfig {
        accounts: number(1, 100_000)?,
        txs_per_block: number(2, 6_000)?,
        blocks: number(3, 5)?,
        pairs: number(4, 300)?,
        ..WorkloadConfig::new(kind)
    };
    let started = Instant::now();
    let workload = generate(&cfg)?;
    let elapsed = started.elapsed();
    let txs: usize = workload.blocks.iter().map(|b| b.transactions.len()).sum();
    println!(
        "{kind}: {} accounts, {txs} txs in {} blocks, {} genesis accounts: generated in {:.3} s \
         on {} threads",
        cfg.accounts,
        workload.blocks.len(),
        workload.genesis.accounts.len(),
        elapsed.as_secs_f64(),
        rayon::current_num_threads(),
    );
    Ok(())
}
