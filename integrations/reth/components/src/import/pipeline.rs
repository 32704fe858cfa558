//! reth v2.5.1's `import_blocks_from_file` and `build_import_pipeline_impl`
//! (`crates/cli/commands/src/import_core.rs`), with two changes: the pipeline's
//! `MerkleExecute` stage is overdrive's [`ParallelMerkleStage`], and an import killed after it
//! stored its blocks but before its pipeline finished is finished first ([`finish_interrupted`]).
//! reth builds the import pipeline inside that function and offers no hook for a stage; the
//! other lines follow reth's, except that missing data is an error instead of a panic.

use crate::merkle::{MerkleStageConfig, ParallelMerkleStage};
use alloy_primitives::B256;
use futures::StreamExt;
use reth_cli_commands::import_core::{ImportConfig, ImportResult};
use reth_config::Config;
use reth_consensus::FullConsensus;
use reth_db_api::{tables, transaction::DbTx};
use reth_downloaders::{
    bodies::bodies::BodiesDownloaderBuilder,
    file_client::{ChunkedFileReader, FileClient},
    headers::reverse_headers::ReverseHeadersDownloaderBuilder,
};
use reth_evm::ConfigureEvm;
use reth_network_p2p::{
    bodies::downloader::BodyDownloader,
    headers::downloader::{HeaderDownloader, SyncTarget},
};
use reth_node_builder::BlockTy;
use reth_node_events::node::NodeEvent;
use reth_provider::{
    BlockNumReader, HeaderProvider, ProviderError, ProviderFactory, RocksDBProviderFactory,
    StageCheckpointReader, providers::ProviderNodeTypes,
};
use reth_prune_types::PruneModes;
use reth_stages::{
    ControlFlow, Pipeline, StageId, StageSet,
    sets::{DefaultStages, OfflineStages},
    stages::FinishStage,
};
use reth_static_file::StaticFileProducer;
use reth_storage_api::StorageSettingsCache;
use std::{path::Path, sync::Arc};
use tokio::sync::watch;
use tracing::{debug, error, info, warn};

