//! `overdrive bench replay`: an exported chain replayed into a fresh node through the Engine
//! API (`engine_newPayloadV4` then `engine_forkchoiceUpdatedV3`, block by block), as a
//! consensus client would feed it, into stock reth and into overdrive-reth with one component
//! on: the parallel executor, or overdrive's state root. It measures the engine's validation
//! path alone: no transaction pool, no RPC intake, no payload building. With the state root,
//! it also compares each block's root time, from the engine's own log line for every root
//! ("State root job finished", with the strategy that computed it), and each node's reads of
//! the trie and hashed-state tables per block, from reth's metrics.

use super::{Component, node, rpc::Rpc};
use alloy_consensus::{Block, TxEnvelope};
use alloy_primitives::B256;
use alloy_rpc_types_engine::ExecutionPayloadV3;
use base64::{Engine as _, engine::general_purpose::URL_SAFE_NO_PAD};
use clap::Args;
use eyre::{WrapErr, bail, eyre};
use hmac::{Hmac, Mac};
use overdrive_bench::round;
use serde_json::{Value, json};
use std::{
    path::{Path, PathBuf},
    time::Instant,
};

#[derive(Debug, Args)]
pub struct ReplayArgs {
    /// A folder from `overdrive chain export` (genesis.json and chain.rlp).
    #[arg(long)]
    chain: PathBuf,
    /// The overdrive-reth binary (default: $OVERDRIVE_RETH_BIN).
    #[arg(long, value_name = "PATH")]
    reth_bin: Option<PathBuf>,
    /// The component overdrive-reth runs.
    #[arg(long, value_enum, default_value_t)]
    component: Component,
    /// Threads of the component.
    #[arg(long, default_value_t = 2, value_parser = crate::commands::positive)]
    threads: usize,
    /// With `--component state-root`: the memory overdrive's trie keeps its nodes in, in MiB
    /// (`--overdrive.trie.cache-mb`; default: the whole trie).
    #[arg(long, value_name = "MIB")]
    trie_cache_mb: Option<u32>,
    /// With `--component state-root`: whether overdrive's trie takes what a block's root
    /// will read while the block executes (`--overdrive.trie.prefetch`; default: the node's,
    /// auto).
    #[arg(long, value_name = "WHEN", value_parser = ["auto", "on", "off"])]
    trie_prefetch: Option<String>,
    /// With `--component state-root`: overdrive's trie hashes each block's updates in rounds
    /// while the block executes (`--overdrive.trie.hash-ahead`; the whole trie only).
    #[arg(long, conflicts_with = "trie_cache_mb")]
    trie_hash_ahead: bool,
    /// Both nodes run reth's sparse-trie state-root task whatever the machine's core count
    /// (`--overdrive.engine.state-root-task`): below five cores, where reth otherwise computes
    /// the root after execution on one thread, to compare against its task.
    #[arg(long)]
    state_root_task: bool,
    /// Where the nodes' datadirs and logs go.
    #[arg(long, default_value = "replay-report")]
    out: PathBuf,
    /// End with one JSON line of the figures.
    #[arg(long)]
    json: bool,
}

/// One node's replay.
struct Replayed {
    blocks: usize,
    gas: u64,
    seconds: f64,
    /// Each block's root as the engine logged it, in order.
    roots: Vec<RootTime>,
    /// Reads of the trie and hashed-state tables during the replay, by [`TABLES`].
    table_reads: [f64; 2],
    /// The node's peak resident memory, in MiB.
    peak_mib: Option<f64>,
}

/// Reads of the tables a state root reads (through reth's overlay of unpersisted blocks), as
/// reth's metrics count them, by table kind: the counters of reth's `StateRoot` (its
/// synchronous root: the walker's trie seeks, the node iterator's hashed seeks and nexts) and
/// those of the proof workers of its sparse-trie task (every cursor operation). overdrive's
/// trie reads the hashed tables only for the levels it does not keep (`--overdrive.trie.cache-mb`):
/// a seek for each subtree it reads back and a next for each leaf.
const TABLES: [(&str, &[&str]); 2] = [
    (
        "trie tables",
        &[
            "reth_trie_walker_branch_nodes_seeked_total",
            "reth_trie_cursor_operations_sum",
        ],
    ),
    (
        "hashed tables",
        &[
            "reth_trie_node_iter_leaf_nodes_seeked_total",
            "reth_trie_node_iter_leaf_nodes_advanced_total",
            "reth_trie_hashed_cursor_operations_sum",
            "reth_overdrive_state_root_subtrees_read_total",
            "reth_overdrive_state_root_leaves_read_total",
        ],
    ),
];

