//! `overdrive_sendRawTransactions`: a batch of raw transactions in one call, decoded and their
//! senders recovered in parallel, inserted into the pool in one batch.
//!
//! Each transaction gets the answer `eth_sendRawTransaction` would give it (its hash, or the
//! same error code and text), in the order sent. What differs from reth's endpoint: the batch
//! goes into the local pool only (`--rpc.forwarder` is not used: the endpoint is not served
//! when it is set), and blob sidecars are not upcast (`--rpc.force-blob-sidecar-upcasting`).

use crate::pool::IntakeShared;
use alloy_eips::eip2718::Decodable2718;
use alloy_primitives::{B256, Bytes};
use jsonrpsee::{
    core::RpcResult,
    proc_macros::rpc,
    types::{
        ErrorObject, ErrorObjectOwned,
        error::{INTERNAL_ERROR_CODE, INVALID_PARAMS_CODE},
    },
};
use overdrive_intake::BatchLimits;
use reth_rpc_eth_types::EthApiError;
use reth_transaction_pool::{
    EthPooledTransaction, PoolTransaction, RawPoolTransactionError, TransactionOrigin,
    TransactionPool,
};
use serde::{Deserialize, Serialize};
use std::sync::Arc;

/// One transaction's answer: its hash when the pool took it, else the error
/// `eth_sendRawTransaction` gives for it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SubmitResult {
    /// The transaction's hash, when accepted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hash: Option<B256>,
    /// Why it was refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<SubmitError>,
}

/// A refusal, as a JSON-RPC error object.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SubmitError {
    /// The JSON-RPC error code `eth_sendRawTransaction` uses.
    pub code: i32,
    /// Its message ("nonce too low", ...).
    pub message: String,
}

impl SubmitResult {
    fn accepted(hash: B256) -> Self {
        Self {
            hash: Some(hash),
            error: None,
        }
    }

    fn refused(error: EthApiError) -> Self {
        let error: ErrorObject<'static> = error.into();
        Self {
            hash: None,
            error: Some(SubmitError {
                code: error.code(),
                message: error.message().to_string(),
            }),
        }
    }
}

/// Describes the endpoint's metrics (reth's endpoint exports them with its `reth_` prefix).
pub fn describe_metrics() {
    metrics::describe_counter!(
        "overdrive_intake_batches_total",
        "overdrive_sendRawTransactions calls taken (not those refused whole)"
    );
    metrics::describe_counter!(
        "overdrive_intake_transactions_total",
        "Transactions of overdrive_sendRawTransactions calls, by result (accepted, refused)"
    );
    metrics::describe_histogram!(
        "overdrive_intake_batch_seconds",
        metrics::Unit::Seconds,
        "Time of an overdrive_sendRawTransactions call, from decoding to the pool's answer"
    );
    metrics::describe_counter!(
        "overdrive_intake_batches_refused_total",
        "overdrive_sendRawTransactions calls refused whole (over the batch limits)"
    );
}

/// The `overdrive` namespace.
#[rpc(server, client, namespace = "overdrive")]
pub trait OverdriveApi {
    /// Submits raw transactions (EIP-2718, as `eth_sendRawTransaction` takes each) and returns
    /// one result per transaction, in order. A batch over the limits is refused whole.
    #[method(name = "sendRawTransactions")]
    async fn send_raw_transactions(&self, transactions: Vec<Bytes>)
    -> RpcResult<Vec<SubmitResult>>;
}

/// The endpoint over a pool.
#[derive(Debug)]
pub struct BatchSubmit<Pool> {
    pool: Pool,
    shared: Arc<IntakeShared>,
    limits: BatchLimits,
}

impl<Pool> BatchSubmit<Pool> {
    /// Submits into `pool`, recovering on `shared`'s intake, refusing batches over `limits`.
    pub fn new(pool: Pool, shared: Arc<IntakeShared>, limits: BatchLimits) -> Self {
        Self {
            pool,
            shared,
            limits,
        }
    }
}

/// Decodes and recovers one raw transaction as reth's `eth_sendRawTransaction` does, through
/// reth's sender recovery cache when the node has one, so that the engine does not recover the
/// sender again when the transaction comes back in a payload.
fn recover(
    raw: &[u8],
    cache: Option<&reth_evm::SenderRecoveryCache>,
) -> Result<EthPooledTransaction, RawPoolTransactionError> {
    let Some(cache) = cache else {
        return EthPooledTransaction::recover_raw_transaction(raw);
    };
    if raw.is_empty() {
        return Err(RawPoolTransactionError::EmptyRawTransactionData);
    }
    let pooled = <EthPooledTransaction as PoolTransaction>::Pooled::decode_2718_exact(raw)
        .map_err(|_| RawPoolTransactionError::FailedToDecodeSignedTransaction)?;
    EthPooledTransaction::try_recover_with_cache(pooled, cache)
        .map_err(|_| RawPoolTransactionError::InvalidTransactionSignature)
}