/// Imports the blocks of `path` as reth's `import_blocks_from_file` does, the state root
/// computed by [`ParallelMerkleStage`] with `merkle`.
#[allow(clippy::too_many_arguments)]
pub async fn import_blocks_from_file<N>(
    path: &Path,
    import_config: ImportConfig,
    provider_factory: ProviderFactory<N>,
    config: &Config,
    executor: impl ConfigureEvm<Primitives = N::Primitives> + 'static,
    consensus: Arc<impl FullConsensus<N::Primitives> + 'static>,
    runtime: reth_tasks::Runtime,
    merkle: MerkleStageConfig,
) -> eyre::Result<ImportResult>
where
    N: ProviderNodeTypes,
{
    if import_config.no_state {
        info!(target: "reth::import", "Disabled stages requiring state");
    }
    let static_file_producer =
        StaticFileProducer::new(provider_factory.clone(), PruneModes::default());
    if !import_config.no_state {
        finish_interrupted(
            &provider_factory,
            config,
            &consensus,
            executor.clone(),
            static_file_producer.clone(),
            merkle,
        )
        .await?;
    }
    let mut reader = ChunkedFileReader::new(path, import_config.chunk_len).await?;

    let provider = provider_factory.provider()?;
    let init_blocks = provider.tx_ref().entries::<tables::HeaderNumbers>()?;
    let init_txns = transaction_count(&provider_factory)?;
    drop(provider);

    let mut total_decoded_blocks = 0;
    let mut total_decoded_txns = 0;
    let mut sealed_header = provider_factory
        .sealed_header(provider_factory.last_block_number()?)?
        .ok_or_else(|| eyre::eyre!("the database has no genesis header"))?;

    let mut stopped_on_invalid_block = false;
    let mut bad_block_number: Option<u64> = None;
    let mut last_valid_block_number: Option<u64> = None;

    let skip_invalid_blocks = !import_config.fail_on_invalid_block;
    while let Some(file_client) = reader
        .next_chunk_with_invalid_block_handling::<BlockTy<N>>(
            consensus.clone(),
            Some(sealed_header.clone()),
            skip_invalid_blocks,
        )
        .await?
    {
        info!(target: "reth::import", "Importing chain file chunk");
        if file_client.headers_len() == 0 {
            debug!(target: "reth::import", "Skipping chain file chunk without valid blocks");
            continue;
        }
        let tip = file_client
            .tip()
            .ok_or(eyre::eyre!("file client has no tip"))?;
        info!(target: "reth::import", "Chain file chunk read");
        total_decoded_blocks += file_client.headers_len();
        total_decoded_txns += file_client.total_transactions();

        let (mut pipeline, events) = build_import_pipeline(
            config,
            provider_factory.clone(),
            &consensus,
            Arc::new(file_client),
            static_file_producer.clone(),
            import_config.no_state,
            executor.clone(),
            runtime.clone(),
            merkle,
        )?;
        pipeline.set_tip(tip);
        debug!(target: "reth::import", ?tip, "Tip manually set");

        let latest_block_number = provider_factory
            .get_stage_checkpoint(StageId::Finish)?
            .map(|ch| ch.block_number);
        tokio::spawn(reth_node_events::node::handle_events(
            None,
            latest_block_number,
            events,
        ));

        info!(target: "reth::import", "Starting sync pipeline");
        if import_config.fail_on_invalid_block {
            tokio::select! {
                res = pipeline.run() => res?,
                _ = tokio::signal::ctrl_c() => {
                    info!(target: "reth::import", "Import interrupted by user");
                    break;
                },
            }
        } else {
            let result = tokio::select! {
                res = pipeline.run_loop() => res,
                _ = tokio::signal::ctrl_c() => {
                    info!(target: "reth::import", "Import interrupted by user");
                    break;
                },
            };
            match result {
                Ok(ControlFlow::Unwind { target, bad_block }) => {
                    let bad = bad_block.block.number;
                    warn!(
                        target: "reth::import",
                        bad_block = bad,
                        last_valid_block = target,
                        "Invalid block encountered during import; stopping at last valid block"
                    );
                    stopped_on_invalid_block = true;
                    bad_block_number = Some(bad);
                    last_valid_block_number = Some(target);
                    break;
                }
                Ok(ControlFlow::Continue { block_number }) => {
                    debug!(target: "reth::import", block_number, "Pipeline chunk completed");
                }
                Ok(ControlFlow::NoProgress { block_number }) => {
                    debug!(target: "reth::import", ?block_number, "Pipeline made no progress");
                }
                Err(e) => return Err(e.into()),
            }
        }
        sealed_header = provider_factory
            .sealed_header(provider_factory.last_block_number()?)?
            .ok_or_else(|| eyre::eyre!("the database has no genesis header"))?;
    }

    let provider = provider_factory.provider()?;
    let total_imported_blocks = provider.tx_ref().entries::<tables::HeaderNumbers>()? - init_blocks;
    let total_imported_txns = transaction_count(&provider_factory)? - init_txns;
    let result = ImportResult {
        total_decoded_blocks,
        total_decoded_txns,
        total_imported_blocks,
        total_imported_txns,
        stopped_on_invalid_block,
        bad_block: bad_block_number,
        last_valid_block: last_valid_block_number,
    };
    if result.stopped_on_invalid_block {
        info!(target: "reth::import",
            total_imported_blocks,
            total_imported_txns,
            bad_block = ?result.bad_block,
            last_valid_block = ?result.last_valid_block,
            "Import stopped at last valid block due to invalid block"
        );
    } else if !result.is_complete() {
        error!(target: "reth::import",
            total_decoded_blocks,
            total_imported_blocks,
            total_decoded_txns,
            total_imported_txns,
            "Chain was partially imported"
        );
    } else {
        info!(target: "reth::import",
            total_imported_blocks,
            total_imported_txns,
            "Chain was fully imported"
        );
    }
    Ok(result)
}

/// Runs the state stages up to the last block whose body is stored, when an earlier import
/// stored blocks but was killed before its pipeline finished with them.
///
/// reth's import skips the blocks a database already has, so its stages would otherwise stay
/// behind the database's own blocks for good (reth's `import` leaves that to `node` or
/// `stage run`). The merkle stage resumes from its last committed chunk.
async fn finish_interrupted<N, C, E>(
    provider_factory: &ProviderFactory<N>,
    config: &Config,
    consensus: &Arc<C>,
    evm_config: E,
    static_file_producer: StaticFileProducer<ProviderFactory<N>>,
    merkle: MerkleStageConfig,
) -> eyre::Result<()>
where
    N: ProviderNodeTypes,
    C: FullConsensus<N::Primitives> + 'static,
    E: ConfigureEvm<Primitives = N::Primitives> + 'static,
{
    let checkpoint = |id| -> eyre::Result<u64> {
        Ok(provider_factory
            .get_stage_checkpoint(id)?
            .map_or(0, |c| c.block_number))
    };
    let (stored, finished) = (checkpoint(StageId::Bodies)?, checkpoint(StageId::Finish)?);
    if finished >= stored {
        return Ok(());
    }
    info!(target: "reth::import", finished, stored, "Finishing the stages of an interrupted import");
    let consensus: Arc<dyn FullConsensus<N::Primitives>> = consensus.clone();
    let mut pipeline = Pipeline::<N>::builder()
        .with_max_block(stored)
        .with_fail_on_unwind(true)
        .add_stages(
            OfflineStages::new(
                evm_config,
                consensus,
                config.stages.clone(),
                PruneModes::default(),
            )
            .builder()
            .set(ParallelMerkleStage::new(
                provider_factory.clone(),
                merkle.with_reth_thresholds(&config.stages.merkle),
            )),
        )
        .add_stage(FinishStage::default())
        .build(provider_factory.clone(), static_file_producer);
    let events = pipeline.events().map(Into::into);
    tokio::spawn(reth_node_events::node::handle_events::<_, N::Primitives>(
        None,
        Some(finished),
        events,
    ));
    match pipeline.run_loop().await? {
        ControlFlow::Unwind { target, bad_block } => eyre::bail!(
            "the interrupted import's block {} is invalid; the database is back at block {target}",
            bad_block.block.number
        ),
        ControlFlow::Continue { .. } | ControlFlow::NoProgress { .. } => Ok(()),
    }
}

