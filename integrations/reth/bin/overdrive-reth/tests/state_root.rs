//! `node --overdrive.state-root overdrive`: the engine takes each new block's state root from
//! overdrive's trie, and the trie tables reth persists from its rows are the ones reth's own
//! merkle stage builds from the same state — also when the node was killed with SIGKILL under
//! load and started again (the restart rebuilds the trie from the database and checks its root
//! against the head's header).

mod support;

use overdrive_chain::Fork;
use overdrive_workload::{WorkloadConfig, WorkloadKind};
use reth_provider::BlockNumReader;
use std::time::Duration;
use support::imports::{tail, trie_rows};

fn wait_mined(http: u16, hash: alloy_primitives::B256) {
    support::wait_for(
        "the last transaction to be mined",
        Duration::from_secs(120),
        || {
            support::rpc(http, "eth_getTransactionReceipt", serde_json::json!([hash]))
                .filter(|r| !r.is_null())
        },
    );
}

#[test]
fn the_engine_takes_its_roots_from_overdrives_trie_across_a_kill() {
    let workload = overdrive_workload::generate(&WorkloadConfig {
        accounts: 300,
        txs_per_block: 150,
        blocks: 10,
        pairs: 8,
        ..WorkloadConfig::new(WorkloadKind::Uniswap)
    })
    .unwrap();
    let chain = overdrive_chain::build(&workload, Fork::Prague).unwrap();
    let dir = support::temp_dir("state-root");
    let (genesis, _) = overdrive_chain::write(&chain, dir.path()).unwrap();
    let raw = support::raw_transactions;
    let last_of = |blocks: &[overdrive_primitives::BlockWithSenders]| {
        *blocks.last().unwrap().transactions.last().unwrap().hash()
    };
    let (first, second) = workload.blocks.split_at(5);
    let flags = [
        "--dev.block-time",
        "1s",
        "--overdrive.state-root",
        "overdrive",
        "--overdrive.trie.threads",
        "2",
        // Blocks persisted as soon as they are canonical: the kill finds some on disk.
        "--engine.persistence-threshold",
        "0",
    ];

    // The first half mined, then the node killed while it mines the second.
    let (http, metrics) = (support::free_port(), support::free_port());
    let mut node = support::dev_node(&genesis, dir.path(), http, metrics, &flags);
    // One block of the workload at a time, so that the node mines one block for each.
    for block in first.chunks(1) {
        support::send_raw(http, &raw(block), true);
        wait_mined(http, last_of(block));
    }
    std::thread::sleep(Duration::from_secs(3));
    support::send_raw(http, &raw(second), true);
    std::thread::sleep(Duration::from_millis(1500));
    node.0.kill().unwrap();
    node.0.wait().unwrap();
    let log = std::fs::read_to_string(dir.path().join("node.log")).unwrap();
    assert!(log.contains("Built overdrive's trie"), "{}", tail(&log));

    // Started again: the trie is rebuilt from the database (its root checked against the
    // persisted head's), and what the kill lost is sent again (what was kept is refused).
    let (http, metrics) = (support::free_port(), support::free_port());
    let mut node = support::dev_node(&genesis, dir.path(), http, metrics, &flags);
    let log = std::fs::read_to_string(dir.path().join("node.log")).unwrap();
    let built = log
        .lines()
        .find(|l| l.contains("Built overdrive's trie"))
        .unwrap_or_else(|| panic!("no trie built at the restart:\n{}", tail(&log)));
    assert!(
        !built.contains("head=0 "),
        "nothing persisted before the kill: {built}"
    );
    support::send_raw(http, &raw(first), false);
    for block in second.chunks(1) {
        support::send_raw(http, &raw(block), false);
        wait_mined(http, last_of(block));
    }
    std::thread::sleep(Duration::from_secs(2));
    let page = support::http(metrics, "/", None).expect("the metrics endpoint answers");
    let log = std::fs::read_to_string(dir.path().join("node.log")).unwrap();
    let ours = support::counter(
        &page,
        "overdrive_state_root_blocks_total",
        "root=\"overdrive\"",
    );
    assert!(
        ours >= 1.0,
        "no root from overdrive's trie:\n{page}\n{}",
        tail(&log)
    );
    assert_eq!(
        support::counter(&page, "overdrive_state_root_blocks_total", "root=\"reth\""),
        0.0,
        "{page}"
    );
    assert!(
        !page.contains("overdrive_state_root_failures_total"),
        "{page}"
    );
    assert!(log.contains("strategy=\"overdrive\""), "{}", tail(&log));

    // Stopped as an operator stops it, so that it persists what it holds.
    // SAFETY: signalling a child process this test started.
    unsafe { libc::kill(node.0.id() as i32, libc::SIGTERM) };
    let status = support::wait_for("the node to stop", Duration::from_secs(60), || {
        node.0.try_wait().unwrap()
    });
    let log = std::fs::read_to_string(dir.path().join("node.log")).unwrap();
    assert!(status.success(), "{status}\n{}", tail(&log));

    // reth's merkle stage rebuilds the tries of the same head from the hashed state, in a copy.
    let datadir = dir.path().join("data");
    let head = support::open(support::reth_spec(&genesis), &datadir)
        .provider()
        .unwrap()
        .best_block_number()
        .unwrap();
    assert!(head >= 10, "head {head}");
    let rows = trie_rows(&genesis, &datadir);
    let rebuilt = dir.path().join("rebuilt");
    support::run_ok(
        std::process::Command::new("cp")
            .arg("-a")
            .arg(&datadir)
            .arg(&rebuilt),
    );
    let output = support::run_ok(
        support::overdrive_reth()
            .args(["stage", "run", "merkle", "--color", "never", "--chain"])
            .arg(&genesis)
            .arg("--datadir")
            .arg(&rebuilt)
            .args([
                "--from",
                "0",
                "--to",
                &head.to_string(),
                "--skip-unwind",
                "--commit",
            ]),
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(stdout.contains("Finished stage"), "{}", tail(&stdout));
    let expected = trie_rows(&genesis, &rebuilt);
    assert!(!expected.1.is_empty(), "no storage trie rows");
    println!(
        "head {head}; {ours} roots from overdrive's trie after the restart; {} account and {} storage trie rows",
        rows.0.len(),
        rows.1.len()
    );
    assert!(
        rows.0 == expected.0,
        "the account trie rows differ from reth's rebuild"
    );
    assert!(
        rows.1 == expected.1,
        "the storage trie rows differ from reth's rebuild"
    );
}
