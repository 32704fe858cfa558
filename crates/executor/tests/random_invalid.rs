//! Invalid transactions among random conflicting blocks: the parallel executor must give the
//! sequential executor's exact result — the same error, or the same output — on the
//! generator's Cancun, Prague, Osaka and BPO1 blocks (every transaction type, hot senders,
//! shared contracts, self-destructs, EIP-7702), each made invalid in one of the ways a block can
//! be:
//! - its gas limit one below what its most demanding transaction needs (and, as a check, exactly
//!   that, which must still be valid);
//! - a base fee above what one transaction offers, or a blob base fee above what blob
//!   transactions offer;
//! - a transaction dropped (a nonce gap for its sender's later ones) or repeated (nonce too
//!   low);
//! - a sender's balance cut before the block, so that validity depends on what its earlier
//!   transactions in the block spent;
//! - from Osaka, a transaction whose gas limit is one above EIP-7825's cap.
//!
//! The committer decides validity from speculative results (gas used so far, balances and
//! nonces as committed), so these are checked where speculation ran ahead of the invalid
//! transaction.

mod common;

use alloy_consensus::{
    Transaction as _, TxEip1559, TxEip2930, TxEip4844Variant, TxEip7702, TxEnvelope, TxLegacy,
    transaction::Recovered,
};
use alloy_eips::eip7825::MAX_TX_GAS_LIMIT_OSAKA;
use common::{Fork, Gen, assert_equal, parallel, seed_base, soak};
use overdrive_executor::{ExecuteBlock, SequentialExecutor};
use overdrive_primitives::{BlockWithSenders, MemState};
use rand::Rng;
use revm::primitives::U256;
use std::collections::BTreeMap;

/// How a valid block is changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Change {
    /// Gas limit = the most any transaction needs (gas used before it + its gas limit).
    GasLimitExact,
    /// One less: the first transaction that needed it is rejected.
    GasLimitShort,
    /// Base fee one above a transaction's fee cap.
    BaseFee,
    /// Blob base fee above every blob transaction's blob fee cap (blocks with one).
    BlobFee,
    /// A transaction whose sender sends again later in the block is left out.
    Dropped,
    /// A transaction is included twice in a row.
    Repeated,
    /// A sender's balance before the block is cut to at most one and a half times the most
    /// its transactions in the block may cost.
    Balance,
    /// A transaction re-signed with a gas limit one above EIP-7825's cap (Osaka on).
    GasCap,
}

/// Per change: how many blocks stayed valid and how many were rejected.
type Tally = BTreeMap<Change, (usize, usize)>;

/// Gas used before each transaction (from the block's reference receipts).
fn gas_before(receipts: &[alloy_consensus::ReceiptEnvelope]) -> Vec<u64> {
    std::iter::once(0)
        .chain(receipts.iter().map(|r| r.cumulative_gas_used()))
        .take(receipts.len())
        .collect()
}

/// `block` with its header changed by `f` (the hash follows the header).
fn with_header(
    block: &BlockWithSenders,
    f: impl FnOnce(&mut alloy_consensus::Header),
) -> BlockWithSenders {
    let mut header = block.header.clone();
    f(&mut header);
    BlockWithSenders::from_parts(
        header,
        block.transactions.clone(),
        block.ommers.clone(),
        block.withdrawals.clone(),
    )
}

/// `block` with other transactions.
fn with_transactions(
    block: &BlockWithSenders,
    transactions: Vec<alloy_consensus::transaction::Recovered<alloy_consensus::TxEnvelope>>,
) -> BlockWithSenders {
    BlockWithSenders::from_parts(
        block.header.clone(),
        transactions,
        block.ommers.clone(),
        block.withdrawals.clone(),
    )
}

