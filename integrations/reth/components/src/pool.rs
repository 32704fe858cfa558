//! The transaction pool: reth's `Pool` with reth's validator, which overdrive runs in parallel
//! over each batch (`--overdrive.pool`).
//!
//! reth validates a batch on one thread, reading each transaction's sender from the database
//! whatever it read for the one before. Here a batch is split into groups that keep each
//! sender's transactions together (`overdrive_intake::Intake::by_sender`); each group runs on
//! a worker with its own state provider, and reads each sender and code hash once. Every rule
//! is reth's own: each transaction goes through `EthTransactionValidator`'s stateless and
//! stateful checks unchanged, so a transaction is accepted or refused, with the same error, as
//! stock reth would. A transaction validated on its own (an `eth_sendRawTransaction` call, unless
//! reth's `--txpool.max-batch-size` batches them) takes reth's path as before; insertion is
//! reth's batch insertion, one pool lock a batch.

use alloy_primitives::{Address, B256};
use overdrive_intake::{Intake, ReadMemo};
use reth_chainspec::ChainSpec;
use reth_evm::ConfigureEvm;
use reth_node_builder::{
    BuilderContext, FullNodeTypes,
    components::{PoolBuilder, TxPoolBuilder, create_blob_store_with_cache},
    node::NodeTypes,
};
use reth_primitives_traits::{Account, Bytecode, SealedBlock};
use reth_storage_api::{
    AccountReader, BytecodeReader, StateProviderBox, StateProviderFactory, errors::ProviderResult,
};
use reth_transaction_pool::{
    EthPooledTransaction, EthTransactionValidator, PoolTransaction, TransactionOrigin,
    TransactionValidationOutcome, TransactionValidationTaskExecutor, TransactionValidator,
    blobstore::DiskFileBlobStore, validate::EthTransactionValidatorBuilder,
};
use std::sync::{Arc, OnceLock};

/// What the pool and the batch endpoint share: how they run a batch in parallel, and reth's
/// sender recovery cache when `--engine.sender-recovery-cache` is on.
#[derive(Debug)]
pub struct IntakeShared {
    intake: Intake,
    recovery_cache: OnceLock<Option<reth_evm::SenderRecoveryCache>>,
}

impl IntakeShared {
    /// Shares `intake`.
    pub fn new(intake: Intake) -> Self {
        Self {
            intake,
            recovery_cache: OnceLock::new(),
        }
    }

    /// How a batch runs in parallel.
    pub fn intake(&self) -> &Intake {
        &self.intake
    }

    /// reth's sender recovery cache, once the pool is built, if the node has one.
    pub fn recovery_cache(&self) -> Option<&reth_evm::SenderRecoveryCache> {
        self.recovery_cache.get().and_then(Option::as_ref)
    }
}

/// reth's validator, with batches validated in parallel by sender when `intake` is set.
#[derive(Debug)]
pub struct BatchValidator<Client, Evm> {
    inner: EthTransactionValidator<Client, EthPooledTransaction, Evm>,
    client: Client,
    intake: Option<Intake>,
}

impl<Client, Evm> BatchValidator<Client, Evm> {
    /// reth's `inner` (reading through `client`), in parallel on `intake` when given.
    pub fn new(
        inner: EthTransactionValidator<Client, EthPooledTransaction, Evm>,
        client: Client,
        intake: Option<Intake>,
    ) -> Self {
        Self {
            inner,
            client,
            intake,
        }
    }
}

/// One worker's view of the state for a batch: the latest state, each account and code read
/// once.
struct MemoState {
    state: StateProviderBox,
    accounts: ReadMemo<Address, Option<Account>>,
    code: ReadMemo<B256, Option<Bytecode>>,
}

impl AccountReader for MemoState {
    fn basic_account(&self, address: &Address) -> ProviderResult<Option<Account>> {
        self.accounts
            .get_or_read(address, || self.state.basic_account(address))
    }
}

impl BytecodeReader for MemoState {
    fn bytecode_by_hash(&self, code_hash: &B256) -> ProviderResult<Option<Bytecode>> {
        self.code
            .get_or_read(code_hash, || self.state.bytecode_by_hash(code_hash))
    }
}

/// What the validator reads through: the node's provider.
pub trait StateClient:
    reth_chainspec::ChainSpecProvider<ChainSpec = ChainSpec>
    + StateProviderFactory
    + Clone
    + Send
    + Sync
    + 'static
{
}

impl<T> StateClient for T where
    T: reth_chainspec::ChainSpecProvider<ChainSpec = ChainSpec>
        + StateProviderFactory
        + Clone
        + Send
        + Sync
        + 'static
{
}

impl<Client: StateClient, Evm: ConfigureEvm + 'static> BatchValidator<Client, Evm> {
    /// Each transaction through reth's checks, groups of senders on the intake's workers.
    fn validate_parallel(
        &self,
        intake: &Intake,
        txs: Vec<(TransactionOrigin, EthPooledTransaction)>,
    ) -> Vec<TransactionValidationOutcome<EthPooledTransaction>> {
        intake.by_sender(
            txs,
            |(_, tx)| tx.sender(),
            || {
                self.client.latest().map(|state| MemoState {
                    state,
                    accounts: ReadMemo::default(),
                    code: ReadMemo::default(),
                })
            },
            |state, (origin, tx)| match state {
                Ok(state) => self
                    .inner
                    .validate_one_with_state_provider(origin, tx, &*state),
                Err(e) => TransactionValidationOutcome::Error(*tx.hash(), Box::new(e.clone())),
            },
        )
    }
}

