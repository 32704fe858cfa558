//! `overdrive-reth node --dev --overdrive.exec parallel` killed with SIGKILL after a load:
//! restarted on the same datadir it still has every block it had shown but the newest (which
//! may still have been on its way to disk: with a persistence threshold of 0 reth writes each
//! block right after it becomes canonical), takes and mines transactions again, and its chain
//! is what a stock reth import of the same blocks gives.

mod support;

use alloy_eips::eip2718::Encodable2718;
use overdrive_chain::Fork;
use overdrive_workload::{WorkloadConfig, WorkloadKind};
use reth_provider::{BlockHashReader, BlockNumReader, HeaderProvider};
use serde_json::{Value, json};
use std::{path::Path, time::Duration};

/// A running node (killed when dropped) and its HTTP port.
struct Node {
    _process: support::KillOnDrop,
    http: u16,
}

/// A dev node on `datadir` that persists every block as soon as it is canonical.
fn start(genesis: &Path, datadir: &Path, log: &Path) -> Node {
    let http = support::free_port();
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .unwrap();
    let child = support::overdrive_reth()
        .args(["node", "--dev", "--dev.block-time", "1s", "--chain"])
        .arg(genesis)
        .arg("--datadir")
        .arg(datadir)
        .args([
            "--http",
            "--http.port",
            &http.to_string(),
            "--http.api",
            "eth,debug",
        ])
        .args(support::off_network())
        .args(["--engine.persistence-threshold", "0"])
        .args(["--engine.memory-block-buffer-target", "0"])
        .args([
            "--overdrive.exec",
            "parallel",
            "--overdrive.exec.threads",
            "2",
        ])
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .unwrap();
    let node = Node {
        _process: support::KillOnDrop(child),
        http,
    };
    support::wait_for("the node's RPC", Duration::from_secs(90), || {
        support::rpc(http, "eth_blockNumber", json!([]))
    });
    node
}

fn number(value: &Value) -> u64 {
    u64::from_str_radix(value.as_str().unwrap().trim_start_matches("0x"), 16).unwrap()
}

fn head(node: &Node) -> u64 {
    number(&support::rpc(node.http, "eth_blockNumber", json!([])).unwrap())
}

fn block_hash(node: &Node, n: u64) -> Option<String> {
    let block = support::rpc(
        node.http,
        "eth_getBlockByNumber",
        json!([format!("{n:#x}"), false]),
    )?;
    Some(block.get("hash")?.as_str()?.to_string())
}

/// Sends `txs` in batches and waits until the last one is mined.
fn send_and_mine(node: &Node, txs: &[String], last: &str) {
    for chunk in txs.chunks(100) {
        let batch: Vec<_> = chunk
            .iter()
            .enumerate()
            .map(|(i, tx)| json!({"jsonrpc": "2.0", "id": i, "method": "eth_sendRawTransaction", "params": [tx]}))
            .collect();
        let response = support::http(node.http, "/", Some(&Value::Array(batch).to_string()))
            .expect("the node answers");
        assert!(!response.contains("\"error\""), "refused: {response}");
    }
    support::wait_for(
        "the transactions to be mined",
        Duration::from_secs(120),
        || {
            support::rpc(node.http, "eth_getTransactionReceipt", json!([last]))
                .filter(|r| !r.is_null())
        },
    );
}

#[test]
fn a_killed_node_keeps_its_persisted_blocks_and_goes_on() {
    let workload = overdrive_workload::generate(&WorkloadConfig {
        accounts: 300,
        txs_per_block: 150,
        blocks: 6,
        ..WorkloadConfig::new(WorkloadKind::Erc20)
    })
    .unwrap();
    let chain = overdrive_chain::build(workload.clone(), Fork::Prague).unwrap();
    let dir = support::temp_dir("crash");
    let (genesis, _) = overdrive_chain::write(&chain, dir.path()).unwrap();
    let (datadir, log) = (dir.path().join("data"), dir.path().join("node.log"));
    let txs: Vec<_> = workload
        .blocks
        .iter()
        .flat_map(|b| &b.transactions)
        .collect();
    let raw: Vec<String> = txs
        .iter()
        .map(|tx| {
            format!(
                "0x{}",
                alloy_primitives::hex::encode(tx.inner().encoded_2718())
            )
        })
        .collect();
    let hash = |i: usize| txs[i].inner().tx_hash().to_string();
    let half = raw.len() / 2;

    // Load, a few empty blocks after it, then SIGKILL right after reading every block's hash.
    let node = start(&genesis, &datadir, &log);
    send_and_mine(&node, &raw[..half], &hash(half - 1));
    let loaded = head(&node);
    support::wait_for("three more blocks", Duration::from_secs(60), || {
        (head(&node) >= loaded + 3).then_some(())
    });
    let mut seen: Vec<(u64, String)> = (1..=head(&node))
        .map(|n| (n, block_hash(&node, n).unwrap()))
        .collect();
    drop(node);
    // The newest may not have reached the disk.
    seen.pop();
    assert!(seen.len() >= 3, "{seen:?}");

    let node = start(&genesis, &datadir, &log);
    for (n, expected) in &seen {
        assert_eq!(
            block_hash(&node, *n).as_ref(),
            Some(expected),
            "block {n} lost or changed after the restart"
        );
    }
    // It takes transactions again: the rest of the load.
    send_and_mine(&node, &raw[half..], &hash(raw.len() - 1));
    let last = head(&node);
    let head_hash = block_hash(&node, last).unwrap();
    let mut file = Vec::new();
    for n in 1..=last {
        let rlp = support::rpc(node.http, "debug_getRawBlock", json!([format!("{n:#x}")])).unwrap();
        file.extend(alloy_primitives::hex::decode(rlp.as_str().unwrap()).unwrap());
    }
    drop(node);

    // A clean import by stock reth of the blocks the node holds: same head, same state root.
    let blocks = dir.path().join("blocks.rlp");
    std::fs::write(&blocks, file).unwrap();
    let fresh = dir.path().join("fresh");
    support::init_datadir(&genesis, &fresh);
    support::run_ok(
        support::overdrive_reth()
            .args(["import", "--color", "never", "--chain"])
            .arg(&genesis)
            .arg("--datadir")
            .arg(&fresh)
            .arg(&blocks),
    );
    let factory = support::open(support::reth_spec(&genesis), &fresh);
    let provider = factory.provider().unwrap();
    assert_eq!(provider.best_block_number().unwrap(), last);
    assert_eq!(
        provider.block_hash(last).unwrap().unwrap().to_string(),
        head_hash,
        "the imported head differs from the node's"
    );
    // The header's state root is the imported one's, which import checked against execution.
    assert!(provider.header_by_number(last).unwrap().is_some());
}