/// One "State root job finished" line of the engine.
#[derive(Debug, Clone, PartialEq)]
struct RootTime {
    strategy: String,
    root: String,
    seconds: f64,
}

pub fn run(args: ReplayArgs) -> eyre::Result<()> {
    let genesis = args.chain.join("genesis.json");
    let blocks = read_chain(&args.chain.join("chain.rlp"))?;
    let reth = super::reth_binary(args.reth_bin.clone())?;
    std::fs::create_dir_all(&args.out)?;
    let threads = args.threads.to_string();
    let cache_mb = args.trie_cache_mb.map(|mb| mb.to_string());
    let mut runs = super::stock_and_overdrive(args.component, &threads, false);
    if let Some(mb) = &cache_mb {
        if args.component != Component::StateRoot {
            bail!("--trie-cache-mb is a setting of --component state-root");
        }
        runs[1].1.extend(["--overdrive.trie.cache-mb", mb.as_str()]);
    }
    if let Some(when) = &args.trie_prefetch {
        if args.component != Component::StateRoot {
            bail!("--trie-prefetch is a setting of --component state-root");
        }
        runs[1]
            .1
            .extend(["--overdrive.trie.prefetch", when.as_str()]);
    }
    if args.trie_hash_ahead {
        if args.component != Component::StateRoot {
            bail!("--trie-hash-ahead is a setting of --component state-root");
        }
        runs[1].1.push("--overdrive.trie.hash-ahead");
    }
    if args.state_root_task {
        for (_, flags) in &mut runs {
            flags.push("--overdrive.engine.state-root-task");
        }
    }
    let mut results = Vec::new();
    for (label, flags) in runs {
        let datadir = args.out.join(format!("{label}-data"));
        let _ = std::fs::remove_dir_all(&datadir);
        std::fs::create_dir_all(&datadir)?;
        let secret: [u8; 32] = rand::random();
        let jwt_path = datadir.join("jwt.hex");
        std::fs::write(&jwt_path, alloy_primitives::hex::encode(secret))?;
        let node = node::DevNode::start(&node::DevNodeConfig {
            binary: &reth,
            genesis: &genesis,
            datadir: &datadir,
            log: &args.out.join(format!("{label}.log")),
            gas_limit: 0,
            block_time: 0,
            flags: &flags,
            jwt: Some(&jwt_path),
        })?;
        let engine = Rpc::new(&node.engine_url())?.with_bearer(move || jwt(&secret));
        // Genesis and launch read the tables too: only what the replay adds counts.
        let reads_before = table_reads(&node)?;
        let replayed = replay(&engine, &blocks);
        let reads = table_reads(&node);
        let peak_mib = node.peak_memory_mib();
        node.stop();
        let log = args.out.join(format!("{label}.log"));
        let mut replayed = replayed.wrap_err_with(|| format!("replaying into the {label} node"))?;
        let reads = reads?;
        replayed.table_reads = [0, 1].map(|kind| reads[kind] - reads_before[kind]);
        replayed.peak_mib = peak_mib;
        replayed.roots = root_times(
            &std::fs::read_to_string(&log)
                .wrap_err_with(|| format!("reading {}", log.display()))?,
        );
        println!(
            "{label}: {} blocks, {:.1} Mgas in {:.2} s: {:.1} Mgas/s; peak memory {}",
            replayed.blocks,
            replayed.gas as f64 / 1e6,
            replayed.seconds,
            replayed.gas as f64 / 1e6 / replayed.seconds,
            replayed
                .peak_mib
                .map_or("unknown".to_string(), |mib| format!("{mib:.0} MiB"))
        );
        results.push(replayed);
        let _ = std::fs::remove_dir_all(&datadir);
    }
    let gas_per_s = |r: &Replayed| r.gas as f64 / r.seconds;
    let (stock, overdrive) = (gas_per_s(&results[0]), gas_per_s(&results[1]));
    let speedup = round(overdrive / stock, 2);
    println!("replay: {speedup}x overdrive over stock");
    let roots = match args.component {
        Component::Exec => Value::Null,
        Component::StateRoot => {
            let mut roots = compare_roots(&results[0].roots, &results[1].roots)?;
            roots["table_reads_per_block"] = compare_table_reads(&results[0], &results[1]);
            roots
        }
    };
    if args.json {
        println!(
            "{}",
            json!({"bench": "replay", "component": format!("{:?}", args.component),
                "blocks": results[0].blocks,
                "stock_mgas_per_s": round(stock / 1e6, 2),
                "overdrive_mgas_per_s": round(overdrive / 1e6, 2), "speedup": speedup,
                "stock_peak_mib": results[0].peak_mib.map(|mib| round(mib, 0)),
                "overdrive_peak_mib": results[1].peak_mib.map(|mib| round(mib, 0)),
                "state_root": roots})
        );
    }
    Ok(())
}

