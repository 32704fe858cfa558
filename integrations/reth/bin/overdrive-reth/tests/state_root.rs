//! `node --overdrive.state-root overdrive`: the engine takes each new block's state root from
//! overdrive's trie, and the trie tables reth persists from its rows are the ones reth's own
//! merkle stage builds from the same state — also when the node was killed with SIGKILL under
//! load and started again (the restart rebuilds the trie from the database and checks its root
//! against the head's header). The payload builder of a `--dev` node takes its roots from
//! the same trie: on every workload, and over a token with a million storage slots, the blocks
//! it builds validate with overdrive's roots and leave reth's trie rows.

mod support;

use overdrive_chain::Fork;
use overdrive_workload::{WorkloadConfig, WorkloadKind};
use reth_provider::BlockNumReader;
use std::time::Duration;
use support::imports::{import, tail, trie_rows, write_blocks};

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
    let (dir, genesis) = write_genesis(&workload, "state-root");
    let raw = support::raw_transactions;
    let last_of = last_transaction;
    let (first, second) = workload.blocks.split_at(5);
    let flags = OVERDRIVE_ROOT;

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
    let node = support::dev_node(&genesis, dir.path(), http, metrics, &flags);
    let built = trie_built(dir.path());
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
    let ours = assert_roots_from_overdrive(metrics, dir.path());
    let (head, rows) = stop_and_compare_rows(node, &genesis, dir.path());
    assert!(head >= 10, "head {head}");
    println!("head {head}; {ours} roots from overdrive's trie after the restart; {rows}");
}

/// With `--overdrive.trie.cache-mb 0` the trie keeps only the root of each trie and its
/// children: every block, built or validated, reads the levels below back from reth's hashed
/// state tables with the blocks not yet persisted on top (three are kept in memory here),
/// much of it while the block executes (`--overdrive.trie.prefetch on`), and its roots and
/// rows are still reth's.
#[test]
fn a_trie_kept_to_its_top_levels_reads_the_rest_from_the_database() {
    let workload = overdrive_workload::generate(&WorkloadConfig {
        accounts: 300,
        txs_per_block: 100,
        blocks: 8,
        pairs: 8,
        ..WorkloadConfig::new(WorkloadKind::Uniswap)
    })
    .unwrap();
    let (dir, genesis) = write_genesis(&workload, "state-root-cache");
    // OVERDRIVE_ROOT's, with blocks kept in memory before they persist.
    let flags = [
        &OVERDRIVE_ROOT[..6],
        &[
            "--overdrive.trie.cache-mb",
            "0",
            "--overdrive.trie.prefetch",
            "on",
            "--engine.persistence-threshold",
            "3",
        ],
    ]
    .concat();
    let (node, metrics) = mine_block_by_block(&genesis, dir.path(), &workload.blocks, &flags);
    let ours = assert_roots_from_overdrive(metrics, dir.path());
    let page = support::http(metrics, "/", None).unwrap();
    let subtrees = support::counter(&page, "overdrive_state_root_subtrees_read_total", "");
    let leaves = support::counter(&page, "overdrive_state_root_leaves_read_total", "");
    let prefetched = support::counter(&page, "overdrive_state_root_prefetched_keys_total", "");
    assert!(
        subtrees >= ours && leaves > subtrees && prefetched > 0.0,
        "{page}"
    );
    let built = trie_built(dir.path());
    assert!(built.contains("kept_depth=2"), "{built}");
    let (head, rows) = stop_and_compare_rows(node, &genesis, dir.path());
    assert!(head >= 8, "head {head}");
    println!(
        "head {head}; {ours} roots from overdrive's trie, {subtrees} subtrees ({leaves} leaves) read back, {prefetched} keys prefetched; {rows}\n{built}"
    );
}