/// `tx` with another gas limit, signed again by its sender (one of the generator's keys).
fn with_gas_limit(
    generator: &Gen,
    tx: &Recovered<TxEnvelope>,
    gas_limit: u64,
) -> Option<Recovered<TxEnvelope>> {
    let key = generator
        .senders
        .iter()
        .chain([&generator.sponsor])
        .find(|k| k.address == tx.signer())?;
    Some(match tx.inner().clone() {
        TxEnvelope::Legacy(s) => key.sign(TxLegacy {
            gas_limit,
            ..s.strip_signature()
        }),
        TxEnvelope::Eip2930(s) => key.sign(TxEip2930 {
            gas_limit,
            ..s.strip_signature()
        }),
        TxEnvelope::Eip1559(s) => key.sign(TxEip1559 {
            gas_limit,
            ..s.strip_signature()
        }),
        TxEnvelope::Eip4844(s) => {
            let mut inner = s.strip_signature();
            match &mut inner {
                TxEip4844Variant::TxEip4844(t) => t.gas_limit = gas_limit,
                TxEip4844Variant::TxEip4844WithSidecar(t) => t.tx.gas_limit = gas_limit,
            }
            key.sign(inner)
        }
        TxEnvelope::Eip7702(s) => key.sign(TxEip7702 {
            gas_limit,
            ..s.strip_signature()
        }),
    })
}

/// The changed blocks (and pre-states) of one valid block, with what each must give where
/// that is known in advance (`Some(true)`: valid; `Some(false)`: rejected).
fn changes(
    generator: &mut Gen,
    block: &BlockWithSenders,
    state: &MemState,
    receipts: &[alloy_consensus::ReceiptEnvelope],
) -> Vec<(Change, BlockWithSenders, Option<MemState>, Option<bool>)> {
    let txs = &block.transactions;
    let n = txs.len();
    let mut out = Vec::new();

    let needs = gas_before(receipts)
        .iter()
        .zip(txs)
        .map(|(before, tx)| before + tx.gas_limit())
        .max()
        .expect("a transaction");
    out.push((
        Change::GasLimitExact,
        with_header(block, |h| h.gas_limit = needs),
        None,
        Some(true),
    ));
    out.push((
        Change::GasLimitShort,
        with_header(block, |h| h.gas_limit = needs - 1),
        None,
        Some(false),
    ));

    let j = generator.rng.random_range(0..n);
    let cap = u64::try_from(txs[j].max_fee_per_gas()).expect("small fee caps");
    out.push((
        Change::BaseFee,
        with_header(block, |h| h.base_fee_per_gas = Some(cap + 1)),
        None,
        Some(false),
    ));

    if txs.iter().any(|tx| tx.blob_versioned_hashes().is_some()) {
        // A blob base fee of about 1,300 wei (BPO1's update fraction, the largest here) or
        // more; transactions offer 10.
        out.push((
            Change::BlobFee,
            with_header(block, |h| h.excess_blob_gas = Some(60_000_000)),
            None,
            Some(false),
        ));
    }

    let later_again: Vec<usize> = (0..n)
        .filter(|&i| {
            txs[i + 1..]
                .iter()
                .any(|later| later.signer() == txs[i].signer())
        })
        .collect();
    if !later_again.is_empty() {
        let drop = later_again[generator.rng.random_range(0..later_again.len())];
        let mut kept = txs.clone();
        kept.remove(drop);
        out.push((
            Change::Dropped,
            with_transactions(block, kept),
            None,
            Some(false),
        ));
    }

    let mut repeated = txs.clone();
    repeated.insert(j, txs[j].clone());
    out.push((
        Change::Repeated,
        with_transactions(block, repeated),
        None,
        Some(false),
    ));

    // Up to one and a half times what the sender's transactions may cost at most: enough for
    // all, for some (validity then depends on what the earlier ones spent), or for none.
    let sender = txs[j].signer();
    let most: u128 = txs
        .iter()
        .filter(|tx| tx.signer() == sender)
        .map(|tx| {
            let blobs = tx.blob_versioned_hashes().map_or(0, |h| h.len() as u128);
            u128::from(tx.gas_limit()) * tx.max_fee_per_gas()
                + tx.value().to::<u128>()
                + blobs * 131_072 * tx.max_fee_per_blob_gas().unwrap_or(0)
        })
        .sum();
    if generator.fork >= Fork::Osaka
        && let Some(over) = with_gas_limit(generator, &txs[j], MAX_TX_GAS_LIMIT_OSAKA + 1)
    {
        let mut capped = txs.clone();
        capped[j] = over;
        out.push((
            Change::GasCap,
            with_header(&with_transactions(block, capped), |h| {
                h.gas_limit = h.gas_limit.max(2 * MAX_TX_GAS_LIMIT_OSAKA)
            }),
            None,
            Some(false),
        ));
    }

    let mut poorer = state.clone();
    if let Some(account) = poorer.accounts.get_mut(&sender) {
        account.info.balance = U256::from(generator.rng.random_range(0..=most * 3 / 2));
        out.push((Change::Balance, block.clone(), Some(poorer), None));
    }
    out
}

