//! Valid chains from the workload generators, for any client to import.
//!
//! The generators make blocks whose post-execution fields are left zero and whose base fee is
//! constant. [`build`] executes each block with the reference executor on the previous one's
//! state and seals it: EIP-1559 base fee, gas used, receipts root, logs bloom, requests hash,
//! state root. Every sealed block passes overdrive's consensus checks before it is kept.
//! [`write()`] stores the chain as reth's `import` reads it: a `genesis.json` and a file of RLP
//! blocks.

use alloy_consensus::{Block, BlockBody, Header, TxEnvelope};
use alloy_eips::{eip1559::BaseFeeParams, eip7840::BlobParams};
use alloy_genesis::Genesis;
use alloy_hardforks::EthereumHardforks;
use alloy_primitives::{B256, Bloom};
use overdrive_consensus::{validate_body, validate_header, validate_post_execution};
use overdrive_executor::{ExecuteBlock, SequentialExecutor};
use overdrive_primitives::{BlockWithSenders, ChainParams, MemState};
use overdrive_trie::{HashedStateChanges, MemNodeStore, StateTrie, TrieConfig};
use overdrive_workload::Workload;
use std::{io::Write, path::Path};

/// The fork rules of an exported chain, active from genesis.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Fork {
    /// Prague (Pectra).
    #[default]
    Prague,
    /// Osaka (Fusaka).
    Osaka,
}

/// Why a chain could not be built or written.
#[derive(Debug, thiserror::Error)]
pub enum ChainError {
    /// A generated block failed to execute.
    #[error("block {number} does not execute: {reason}")]
    Execution {
        /// The block's number.
        number: u64,
        /// The executor's error.
        reason: String,
    },
    /// A sealed block failed overdrive's own consensus checks (a bug in the sealing).
    #[error("sealed block {number} is invalid: {reason}")]
    Invalid {
        /// The block's number.
        number: u64,
        /// The failed rule.
        reason: String,
    },
    /// The state trie failed.
    #[error("state root of block {number}: {reason}")]
    Trie {
        /// The block's number.
        number: u64,
        /// The trie's error.
        reason: String,
    },
    /// Writing the files failed.
    #[error("writing {path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The cause.
        source: std::io::Error,
    },
}

/// A sealed chain and the genesis it starts from.
#[derive(Debug, Clone)]
pub struct Chain {
    /// The genesis (geth format: fork schedule, gas limit, allocation).
    pub genesis: Genesis,
    /// The genesis header.
    pub genesis_header: Header,
    /// Blocks `1..`, sealed.
    pub blocks: Vec<Block<TxEnvelope>>,
    /// Each block's hash.
    pub hashes: Vec<B256>,
    /// The state after the last block.
    pub state: MemState,
}

impl Chain {
    /// The hash of the last block (the genesis's when there is none).
    pub fn head_hash(&self) -> B256 {
        self.hashes
            .last()
            .copied()
            .unwrap_or_else(|| self.genesis_header.hash_slow())
    }

    /// The header of the last block (the genesis's when there is none).
    pub fn head(&self) -> &Header {
        self.blocks
            .last()
            .map_or(&self.genesis_header, |b| &b.header)
    }
}