/// Every workload, mined by a `--dev` node whose payload builder and engine both take their
/// roots from overdrive's trie: the builder's root (from the transactions' state updates as
/// they execute) is the one the engine validates (from reth's bundle), no block falls back to
/// reth, and the trie tables equal reth's rebuild.
#[test]
fn every_workload_builds_and_validates_with_overdrives_roots() {
    for kind in [
        WorkloadKind::Transfer,
        WorkloadKind::Erc20,
        WorkloadKind::Uniswap,
        WorkloadKind::Hybrid,
        WorkloadKind::Chained,
        WorkloadKind::Router,
        WorkloadKind::Allowance,
        WorkloadKind::Compute,
        WorkloadKind::Exchange,
    ] {
        let workload = overdrive_workload::generate(&WorkloadConfig {
            accounts: 200,
            // Compute calls use 0.2-0.9 Mgas each.
            txs_per_block: if kind == WorkloadKind::Compute {
                15
            } else {
                60
            },
            blocks: 3,
            pairs: 4,
            ..WorkloadConfig::new(kind)
        })
        .unwrap();
        let (dir, genesis) = write_genesis(&workload, &format!("state-root-{kind:?}"));
        let (node, metrics) = mine(&genesis, dir.path(), &workload.blocks, 60);
        let ours = assert_roots_from_overdrive(metrics, dir.path());
        let (head, rows) = stop_and_compare_rows(node, &genesis, dir.path());
        println!("{kind:?}: head {head}; {ours} roots from overdrive's trie; {rows}");
    }
}

/// With `--overdrive.trie.hash-ahead` the engine's stream of each block's transactions is
/// hashed in rounds while the block executes: blocks of every kind of transaction take their
/// roots from the rounds and the rest, and the trie tables equal reth's rebuild.
#[test]
fn blocks_hashed_ahead_write_reths_rows() {
    let workload = overdrive_workload::generate(&WorkloadConfig {
        accounts: 300,
        txs_per_block: 120,
        blocks: 6,
        pairs: 4,
        ..WorkloadConfig::new(WorkloadKind::Hybrid)
    })
    .unwrap();
    let (dir, genesis) = write_genesis(&workload, "state-root-ahead");
    let flags = [&OVERDRIVE_ROOT[..], &["--overdrive.trie.hash-ahead"]].concat();
    let (node, metrics) = mine_block_by_block(&genesis, dir.path(), &workload.blocks, &flags);
    let ours = assert_roots_from_overdrive(metrics, dir.path());
    let page = support::http(metrics, "/", None).unwrap();
    let rounds = support::counter(&page, "overdrive_state_root_rounds_total", "");
    let ahead = support::counter(&page, "overdrive_state_root_blocks_hashed_ahead_total", "");
    assert!(
        rounds >= 1.0 && ahead >= 1.0,
        "no root hashed ahead:\n{page}"
    );
    let (head, rows) = stop_and_compare_rows(node, &genesis, dir.path());
    println!(
        "head {head}; {ours} roots from overdrive's trie, {ahead} of them from {rounds} rounds hashed ahead; {rows}"
    );
}

/// A token with a million storage slots (one balance per account, from genesis) under the
/// engine: the trie is built from a million-slot storage table at launch, and the blocks that
/// move balances write the token's storage trie rows reth's merkle stage writes.
#[test]
fn a_million_slot_storage_trie_through_the_engine() {
    let workload = overdrive_workload::generate(&WorkloadConfig {
        accounts: 1_000_000,
        txs_per_block: 1_000,
        blocks: 2,
        ..WorkloadConfig::new(WorkloadKind::Erc20)
    })
    .unwrap();
    let (dir, genesis) = write_genesis(&workload, "state-root-million");
    // Writing the genesis of a million accounts takes the node a while.
    let (node, metrics) = mine(&genesis, dir.path(), &workload.blocks, 600);
    drop(workload);
    let ours = assert_roots_from_overdrive(metrics, dir.path());
    let built = trie_built(dir.path());
    assert!(built.contains("storage_tries="), "{built}");
    let (head, rows) = stop_and_compare_rows(node, &genesis, dir.path());
    println!("head {head}; {ours} roots from overdrive's trie; {rows}; {built}");
}

