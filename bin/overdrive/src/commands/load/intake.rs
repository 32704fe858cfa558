//! `overdrive bench intake`: what taking transactions in costs a node, apart from building and
//! validating blocks. Each node runs `--dev` with a block time far longer than the run, so it
//! only takes transactions in: pre-signed ones are sent until the pool holds every accepted
//! one, and the node's CPU time over that span, divided by the transactions accepted, is the
//! intake's cost per transaction. Four nodes, one after the other, on the same genesis and
//! transactions:
//!
//! - `stock`: reth, JSON-RPC batches of `eth_sendRawTransaction` (each transaction validated
//!   and inserted on its own);
//! - `stock-batched`: the same with `--txpool.max-batch-size` set to the batch, reth's own
//!   batching of pool insertions;
//! - `overdrive-eth`: `--overdrive.pool` with reth's batched insertion, still
//!   `eth_sendRawTransaction` (batches reach the parallel validator, not the batch endpoint);
//! - `overdrive`: `--overdrive.pool` and `overdrive_sendRawTransactions`.

use super::{Submit, node, rpc::Rpc};
use clap::Args;
use eyre::{WrapErr, bail};
use overdrive_bench::round;
use overdrive_workload::WorkloadKind;
use serde_json::json;
use std::{
    path::PathBuf,
    sync::atomic::{AtomicUsize, Ordering},
    time::{Duration, Instant},
};

/// The genesis' block gas limit: no block is built, so it only bounds a transaction's gas.
const GAS_LIMIT: u64 = 30_000_000;

#[derive(Debug, Args)]
pub struct IntakeArgs {
    /// transfer | erc20 | uniswap (or any other generated workload).
    #[arg(long, default_value = "erc20")]
    workload: WorkloadKind,
    /// Funded accounts in the genesis (the transactions' senders).
    #[arg(long, default_value_t = 20_000, value_parser = crate::commands::positive)]
    accounts: usize,
    /// Transactions sent to each node.
    #[arg(long, default_value_t = 40_000, value_parser = crate::commands::positive)]
    txs: usize,
    /// Transactions per call (a JSON-RPC batch, or one `overdrive_sendRawTransactions`).
    #[arg(long, default_value_t = 200, value_parser = crate::commands::positive)]
    batch: usize,
    /// Connections sending at once (each sender's transactions on one, in nonce order).
    #[arg(long, default_value_t = 4, value_parser = crate::commands::positive)]
    connections: usize,
    /// Threads of overdrive's intake.
    #[arg(long, default_value_t = 2, value_parser = crate::commands::positive)]
    threads: usize,
    /// Workload seed.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// The overdrive-reth binary (default: $OVERDRIVE_RETH_BIN).
    #[arg(long, value_name = "PATH")]
    reth_bin: Option<PathBuf>,
    /// Where the nodes' datadirs and logs go.
    #[arg(long, default_value = "intake-report")]
    out: PathBuf,
    /// End with one JSON line of the figures.
    #[arg(long)]
    json: bool,
}

/// One node's intake.
struct Taken {
    label: &'static str,
    accepted: usize,
    refused: usize,
    /// From the first send until the pool held every accepted transaction.
    seconds: f64,
    /// The node's CPU seconds over the same span.
    cpu_seconds: f64,
}

impl Taken {
    fn cpu_us_per_tx(&self) -> f64 {
        if self.accepted == 0 {
            return 0.0;
        }
        self.cpu_seconds * 1e6 / self.accepted as f64
    }

    fn per_second(&self) -> f64 {
        if self.seconds <= 0.0 {
            return 0.0;
        }
        self.accepted as f64 / self.seconds
    }
}

