//! `overdrive-reth import` with a component on: reth's import, with the database at hand.
//!
//! reth's offline commands build their EVM configuration from the chain spec alone, so the
//! parallel executor, which opens a read transaction per thread, has no database there. This
//! command is reth's `import` (same flags, same steps, reth's `import_blocks_from_file` does the
//! work) with the EVM configuration built after the database is open. With
//! `--overdrive.merkle-stage` the work is done by [`pipeline`], reth's function with overdrive's
//! merkle stage in the pipeline. The launcher runs this command in place of reth's when a
//! component is on.

mod pipeline;

use crate::{
    BlockLog, FactoryOpener, OverdriveArgs, OverdriveEvmConfig, OverdriveNode, ParallelBlocks,
    args::ExecMode,
};
use clap::Parser;
use reth_chainspec::{ChainSpec, ChainSpecProvider};
use reth_cli_commands::{
    common::{AccessRights, Environment, EnvironmentArgs},
    import_core::{ImportConfig, import_blocks_from_file},
};
use reth_cli_runner::CliRunner;
use reth_ethereum_cli::chainspec::EthereumChainSpecParser;
use std::{path::PathBuf, sync::Arc};
use tracing::info;

/// Syncs RLP-encoded blocks from files (reth's `import`, with overdrive's components).
#[derive(Debug, Parser)]
pub struct ImportCommand {
    #[command(flatten)]
    env: EnvironmentArgs<EthereumChainSpecParser>,

    /// Disables stages that require state.
    #[arg(long)]
    no_state: bool,

    /// Chunk byte length to read from file.
    #[arg(long, value_name = "CHUNK_LEN")]
    chunk_len: Option<u64>,

    /// Fail immediately when an invalid block is encountered (by default the import stops at
    /// the last valid block and succeeds).
    #[arg(long)]
    fail_on_invalid_block: bool,

    /// The path(s) to block file(s) for import.
    #[arg(value_name = "IMPORT_PATH", required = true, num_args = 1..)]
    paths: Vec<PathBuf>,

    /// The switches, set by the launcher from the command line's `--overdrive.*` flags.
    #[arg(skip)]
    pub overdrive: OverdriveArgs,
}

impl ImportCommand {
    /// Runs the import on `runner` (reth's CLI runner: the tokio runtime and Ctrl-C handling).
    pub fn run(self, runner: CliRunner) -> eyre::Result<()> {
        let runtime = runner.runtime();
        runner.run_blocking_until_ctrl_c(self.execute(runtime))
    }

    async fn execute(self, runtime: reth_tasks::Runtime) -> eyre::Result<()> {
        info!(target: "reth::cli", "overdrive-reth import: {}", self.overdrive.summary());
        let Environment {
            provider_factory,
            config,
            ..
        } = self
            .env
            .init::<OverdriveNode>(AccessRights::RW, runtime.clone())?;
        let spec: Arc<ChainSpec> = provider_factory.chain_spec();
        let (stock, consensus) = OverdriveNode::cli_components(spec.clone());
        let log = Arc::new(BlockLog::default());
        let parallel = (self.overdrive.exec == ExecMode::Parallel).then(|| {
            Arc::new(ParallelBlocks::new(
                &spec,
                self.overdrive.exec_threads(),
                Arc::new(FactoryOpener(provider_factory.clone())),
                log.clone(),
            ))
        });
        let evm_config = OverdriveEvmConfig::new(stock.inner().clone(), parallel);
        let import = ImportConfig {
            no_state: self.no_state,
            chunk_len: self.chunk_len,
            fail_on_invalid_block: self.fail_on_invalid_block,
        };
        info!(target: "reth::cli", "Starting import of {} file(s)", self.paths.len());
        for (index, path) in self.paths.iter().enumerate() {
            info!(target: "reth::cli", "Importing file {} of {}: {}", index + 1, self.paths.len(), path.display());
            let result = if self.overdrive.merkle_stage {
                pipeline::import_blocks_from_file(
                    path,
                    import.clone(),
                    provider_factory.clone(),
                    &config,
                    evm_config.clone(),
                    consensus.clone(),
                    runtime.clone(),
                    self.overdrive.merkle_config(),
                )
                .await?
            } else {
                import_blocks_from_file(
                    path,
                    import.clone(),
                    provider_factory.clone(),
                    &config,
                    evm_config.clone(),
                    consensus.clone(),
                    runtime.clone(),
                )
                .await?
            };
            if result.stopped_on_invalid_block {
                info!(target: "reth::cli",
                    "Stopped at last valid block {} due to invalid block {} in file: {}. Imported {} blocks, {} transactions",
                    result.last_valid_block.unwrap_or(0), result.bad_block.unwrap_or(0),
                    path.display(), result.total_imported_blocks, result.total_imported_txns);
                break;
            }
            if !result.is_successful() {
                eyre::bail!(
                    "Chain was partially imported from file: {}. Imported {}/{} blocks, {}/{} transactions",
                    path.display(),
                    result.total_imported_blocks,
                    result.total_decoded_blocks,
                    result.total_imported_txns,
                    result.total_decoded_txns
                );
            }
            info!(target: "reth::cli", "Successfully imported file {}: {} blocks, {} transactions",
                path.display(), result.total_imported_blocks, result.total_imported_txns);
        }
        info!(target: "overdrive", "Executed {}", log.summary());
        Ok(())
    }
}
