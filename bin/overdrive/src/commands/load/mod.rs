//! `overdrive bench load`: transactions per second of a node under load, measured from the chain
//! itself. It talks JSON-RPC only, so it drives any node; `--compare` starts stock reth
//! (`overdrive-reth` with every switch off) and `overdrive-reth` with every component on, one
//! after the other, on the same genesis and the same pre-signed transactions.

pub mod intake;
pub mod merkle;
mod node;
pub mod replay;
mod report;
mod rpc;

use alloy_eips::eip2718::Encodable2718;
use alloy_primitives::{Address, B256, hex};
use clap::Args;
use eyre::{WrapErr, eyre};
use overdrive_workload::{WorkloadConfig, WorkloadKind};
use report::{BlockSeen, Observed, Report};
use rpc::Rpc;
use serde_json::{Value, json};
use std::{
    collections::{BTreeMap, HashMap},
    path::PathBuf,
    sync::{
        Mutex,
        atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

/// Transactions signed per second of `--duration` when `--rate max` and no `--txs`: more than
/// any node here includes, so the run never runs dry.
const MAX_RATE_PRESIGN: usize = 25_000;

/// How long the poller waits, after the last send, for blocks that still include the run's
/// transactions; it stops earlier once every accepted one is in.
const DRAIN: Duration = Duration::from_secs(30);

#[derive(Debug, Args)]
pub struct LoadArgs {
    /// Write the genesis (funded accounts and the workload's contracts) to FILE and exit, to
    /// start a node on it; run the load with the same --workload, --accounts, --seed, --txs.
    #[arg(long, value_name = "FILE")]
    write_genesis: Option<PathBuf>,
    /// The node's JSON-RPC endpoint, e.g. http://127.0.0.1:8545.
    #[arg(long, required_unless_present_any = ["write_genesis", "compare"])]
    rpc: Option<String>,
    /// Start stock reth and overdrive-reth one after the other on the same genesis and load,
    /// and print both and their ratio.
    #[arg(long, conflicts_with = "rpc")]
    compare: bool,
    /// transfer | erc20 | uniswap (or any other generated workload).
    #[arg(long, default_value = "erc20")]
    workload: WorkloadKind,
    /// Funded accounts in the genesis (transactions are spread over them).
    #[arg(long, default_value_t = 100_000, value_parser = super::positive)]
    accounts: usize,
    /// Transactions per second to send, or `max`.
    #[arg(long, default_value = "max", value_parser = parse_rate)]
    rate: Rate,
    /// Seconds of sending.
    #[arg(long, default_value_t = 60, value_parser = super::positive)]
    duration: usize,
    /// Connections sending at once (each sender's transactions always go through one, in
    /// nonce order).
    #[arg(long, default_value_t = 4, value_parser = super::positive)]
    connections: usize,
    /// How transactions are sent: `single` (JSON-RPC batches of `eth_sendRawTransaction`, any
    /// node) or `batch` (`overdrive_sendRawTransactions`, which needs `--overdrive.pool`;
    /// `--compare` then runs overdrive-reth with it, and stock reth still gets `single`).
    #[arg(long, value_enum, default_value_t = Submit::Single)]
    submit: Submit,
    /// Transactions per JSON-RPC batch of `eth_sendRawTransaction`, or per
    /// `overdrive_sendRawTransactions` call.
    #[arg(long, default_value_t = 200, value_parser = super::positive)]
    batch: usize,
    /// Transactions to pre-sign (default: rate × duration; with `max`, 25,000 a second).
    #[arg(long, value_parser = super::positive)]
    txs: Option<usize>,
    /// Workload seed (the same seed gives the same genesis and transactions).
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Block gas limit of the genesis (and of the blocks `--compare`'s nodes build): large, so
    /// that gas does not cap the rate.
    #[arg(long, default_value_t = 3_000_000_000)]
    gas_limit: u64,
    /// `--compare`: the overdrive-reth binary (default: $OVERDRIVE_RETH_BIN).
    #[arg(long, value_name = "PATH")]
    reth_bin: Option<PathBuf>,
    /// `--compare`: seconds between the dev nodes' blocks.
    #[arg(long, default_value_t = 1, value_parser = super::positive)]
    block_time: usize,
    /// `--compare`: threads of overdrive's components.
    #[arg(long, default_value_t = 2, value_parser = super::positive)]
    threads: usize,
    /// `--compare`: the component overdrive-reth runs.
    #[arg(long, value_enum, default_value_t)]
    component: Component,
    /// Directory for the report (report.json) and chart (*.svg).
    #[arg(long, default_value = "load-report")]
    out: PathBuf,
    /// End with one JSON line of the figures.
    #[arg(long)]
    json: bool,
}

/// How a load reaches the node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Submit {
    /// One `eth_sendRawTransaction` a transaction, in JSON-RPC batches.
    Single,
    /// `overdrive_sendRawTransactions`, a list of transactions a call.
    Batch,
}

impl Submit {
    /// Sends `raw` (`0x`-prefixed transactions); each one's answer or error message.
    fn send(self, rpc: &Rpc, raw: &[&str]) -> eyre::Result<Vec<Result<Value, String>>> {
        match self {
            Self::Single => {
                let calls: Vec<_> = raw
                    .iter()
                    .map(|tx| ("eth_sendRawTransaction", json!([tx])))
                    .collect();
                rpc.batch(&calls)
            }
            Self::Batch => rpc.send_raw_transactions(raw),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Rate {
    Max,
    PerSecond(f64),
}

fn parse_rate(s: &str) -> Result<Rate, String> {
    if s == "max" {
        return Ok(Rate::Max);
    }
    match s.parse::<f64>() {
        Ok(r) if r > 0.0 && r.is_finite() => Ok(Rate::PerSecond(r)),
        _ => Err(format!(
            "expected a positive number of transactions a second or `max`, got {s:?}"
        )),
    }
}

/// A transaction signed before the run.
struct PreSigned {
    hash: B256,
    sender: Address,
    /// `0x`-prefixed EIP-2718 encoding, as `eth_sendRawTransaction` takes it.
    raw: String,
}

pub fn run(args: LoadArgs) -> eyre::Result<()> {
    let started = Instant::now();
    let (genesis, txs) = presign(&args)?;
    eprintln!(
        "load: {} {} transactions over {} accounts signed in {:.1}s",
        txs.len(),
        args.workload,
        args.accounts,
        started.elapsed().as_secs_f64()
    );
    if let Some(path) = &args.write_genesis {
        std::fs::write(path, serde_json::to_vec_pretty(&genesis)?)
            .wrap_err_with(|| format!("writing {}", path.display()))?;
        eprintln!("load: genesis written to {}", path.display());
        if args.rpc.is_none() && !args.compare {
            return Ok(());
        }
    }
    std::fs::create_dir_all(&args.out)
        .wrap_err_with(|| format!("creating {}", args.out.display()))?;
    let name = args.workload.to_string();
    if !args.compare {
        let rpc = Rpc::new(args.rpc.as_deref().expect("clap requires --rpc"))?;
        let report = Report::new(
            &name,
            args.accounts,
            &run_load(&rpc, &txs, &args, args.submit)?,
        );
        write_report(&args, "node", &report)?;
        print_report("node", &report);
        if args.json {
            println!(
                "{}",
                json!({"bench": "load", "workload": name, "accounts": args.accounts,
                    "tps": report.tps, "gas_per_s": report.gas_per_s,
                    "p50_ms": report.p50_ms, "p99_ms": report.p99_ms})
            );
        }
        return Ok(());
    }

    let reth = reth_binary(args.reth_bin.clone())?;
    let genesis_path = args.out.join("genesis.json");
    std::fs::write(&genesis_path, serde_json::to_vec_pretty(&genesis)?)?;
    let threads = args.threads.to_string();
    let mut reports = Vec::new();
    let pool = args.submit == Submit::Batch;
    for (label, flags) in stock_and_overdrive(args.component, &threads, pool) {
        let submit = if label == "stock" {
            Submit::Single
        } else {
            args.submit
        };
        let datadir = args.out.join(format!("{label}-data"));
        let _ = std::fs::remove_dir_all(&datadir);
        let node = node::DevNode::start(&node::DevNodeConfig {
            binary: &reth,
            genesis: &genesis_path,
            datadir: &datadir,
            log: &args.out.join(format!("{label}.log")),
            gas_limit: args.gas_limit,
            block_time: args.block_time,
            flags: &flags,
            jwt: None,
        })?;
        eprintln!("load: {label} node up ({}), sending", node.rpc_url());
        let cpu_before = node.cpu_seconds();
        let stages_before = node.stage_seconds()?;
        let observed = run_load(&Rpc::new(&node.rpc_url())?, &txs, &args, submit);
        let cpu = cpu_before.zip(node.cpu_seconds()).map(|(a, b)| b - a);
        let stages = node.stage_seconds()?;
        node.stop();
        let mut report = Report::new(&name, args.accounts, &observed?);
        report.set_node_cpu(cpu);
        report.set_stages(
            node::STAGES
                .iter()
                .zip(stages.iter().zip(&stages_before))
                .map(|((stage, _, _), (after, before))| (stage.to_string(), after - before)),
        );
        write_report(&args, label, &report)?;
        print_report(label, &report);
        reports.push(report);
        let _ = std::fs::remove_dir_all(&datadir);
    }
    let (stock, overdrive) = (&reports[0], &reports[1]);
    let speedup = if stock.tps > 0.0 {
        overdrive_bench::round(overdrive.tps / stock.tps, 2)
    } else {
        0.0
    };
    println!(
        "load compare: {name}, {} accounts: stock {} tps, overdrive {} tps, {speedup}x",
        args.accounts, stock.tps, overdrive.tps
    );
    if args.json {
        println!(
            "{}",
            json!({"bench": "load", "compare": true, "workload": name,
                "accounts": args.accounts, "stock_tps": stock.tps,
                "overdrive_tps": overdrive.tps, "speedup": speedup})
        );
    }
    Ok(())
}

/// The overdrive-reth binary: `given`, else `$OVERDRIVE_RETH_BIN`.
fn reth_binary(given: Option<PathBuf>) -> eyre::Result<PathBuf> {
    given
        .or_else(|| std::env::var_os("OVERDRIVE_RETH_BIN").map(PathBuf::from))
        .ok_or_else(|| {
            eyre!("give the overdrive-reth binary: --reth-bin PATH or OVERDRIVE_RETH_BIN")
        })
}

/// The two nodes a comparison runs, by label: stock reth (no switch), and overdrive-reth with
/// the parallel executor, and when `pool` the batched pool with reth's sender recovery cache
/// (the batch endpoint fills it, so the engine does not recover the senders of a payload
/// again; reth's `eth_sendRawTransaction` does not fill it, so stock gains nothing from it).
/// Which of overdrive's components a comparison runs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Component {
    /// The parallel executor (`--overdrive.exec parallel`).
    #[default]
    Exec,
    /// The state root (`--overdrive.state-root overdrive`).
    StateRoot,
}

/// The two nodes of a comparison: stock reth, and overdrive-reth with `component` on
/// `threads` threads (and `--overdrive.pool` with `pool`).
fn stock_and_overdrive(
    component: Component,
    threads: &str,
    pool: bool,
) -> [(&'static str, Vec<&str>); 2] {
    let mut overdrive = match component {
        Component::Exec => vec![
            "--overdrive.exec",
            "parallel",
            "--overdrive.exec.threads",
            threads,
        ],
        Component::StateRoot => vec![
            "--overdrive.state-root",
            "overdrive",
            "--overdrive.trie.threads",
            threads,
            // The trie's own split of each root (hashing, rows) and its dirty nodes.
            "--log.stdout.filter",
            "info,overdrive::state_root=debug,overdrive::trie=debug",
        ],
    };
    if pool {
        overdrive.extend([
            "--overdrive.pool",
            "--overdrive.pool.threads",
            threads,
            "--engine.sender-recovery-cache",
        ]);
    }
    [("stock", Vec::new()), ("overdrive", overdrive)]
}

/// The workload's genesis (with `--gas-limit`) and its transactions, in block order.
fn presign(args: &LoadArgs) -> eyre::Result<(alloy_genesis::Genesis, Vec<PreSigned>)> {
    let total = args.txs.unwrap_or(match args.rate {
        Rate::Max => MAX_RATE_PRESIGN * args.duration,
        Rate::PerSecond(rate) => (rate * args.duration as f64).ceil() as usize,
    });
    presign_workload(
        args.workload,
        args.accounts,
        total,
        args.seed,
        args.gas_limit,
    )
}

/// `total` transactions of `kind` over `accounts` and their genesis, with `gas_limit`.
fn presign_workload(
    kind: WorkloadKind,
    accounts: usize,
    total: usize,
    seed: u64,
    gas_limit: u64,
) -> eyre::Result<(alloy_genesis::Genesis, Vec<PreSigned>)> {
    let per_block = total.min(1_000);
    let workload = overdrive_workload::generate(&WorkloadConfig {
        accounts,
        txs_per_block: per_block,
        blocks: total.div_ceil(per_block),
        seed,
        ..WorkloadConfig::new(kind)
    })?;
    let mut genesis = workload.chain_spec.genesis.clone();
    genesis.gas_limit = gas_limit;
    let txs = workload
        .blocks
        .iter()
        .flat_map(|block| &block.transactions)
        .take(total)
        .map(|tx| PreSigned {
            hash: *tx.inner().tx_hash(),
            sender: tx.signer(),
            raw: format!("0x{}", hex::encode(tx.inner().encoded_2718())),
        })
        .collect();
    Ok((genesis, txs))
}

/// Sends `txs` to `rpc` as `args` says while a poller follows the chain; what it saw.
fn run_load(
    rpc: &Rpc,
    txs: &[PreSigned],
    args: &LoadArgs,
    submit: Submit,
) -> eyre::Result<Observed> {
    let head = block_number(rpc)?;
    let index: HashMap<B256, usize> = txs.iter().enumerate().map(|(i, t)| (t.hash, i)).collect();
    // Each sender's transactions on one connection, in order: no nonce gaps in the pool.
    let mut queues = vec![Vec::new(); args.connections];
    for (i, tx) in txs.iter().enumerate() {
        let lane = (u64::from_be_bytes(tx.sender.0[12..].try_into().expect("8 bytes"))
            % args.connections as u64) as usize;
        queues[lane].push(i);
    }
    // Microseconds since the start, plus one (zero: not sent); refused ones are reset.
    let sent: Vec<AtomicU64> = txs.iter().map(|_| AtomicU64::new(0)).collect();
    let rejected: Mutex<BTreeMap<String, usize>> = Mutex::default();
    let sent_count = AtomicUsize::new(0);
    let sending = AtomicBool::new(true);
    let start = Instant::now();
    let deadline = Duration::from_secs(args.duration as u64);
    let per_lane = match args.rate {
        Rate::Max => None,
        Rate::PerSecond(rate) => Some(rate / args.connections as f64),
    };

    let (blocks, included) = std::thread::scope(|scope| -> eyre::Result<_> {
        let poller = scope.spawn(|| {
            poll(
                rpc,
                head,
                &index,
                txs.len(),
                start,
                &sending,
                &sent,
                &sent_count,
            )
        });
        let lanes: Vec<_> = queues
            .iter()
            .map(|queue| {
                scope.spawn(|| -> eyre::Result<()> {
                    let mut at = 0;
                    while at < queue.len() && start.elapsed() < deadline {
                        let allowed = match per_lane {
                            None => queue.len(),
                            Some(rate) => (rate * start.elapsed().as_secs_f64()) as usize + 1,
                        };
                        if allowed <= at {
                            std::thread::sleep(Duration::from_millis(2));
                            continue;
                        }
                        let end = queue.len().min(at + args.batch).min(allowed.max(at + 1));
                        let batch = &queue[at..end];
                        let raw: Vec<&str> = batch.iter().map(|&i| txs[i].raw.as_str()).collect();
                        let now = start.elapsed().as_micros() as u64 + 1;
                        for &i in batch {
                            sent[i].store(now, Ordering::Relaxed);
                        }
                        let answers = submit.send(rpc, &raw).wrap_err("sending a batch")?;
                        for (&i, answer) in batch.iter().zip(answers) {
                            match answer {
                                Ok(_) => {
                                    sent_count.fetch_add(1, Ordering::Relaxed);
                                }
                                Err(error) => {
                                    sent[i].store(0, Ordering::Relaxed);
                                    *rejected
                                        .lock()
                                        .expect("no panics")
                                        .entry(error)
                                        .or_default() += 1;
                                }
                            }
                        }
                        at = end;
                    }
                    Ok(())
                })
            })
            .collect();
        let mut failure = None;
        for lane in lanes {
            if let Err(e) = lane
                .join()
                .map_err(|_| eyre!("a sending thread panicked"))?
            {
                failure.get_or_insert(e);
            }
        }
        sending.store(false, Ordering::Relaxed);
        let polled = poller.join().map_err(|_| eyre!("the poller panicked"))?;
        match failure {
            Some(e) => Err(e),
            None => polled,
        }
    })?;
    Ok(Observed {
        sent: sent
            .iter()
            .map(|s| match s.load(Ordering::Relaxed) {
                0 => None,
                us => Some((us - 1) as f64 / 1e6),
            })
            .collect(),
        included,
        blocks,
        rejected: rejected.into_inner().expect("no panics"),
        sending_s: sent
            .iter()
            .map(|s| s.load(Ordering::Relaxed))
            .max()
            .map_or(0.0, |us| us.saturating_sub(1) as f64 / 1e6),
    })
}

/// Follows the chain from `head`: every new block, and when each of the run's transactions was
/// first seen in one. Ends once sending has stopped and every accepted transaction is in, or
/// [`DRAIN`] after sending stopped.
#[allow(clippy::too_many_arguments)]
fn poll(
    rpc: &Rpc,
    head: u64,
    index: &HashMap<B256, usize>,
    count: usize,
    start: Instant,
    sending: &AtomicBool,
    sent: &[AtomicU64],
    sent_count: &AtomicUsize,
) -> eyre::Result<(Vec<BlockSeen>, Vec<Option<f64>>)> {
    let mut blocks = vec![BlockSeen {
        number: head,
        seen_s: 0.0,
        txs: 0,
        ours: 0,
        gas_used: 0,
    }];
    let mut included = vec![None; count];
    let (mut included_count, mut last_report, mut stopped_at) = (0usize, 0u64, None);
    loop {
        let latest = block_number(rpc)?;
        let next = blocks.last().expect("the start").number + 1;
        if latest >= next {
            let numbers: Vec<u64> = (next..=latest).take(16).collect();
            let calls: Vec<_> = numbers
                .iter()
                .map(|n| ("eth_getBlockByNumber", json!([format!("{n:#x}"), false])))
                .collect();
            let seen_s = start.elapsed().as_secs_f64();
            for (number, block) in numbers.iter().zip(rpc.batch(&calls)?) {
                let block = block.map_err(|e| eyre!("block {number}: {e}"))?;
                let hashes = block["transactions"]
                    .as_array()
                    .ok_or_else(|| eyre!("block {number} has no transaction list"))?;
                let mut ours = 0;
                for hash in hashes {
                    let hash: B256 = serde_json::from_value(hash.clone())?;
                    if let Some(&i) = index.get(&hash) {
                        included[i] = Some(seen_s);
                        ours += 1;
                    }
                }
                included_count += ours;
                blocks.push(BlockSeen {
                    number: *number,
                    seen_s,
                    txs: hashes.len(),
                    ours,
                    gas_used: quantity(&block["gasUsed"])?,
                });
            }
        }
        let elapsed = start.elapsed();
        if elapsed.as_secs() > last_report {
            last_report = elapsed.as_secs();
            let last = blocks.last().expect("the start");
            eprintln!(
                "load: {:>4}s sent {:>8} included {:>8} head #{} ({} txs)",
                last_report,
                sent_count.load(Ordering::Relaxed),
                included_count,
                last.number,
                last.txs
            );
        }
        if !sending.load(Ordering::Relaxed) {
            let stopped = *stopped_at.get_or_insert(Instant::now());
            let accepted = sent
                .iter()
                .filter(|s| s.load(Ordering::Relaxed) > 0)
                .count();
            if included_count >= accepted || stopped.elapsed() > DRAIN {
                return Ok((blocks, included));
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn block_number(rpc: &Rpc) -> eyre::Result<u64> {
    quantity(&rpc.call("eth_blockNumber", json!([]))?)
}

/// A JSON-RPC hex quantity.
fn quantity(value: &Value) -> eyre::Result<u64> {
    let text = value
        .as_str()
        .ok_or_else(|| eyre!("expected a hex quantity, got {value}"))?;
    u64::from_str_radix(text.trim_start_matches("0x"), 16)
        .wrap_err_with(|| format!("bad hex quantity {text:?}"))
}

fn write_report(args: &LoadArgs, label: &str, report: &Report) -> eyre::Result<()> {
    let json_path = args.out.join(format!("{label}.json"));
    std::fs::write(&json_path, serde_json::to_vec_pretty(report)?)
        .wrap_err_with(|| format!("writing {}", json_path.display()))?;
    let svg_path = args.out.join(format!("{label}.svg"));
    let title = format!(
        "{label}: {} over {} accounts, {} tx/s, p50 {} ms",
        report.workload, report.accounts, report.tps, report.p50_ms
    );
    std::fs::write(&svg_path, report.svg(&title))
        .wrap_err_with(|| format!("writing {}", svg_path.display()))?;
    Ok(())
}

fn print_report(label: &str, report: &Report) {
    if let (Some(cpu), Some(per_tx)) = (report.node_cpu_s, report.node_cpu_us_per_tx) {
        println!("{label}: node CPU {cpu} s, {per_tx} us per included transaction");
    }
    for (stage, ms) in &report.stage_ms_per_block {
        println!("{label}:   {stage}: {ms} ms per block");
    }
    println!(
        "{label}: {} tps, {:.1} Mgas/s over {} blocks ({} s); latency p50 {} ms, p95 {} ms, p99 {} ms; {} sent, {} included, {} refused",
        report.tps,
        report.gas_per_s / 1e6,
        report.blocks,
        report.window_s,
        report.p50_ms,
        report.p95_ms,
        report.p99_ms,
        report.sent,
        report.included,
        report.rejected
    );
    for (error, n) in &report.rejected_by_error {
        println!("{label}:   refused {n}: {error}");
    }
    if report.sent > 0 && report.included < report.sent {
        println!(
            "{label}: {} accepted transactions were not included before the poller stopped",
            report.sent - report.included
        );
    }
    if report.blocks == 0 {
        println!("{label}: no block carried the run's transactions");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;
    use std::{
        io::{BufRead, BufReader, Read, Write},
        net::TcpListener,
        sync::Arc,
    };

    /// A node in miniature: takes raw transactions (refusing every seventh), and every 50 ms
    /// seals what it took into a block.
    struct FakeNode {
        pending: Vec<B256>,
        blocks: Vec<Vec<B256>>,
        seen: usize,
    }

    impl FakeNode {
        /// Takes one raw transaction: its hash, or an error object.
        fn take(&mut self, raw: &Value) -> Result<B256, Value> {
            self.seen += 1;
            if self.seen.is_multiple_of(7) {
                return Err(json!({"code": -32000, "message": "nonce too low"}));
            }
            let raw = hex::decode(raw.as_str().unwrap()).unwrap();
            let hash = alloy_primitives::keccak256(raw);
            self.pending.push(hash);
            Ok(hash)
        }
    }

    fn answer(node: &Mutex<FakeNode>, call: &Value) -> Value {
        let id = call["id"].clone();
        let mut node = node.lock().unwrap();
        let result = match call["method"].as_str().unwrap() {
            "eth_blockNumber" => json!(format!("{:#x}", node.blocks.len())),
            "eth_sendRawTransaction" => match node.take(&call["params"][0]) {
                Ok(hash) => json!(hash),
                Err(error) => return json!({"jsonrpc": "2.0", "id": id, "error": error}),
            },
            "overdrive_sendRawTransactions" => call["params"][0]
                .as_array()
                .unwrap()
                .iter()
                .map(|raw| match node.take(raw) {
                    Ok(hash) => json!({"hash": hash}),
                    Err(error) => json!({"error": error}),
                })
                .collect(),
            "eth_getBlockByNumber" => {
                let n = quantity(&call["params"][0]).unwrap() as usize;
                let txs = &node.blocks[n - 1];
                json!({"transactions": txs, "gasUsed": format!("{:#x}", txs.len() * 21_000)})
            }
            other => panic!("unexpected {other}"),
        };
        json!({"jsonrpc": "2.0", "id": id, "result": result})
    }

    fn serve(node: Arc<Mutex<FakeNode>>) -> String {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let sealer = node.clone();
        std::thread::spawn(move || {
            loop {
                std::thread::sleep(Duration::from_millis(50));
                let mut node = sealer.lock().unwrap();
                let block = std::mem::take(&mut node.pending);
                node.blocks.push(block);
            }
        });
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let mut stream = stream.unwrap();
                let mut reader = BufReader::new(stream.try_clone().unwrap());
                let mut length = 0;
                loop {
                    let mut line = String::new();
                    reader.read_line(&mut line).unwrap();
                    if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                        length = v.trim().parse().unwrap();
                    }
                    if line == "\r\n" {
                        break;
                    }
                }
                let mut body = vec![0; length];
                reader.read_exact(&mut body).unwrap();
                let request: Value = serde_json::from_slice(&body).unwrap();
                let response = match &request {
                    Value::Array(calls) => {
                        Value::Array(calls.iter().map(|c| answer(&node, c)).collect())
                    }
                    call => answer(&node, call),
                }
                .to_string();
                let _ = write!(
                    stream,
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{response}",
                    response.len()
                );
            }
        });
        url
    }

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        load: LoadArgs,
    }

    /// Every transaction is sent once, each refusal is counted with its message, and every
    /// accepted one is found in a block; one transaction a call or a list a call.
    #[test]
    fn a_run_sees_every_transaction_sent_refused_or_included() {
        for submit in ["single", "batch"] {
            run_against_a_fake_node(submit);
        }
    }

    fn run_against_a_fake_node(submit: &str) {
        let node = Arc::new(Mutex::new(FakeNode {
            pending: Vec::new(),
            blocks: Vec::new(),
            seen: 0,
        }));
        let url = serve(node.clone());
        let args = Cli::parse_from([
            "t",
            "--rpc",
            &url,
            "--workload",
            "transfer",
            "--accounts",
            "200",
            "--txs",
            "700",
            "--rate",
            "2000",
            "--duration",
            "5",
            "--connections",
            "3",
            "--batch",
            "50",
            "--submit",
            submit,
        ])
        .load;
        let (_, txs) = presign(&args).unwrap();
        assert_eq!(txs.len(), 700);
        let observed = run_load(&Rpc::new(&url).unwrap(), &txs, &args, args.submit).unwrap();
        let report = Report::new("transfer", 200, &observed);
        assert_eq!(report.rejected, 100, "{:?}", report.rejected_by_error);
        assert_eq!(report.rejected_by_error["nonce too low"], 100);
        assert_eq!((report.sent, report.included), (600, 600));
        assert_eq!(node.lock().unwrap().seen, 700);
        // 2,000 a second: about a third of a second of sending.
        assert!(report.tps > 0.0 && report.window_s < 3.0, "{report:?}");
        assert!(report.p50_ms > 0.0 && report.p99_ms >= report.p50_ms);
    }

    #[test]
    fn rates() {
        assert_eq!(parse_rate("max"), Ok(Rate::Max));
        assert_eq!(parse_rate("1500"), Ok(Rate::PerSecond(1500.0)));
        assert!(parse_rate("0").is_err());
        assert!(parse_rate("fast").is_err());
    }
}
