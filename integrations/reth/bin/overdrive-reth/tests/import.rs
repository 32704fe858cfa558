//! `overdrive-reth import` of exported chains, with reth's executor and with overdrive's: the
//! same head, state root and receipts, the same tables row for row, and bad input rejected the
//! same way, leaving the database at the last valid block.

mod support;

use alloy_consensus::{Block, TxEnvelope};
use alloy_primitives::B256;
use overdrive_workload::WorkloadKind;
use support::imports::{chain, contents, import, tail, write_blocks};

/// The two ways the tests import: reth's executor, and overdrive's on two threads.
const MODES: [(&str, &[&str]); 2] = [
    ("reth", &[]),
    (
        "parallel",
        &[
            "--overdrive.exec",
            "parallel",
            "--overdrive.exec.threads",
            "2",
        ],
    ),
];

/// Both executors import each workload's chain to the chain's own head and state root, into
/// identical databases; overdrive's ran every block on its parallel path.
#[test]
fn imports_agree_for_every_workload() {
    for kind in WorkloadKind::ALL {
        let chain = chain(kind, 5);
        let dir = support::temp_dir("import");
        let (genesis, file) = overdrive_chain::write(&chain, dir.path()).unwrap();
        let mut seen = Vec::new();
        for (mode, flags) in MODES {
            let datadir = dir.path().join(mode);
            let output = import(&genesis, &file, &datadir, flags);
            let stdout = String::from_utf8_lossy(&output.stdout);
            assert!(
                output.status.success(),
                "{kind} {mode}: {stdout}\n{}",
                String::from_utf8_lossy(&output.stderr)
            );
            if mode == "parallel" {
                assert!(
                    stdout.contains(&format!(
                        "Executed {} blocks on overdrive's parallel executor",
                        chain.blocks.len()
                    )),
                    "{kind}: not every block ran in parallel:\n{}",
                    tail(&stdout)
                );
            }
            let (head, hash, tables) = contents(&genesis, &datadir);
            assert_eq!(head, chain.blocks.len() as u64, "{kind} {mode}: head");
            assert_eq!(hash, chain.head_hash(), "{kind} {mode}: head hash");
            seen.push(tables);
        }
        assert!(
            seen[0] == seen[1],
            "{kind}: the two imports' databases differ"
        );
    }
}

/// Seals `block` again after a change (its hash changes, so later blocks no longer follow it).
fn reseal(block: &mut Block<TxEnvelope>) {
    block.header.transactions_root =
        alloy_consensus::proofs::calculate_transaction_root(&block.body.transactions);
}

/// A bad block after good ones: the import keeps the good ones and stops before the bad one,
/// with the same head and the same database whichever executor runs.
///
/// The good blocks come in a file of their own: reth's pipeline executes a file's blocks as
/// one batch and writes it whole, so a bad block discards the blocks of its batch before it
/// (the merkle stage even checks only a range's last root).
#[test]
fn bad_blocks_stop_the_import_at_the_last_valid_one() {
    let chain = chain(WorkloadKind::Erc20, 4);
    let dir = support::temp_dir("bad");
    let (genesis, _) = overdrive_chain::write(&chain, dir.path()).unwrap();
    let good = &chain.blocks[..2];
    let good_file = write_blocks(dir.path(), "good.rlp", good);

    // Block 3 claims a wrong state root.
    let mut wrong_root = chain.blocks[2].clone();
    wrong_root.header.state_root = B256::repeat_byte(0x11);
    // Block 3 repeats one of its transactions: the repeat's nonce is too low where it stands.
    let mut replayed = chain.blocks[2].clone();
    let again = replayed.body.transactions[0].clone();
    replayed.body.transactions.push(again);
    reseal(&mut replayed);
    for (name, block) in [("wrong-root.rlp", wrong_root), ("replayed.rlp", replayed)] {
        let file = write_blocks(dir.path(), name, std::slice::from_ref(&block));
        let mut seen = Vec::new();
        for (mode, flags) in MODES {
            let datadir = dir.path().join(format!("{name}-{mode}"));
            support::init_datadir(&genesis, &datadir);
            let output = support::overdrive_reth()
                .args(["import", "--color", "never"])
                .args(flags)
                .arg("--chain")
                .arg(&genesis)
                .arg("--datadir")
                .arg(&datadir)
                .args([&good_file, &file])
                .output()
                .unwrap();
            let stdout = String::from_utf8_lossy(&output.stdout);
            assert!(
                output.status.success(),
                "{name} {mode}: {}: {}\nstderr: {}",
                output.status,
                tail(&stdout),
                tail(&String::from_utf8_lossy(&output.stderr))
            );
            let stopped = "Stopped at last valid block 2 due to invalid block 3";
            assert!(stdout.contains(stopped), "{name} {mode}: {}", tail(&stdout));
            let (head, hash, tables) = contents(&genesis, &datadir);
            assert_eq!((head, hash), (2, chain.hashes[1]), "{name} {mode}: head");
            seen.push(tables);
        }
        assert!(
            seen[0] == seen[1],
            "{name}: the two imports' databases differ"
        );
    }

    // A file cut short inside block 3, and one with garbage after the valid blocks: an error,
    // not a panic, and nothing past the valid blocks.
    let mut cut = std::fs::read(write_blocks(dir.path(), "three.rlp", &chain.blocks[..3])).unwrap();
    cut.truncate(cut.len() - 100);
    let mut garbage = std::fs::read(write_blocks(dir.path(), "two.rlp", good)).unwrap();
    garbage.extend_from_slice(&[0xff; 64]);
    for (name, bytes) in [("cut.rlp", cut), ("garbage.rlp", garbage)] {
        let file = dir.path().join(name);
        std::fs::write(&file, bytes).unwrap();
        for (mode, flags) in MODES {
            let datadir = dir.path().join(format!("{name}-{mode}"));
            let output = import(&genesis, &file, &datadir, flags);
            let all = format!(
                "{}{}",
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            );
            assert!(!all.contains("panicked"), "{name} {mode}: {all}");
            let (head, _, _) = contents(&genesis, &datadir);
            assert!(
                head <= 2,
                "{name} {mode}: head {head} past the valid blocks"
            );
        }
    }
}