/// Transactions in the database (in RocksDB under reth's storage v2).
fn transaction_count<N: ProviderNodeTypes>(factory: &ProviderFactory<N>) -> eyre::Result<usize> {
    Ok(if factory.cached_storage_settings().storage_v2 {
        factory
            .rocksdb_provider()
            .iter::<tables::TransactionHashNumbers>()?
            .count()
    } else {
        factory
            .provider()?
            .tx_ref()
            .entries::<tables::TransactionHashNumbers>()?
    })
}

/// reth's import pipeline with [`ParallelMerkleStage`] as its `MerkleExecute` stage.
#[allow(clippy::too_many_arguments)]
fn build_import_pipeline<N, C, E>(
    config: &Config,
    provider_factory: ProviderFactory<N>,
    consensus: &Arc<C>,
    file_client: Arc<FileClient<BlockTy<N>>>,
    static_file_producer: StaticFileProducer<ProviderFactory<N>>,
    disable_exec: bool,
    evm_config: E,
    runtime: reth_tasks::Runtime,
    merkle: MerkleStageConfig,
) -> eyre::Result<(
    Pipeline<N>,
    impl futures::Stream<Item = NodeEvent<N::Primitives>> + use<N, C, E>,
)>
where
    N: ProviderNodeTypes,
    C: FullConsensus<N::Primitives> + 'static,
    E: ConfigureEvm<Primitives = N::Primitives> + 'static,
{
    if !file_client.has_canonical_blocks() {
        eyre::bail!("unable to import non canonical blocks");
    }
    let (Some(tip), Some(min_block), Some(max_block)) = (
        file_client.tip(),
        file_client.min_block(),
        file_client.max_block(),
    ) else {
        eyre::bail!("the chain file chunk has no blocks");
    };
    let last_block_number = provider_factory.last_block_number()?;
    let local_head = provider_factory
        .sealed_header(last_block_number)?
        .ok_or_else(|| ProviderError::HeaderNotFound(last_block_number.into()))?;

    let mut header_downloader = ReverseHeadersDownloaderBuilder::new(config.stages.headers)
        .build(file_client.clone(), consensus.clone())
        .into_task_with(&runtime);
    header_downloader.update_local_head(local_head);
    header_downloader.update_sync_target(SyncTarget::Tip(tip));

    let mut body_downloader = BodiesDownloaderBuilder::new(config.stages.bodies)
        .build(
            file_client.clone(),
            consensus.clone(),
            provider_factory.clone(),
        )
        .into_task_with(&runtime);
    body_downloader.set_download_range(min_block..=max_block)?;

    let (tip_tx, tip_rx) = watch::channel(B256::ZERO);
    let stages = DefaultStages::new(
        provider_factory.clone(),
        tip_rx,
        consensus.clone(),
        header_downloader,
        body_downloader,
        evm_config,
        config.stages.clone(),
        PruneModes::default(),
        None,
    )
    .builder()
    .disable_all_if(&StageId::STATE_REQUIRED, || disable_exec)
    // The one difference from reth's import pipeline.
    .set(ParallelMerkleStage::new(
        provider_factory.clone(),
        merkle.with_reth_thresholds(&config.stages.merkle),
    ));
    let pipeline = Pipeline::builder()
        .with_tip_sender(tip_tx)
        .with_max_block(max_block)
        .with_fail_on_unwind(true)
        .add_stages(stages)
        .build(provider_factory, static_file_producer);
    let events = pipeline.events().map(Into::into);
    Ok((pipeline, events))
}