/// A node whose pipeline backfills at launch (to the blocks an `import --no-state` stored)
/// moves the database past the trie it built at launch: the engine's first block on top gets
/// reth's root and is kept, the trie is rebuilt from the database in the background and
/// follows it, and the blocks after it take overdrive's roots; the trie rows are reth's
/// rebuild's.
#[test]
fn the_trie_catches_up_after_a_backfill() {
    let workload = overdrive_workload::generate(&WorkloadConfig {
        accounts: 300,
        txs_per_block: 100,
        blocks: 6,
        pairs: 8,
        ..WorkloadConfig::new(WorkloadKind::Uniswap)
    })
    .unwrap();
    let chain = overdrive_chain::build(workload.clone(), Fork::Prague).unwrap();
    let dir = support::temp_dir("state-root-backfill");
    let (genesis, _) = overdrive_chain::write(&chain, dir.path()).unwrap();
    let file = write_blocks(dir.path(), "chain.rlp", &chain.blocks[..4]);
    let output = import(&genesis, &file, &dir.path().join("data"), &["--no-state"]);
    assert!(
        output.status.success(),
        "{}",
        tail(&String::from_utf8_lossy(&output.stdout))
    );

    // The node first backfills the stored blocks (its pipeline, at launch).
    let (node, metrics) = mine(&genesis, dir.path(), &workload.blocks[4..], 300);
    let log_path = dir.path().join("node.log");
    support::wait_for("the trie to catch up", Duration::from_secs(120), || {
        std::fs::read_to_string(&log_path)
            .ok()
            .filter(|log| log.contains("overdrive's trie caught up with the chain"))
    });
    let count = |page: &str, root| {
        support::counter(
            page,
            "overdrive_state_root_blocks_total",
            &format!("root=\"{root}\""),
        )
    };
    let page = support::wait_for(
        "a root from the caught-up trie",
        Duration::from_secs(60),
        || support::http(metrics, "/", None).filter(|page| count(page, "overdrive") >= 1.0),
    );
    let log = std::fs::read_to_string(&log_path).unwrap();
    assert!(count(&page, "reth") >= 1.0, "{page}");
    assert!(
        !page.contains("overdrive_state_root_failures_total"),
        "{page}\n{}",
        tail(&log)
    );
    assert!(!log.contains("Invalid payload"), "{}", tail(&log));
    let launch = log
        .lines()
        .find(|l| {
            (l.contains("overdrive's trie") && l.contains("launch"))
                || l.contains("Built overdrive's trie")
        })
        .unwrap_or_default()
        .to_string();
    let caught_up = log
        .lines()
        .find(|l| l.contains("caught up with the chain"))
        .unwrap_or_default()
        .to_string();
    let (head, rows) = stop_and_compare_rows(node, &genesis, dir.path());
    assert!(head > 4, "head {head}");
    println!(
        "head {head}; {} roots from reth's strategy before the catch-up, {} from overdrive's trie after; {rows}\nat launch: {launch}\n{caught_up}",
        count(&page, "reth"),
        count(&page, "overdrive")
    );
}

/// `node` flags of every test here: overdrive's state root on two threads, a block a second,
/// and blocks persisted as soon as they are canonical (so that a kill finds some on disk).
const OVERDRIVE_ROOT: [&str; 8] = [
    "--dev.block-time",
    "1s",
    "--overdrive.state-root",
    "overdrive",
    "--overdrive.trie.threads",
    "2",
    "--engine.persistence-threshold",
    "0",
];

/// Starts a `--dev` node with overdrive's state root on `genesis` (waiting up to `startup`
/// seconds for its RPC), sends it the transactions of `blocks` and waits until the last one
/// is mined; returns the node and its metrics port.
fn mine(
    genesis: &std::path::Path,
    dir: &std::path::Path,
    blocks: &[overdrive_primitives::BlockWithSenders],
    startup: u64,
) -> (support::KillOnDrop, u16) {
    let (http, metrics) = (support::free_port(), support::free_port());
    let node = support::dev_node_within(
        genesis,
        dir,
        http,
        metrics,
        &OVERDRIVE_ROOT,
        Duration::from_secs(startup),
    );
    support::send_raw(http, &support::raw_transactions(blocks), true);
    wait_mined(http, last_transaction(blocks));
    // The metrics and the log catch up with the last block.
    std::thread::sleep(Duration::from_secs(2));
    (node, metrics)
}

/// Starts a `--dev` node with `flags` on `genesis` and sends it the transactions of `blocks` a
/// block at a time, each mined before the next is sent, so that the node's blocks follow the
/// workload's; returns the node and its metrics port.
fn mine_block_by_block(
    genesis: &std::path::Path,
    dir: &std::path::Path,
    blocks: &[overdrive_primitives::BlockWithSenders],
    flags: &[&str],
) -> (support::KillOnDrop, u16) {
    let (http, metrics) = (support::free_port(), support::free_port());
    let node = support::dev_node(genesis, dir, http, metrics, flags);
    for block in blocks.chunks(1) {
        support::send_raw(http, &support::raw_transactions(block), true);
        wait_mined(http, last_transaction(block));
    }
    // The metrics and the log catch up with the last block.
    std::thread::sleep(Duration::from_secs(2));
    (node, metrics)
}