#[jsonrpsee::core::async_trait]
impl<Pool> OverdriveApiServer for BatchSubmit<Pool>
where
    Pool: TransactionPool<Transaction = EthPooledTransaction> + 'static,
{
    async fn send_raw_transactions(
        &self,
        transactions: Vec<Bytes>,
    ) -> RpcResult<Vec<SubmitResult>> {
        if let Err(e) = self.limits.check(transactions.iter().map(|raw| raw.len())) {
            metrics::counter!("overdrive_intake_batches_refused_total").increment(1);
            tracing::debug!(target: "overdrive::intake", %e, "batch refused");
            return Err(ErrorObjectOwned::owned(
                INVALID_PARAMS_CODE,
                e.to_string(),
                None::<()>,
            ));
        }
        let started = std::time::Instant::now();
        let count = transactions.len();
        let intake = *self.shared.intake();
        let cache = self.shared.recovery_cache().cloned();
        let recovered = tokio::task::spawn_blocking(move || {
            intake.map(transactions, |raw| recover(&raw, cache.as_ref()))
        })
        .await
        .map_err(|e| {
            ErrorObjectOwned::owned(
                INTERNAL_ERROR_CODE,
                format!("the intake's workers failed: {e}"),
                None::<()>,
            )
        })?;

        let mut results: Vec<Option<SubmitResult>> = vec![None; count];
        let mut positions = Vec::with_capacity(count);
        let mut decoded = Vec::with_capacity(count);
        for (i, tx) in recovered.into_iter().enumerate() {
            match tx {
                Ok(tx) => {
                    positions.push(i);
                    decoded.push(tx);
                }
                Err(e) => results[i] = Some(SubmitResult::refused(e.into())),
            }
        }
        let added = self
            .pool
            .add_transactions(TransactionOrigin::Local, decoded)
            .await;
        for (i, outcome) in positions.into_iter().zip(added) {
            results[i] = Some(match outcome {
                Ok(outcome) => SubmitResult::accepted(outcome.hash),
                Err(e) => SubmitResult::refused(e.into()),
            });
        }
        let results: Vec<SubmitResult> = results
            .into_iter()
            .map(|r| r.expect("every transaction has a result"))
            .collect();
        let accepted = results.iter().filter(|r| r.hash.is_some()).count();
        metrics::counter!("overdrive_intake_batches_total").increment(1);
        metrics::counter!("overdrive_intake_transactions_total", "result" => "accepted")
            .increment(accepted as u64);
        metrics::counter!("overdrive_intake_transactions_total", "result" => "refused")
            .increment((count - accepted) as u64);
        metrics::histogram!("overdrive_intake_batch_seconds").record(started.elapsed());
        tracing::debug!(
            target: "overdrive::intake",
            count,
            accepted,
            elapsed = ?started.elapsed(),
            "batch taken"
        );
        Ok(results)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloy_eips::eip2718::Encodable2718;
    use overdrive_workload::{WorkloadConfig, WorkloadKind};

    /// The endpoint's recovery leaves each sender in reth's cache, where the engine looks it up
    /// when the transaction comes back in a payload; it decodes and refuses as reth does.
    #[test]
    fn recovery_fills_reths_sender_cache() {
        let workload = overdrive_workload::generate(&WorkloadConfig {
            accounts: 50,
            txs_per_block: 20,
            blocks: 1,
            ..WorkloadConfig::new(WorkloadKind::Transfer)
        })
        .unwrap();
        let cache = reth_evm::SenderRecoveryCache::new(64);
        for tx in &workload.blocks[0].transactions {
            let raw = tx.inner().encoded_2718();
            let hash = *tx.inner().tx_hash();
            assert_eq!(cache.get(&hash), None);
            let with_cache = recover(&raw, Some(&cache)).unwrap();
            let without = recover(&raw, None).unwrap();
            assert_eq!(with_cache.sender(), tx.signer());
            assert_eq!(without.sender(), tx.signer());
            assert_eq!(with_cache.hash(), without.hash());
            assert_eq!(cache.get(&hash), Some(tx.signer()));
        }
        for raw in [&[][..], &[0xde, 0xad][..]] {
            assert_eq!(
                recover(raw, Some(&cache)).unwrap_err().to_string(),
                EthPooledTransaction::recover_raw_transaction(raw)
                    .unwrap_err()
                    .to_string()
            );
        }
    }
}