pub fn run(args: IntakeArgs) -> eyre::Result<()> {
    let started = Instant::now();
    let (genesis, txs) =
        super::presign_workload(args.workload, args.accounts, args.txs, args.seed, GAS_LIMIT)?;
    eprintln!(
        "intake: {} {} transactions over {} accounts signed in {:.1}s",
        txs.len(),
        args.workload,
        args.accounts,
        started.elapsed().as_secs_f64()
    );
    let recovery_us = recovery_cost_us(&txs)?;
    eprintln!("intake: decoding and recovering one sender here: {recovery_us:.1} µs (one thread)");
    let reth = super::reth_binary(args.reth_bin.clone())?;
    std::fs::create_dir_all(&args.out)
        .wrap_err_with(|| format!("creating {}", args.out.display()))?;
    let genesis_path = args.out.join("genesis.json");
    std::fs::write(&genesis_path, serde_json::to_vec_pretty(&genesis)?)?;
    let (batch, threads) = (args.batch.to_string(), args.threads.to_string());
    let nodes: [(&'static str, Vec<&str>, Submit); 4] = [
        ("stock", vec![], Submit::Single),
        (
            "stock-batched",
            vec!["--txpool.max-batch-size", &batch],
            Submit::Single,
        ),
        (
            "overdrive-eth",
            vec![
                "--overdrive.pool",
                "--overdrive.pool.threads",
                &threads,
                "--txpool.max-batch-size",
                &batch,
            ],
            Submit::Single,
        ),
        (
            "overdrive",
            vec!["--overdrive.pool", "--overdrive.pool.threads", &threads],
            Submit::Batch,
        ),
    ];
    let mut results = Vec::new();
    for (label, flags, submit) in nodes {
        let datadir = args.out.join(format!("{label}-data"));
        let _ = std::fs::remove_dir_all(&datadir);
        let node = node::DevNode::start(&node::DevNodeConfig {
            binary: &reth,
            genesis: &genesis_path,
            datadir: &datadir,
            log: &args.out.join(format!("{label}.log")),
            gas_limit: genesis.gas_limit,
            // No block during the run: the node only takes transactions in.
            block_time: 24 * 3600,
            flags: &flags,
            jwt: None,
        })?;
        let rpc = Rpc::new(&node.rpc_url())?;
        let taken = take_in(label, &node, &rpc, &txs, &args, submit);
        node.stop();
        let _ = std::fs::remove_dir_all(&datadir);
        let taken = taken?;
        eprintln!(
            "intake: {label}: {} accepted, {} refused in {:.2}s ({:.0}/s), node CPU {:.1} µs a transaction",
            taken.accepted,
            taken.refused,
            taken.seconds,
            taken.per_second(),
            taken.cpu_us_per_tx()
        );
        results.push(taken);
    }
    let stock_cpu = results[0].cpu_us_per_tx();
    let ratio = |t: &Taken| {
        if t.cpu_us_per_tx() > 0.0 {
            round(stock_cpu / t.cpu_us_per_tx(), 2)
        } else {
            0.0
        }
    };
    println!(
        "intake {}, {} transactions, batches of {}, {} connections (decoding and recovering a sender alone: {:.1} µs):",
        args.workload, args.txs, args.batch, args.connections, recovery_us
    );
    for taken in &results {
        println!(
            "  {:<14} {:>8.1} µs CPU/tx ({:>5.2}x less than stock)  {:>8.0} tx/s  {} refused",
            taken.label,
            taken.cpu_us_per_tx(),
            ratio(taken),
            taken.per_second(),
            taken.refused
        );
    }
    if args.json {
        let nodes: Vec<_> = results
            .iter()
            .map(|t| {
                json!({"node": t.label, "accepted": t.accepted, "refused": t.refused,
                    "seconds": round(t.seconds, 3), "cpu_us_per_tx": round(t.cpu_us_per_tx(), 1),
                    "tx_per_s": round(t.per_second(), 0), "cpu_less_than_stock": ratio(t)})
            })
            .collect();
        println!(
            "{}",
            json!({"bench": "intake", "workload": args.workload.to_string(), "txs": args.txs,
                "recovery_us_per_tx": round(recovery_us, 1),
                "batch": args.batch, "connections": args.connections, "threads": args.threads,
                "nodes": nodes})
        );
    }
    Ok(())
}

/// What decoding a raw transaction and recovering its sender costs on one thread of this
/// machine, in µs: the part of intake that no batching removes, since every signature must be
/// checked once. Measured over the run's own transactions (at most 5,000).
fn recovery_cost_us(txs: &[super::PreSigned]) -> eyre::Result<f64> {
    use alloy_consensus::{TxEnvelope, transaction::SignerRecoverable};
    use alloy_eips::eip2718::Decodable2718;
    let raw: Vec<Vec<u8>> = txs
        .iter()
        .take(5_000)
        .map(|tx| alloy_primitives::hex::decode(&tx.raw))
        .collect::<Result<_, _>>()?;
    let started = overdrive_bench::process_cpu_time();
    for (tx, bytes) in txs.iter().zip(&raw) {
        let decoded = TxEnvelope::decode_2718_exact(bytes)
            .map_err(|e| eyre::eyre!("a pre-signed transaction does not decode: {e}"))?;
        if decoded.recover_signer()? != tx.sender {
            bail!("a pre-signed transaction recovers to another sender");
        }
    }
    let spent = overdrive_bench::process_cpu_time() - started;
    Ok(spent.as_secs_f64() * 1e6 / raw.len().max(1) as f64)
}

/// Sends every transaction to `node` and waits until its pool holds each accepted one.
fn take_in(
    label: &'static str,
    node: &node::DevNode,
    rpc: &Rpc,
    txs: &[super::PreSigned],
    args: &IntakeArgs,
    submit: Submit,
) -> eyre::Result<Taken> {
    let mut lanes = vec![Vec::new(); args.connections];
    for tx in txs {
        let lane = (u64::from_be_bytes(tx.sender.0[12..].try_into().expect("8 bytes"))
            % args.connections as u64) as usize;
        lanes[lane].push(tx.raw.as_str());
    }
    let accepted = AtomicUsize::new(0);
    let refused = AtomicUsize::new(0);
    let cpu_before = node.cpu_seconds();
    let start = Instant::now();
    std::thread::scope(|scope| -> eyre::Result<()> {
        let senders: Vec<_> = lanes
            .iter()
            .map(|lane| {
                let (accepted, refused) = (&accepted, &refused);
                scope.spawn(move || -> eyre::Result<()> {
                    for chunk in lane.chunks(args.batch) {
                        for answer in submit.send(rpc, chunk)? {
                            match answer {
                                Ok(_) => accepted.fetch_add(1, Ordering::Relaxed),
                                Err(_) => refused.fetch_add(1, Ordering::Relaxed),
                            };
                        }
                    }
                    Ok(())
                })
            })
            .collect();
        for sender in senders {
            sender
                .join()
                .map_err(|_| eyre::eyre!("a sending thread panicked"))??;
        }
        Ok(())
    })?;
    let accepted = accepted.into_inner();
    // reth answers once a transaction is in the pool, but `--txpool.max-batch-size` and the
    // pool's own listeners may lag: the span ends when the pool counts every accepted one.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let status = rpc.call("txpool_status", json!([]))?;
        let count = super::quantity(&status["pending"])? + super::quantity(&status["queued"])?;
        if count as usize >= accepted {
            break;
        }
        if Instant::now() > deadline {
            bail!("{label}: the pool holds {count} of {accepted} accepted transactions after 60s");
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let seconds = start.elapsed().as_secs_f64();
    let cpu_seconds = cpu_before
        .zip(node.cpu_seconds())
        .map(|(before, after)| after - before)
        .ok_or_else(|| eyre::eyre!("the node's CPU time cannot be read from /proc"))?;
    Ok(Taken {
        label,
        accepted,
        refused: refused.into_inner(),
        seconds,
        cpu_seconds,
    })
}