/// The first line of `dir`'s node log (of its last launch) saying the trie was built.
fn trie_built(dir: &std::path::Path) -> String {
    let log = std::fs::read_to_string(dir.join("node.log")).unwrap();
    log.lines()
        .find(|l| l.contains("Built overdrive's trie"))
        .unwrap_or_else(|| panic!("no trie built:\n{}", tail(&log)))
        .to_string()
}

/// A temporary folder holding the genesis of `workload`'s chain, and the genesis's path.
fn write_genesis(
    workload: &overdrive_workload::Workload,
    label: &str,
) -> (tempfile::TempDir, std::path::PathBuf) {
    let chain = overdrive_chain::build(workload.clone(), Fork::Prague).unwrap();
    let dir = support::temp_dir(label);
    let (genesis, _) = overdrive_chain::write(&chain, dir.path()).unwrap();
    (dir, genesis)
}

fn last_transaction(blocks: &[overdrive_primitives::BlockWithSenders]) -> alloy_primitives::B256 {
    *blocks.last().unwrap().transactions.last().unwrap().hash()
}

/// Asserts from the node's metrics and log that every block root since it started came from
/// overdrive's trie, in the engine and in the payload builder, with no failure; returns how
/// many blocks did.
fn assert_roots_from_overdrive(metrics: u16, dir: &std::path::Path) -> f64 {
    let page = support::http(metrics, "/", None).expect("the metrics endpoint answers");
    let log = std::fs::read_to_string(dir.join("node.log")).unwrap();
    let count = |name, root| support::counter(&page, name, &format!("root=\"{root}\""));
    let ours = count("overdrive_state_root_blocks_total", "overdrive");
    assert!(
        ours >= 1.0,
        "no root from overdrive's trie:\n{page}\n{}",
        tail(&log)
    );
    assert_eq!(
        count("overdrive_state_root_blocks_total", "reth"),
        0.0,
        "{page}"
    );
    assert!(
        count("overdrive_state_root_payloads_total", "overdrive") >= 1.0,
        "no payload root from overdrive's trie:\n{page}\n{}",
        tail(&log)
    );
    assert_eq!(
        count("overdrive_state_root_payloads_total", "reth"),
        0.0,
        "{page}"
    );
    assert!(
        !page.contains("overdrive_state_root_failures_total"),
        "{page}"
    );
    assert!(log.contains("strategy=\"overdrive\""), "{}", tail(&log));
    assert!(!log.contains("Invalid payload"), "{}", tail(&log));
    ours
}

/// Stops the node as an operator does (so that it persists what it holds), then has reth's
/// merkle stage rebuild the tries of the same head from the hashed state in a copy, and
/// asserts that the trie tables the node wrote from overdrive's rows are the rebuild's, row for
/// row. Returns the head and a line counting the rows.
fn stop_and_compare_rows(
    mut node: support::KillOnDrop,
    genesis: &std::path::Path,
    dir: &std::path::Path,
) -> (u64, String) {
    // SAFETY: signalling a child process this test started.
    unsafe { libc::kill(node.0.id() as i32, libc::SIGTERM) };
    let status = support::wait_for("the node to stop", Duration::from_secs(120), || {
        node.0.try_wait().unwrap()
    });
    let log = std::fs::read_to_string(dir.join("node.log")).unwrap();
    assert!(status.success(), "{status}\n{}", tail(&log));

    let datadir = dir.join("data");
    let head = support::open(support::reth_spec(genesis), &datadir)
        .provider()
        .unwrap()
        .best_block_number()
        .unwrap();
    assert!(head >= 1, "head {head}");
    let rows = trie_rows(genesis, &datadir);
    let rebuilt = dir.join("rebuilt");
    support::run_ok(
        std::process::Command::new("cp")
            .arg("-a")
            .arg(&datadir)
            .arg(&rebuilt),
    );
    let output = support::run_ok(
        support::overdrive_reth()
            .args(["stage", "run", "merkle", "--color", "never", "--chain"])
            .arg(genesis)
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
    let expected = trie_rows(genesis, &rebuilt);
    assert!(!expected.0.is_empty(), "no account trie rows");
    assert!(
        rows.0 == expected.0,
        "the account trie rows differ from reth's rebuild"
    );
    assert!(
        rows.1 == expected.1,
        "the storage trie rows differ from reth's rebuild"
    );
    let _ = std::fs::remove_dir_all(&rebuilt);
    (
        head,
        format!(
            "{} account and {} storage trie rows as reth's rebuild",
            rows.0.len(),
            rows.1.len()
        ),
    )
}