/// The node's [`TABLES`] reads so far. reth records a proof worker's counts when the worker
/// ends, after its block's root: the counts are read until they settle.
fn table_reads(node: &node::DevNode) -> eyre::Result<[f64; 2]> {
    let read = || -> eyre::Result<[f64; 2]> {
        let page = node.metrics_page()?;
        Ok(TABLES.map(|(_, metrics)| {
            metrics
                .iter()
                .map(|metric| node::metric_sum(&page, metric, ""))
                .sum()
        }))
    };
    let mut last = read()?;
    for _ in 0..20 {
        std::thread::sleep(std::time::Duration::from_millis(250));
        let now = read()?;
        if now == last {
            break;
        }
        last = now;
    }
    Ok(last)
}

/// Prints each node's table reads per block and returns them as JSON.
fn compare_table_reads(stock: &Replayed, overdrive: &Replayed) -> Value {
    let mut json = json!({});
    for (label, replayed) in [("stock", stock), ("overdrive", overdrive)] {
        let per_block = replayed
            .table_reads
            .map(|reads| round(reads / replayed.blocks.max(1) as f64, 1));
        println!(
            "table reads per block ({label}): {} in the trie tables, {} in the hashed tables",
            per_block[0], per_block[1]
        );
        json[label] = json!({TABLES[0].0: per_block[0], TABLES[1].0: per_block[1]});
    }
    json
}

/// Every "State root job finished" line of a node's log: the strategy, the root and the time.
fn root_times(log: &str) -> Vec<RootTime> {
    log.lines()
        .filter(|line| line.contains("State root job finished"))
        .filter_map(|line| {
            let field = |name: &str| {
                line.split_whitespace()
                    .find_map(|word| word.strip_prefix(name))
                    .map(|value| value.trim_matches('"').to_string())
            };
            Some(RootTime {
                strategy: field("strategy=")?,
                root: field("state_root=")?,
                seconds: duration_seconds(&field("elapsed=")?)?,
            })
        })
        .collect()
}

/// A `Duration`'s `Debug` form (`850ns`, `12.5µs`, `3.2ms`, `1.05s`) in seconds.
fn duration_seconds(text: &str) -> Option<f64> {
    let split = text.find(|c: char| !(c.is_ascii_digit() || c == '.'))?;
    let (number, unit) = text.split_at(split);
    let scale = match unit {
        "ns" => 1e-9,
        "µs" | "us" => 1e-6,
        "ms" => 1e-3,
        "s" => 1.0,
        _ => return None,
    };
    Some(number.parse::<f64>().ok()? * scale)
}