/// Executes and seals `workload`'s blocks under `fork`'s rules.
///
/// The gas limit is twice the workload's, in the genesis and every block, so that no block uses
/// more than the EIP-1559 target and the base fee never rises above the transactions' fee cap
/// (it falls by an eighth a block, to its floor).
///
/// Takes the workload by value: at 10M accounts each copy of its genesis costs gigabytes.
pub fn build(workload: Workload, fork: Fork) -> Result<Chain, ChainError> {
    let Workload {
        chain_spec,
        genesis: mut state,
        blocks: generated_blocks,
        ..
    } = workload;
    let mut genesis = chain_spec.genesis;
    genesis.gas_limit = genesis.gas_limit.saturating_mul(2);
    if fork == Fork::Osaka {
        genesis.config.osaka_time = Some(0);
        genesis
            .config
            .blob_schedule
            .insert("osaka".into(), BlobParams::osaka());
    }
    // The rules and the header's fields, not the allocation (the trie below holds the state).
    let alloc = std::mem::take(&mut genesis.alloc);
    let spec = ChainParams::from_genesis(genesis.clone());
    genesis.alloc = alloc;
    let mut trie = StateTrie::new(MemNodeStore::default(), TrieConfig::default()).map_err(|e| {
        ChainError::Trie {
            number: 0,
            reason: e.to_string(),
        }
    })?;
    let genesis_root = trie
        .apply(&HashedStateChanges::from_state(&state))
        .map_err(|e| ChainError::Trie {
            number: 0,
            reason: e.to_string(),
        })?
        .root;
    let genesis_header = spec.genesis_header(genesis_root);
    state.block_hashes.clear();
    state.block_hashes.insert(0, genesis_header.hash_slow());

    let mut parent = genesis_header.clone();
    let mut blocks = Vec::with_capacity(generated_blocks.len());
    let mut hashes = Vec::with_capacity(generated_blocks.len());
    for generated in generated_blocks {
        let number = generated.header.number;
        let mut header = generated.header;
        header.parent_hash = parent.hash_slow();
        header.gas_limit = genesis.gas_limit;
        header.base_fee_per_gas = parent.next_block_base_fee(BaseFeeParams::ethereum());
        header.excess_blob_gas = spec
            .blob_params_at(header.timestamp)
            .and_then(|params| parent.next_block_excess_blob_gas(params));
        let mut block = BlockWithSenders::from_parts(
            header,
            generated.transactions,
            generated.ommers,
            generated.withdrawals,
        );
        let output = SequentialExecutor
            .execute(&spec, &block, &state)
            .map_err(|e| ChainError::Execution {
                number,
                reason: e.to_string(),
            })?;
        let diff = HashedStateChanges::from_bundle(&output.bundle);
        state.apply_bundle(&output.bundle);
        let root = trie
            .apply(&diff)
            .map_err(|e| ChainError::Trie {
                number,
                reason: e.to_string(),
            })?
            .root;

        let header = &mut block.header;
        header.gas_used = output.gas_used;
        header.receipts_root = alloy_consensus::proofs::calculate_receipt_root(&output.receipts);
        header.logs_bloom = output
            .receipts
            .iter()
            .fold(Bloom::ZERO, |bloom, r| bloom | r.logs_bloom());
        header.state_root = root;
        if spec.is_prague_active_at_timestamp(header.timestamp) {
            header.requests_hash = Some(output.requests.requests_hash());
        }
        let block = BlockWithSenders::from_parts(
            block.header,
            block.transactions,
            block.ommers,
            block.withdrawals,
        );
        let invalid = |reason: String| ChainError::Invalid { number, reason };
        validate_header(&spec, &block.header, &parent).map_err(|e| invalid(e.to_string()))?;
        validate_body(&spec, &block).map_err(|e| invalid(e.to_string()))?;
        validate_post_execution(
            &spec,
            &block.header,
            &output.receipts,
            output.gas_used,
            &output.requests,
        )
        .map_err(|e| invalid(e.to_string()))?;

        state.block_hashes.insert(number, block.hash);
        hashes.push(block.hash);
        parent = block.header.clone();
        blocks.push(Block {
            header: block.header,
            body: BlockBody {
                transactions: block
                    .transactions
                    .into_iter()
                    .map(|tx| tx.into_inner())
                    .collect(),
                ommers: block.ommers,
                withdrawals: block.withdrawals.map(Into::into),
            },
        });
        tracing::debug!(target: "overdrive::chain", number, gas = output.gas_used, "sealed");
    }
    Ok(Chain {
        genesis,
        genesis_header,
        blocks,
        hashes,
        state,
    })
}

