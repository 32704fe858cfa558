//! `--overdrive.merkle-stage` in `import` and in `node`'s pipeline: overdrive's merkle stage
//! against reth's, on the same chains. The trie tables must come out row for row as reth's
//! stage writes them, whether every storage trie is hashed whole or cut into subtrees, in one
//! commit or one per trie, on one thread or handed to reth's stage, in a node's pipeline, and
//! after the import is killed inside the stage again and again, and over a state with a
//! million-slot storage trie in `stage run merkle`.

mod support;

use alloy_primitives::B256;
use overdrive_workload::{WorkloadConfig, WorkloadKind};
use rand::{Rng, SeedableRng, rngs::SmallRng};
use reth_db::{
    Database, tables,
    transaction::{DbTx, DbTxMut},
};
use reth_trie::{
    BranchNodeCompact, Nibbles, PackedStorageTrieEntry, PackedStoredNibbles,
    PackedStoredNibblesSubKey, TrieMask,
    trie_cursor::{TrieCursor, TrieCursorFactory},
};
use reth_trie_db::{DatabaseTrieCursorFactory, PackedKeyAdapter};
use std::{
    io::{BufRead, BufReader},
    process::Stdio,
    time::Duration,
};
use support::imports::{
    chain, contents, import, import_command, import_files, tail, trie_rows, write_blocks,
};

/// The ways the tests run the stage: by name, its threads, its other flags, and how many of
/// the two runs (from genesis, then incremental) it finishes itself and hands to reth's stage.
/// Every storage trie hashed whole, every one cut into its sixteen subtrees, one trie per
/// committed chunk, all of it on one thread — these four never handed to reth's stage — and
/// the default fallback on these small chains, where the rebuild from genesis goes to reth's
/// stage and the incremental run does not.
const VARIANTS: [Variant; 5] = [
    (
        "whole",
        "2",
        &[
            "--overdrive.merkle-stage.split-slots",
            "1000000000",
            "--overdrive.merkle-stage.no-fallback",
        ],
        (2, 0),
    ),
    (
        "split",
        "2",
        &[
            "--overdrive.merkle-stage.split-slots",
            "1",
            "--overdrive.merkle-stage.no-fallback",
        ],
        (2, 0),
    ),
    (
        "chunks",
        "2",
        &[
            "--overdrive.merkle-stage.split-slots",
            "1",
            "--overdrive.merkle-stage.chunk-slots",
            "1",
            "--overdrive.merkle-stage.no-fallback",
        ],
        (2, 0),
    ),
    (
        "one thread",
        "1",
        &[
            "--overdrive.merkle-stage.split-slots",
            "1",
            "--overdrive.merkle-stage.chunk-slots",
            "2",
            "--overdrive.merkle-stage.no-fallback",
        ],
        (2, 0),
    ),
    (
        "fallback",
        "2",
        &["--overdrive.merkle-stage.split-slots", "1000000000"],
        (1, 1),
    ),
];

/// One trie per chunk, every trie split, the fallback on: a chain whose tries change keeps
/// every run in overdrive's stage (each changed trie has split-slots changed slots).
const CHUNKS_WITH_FALLBACK: Variant = (
    "chunks with the fallback",
    "2",
    &[
        "--overdrive.merkle-stage.split-slots",
        "1",
        "--overdrive.merkle-stage.chunk-slots",
        "1",
    ],
    (2, 0),
);

type Variant = (
    &'static str,
    &'static str,
    &'static [&'static str],
    (usize, usize),
);

/// What overdrive's stage logs when it finishes a run.
const OURS: &str = "State root checked";
/// What it logs when it hands a run to reth's stage.
const RETHS: &str = "Running reth's merkle stage";

fn flags((_, threads, rest, _): Variant) -> Vec<&'static str> {
    let stage = [
        "--overdrive.merkle-stage",
        "--overdrive.merkle-stage.threads",
        threads,
    ];
    stage.iter().chain(rest).copied().collect()
}