/// Prints the two nodes' root times over the same blocks (paired by root) and returns them as
/// JSON. Fails when the nodes computed different roots or either logged none.
fn compare_roots(stock: &[RootTime], overdrive: &[RootTime]) -> eyre::Result<Value> {
    if stock.is_empty() || overdrive.is_empty() {
        bail!(
            "the engine logged {} roots in the stock node and {} in overdrive's: no \"State root job finished\" lines to compare",
            stock.len(),
            overdrive.len()
        );
    }
    let roots = |times: &[RootTime]| times.iter().map(|t| t.root.clone()).collect::<Vec<_>>();
    if roots(stock) != roots(overdrive) {
        bail!("the two nodes logged different roots for the same blocks");
    }
    let strategies = |times: &[RootTime]| {
        let mut names: Vec<&str> = times.iter().map(|t| t.strategy.as_str()).collect();
        names.sort_unstable();
        names.dedup();
        names.join("+")
    };
    let total = |times: &[RootTime]| times.iter().map(|t| t.seconds).sum::<f64>();
    let mut ratios: Vec<f64> = stock
        .iter()
        .zip(overdrive)
        .map(|(s, o)| s.seconds / o.seconds.max(1e-9))
        .collect();
    ratios.sort_unstable_by(f64::total_cmp);
    let median = ratios[ratios.len() / 2];
    let (stock_total, overdrive_total) = (total(stock), total(overdrive));
    println!(
        "state root: {} blocks; stock ({}) {:.1} ms, overdrive ({}) {:.1} ms in all: {:.2}x; per block median {:.2}x (range {:.2}-{:.2})",
        stock.len(),
        strategies(stock),
        stock_total * 1e3,
        strategies(overdrive),
        overdrive_total * 1e3,
        stock_total / overdrive_total,
        median,
        ratios[0],
        ratios[ratios.len() - 1]
    );
    Ok(
        json!({"blocks": stock.len(), "stock_strategy": strategies(stock),
        "overdrive_strategy": strategies(overdrive),
        "stock_ms": round(stock_total * 1e3, 2), "overdrive_ms": round(overdrive_total * 1e3, 2),
        "speedup": round(stock_total / overdrive_total, 2), "median_block_speedup": round(median, 2)}),
    )
}

pub(super) fn read_chain(path: &Path) -> eyre::Result<Vec<Block<TxEnvelope>>> {
    let bytes = std::fs::read(path).wrap_err_with(|| format!("reading {}", path.display()))?;
    let mut rest = bytes.as_slice();
    let mut blocks = Vec::new();
    while !rest.is_empty() {
        let block = alloy_rlp::Decodable::decode(&mut rest).map_err(|e| {
            eyre!(
                "{}: block {} does not decode: {e}",
                path.display(),
                blocks.len() + 1
            )
        })?;
        blocks.push(block);
    }
    Ok(blocks)
}

/// Sends every block as a payload and makes it the head; times the whole.
fn replay(engine: &Rpc, blocks: &[Block<TxEnvelope>]) -> eyre::Result<Replayed> {
    let started = Instant::now();
    let mut gas = 0;
    for block in blocks {
        let hash = block.header.hash_slow();
        let payload = ExecutionPayloadV3::from_block_unchecked(hash, block);
        let beacon_root = block.header.parent_beacon_block_root.unwrap_or_default();
        // Generated chains carry no EIP-7685 requests.
        let status = engine.call(
            "engine_newPayloadV4",
            json!([
                payload,
                Vec::<B256>::new(),
                beacon_root,
                Vec::<String>::new()
            ]),
        )?;
        if status["status"] != "VALID" {
            bail!(
                "block {}: newPayload answered {status}",
                block.header.number
            );
        }
        let state =
            json!({"headBlockHash": hash, "safeBlockHash": hash, "finalizedBlockHash": hash});
        let updated = engine.call("engine_forkchoiceUpdatedV3", json!([state, Value::Null]))?;
        if updated["payloadStatus"]["status"] != "VALID" {
            bail!(
                "block {}: forkchoiceUpdated answered {updated}",
                block.header.number
            );
        }
        gas += block.header.gas_used;
    }
    Ok(Replayed {
        blocks: blocks.len(),
        gas,
        seconds: started.elapsed().as_secs_f64(),
        roots: Vec::new(),
        table_reads: [0.0; 2],
        peak_mib: None,
    })
}

