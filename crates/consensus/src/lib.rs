//! Post-merge block validity rules, in three steps the node and the ethereum/tests runner share:
//! [`validate_header`] (the header alone and against its parent), [`validate_body`] (the body
//! against the header's commitments) and [`validate_post_execution`] (execution results against
//! the header). Pre-merge (proof-of-work) rules are out of scope: overdrive follows post-merge
//! chains.

use alloy_consensus::{
    BlockHeader, EMPTY_OMMER_ROOT_HASH, Header, ReceiptEnvelope, Transaction, TxReceipt,
    constants::MAXIMUM_EXTRA_DATA_SIZE,
    proofs::{
        calculate_ommers_root, calculate_receipt_root, calculate_transaction_root,
        calculate_withdrawals_root,
    },
};
use alloy_eips::{
    eip1559::{GAS_LIMIT_BOUND_DIVISOR, INITIAL_BASE_FEE},
    eip4844::DATA_GAS_PER_BLOB,
    eip7685::Requests,
    eip7840::BlobParams,
};
use alloy_primitives::{Address, B256, Bloom};
use alloy_rlp::Encodable;
use overdrive_primitives::{BlockWithSenders, ChainParams, EthereumHardforks};

/// The smallest gas limit a block may have.
pub const MINIMUM_GAS_LIMIT: u64 = 5000;
/// The largest gas limit a block may have (geth's and reth's bound).
pub const MAXIMUM_GAS_LIMIT: u64 = i64::MAX as u64;
/// EIP-7934 (Osaka): the largest RLP-encoded block, 10 MiB less a 2 MiB margin for the
/// consensus layer's wrapping (reth's `MAX_RLP_BLOCK_SIZE`).
pub const MAX_RLP_BLOCK_SIZE: usize = 8_388_608;