/// Each workload's chain imported in two files, so the stage runs once from genesis (a
/// rebuild) and once over a range on top of the first (incremental): every variant writes the
/// tables reth's stage writes, and the stage did run.
#[test]
fn the_stage_writes_reths_tries_for_every_workload() {
    for kind in WorkloadKind::ALL {
        let chain = chain(kind, 6);
        let dir = support::temp_dir("merkle");
        let (genesis, _) = overdrive_chain::write(&chain, dir.path()).unwrap();
        let first = write_blocks(dir.path(), "first.rlp", &chain.blocks[..3]);
        let second = write_blocks(dir.path(), "second.rlp", &chain.blocks[3..]);
        let files = [first.as_path(), second.as_path()];

        let reth = dir.path().join("reth");
        let output = import_files(&genesis, &files, &reth, &[]);
        assert!(
            output.status.success(),
            "{kind} reth: {}",
            tail(&String::from_utf8_lossy(&output.stdout))
        );
        let (head, hash, expected) = contents(&genesis, &reth);
        assert_eq!(
            (head, hash),
            (chain.blocks.len() as u64, chain.head_hash()),
            "{kind} reth"
        );

        for variant @ (name, _, _, ran) in VARIANTS {
            let datadir = dir.path().join(name);
            let output = import_files(&genesis, &files, &datadir, &flags(variant));
            let stdout = String::from_utf8_lossy(&output.stdout);
            assert!(
                output.status.success(),
                "{kind} {name}: {}\n{}",
                tail(&stdout),
                tail(&String::from_utf8_lossy(&output.stderr))
            );
            assert_eq!(
                (stdout.matches(OURS).count(), stdout.matches(RETHS).count()),
                ran,
                "{kind} {name}: runs finished by overdrive's stage and handed to reth's:\n{}",
                tail(&stdout)
            );
            let (head, hash, tables) = contents(&genesis, &datadir);
            assert_eq!(
                (head, hash),
                (chain.blocks.len() as u64, chain.head_hash()),
                "{kind} {name}"
            );
            assert!(
                tables == expected,
                "{kind} {name}: the tables differ from reth's"
            );
        }
    }
}

/// A chain with many storage tries: uniswap over 24 pairs (each pair and each token has one).
fn many_tries() -> overdrive_chain::Chain {
    let workload = overdrive_workload::generate(&WorkloadConfig {
        accounts: 400,
        txs_per_block: 300,
        blocks: 4,
        pairs: 24,
        ..WorkloadConfig::new(WorkloadKind::Uniswap)
    })
    .unwrap();
    overdrive_chain::build(workload, overdrive_chain::Fork::Prague).unwrap()
}

/// The import killed with SIGKILL inside the stage, at random points after a chunk has been
/// committed, again and again, then run to the end: the tables reth's stage writes. Each run
/// commits at least one chunk, so the runs are bounded by the chunks (a stage that never
/// advanced its checkpoint would loop until the bound fails the test).
#[test]
fn a_stage_killed_again_and_again_resumes_to_reths_tries() {
    let chain = many_tries();
    let dir = support::temp_dir("merkle-kill");
    let (genesis, _) = overdrive_chain::write(&chain, dir.path()).unwrap();
    let first = write_blocks(dir.path(), "first.rlp", &chain.blocks[..2]);
    let second = write_blocks(dir.path(), "second.rlp", &chain.blocks[2..]);
    let files = [first.as_path(), second.as_path()];

    let reth = dir.path().join("reth");
    let output = import_files(&genesis, &files, &reth, &[]);
    assert!(output.status.success());
    let (_, _, expected) = contents(&genesis, &reth);

    let datadir = dir.path().join("killed");
    support::init_datadir(&genesis, &datadir);
    let flags = flags(CHUNKS_WITH_FALLBACK);
    let mut rng = SmallRng::seed_from_u64(41);
    let (mut runs, mut kills, mut chunks) = (0, 0, 0);
    loop {
        runs += 1;
        assert!(
            runs <= 200,
            "{runs} runs and the import has not finished: the stage does not advance"
        );
        let mut child = support::KillOnDrop(
            import_command(&genesis, &files, &datadir, &flags)
                .stdout(Stdio::piped())
                .stderr(Stdio::null())
                .spawn()
                .unwrap(),
        );
        // Killed after the second or third chunk of this run (the first is committed by then),
        // a few milliseconds in: before, during or after that chunk's commit.
        let kill_at = rng.random_range(2..=3);
        let mut seen = 0;
        let stdout = BufReader::new(child.0.stdout.take().unwrap());
        let mut killed = false;
        let mut log = Vec::new();
        for line in stdout.lines() {
            let line = line.unwrap();
            if line.contains("Hashed storage tries") {
                seen += 1;
                chunks += 1;
                if seen == kill_at {
                    std::thread::sleep(Duration::from_micros(rng.random_range(0..5_000)));
                    child.0.kill().unwrap();
                    killed = true;
                    break;
                }
            }
            log.push(line);
        }
        let status = child.0.wait().unwrap();
        if killed {
            kills += 1;
            continue;
        }
        assert!(
            status.success(),
            "run {runs}: {status}\n{}",
            tail(&log.join("\n"))
        );
        break;
    }
    println!("{kills} kills in {runs} runs, {chunks} chunks logged");
    // How far a run gets before its kill depends on the machine's timing, so the count of
    // kills varies between machines; ten still resume from as many different checkpoints.
    assert!(
        kills >= 10,
        "only {kills} kills in {runs} runs ({chunks} chunks): too few chunks"
    );
    let (head, hash, tables) = contents(&genesis, &datadir);
    assert_eq!((head, hash), (chain.blocks.len() as u64, chain.head_hash()));
    assert!(
        tables == expected,
        "after {kills} kills the tables differ from reth's"
    );
}