/// Writes `chain` into `dir` as `genesis.json` and `chain.rlp` (the blocks' RLP, one after the
/// other, as `reth import` reads them). Returns the two paths.
pub fn write(
    chain: &Chain,
    dir: &Path,
) -> Result<(std::path::PathBuf, std::path::PathBuf), ChainError> {
    let io = |path: &Path| {
        let path = path.display().to_string();
        move |source| ChainError::Io { path, source }
    };
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    let genesis_path = dir.join("genesis.json");
    // Streamed: a genesis of millions of accounts is gigabytes of JSON.
    let file = std::fs::File::create(&genesis_path).map_err(io(&genesis_path))?;
    let mut out = std::io::BufWriter::new(file);
    serde_json::to_writer_pretty(&mut out, &chain.genesis)
        .map_err(std::io::Error::from)
        .and_then(|()| out.flush())
        .map_err(io(&genesis_path))?;
    let chain_path = dir.join("chain.rlp");
    let file = std::fs::File::create(&chain_path).map_err(io(&chain_path))?;
    let mut out = std::io::BufWriter::new(file);
    let mut buf = Vec::new();
    for block in &chain.blocks {
        buf.clear();
        alloy_rlp::Encodable::encode(block, &mut buf);
        out.write_all(&buf).map_err(io(&chain_path))?;
    }
    out.flush().map_err(io(&chain_path))?;
    Ok((genesis_path, chain_path))
}

#[cfg(test)]
mod tests {
    use super::*;
    use overdrive_workload::{WorkloadConfig, WorkloadKind, generate};

    fn workload(kind: WorkloadKind) -> Workload {
        generate(&WorkloadConfig {
            accounts: 64,
            txs_per_block: 40,
            blocks: 4,
            ..WorkloadConfig::new(kind)
        })
        .unwrap()
    }

    /// Every block links to its parent, follows EIP-1559 and passed the consensus checks; the
    /// base fee falls, so no transaction's fee cap is ever short.
    #[test]
    fn transfer_chain_is_sealed_and_linked() {
        for fork in [Fork::Prague, Fork::Osaka] {
            let chain = build(workload(WorkloadKind::Transfer), fork).unwrap();
            assert_eq!(chain.blocks.len(), 4);
            let mut parent = chain.genesis_header.clone();
            for (block, hash) in chain.blocks.iter().zip(&chain.hashes) {
                assert_eq!(block.header.parent_hash, parent.hash_slow());
                assert_eq!(block.header.hash_slow(), *hash);
                assert!(block.header.gas_used > 0);
                assert!(block.header.base_fee_per_gas < parent.base_fee_per_gas);
                parent = block.header.clone();
            }
            let spec = ChainParams::from_genesis(chain.genesis.clone());
            assert_eq!(spec.is_osaka_active_at_timestamp(0), fork == Fork::Osaka);
        }
    }

    /// The files decode back to the same chain, and the genesis to the same spec and header.
    #[test]
    fn written_files_read_back() {
        let chain = build(workload(WorkloadKind::Transfer), Fork::Prague).unwrap();
        let dir = std::env::temp_dir().join(format!("overdrive-chain-{}", std::process::id()));
        let (genesis_path, chain_path) = write(&chain, &dir).unwrap();
        let spec = ChainParams::from_genesis_file(&genesis_path).unwrap();
        let state = MemState::from_alloc(&spec.genesis.alloc);
        let root = overdrive_trie::reference::state_root(&state);
        assert_eq!(spec.genesis_header(root), chain.genesis_header);
        let bytes = std::fs::read(&chain_path).unwrap();
        let mut rest = bytes.as_slice();
        let mut decoded = Vec::new();
        while !rest.is_empty() {
            decoded.push(<Block<TxEnvelope> as alloy_rlp::Decodable>::decode(&mut rest).unwrap());
        }
        assert_eq!(decoded, chain.blocks);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
