//! Importing exported chains with the binary, and reading back what the import wrote.

use super::{init_datadir, open, overdrive_reth, reth_spec};
use alloy_consensus::{Block, TxEnvelope};
use alloy_primitives::B256;
use overdrive_chain::{Chain, Fork};
use overdrive_workload::{WorkloadConfig, WorkloadKind};
use reth_db::{cursor::DbCursorRO, tables, transaction::DbTx};
use reth_provider::{
    BlockHashReader, BlockNumReader, ChangeSetReader, HeaderProvider, ReceiptProvider,
    StorageChangeSetReader,
};
use std::{
    path::Path,
    process::{Command, Output},
};

/// A workload's chain of `blocks` blocks, as the import tests use it.
pub fn chain(kind: WorkloadKind, blocks: usize) -> Chain {
    let workload = overdrive_workload::generate(&WorkloadConfig {
        accounts: 400,
        // Compute calls use 0.2-0.9 Mgas each.
        txs_per_block: if kind == WorkloadKind::Compute {
            30
        } else {
            250
        },
        blocks,
        pairs: 8,
        ..WorkloadConfig::new(kind)
    })
    .unwrap();
    overdrive_chain::build(workload, Fork::Prague).unwrap()
}

/// Writes `blocks` as a chain file in `dir`.
pub fn write_blocks(dir: &Path, name: &str, blocks: &[Block<TxEnvelope>]) -> std::path::PathBuf {
    let path = dir.join(name);
    let mut bytes = Vec::new();
    for block in blocks {
        alloy_rlp::Encodable::encode(block, &mut bytes);
    }
    std::fs::write(&path, bytes).unwrap();
    path
}

/// Initializes a datadir and imports `file` into it with `flags`; returns the command's output.
pub fn import(genesis: &Path, file: &Path, datadir: &Path, flags: &[&str]) -> Output {
    import_files(genesis, &[file], datadir, flags)
}

/// Initializes a datadir and imports `files` into it, one after the other, with `flags`.
pub fn import_files(genesis: &Path, files: &[&Path], datadir: &Path, flags: &[&str]) -> Output {
    init_datadir(genesis, datadir);
    import_command(genesis, files, datadir, flags)
        .output()
        .expect("the binary runs")
}

/// `overdrive-reth import` of `files` into `datadir` with `flags`, not started.
pub fn import_command(genesis: &Path, files: &[&Path], datadir: &Path, flags: &[&str]) -> Command {
    let mut command = overdrive_reth();
    command
        .args(["import", "--color", "never"])
        .args(flags)
        .arg("--chain")
        .arg(genesis)
        .arg("--datadir")
        .arg(datadir)
        .args(files);
    command
}

/// Everything a test compares between two imports: the head, every header, every receipt, and
/// the state, history and trie tables row for row.
pub fn contents(genesis: &Path, datadir: &Path) -> (u64, B256, String) {
    let factory = open(reth_spec(genesis), datadir);
    let provider = factory.provider().unwrap();
    let head = provider.best_block_number().unwrap();
    let hash = provider.block_hash(head).unwrap().unwrap();
    let mut out = String::new();
    for number in 0..=head {
        let header = provider.header_by_number(number).unwrap().unwrap();
        let receipts = provider
            .receipts_by_block(number.into())
            .unwrap()
            .unwrap_or_default();
        out.push_str(&format!("{number}: {header:?} {receipts:?}\n"));
    }
    macro_rules! table {
        ($table:ty) => {{
            let mut cursor = provider.tx_ref().cursor_read::<$table>().unwrap();
            let rows: Vec<_> = cursor.walk(None).unwrap().map(|row| row.unwrap()).collect();
            out.push_str(&format!("{}: {rows:?}\n", stringify!($table)));
        }};
    }
    table!(tables::PlainAccountState);
    table!(tables::PlainStorageState);
    table!(tables::HashedAccounts);
    table!(tables::HashedStorages);
    // reth v2.5.1 writes the trie tables in the packed encoding of its storage v2.
    table!(tables::PackedAccountsTrie);
    table!(tables::PackedStoragesTrie);
    for number in 1..=head {
        let accounts = provider.account_block_changeset(number).unwrap();
        let storage = provider.storage_changeset(number).unwrap();
        out.push_str(&format!("changes {number}: {accounts:?} {storage:?}\n"));
    }
    table!(tables::Bytecodes);
    (head, hash, out)
}

/// The rows of the trie tables alone (reth v2.5.1's packed layout), for a state too large to
/// compare whole.
pub fn trie_rows(genesis: &Path, datadir: &Path) -> (Vec<String>, Vec<String>) {
    let factory = open(reth_spec(genesis), datadir);
    let provider = factory.provider().unwrap();
    macro_rules! rows {
        ($table:ty) => {{
            let mut cursor = provider.tx_ref().cursor_read::<$table>().unwrap();
            cursor
                .walk(None)
                .unwrap()
                .map(|row| format!("{:?}", row.unwrap()))
                .collect::<Vec<_>>()
        }};
    }
    (
        rows!(tables::PackedAccountsTrie),
        rows!(tables::PackedStoragesTrie),
    )
}

/// The last lines of a command's output.
pub fn tail(output: &str) -> String {
    let lines: Vec<&str> = output.lines().collect();
    lines[lines.len().saturating_sub(25)..].join("\n")
}