/// `node --overdrive.merkle-stage`: the blocks stored by an import without state
/// (`import --no-state`), then a node started on them, whose engine backfills to the stored
/// head at launch: its pipeline runs the stage (in chunks, every trie split), and the tables
/// are the ones reth's stage writes in an import of the same chain.
#[test]
fn the_nodes_pipeline_runs_the_stage() {
    let chain = many_tries();
    let dir = support::temp_dir("merkle-node");
    let (genesis, _) = overdrive_chain::write(&chain, dir.path()).unwrap();
    let file = write_blocks(dir.path(), "chain.rlp", &chain.blocks);

    let reth = dir.path().join("reth");
    let output = import(&genesis, &file, &reth, &[]);
    assert!(output.status.success());
    let (_, _, expected) = contents(&genesis, &reth);

    let datadir = dir.path().join("node");
    let output = import(&genesis, &file, &datadir, &["--no-state"]);
    assert!(
        output.status.success(),
        "{}",
        tail(&String::from_utf8_lossy(&output.stdout))
    );
    let log_path = dir.path().join("node.log");
    let log = std::fs::File::create(&log_path).unwrap();
    let mut node = support::KillOnDrop(
        support::overdrive_reth()
            .args(["node", "--color", "never", "--chain"])
            .arg(&genesis)
            .arg("--datadir")
            .arg(&datadir)
            .args(support::off_network())
            // Exit once the launch's backfill is done.
            .arg("--debug.terminate")
            .args(flags(CHUNKS_WITH_FALLBACK))
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap(),
    );
    let status = support::wait_for(
        "the node to finish its backfill",
        Duration::from_secs(300),
        || node.0.try_wait().unwrap(),
    );
    let log = std::fs::read_to_string(&log_path).unwrap();
    assert!(status.success(), "{status}\n{}", tail(&log));
    assert!(
        log.contains("Pipeline runs overdrive's merkle stage") && log.matches(OURS).count() == 1,
        "the node's pipeline did not run the stage once:\n{}",
        tail(&log)
    );
    let (head, hash, tables) = contents(&genesis, &datadir);
    assert_eq!((head, hash), (chain.blocks.len() as u64, chain.head_hash()));
    assert!(
        tables == expected,
        "the node's tables differ from reth's import"
    );
}