/// An Engine API token: HS256 over `{"iat": now}` with the node's secret.
fn jwt(secret: &[u8; 32]) -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    jwt_at(secret, now)
}

fn jwt_at(secret: &[u8; 32], now: u64) -> String {
    let header = URL_SAFE_NO_PAD.encode(r#"{"alg":"HS256","typ":"JWT"}"#);
    let claims = URL_SAFE_NO_PAD.encode(format!(r#"{{"iat":{now}}}"#));
    let signing_input = format!("{header}.{claims}");
    let mut mac = Hmac::<sha2::Sha256>::new_from_slice(secret).expect("any key length");
    mac.update(signing_input.as_bytes());
    let signature = URL_SAFE_NO_PAD.encode(mac.finalize().into_bytes());
    format!("{signing_input}.{signature}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn root_lines_are_read_from_the_log() {
        let log = "2026-11-28T01:00:00.000000Z  INFO engine::tree::payload_validator: State root job finished strategy=\"overdrive\" state_root=0xab elapsed=1.5ms\n\
                   2026-11-28T01:00:01.000000Z  INFO reth::cli: something else elapsed=3s\n\
                   2026-11-28T01:00:02.000000Z  INFO engine::tree::payload_validator: State root job finished strategy=synchronous state_root=0xcd elapsed=250µs\n";
        let times = root_times(log);
        assert_eq!(times.len(), 2);
        assert_eq!(
            (times[0].strategy.as_str(), times[0].root.as_str()),
            ("overdrive", "0xab")
        );
        assert!((times[0].seconds - 0.0015).abs() < 1e-12);
        assert!((times[1].seconds - 0.000_25).abs() < 1e-12);
        assert_eq!(duration_seconds("2s"), Some(2.0));
        assert!((duration_seconds("12ns").unwrap() - 12e-9).abs() < 1e-18);
        assert_eq!(duration_seconds("ms"), None);
        assert_eq!(duration_seconds("5m"), None);
    }

    #[test]
    fn nodes_with_different_roots_do_not_compare() {
        let time = |root: &str, seconds| RootTime {
            strategy: "x".into(),
            root: root.into(),
            seconds,
        };
        assert!(compare_roots(&[time("0x1", 1.0)], &[time("0x2", 0.5)]).is_err());
        assert!(compare_roots(&[], &[time("0x2", 0.5)]).is_err());
        let same = compare_roots(&[time("0x1", 1.0)], &[time("0x1", 0.5)]).unwrap();
        assert_eq!(same["speedup"], 2.0);
    }

    #[test]
    fn table_reads_are_given_per_block() {
        let replayed = |table_reads| Replayed {
            blocks: 4,
            gas: 0,
            seconds: 1.0,
            roots: Vec::new(),
            table_reads,
            peak_mib: None,
        };
        let reads = compare_table_reads(&replayed([10.0, 402.0]), &replayed([0.0, 0.0]));
        assert_eq!(reads["stock"]["trie tables"], 2.5);
        assert_eq!(reads["stock"]["hashed tables"], 100.5);
        assert_eq!(reads["overdrive"]["hashed tables"], 0.0);
    }

    #[test]
    fn tokens_are_hs256_jwts() {
        let secret = [7u8; 32];
        let token = jwt_at(&secret, 1_700_000_000);
        let parts: Vec<&str> = token.split('.').collect();
        assert_eq!(parts[0], "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9");
        assert_eq!(
            URL_SAFE_NO_PAD.decode(parts[1]).unwrap(),
            br#"{"iat":1700000000}"#
        );
        let mut mac = Hmac::<sha2::Sha256>::new_from_slice(&secret).unwrap();
        mac.update(format!("{}.{}", parts[0], parts[1]).as_bytes());
        mac.verify_slice(&URL_SAFE_NO_PAD.decode(parts[2]).unwrap())
            .expect("the signature is the secret's");
        assert_ne!(jwt_at(&[8u8; 32], 1_700_000_000), token);
    }
}
