//! `overdrive-reth node --dev` under a stream of pre-signed transactions: it mines them all,
//! and with `--overdrive.exec parallel` the engine validates the blocks on overdrive's parallel
//! executor (counted by the timings ExEx's metrics); without the flag it is stock reth (no
//! overdrive metrics at all).

mod support;

use overdrive_chain::Fork;
use overdrive_workload::{WorkloadConfig, WorkloadKind};
use std::time::Duration;

/// Runs a dev node with `flags` on the workload's genesis, sends every transaction of its
/// blocks, waits until all are mined; returns the node's metrics page.
fn mine_all(flags: &[&str]) -> String {
    let workload = overdrive_workload::generate(&WorkloadConfig {
        accounts: 300,
        txs_per_block: 150,
        blocks: 4,
        ..WorkloadConfig::new(WorkloadKind::Erc20)
    })
    .unwrap();
    let chain = overdrive_chain::build(workload.clone(), Fork::Prague).unwrap();
    let dir = support::temp_dir("dev");
    let (genesis, _) = overdrive_chain::write(&chain, dir.path()).unwrap();
    let (http, metrics) = (support::free_port(), support::free_port());
    let mut node_flags = vec!["--dev.block-time", "1s"];
    node_flags.extend_from_slice(flags);
    let node = support::dev_node(&genesis, dir.path(), http, metrics, &node_flags);

    let raw = support::raw_transactions(&workload.blocks);
    support::send_raw(http, &raw, true);
    let last = workload
        .blocks
        .last()
        .unwrap()
        .transactions
        .last()
        .unwrap()
        .hash();
    support::wait_for(
        "every transaction to be mined",
        Duration::from_secs(120),
        || {
            support::rpc(http, "eth_getTransactionReceipt", serde_json::json!([last]))
                .filter(|r| !r.is_null())
        },
    );
    // The ExEx hears of a block after it is committed: give the last one a moment.
    std::thread::sleep(Duration::from_secs(2));
    let page = support::http(metrics, "/", None).expect("the metrics endpoint answers");
    drop(node);
    page
}

#[test]
fn dev_node_validates_blocks_on_the_parallel_executor() {
    let page = mine_all(&[
        "--overdrive.exec",
        "parallel",
        "--overdrive.exec.threads",
        "2",
    ]);
    let parallel = support::counter(
        &page,
        "overdrive_block_executed_total",
        "executor=\"parallel\"",
    );
    eprintln!(
        "{}",
        page.lines()
            .filter(|l| l.contains("overdrive_block") && !l.starts_with('#'))
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert!(
        parallel >= 1.0,
        "no block was validated in parallel:\n{page}"
    );
    assert_eq!(
        support::counter(&page, "overdrive_block_executed_total", "executor=\"reth\""),
        0.0,
        "{page}"
    );
}

#[test]
fn dev_node_without_flags_is_stock_reth() {
    let page = mine_all(&[]);
    assert!(
        !page.contains("overdrive_"),
        "overdrive metrics without a flag:\n{page}"
    );
}