/// `stage run merkle --overdrive.merkle-stage` from genesis over an imported erc20 chain whose
/// token holds a million storage slots (one per account): the stage clears the trie tables
/// and rebuilds them, the token's trie cut into subtrees on two threads, to the rows reth's
/// stage wrote in the import (every changed trie split, no fallback). Without `--commit` the
/// command refuses to run on two threads.
#[test]
fn stage_run_rebuilds_a_million_slot_trie() {
    let workload = overdrive_workload::generate(&WorkloadConfig {
        accounts: 1_000_000,
        txs_per_block: 2_000,
        blocks: 2,
        ..WorkloadConfig::new(WorkloadKind::Erc20)
    })
    .unwrap();
    let chain = overdrive_chain::build(workload, overdrive_chain::Fork::Prague).unwrap();
    let dir = support::temp_dir("merkle-stage-run");
    let (genesis, _) = overdrive_chain::write(&chain, dir.path()).unwrap();
    let file = write_blocks(dir.path(), "chain.rlp", &chain.blocks);
    let datadir = dir.path().join("reth");
    let output = import(&genesis, &file, &datadir, &[]);
    assert!(
        output.status.success(),
        "{}",
        tail(&String::from_utf8_lossy(&output.stdout))
    );
    let (accounts, storages) = trie_rows(&genesis, &datadir);

    let stage_run = |extra: &[&str]| {
        let mut command = support::overdrive_reth();
        command
            .args(["stage", "run", "merkle", "--color", "never", "--chain"])
            .arg(&genesis)
            .arg("--datadir")
            .arg(&datadir)
            .args(["--from", "0", "--to", "2", "--skip-unwind"])
            .args(flags(VARIANTS[1]))
            .args(extra);
        command.output().expect("the binary runs")
    };
    let refused = stage_run(&[]);
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        !refused.status.success() && stderr.contains("needs --commit"),
        "{stderr}"
    );

    let output = stage_run(&["--commit"]);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{}", tail(&stdout));
    assert!(
        stdout.contains("Cleared the trie tables to rebuild them")
            && stdout.matches(OURS).count() == 1
            && !stdout.contains(RETHS),
        "overdrive's stage did not rebuild the tries:\n{}",
        tail(&stdout)
    );
    let (rebuilt_accounts, rebuilt_storages) = trie_rows(&genesis, &datadir);
    assert!(storages.len() > 60_000, "{} storage nodes", storages.len());
    assert_eq!(
        (rebuilt_accounts.len(), rebuilt_storages.len()),
        (accounts.len(), storages.len())
    );
    assert!(rebuilt_accounts == accounts, "the account trie differs");
    assert!(rebuilt_storages == storages, "the storage tries differ");
}

/// Every 16-bit mask, as a branch's state mask (with tree and hash masks inside it), stored in
/// reth's trie tables with their packed keys (reth v2.5.1's layout, the one the stage writes)
/// and read back by reth's trie cursors, the ones the stage reads with: the same node, in the
/// account trie and in a storage trie. Masks whose big-endian bytes look like a length must not
/// be misread.
#[test]
fn every_mask_round_trips_through_the_trie_tables() {
    let dir = support::temp_dir("masks");
    let db = reth_db::init_db(
        dir.path(),
        reth_db::mdbx::DatabaseArguments::new(reth_db::ClientVersion::default()),
    )
    .unwrap();
    let node = |mask: u16| {
        let state = TrieMask::new(mask);
        let tree = TrieMask::new(mask & 0x5a5a);
        let hash = TrieMask::new(mask & 0x36c9);
        let hashes = (0..hash.count_ones())
            .map(|i| B256::with_last_byte(i as u8) ^ B256::left_padding_from(&mask.to_be_bytes()))
            .collect();
        BranchNodeCompact::new(state, tree, hash, hashes, None)
    };
    let path = |mask: u16| Nibbles::unpack(mask.to_be_bytes());
    let address = B256::repeat_byte(0x41);

    let tx = db.tx_mut().unwrap();
    for mask in 0..=u16::MAX {
        tx.put::<tables::PackedAccountsTrie>(PackedStoredNibbles(path(mask)), node(mask))
            .unwrap();
        let entry = PackedStorageTrieEntry {
            nibbles: PackedStoredNibblesSubKey(path(mask)),
            node: node(mask),
        };
        tx.put::<tables::PackedStoragesTrie>(address, entry)
            .unwrap();
    }
    tx.commit().unwrap();

    let tx = db.tx().unwrap();
    let cursors = DatabaseTrieCursorFactory::<_, PackedKeyAdapter>::new(&tx);
    for (trie, mut cursor) in [
        (
            "account",
            Box::new(cursors.account_trie_cursor().unwrap()) as Box<dyn TrieCursor>,
        ),
        (
            "storage",
            Box::new(cursors.storage_trie_cursor(address).unwrap()),
        ),
    ] {
        let mut expected = 0..=u16::MAX;
        let mut entry = cursor.seek(Nibbles::default()).unwrap();
        while let Some((key, stored)) = entry {
            let mask = expected.next().expect("no more rows than written");
            assert_eq!(key, path(mask), "{trie} trie: rows out of order");
            assert_eq!(stored, node(mask), "{trie} trie: mask {mask:#06x}");
            entry = cursor.next().unwrap();
        }
        assert_eq!(
            expected.next(),
            None,
            "{trie} trie: not every mask came back"
        );
    }
}