impl<Client, Evm> TransactionValidator for BatchValidator<Client, Evm>
where
    Client: StateClient,
    Evm: ConfigureEvm<Primitives = reth_ethereum_primitives::EthPrimitives> + 'static,
{
    type Transaction = EthPooledTransaction;
    type Block = reth_ethereum_primitives::Block;

    async fn validate_transaction(
        &self,
        origin: TransactionOrigin,
        transaction: Self::Transaction,
    ) -> TransactionValidationOutcome<Self::Transaction> {
        self.inner.validate_transaction(origin, transaction).await
    }

    async fn validate_transactions(
        &self,
        transactions: impl IntoIterator<Item = (TransactionOrigin, Self::Transaction), IntoIter: Send>
        + Send,
    ) -> Vec<TransactionValidationOutcome<Self::Transaction>> {
        match &self.intake {
            Some(intake) => self.validate_parallel(intake, transactions.into_iter().collect()),
            None => self.inner.validate_transactions(transactions).await,
        }
    }

    async fn validate_transactions_with_origin(
        &self,
        origin: TransactionOrigin,
        transactions: impl IntoIterator<Item = Self::Transaction, IntoIter: Send> + Send,
    ) -> Vec<TransactionValidationOutcome<Self::Transaction>> {
        match &self.intake {
            Some(intake) => self.validate_parallel(
                intake,
                transactions.into_iter().map(|tx| (origin, tx)).collect(),
            ),
            None => {
                self.inner
                    .validate_transactions_with_origin(origin, transactions)
                    .await
            }
        }
    }

    fn on_new_head_block(&self, new_tip_block: &SealedBlock<Self::Block>) {
        TransactionValidator::on_new_head_block(&self.inner, new_tip_block)
    }
}

/// The pool reth's `EthereumPoolBuilder` builds, with [`BatchValidator`] around its validator.
#[derive(Debug, Clone, Default)]
pub struct OverdrivePoolBuilder {
    shared: Option<Arc<IntakeShared>>,
}

impl OverdrivePoolBuilder {
    /// Validates batches on `shared`'s intake when given; stock reth's pool otherwise.
    pub fn new(shared: Option<Arc<IntakeShared>>) -> Self {
        Self { shared }
    }
}

impl<Node, Evm> PoolBuilder<Node, Evm> for OverdrivePoolBuilder
where
    Node: FullNodeTypes<
        Types: NodeTypes<
            ChainSpec = ChainSpec,
            Primitives = reth_ethereum_primitives::EthPrimitives,
        >,
    >,
    Evm: ConfigureEvm<Primitives = reth_ethereum_primitives::EthPrimitives> + Clone + 'static,
{
    type Pool = reth_transaction_pool::Pool<
        TransactionValidationTaskExecutor<BatchValidator<Node::Provider, Evm>>,
        reth_transaction_pool::CoinbaseTipOrdering<EthPooledTransaction>,
        DiskFileBlobStore,
    >;

    async fn build_pool(
        self,
        ctx: &BuilderContext<Node>,
        evm_config: Evm,
    ) -> eyre::Result<Self::Pool> {
        // As reth's `EthereumPoolBuilder`, which has no hook for the validator it builds.
        let pool_config = ctx.pool_config();
        let txpool = &ctx.config().txpool;
        let blobs_disabled = txpool.disable_blobs_support || txpool.blobpool_max_count == 0;
        let blob_cache_size = pool_config.blob_cache_size.or_else(|| {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs());
            let params = reth_chainspec::EthChainSpec::blob_params_at_timestamp(
                ctx.chain_spec().as_ref(),
                now,
            )
            .unwrap_or_else(alloy_eips::eip7840::BlobParams::cancun);
            // Two epochs of target blobs, as reth sizes it.
            Some((params.target_blob_count * 32 * 2) as u32)
        });
        let blob_store = create_blob_store_with_cache(ctx, blob_cache_size)?;
        let inner = EthTransactionValidatorBuilder::new(ctx.provider().clone(), evm_config)
            .set_eip4844(!blobs_disabled)
            .kzg_settings(ctx.kzg_settings()?)
            .with_max_tx_input_bytes(txpool.max_tx_input_bytes)
            .with_local_transactions_config(pool_config.local_transactions_config.clone())
            .set_tx_fee_cap(ctx.config().rpc.rpc_tx_fee_cap)
            .with_max_tx_gas_limit(txpool.max_tx_gas_limit)
            .with_minimum_priority_fee(txpool.minimum_priority_fee)
            .build::<EthPooledTransaction, _>(blob_store.clone());
        if inner.eip4844() {
            let kzg = inner.kzg_settings().clone();
            ctx.task_executor().spawn_blocking_task(async move {
                let _ = kzg.get();
            });
        }
        if let Some(shared) = &self.shared {
            let _ = shared
                .recovery_cache
                .set(ctx.sender_recovery_cache().cloned());
        }
        let validator = TransactionValidationTaskExecutor::spawn(
            BatchValidator::new(
                inner,
                ctx.provider().clone(),
                self.shared.as_ref().map(|s| s.intake),
            ),
            ctx.task_executor(),
            txpool.additional_validation_tasks,
        );
        let pool = TxPoolBuilder::new(ctx)
            .with_validator(validator)
            .build_and_spawn_maintenance_task(blob_store, pool_config)?;
        tracing::info!(target: "reth::cli", "Transaction pool initialized");
        match &self.shared {
            Some(shared) => tracing::info!(
                target: "overdrive",
                threads = shared.intake.threads(),
                "transaction pool: batches validated in parallel by sender"
            ),
            None => tracing::debug!(target: "overdrive", "transaction pool: reth's"),
        }
        Ok(pool)
    }
}