/// A broken consensus rule. The block is invalid and must leave the chain at its parent.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConsensusError {
    /// Header number is not the parent's plus one.
    #[error("block number {got} does not follow parent {parent}")]
    BlockNumber { got: u64, parent: u64 },
    /// Timestamp does not increase.
    #[error("timestamp {got} is not after the parent's {parent}")]
    Timestamp { got: u64, parent: u64 },
    /// Gas limit outside the allowed step from the parent, or outside absolute bounds.
    #[error("gas limit {got} is invalid against the parent's {parent}")]
    GasLimit { got: u64, parent: u64 },
    /// Gas used above the gas limit.
    #[error("gas used {used} exceeds gas limit {limit}")]
    GasUsedAboveLimit { used: u64, limit: u64 },
    /// Extra data longer than 32 bytes.
    #[error("extra data is {0} bytes, more than 32")]
    ExtraDataTooLong(usize),
    /// Proof-of-work fields set after the merge.
    #[error("post-merge header has {0}")]
    ProofOfWorkField(&'static str),
    /// Wrong EIP-1559 base fee.
    #[error("base fee {got:?}, expected {expected:?}")]
    BaseFee {
        got: Option<u64>,
        expected: Option<u64>,
    },
    /// A header field present or absent against the fork schedule.
    #[error("header field {field} is {state} at this fork")]
    ForkField {
        field: &'static str,
        state: &'static str,
    },
    /// Wrong EIP-4844 excess blob gas.
    #[error("excess blob gas {got}, expected {expected}")]
    ExcessBlobGas { got: u64, expected: u64 },
    /// Wrong or out-of-range EIP-4844 blob gas used.
    #[error("blob gas used {got}, expected {expected} (max {max})")]
    BlobGasUsed { got: u64, expected: u64, max: u64 },
    /// A committed root or hash does not match the body or the execution result.
    #[error("{what} mismatch: header {header}, computed {computed}")]
    RootMismatch {
        what: &'static str,
        header: B256,
        computed: B256,
    },
    /// Logs bloom does not match the receipts.
    #[error("logs bloom mismatch")]
    LogsBloom,
    /// Gas used does not match execution.
    #[error("gas used mismatch: header {header}, executed {executed}")]
    GasUsed { header: u64, executed: u64 },
    /// Ommers after the merge.
    #[error("block has {0} ommers after the merge")]
    Ommers(usize),
    /// Withdrawals present before Shanghai or missing after.
    #[error("withdrawals are {0} at this fork")]
    Withdrawals(&'static str),
    /// A blob transaction that cannot be included.
    #[error("transaction {index}: {reason}")]
    BlobTransaction { index: usize, reason: &'static str },
    /// An Osaka block larger than EIP-7934 allows.
    #[error("block is {rlp_length} bytes of RLP, more than the {max} allowed")]
    BlockTooLarge { rlp_length: usize, max: usize },
    /// A Prague block whose end-of-block call reaches a request contract with no code.
    #[error("system contract {contract} ({address}) has no code")]
    SystemContractEmpty {
        contract: &'static str,
        address: Address,
    },
}

use ConsensusError as E;

/// Validates a header on its own and against its parent.
pub fn validate_header(
    spec: &ChainParams,
    header: &Header,
    parent: &Header,
) -> Result<(), ConsensusError> {
    if header.extra_data.len() > MAXIMUM_EXTRA_DATA_SIZE {
        return Err(E::ExtraDataTooLong(header.extra_data.len()));
    }
    if header.gas_used > header.gas_limit {
        return Err(E::GasUsedAboveLimit {
            used: header.gas_used,
            limit: header.gas_limit,
        });
    }
    if Some(header.number) != parent.number.checked_add(1) {
        return Err(E::BlockNumber {
            got: header.number,
            parent: parent.number,
        });
    }
    if header.timestamp <= parent.timestamp {
        return Err(E::Timestamp {
            got: header.timestamp,
            parent: parent.timestamp,
        });
    }
    if spec.is_paris_active_at_block(header.number) {
        if !header.difficulty.is_zero() {
            return Err(E::ProofOfWorkField("a non-zero difficulty"));
        }
        if !header.nonce.is_zero() {
            return Err(E::ProofOfWorkField("a non-zero nonce"));
        }
        if header.ommers_hash != EMPTY_OMMER_ROOT_HASH {
            return Err(E::ProofOfWorkField(
                "an ommers hash other than the empty list's",
            ));
        }
    }
    validate_gas_limit(header, parent)?;
    validate_base_fee(spec, header, parent)?;
    let ts = header.timestamp;
    presence(
        "withdrawals_root",
        header.withdrawals_root.is_some(),
        spec.is_shanghai_active_at_timestamp(ts),
    )?;
    let cancun = spec.is_cancun_active_at_timestamp(ts);
    presence("blob_gas_used", header.blob_gas_used.is_some(), cancun)?;
    presence("excess_blob_gas", header.excess_blob_gas.is_some(), cancun)?;
    presence(
        "parent_beacon_block_root",
        header.parent_beacon_block_root.is_some(),
        cancun,
    )?;
    presence(
        "requests_hash",
        header.requests_hash.is_some(),
        spec.is_prague_active_at_timestamp(ts),
    )?;
    if cancun {
        validate_excess_blob_gas(spec, header, parent)?;
    }
    Ok(())
}

fn presence(field: &'static str, present: bool, required: bool) -> Result<(), ConsensusError> {
    match (present, required) {
        (true, false) => Err(E::ForkField {
            field,
            state: "present",
        }),
        (false, true) => Err(E::ForkField {
            field,
            state: "missing",
        }),
        _ => Ok(()),
    }
}

fn validate_gas_limit(header: &Header, parent: &Header) -> Result<(), ConsensusError> {
    let err = || E::GasLimit {
        got: header.gas_limit,
        parent: parent.gas_limit,
    };
    if header.gas_limit < MINIMUM_GAS_LIMIT || header.gas_limit > MAXIMUM_GAS_LIMIT {
        return Err(err());
    }
    let max_delta = parent.gas_limit / GAS_LIMIT_BOUND_DIVISOR;
    if header.gas_limit.abs_diff(parent.gas_limit) >= max_delta {
        return Err(err());
    }
    Ok(())
}

fn validate_base_fee(
    spec: &ChainParams,
    header: &Header,
    parent: &Header,
) -> Result<(), ConsensusError> {
    if !spec.is_london_active_at_block(header.number) {
        return presence("base_fee_per_gas", header.base_fee_per_gas.is_some(), false);
    }
    let expected = if spec.is_london_active_at_block(parent.number) {
        parent.next_block_base_fee(spec.base_fee_params())
    } else {
        Some(INITIAL_BASE_FEE)
    };
    if header.base_fee_per_gas != expected || expected.is_none() {
        return Err(E::BaseFee {
            got: header.base_fee_per_gas,
            expected,
        });
    }
    Ok(())
}

fn validate_excess_blob_gas(
    spec: &ChainParams,
    header: &Header,
    parent: &Header,
) -> Result<(), ConsensusError> {
    let got = header.excess_blob_gas.unwrap_or_default();
    let params = spec
        .blob_params_at(header.timestamp)
        .unwrap_or_else(BlobParams::cancun);
    // The first Cancun block's parent has no blob fields: its excess and usage count as zero.
    let parent_excess = parent.excess_blob_gas.unwrap_or_default();
    let parent_used = parent.blob_gas_used.unwrap_or_default();
    let expected = match parent_excess.checked_add(parent_used) {
        Some(_) => params.next_block_excess_blob_gas_osaka(
            parent_excess,
            parent_used,
            parent.base_fee_per_gas.unwrap_or_default(),
        ),
        None => {
            return Err(E::ExcessBlobGas {
                got,
                expected: u64::MAX,
            });
        }
    };
    if got != expected {
        return Err(E::ExcessBlobGas { got, expected });
    }
    Ok(())
}

/// Validates a body against its header: transactions root, ommers, withdrawals, blob gas.
pub fn validate_body(spec: &ChainParams, block: &BlockWithSenders) -> Result<(), ConsensusError> {
    let header = &block.header;
    let txs: Vec<_> = block.transactions.iter().map(|tx| tx.inner()).collect();
    let tx_root = calculate_transaction_root(&txs);
    if tx_root != header.transactions_root {
        return Err(E::RootMismatch {
            what: "transactions root",
            header: header.transactions_root,
            computed: tx_root,
        });
    }
    let ommers_root = calculate_ommers_root(&block.ommers);
    if ommers_root != header.ommers_hash {
        return Err(E::RootMismatch {
            what: "ommers hash",
            header: header.ommers_hash,
            computed: ommers_root,
        });
    }
    if spec.is_paris_active_at_block(header.number) && !block.ommers.is_empty() {
        return Err(E::Ommers(block.ommers.len()));
    }
    let shanghai = spec.is_shanghai_active_at_timestamp(header.timestamp);
    match (&block.withdrawals, header.withdrawals_root) {
        (Some(w), Some(root)) if shanghai => {
            let computed = calculate_withdrawals_root(w);
            if computed != root {
                return Err(E::RootMismatch {
                    what: "withdrawals root",
                    header: root,
                    computed,
                });
            }
        }
        (None, None) if !shanghai => {}
        (Some(_), _) => return Err(E::Withdrawals("present")),
        (None, _) => return Err(E::Withdrawals("missing")),
    }
    if spec.is_osaka_active_at_timestamp(header.timestamp) {
        let rlp_length = block_rlp_length(block);
        if rlp_length > MAX_RLP_BLOCK_SIZE {
            return Err(E::BlockTooLarge {
                rlp_length,
                max: MAX_RLP_BLOCK_SIZE,
            });
        }
    }
    if let Some(got) = header.blob_gas_used {
        let params = spec
            .blob_params_at(header.timestamp)
            .unwrap_or_else(BlobParams::cancun);
        let mut expected = 0u64;
        for (index, tx) in block.transactions.iter().enumerate() {
            if let Some(hashes) = tx.blob_versioned_hashes() {
                if hashes.is_empty() {
                    return Err(E::BlobTransaction {
                        index,
                        reason: "blob transaction without blobs",
                    });
                }
                if hashes.len() as u64 > params.max_blobs_per_tx {
                    return Err(E::BlobTransaction {
                        index,
                        reason: "too many blobs in one transaction",
                    });
                }
                expected = expected.saturating_add(hashes.len() as u64 * DATA_GAS_PER_BLOB);
            }
        }
        let max = params.max_blob_gas_per_block();
        if got != expected || got > max || got % DATA_GAS_PER_BLOB != 0 {
            return Err(E::BlobGasUsed { got, expected, max });
        }
    }
    Ok(())
}

/// Validates execution results against the header: gas used, receipts root, logs bloom and
/// (Prague) the requests hash. The state root is checked by the caller, who owns the trie.
pub fn validate_post_execution(
    spec: &ChainParams,
    header: &Header,
    receipts: &[ReceiptEnvelope],
    gas_used: u64,
    requests: &Requests,
) -> Result<(), ConsensusError> {
    if gas_used != header.gas_used {
        return Err(E::GasUsed {
            header: header.gas_used,
            executed: gas_used,
        });
    }
    let receipts_root = calculate_receipt_root(receipts);
    if receipts_root != header.receipts_root {
        return Err(E::RootMismatch {
            what: "receipts root",
            header: header.receipts_root,
            computed: receipts_root,
        });
    }
    let bloom = receipts.iter().fold(Bloom::ZERO, |acc, r| acc | r.bloom());
    if bloom != header.logs_bloom {
        return Err(E::LogsBloom);
    }
    if spec.is_prague_active_at_timestamp(header.timestamp) {
        let computed = requests.requests_hash();
        let header_hash = header.requests_hash().unwrap_or_default();
        if computed != header_hash {
            return Err(E::RootMismatch {
                what: "requests hash",
                header: header_hash,
                computed,
            });
        }
    }
    Ok(())
}

/// The length of `block`'s RLP encoding, without encoding it.
pub fn block_rlp_length(block: &BlockWithSenders) -> usize {
    fn list(payload: usize) -> usize {
        payload + alloy_rlp::length_of_length(payload)
    }
    let transactions = block
        .transactions
        .iter()
        .map(|tx| tx.inner().length())
        .sum();
    let ommers = block.ommers.iter().map(Encodable::length).sum();
    let withdrawals = block
        .withdrawals
        .as_ref()
        .map_or(0, |w| list(w.iter().map(Encodable::length).sum()));
    list(block.header.length() + list(transactions) + list(ommers) + withdrawals)
}

/// EIP-7002 and EIP-7251: a Prague block is invalid when the withdrawal or the consolidation
/// request contract has no code for the block's end-of-block call. `has_code` answers for the
/// state after the block's transactions (the calls themselves cannot remove code).
///
/// reth v2.5.1 and alloy-evm 0.38 do not check this (the call to an empty account succeeds
/// with no requests); execution-spec-tests expect the block rejected.
pub fn validate_system_contracts(
    spec: &ChainParams,
    header: &Header,
    has_code: impl Fn(Address) -> bool,
) -> Result<(), ConsensusError> {
    if !spec.is_prague_active_at_timestamp(header.timestamp) {
        return Ok(());
    }
    let contracts = [
        (
            "EIP-7002 withdrawal requests",
            alloy_eips::eip7002::WITHDRAWAL_REQUEST_PREDEPLOY_ADDRESS,
        ),
        (
            "EIP-7251 consolidation requests",
            alloy_eips::eip7251::CONSOLIDATION_REQUEST_PREDEPLOY_ADDRESS,
        ),
    ];
    for (contract, address) in contracts {
        if !has_code(address) {
            return Err(E::SystemContractEmpty { contract, address });
        }
    }
    Ok(())
}

/// Validates the state root after execution.
pub fn validate_state_root(header: &Header, computed: B256) -> Result<(), ConsensusError> {
    if computed != header.state_root {
        return Err(E::RootMismatch {
            what: "state root",
            header: header.state_root,
            computed,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloy_primitives::{B64, Bytes, U256};

    /// The dev chain (every fork through Prague from genesis), its genesis header, and a valid
    /// child of it.
    fn chain() -> (ChainParams, Header, Header) {
        let spec = ChainParams::dev();
        let parent = spec.genesis_header(B256::ZERO);
        let child = Header {
            parent_hash: parent.hash_slow(),
            number: parent.number + 1,
            timestamp: parent.timestamp + 12,
            base_fee_per_gas: parent.next_block_base_fee(spec.base_fee_params()),
            excess_blob_gas: Some(0),
            blob_gas_used: Some(0),
            ..parent.clone()
        };
        (spec, parent, child)
    }

    /// `child` with one change, validated against `parent`.
    fn check(change: impl FnOnce(&mut Header)) -> Result<(), ConsensusError> {
        let (spec, parent, mut child) = chain();
        change(&mut child);
        validate_header(&spec, &child, &parent)
    }

    #[test]
    fn a_valid_child_passes() {
        assert_eq!(check(|_| {}), Ok(()));
        // The gas limit may move by just under 1/1024 of the parent's either way.
        let step = 60_000_000 / GAS_LIMIT_BOUND_DIVISOR - 1;
        assert_eq!(check(|h| h.gas_limit += step), Ok(()));
        assert_eq!(check(|h| h.gas_limit -= step), Ok(()));
    }

    #[test]
    fn each_header_rule_rejects_with_its_error() {
        assert!(matches!(
            check(|h| h.number += 1),
            Err(E::BlockNumber { .. })
        ));
        assert!(matches!(
            check(|h| h.timestamp = 0),
            Err(E::Timestamp { got: 0, .. })
        ));
        let step = 60_000_000 / GAS_LIMIT_BOUND_DIVISOR;
        assert!(matches!(
            check(|h| h.gas_limit += step),
            Err(E::GasLimit { .. })
        ));
        assert!(matches!(
            check(|h| h.gas_limit = MINIMUM_GAS_LIMIT - 1),
            Err(E::GasLimit { .. })
        ));
        assert!(matches!(
            check(|h| h.gas_used = h.gas_limit + 1),
            Err(E::GasUsedAboveLimit { .. })
        ));
        assert!(matches!(
            check(|h| h.extra_data = Bytes::from(vec![0; MAXIMUM_EXTRA_DATA_SIZE + 1])),
            Err(E::ExtraDataTooLong(n)) if n == MAXIMUM_EXTRA_DATA_SIZE + 1
        ));
        assert!(matches!(
            check(|h| h.difficulty = U256::from(1)),
            Err(E::ProofOfWorkField(_))
        ));
        assert!(matches!(
            check(|h| h.nonce = B64::with_last_byte(1)),
            Err(E::ProofOfWorkField(_))
        ));
        assert!(matches!(
            check(|h| h.ommers_hash = B256::ZERO),
            Err(E::ProofOfWorkField(_))
        ));
        assert!(matches!(
            check(|h| h.base_fee_per_gas = h.base_fee_per_gas.map(|f| f + 1)),
            Err(E::BaseFee { .. })
        ));
        assert!(matches!(
            check(|h| h.excess_blob_gas = Some(DATA_GAS_PER_BLOB)),
            Err(E::ExcessBlobGas { .. })
        ));
    }

    #[test]
    fn fork_fields_must_match_the_fork() {
        let missing = |field| {
            Err(E::ForkField {
                field,
                state: "missing",
            })
        };
        assert_eq!(
            check(|h| h.withdrawals_root = None),
            missing("withdrawals_root")
        );
        assert_eq!(check(|h| h.blob_gas_used = None), missing("blob_gas_used"));
        assert_eq!(
            check(|h| h.parent_beacon_block_root = None),
            missing("parent_beacon_block_root")
        );
        assert_eq!(check(|h| h.requests_hash = None), missing("requests_hash"));

        // Before Prague, a requests hash is one field too many.
        let (spec, parent, mut child) = chain();
        let spec = spec.with_fork(
            overdrive_primitives::EthereumHardfork::Prague,
            overdrive_primitives::ForkCondition::Never,
        );
        assert_eq!(
            validate_header(&spec, &child, &parent),
            Err(E::ForkField {
                field: "requests_hash",
                state: "present"
            })
        );
        child.requests_hash = None;
        assert_eq!(validate_header(&spec, &child, &parent), Ok(()));
    }

    #[test]
    fn state_root_mismatch_names_both_roots() {
        let (_, _, child) = chain();
        assert_eq!(validate_state_root(&child, child.state_root), Ok(()));
        assert!(matches!(
            validate_state_root(&child, B256::repeat_byte(1)),
            Err(E::RootMismatch { .. })
        ));
    }

    /// An Osaka (dev plus Osaka) block whose one legacy transaction carries `input`, with every
    /// body commitment in its header right.
    fn osaka_block(input: usize, osaka: bool) -> (ChainParams, BlockWithSenders) {
        use alloy_consensus::{SignableTransaction, TxEnvelope, TxLegacy, transaction::Recovered};
        use alloy_primitives::{Signature, TxKind};
        let mut spec = ChainParams::dev();
        if osaka {
            spec = spec.with_fork(
                overdrive_primitives::EthereumHardfork::Osaka,
                overdrive_primitives::ForkCondition::Timestamp(0),
            );
        }
        let (_, _, mut header) = chain();
        let tx = TxLegacy {
            chain_id: Some(spec.chain_id),
            gas_limit: 30_000_000,
            to: TxKind::Call(Address::ZERO),
            input: Bytes::from(vec![1u8; input]),
            ..Default::default()
        };
        let tx = TxEnvelope::from(tx.into_signed(Signature::test_signature()));
        header.transactions_root = calculate_transaction_root(std::slice::from_ref(&tx));
        let transactions = vec![Recovered::new_unchecked(tx, Address::ZERO)];
        (
            spec,
            BlockWithSenders::from_parts(header, transactions, Vec::new(), Some(Vec::new())),
        )
    }

    #[test]
    fn block_rlp_length_is_the_encoding_length() {
        use alloy_eips::eip4895::Withdrawal;
        let (_, mut block) = osaka_block(1000, true);
        assert_eq!(
            block_rlp_length(&block),
            alloy_rlp::encode(block.to_block()).len()
        );
        block.withdrawals = Some(vec![Withdrawal::default(); 3]);
        block.ommers = vec![block.header.clone()];
        assert_eq!(
            block_rlp_length(&block),
            alloy_rlp::encode(block.to_block()).len()
        );
    }

    /// EIP-7934: an Osaka block may be at most `MAX_RLP_BLOCK_SIZE` bytes of RLP; before Osaka
    /// any size passes.
    #[test]
    fn osaka_blocks_have_a_size_limit() {
        let (spec, small) = osaka_block(1000, true);
        assert_eq!(validate_body(&spec, &small), Ok(()));
        let (spec, large) = osaka_block(MAX_RLP_BLOCK_SIZE, true);
        assert_eq!(
            validate_body(&spec, &large),
            Err(E::BlockTooLarge {
                rlp_length: block_rlp_length(&large),
                max: MAX_RLP_BLOCK_SIZE
            })
        );
        let (prague, large) = osaka_block(MAX_RLP_BLOCK_SIZE, false);
        assert_eq!(validate_body(&prague, &large), Ok(()));
    }

    /// EIP-7002/7251: from Prague both request contracts need code; before, neither does.
    #[test]
    fn prague_request_contracts_need_code() {
        use alloy_eips::{eip7002, eip7251};
        let (spec, _, header) = chain();
        assert_eq!(validate_system_contracts(&spec, &header, |_| true), Ok(()));
        let without = |missing: Address| {
            validate_system_contracts(&spec, &header, |address| address != missing)
        };
        assert_eq!(
            without(eip7002::WITHDRAWAL_REQUEST_PREDEPLOY_ADDRESS),
            Err(E::SystemContractEmpty {
                contract: "EIP-7002 withdrawal requests",
                address: eip7002::WITHDRAWAL_REQUEST_PREDEPLOY_ADDRESS
            })
        );
        assert!(matches!(
            without(eip7251::CONSOLIDATION_REQUEST_PREDEPLOY_ADDRESS),
            Err(E::SystemContractEmpty { .. })
        ));
        let cancun = spec.with_fork(
            overdrive_primitives::EthereumHardfork::Prague,
            overdrive_primitives::ForkCondition::Never,
        );
        assert_eq!(
            validate_system_contracts(&cancun, &header, |_| false),
            Ok(())
        );
    }
}