fn run(fork: Fork, seed: u64, blocks: usize, tally: &mut Tally) {
    let (mut generator, mut state) = Gen::new(fork, seed);
    // Some history first: children created, authorities delegated, hot slots written.
    generator.advance(&mut state, 2, 20);
    let executors = [parallel(2), parallel(3), parallel(4)];
    for b in 0..blocks {
        let n = generator.rng.random_range(8..=60);
        let block = generator.block(&state, n);
        let reference = SequentialExecutor
            .execute(&generator.spec, &block, &state)
            .unwrap_or_else(|e| panic!("{fork:?} seed {seed} block {b}: generated block: {e}"));
        for (change, changed, pre, expect) in
            changes(&mut generator, &block, &state, &reference.receipts)
        {
            let pre = pre.as_ref().unwrap_or(&state);
            let mut valid = false;
            for (executor, t) in executors.iter().zip([2, 3, 4]) {
                let what =
                    format!("{fork:?} seed {seed} block {b} ({n} txs) {change:?} threads {t}");
                let result = assert_equal(executor, &generator.spec, &changed, pre, &what);
                match (expect, &result) {
                    (Some(true), Err(e)) => panic!("{what}: must stay valid, got {e}"),
                    (Some(false), Ok(_)) => panic!("{what}: must be rejected"),
                    _ => {}
                }
                valid = result.is_ok();
            }
            let entry = tally.entry(change).or_default();
            if valid {
                entry.0 += 1;
            } else {
                entry.1 += 1;
            }
        }
        state.apply_bundle(&reference.bundle);
        state.block_hashes.insert(block.number(), block.hash);
    }
}

#[test]
fn invalid_transactions_in_random_blocks_give_the_sequential_result() {
    let (seeds, blocks) = if soak() { (60, 12) } else { (12, 6) };
    let mut tally = Tally::new();
    let base = seed_base();
    for seed in base..base + seeds {
        for fork in [Fork::Cancun, Fork::Prague, Fork::Osaka, Fork::Bpo1] {
            run(fork, 7_000 + seed, blocks, &mut tally);
        }
    }
    eprintln!("valid / rejected blocks per change: {tally:?}");
    // Every change was made and every kind of rejection happened; the cut balances left some
    // blocks valid and rejected others.
    for change in [
        Change::GasLimitExact,
        Change::GasLimitShort,
        Change::BaseFee,
        Change::BlobFee,
        Change::Dropped,
        Change::Repeated,
        Change::Balance,
        Change::GasCap,
    ] {
        let (valid, rejected) = tally.get(&change).copied().unwrap_or_default();
        assert!(valid + rejected > 0, "{change:?} never made");
        if change != Change::GasLimitExact {
            assert!(rejected > 0, "{change:?} never rejected a block");
        }
    }
    let (valid, rejected) = tally[&Change::Balance];
    assert!(
        valid > 0 && rejected > 0,
        "cut balances: {valid} valid, {rejected} rejected"
    );
}
