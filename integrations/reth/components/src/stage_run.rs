//! `overdrive-reth stage run merkle --overdrive.merkle-stage`: reth's `stage run` of the merkle
//! stage with overdrive's [`ParallelMerkleStage`] executing the range.
//!
//! reth's command builds its stages inside itself, so this is its merkle path (same flags, same
//! unwind-then-execute loop, reth's `MerkleStage::Unwind` for the unwind) with the execute
//! stage swapped. (reth's loop also awaits `execute_ready`, which neither merkle stage
//! implements: it is always ready.) The launcher runs it in place of reth's when the flag is on. Two flags of
//! reth's command are not taken: `--metrics` and the network flags (the merkle stage uses
//! neither), and `--batch-size`, which reth's merkle stage ignores too.

use crate::{
    OverdriveArgs, OverdriveNode,
    merkle::{MerkleStageConfig, ParallelMerkleStage},
};
use clap::Parser;
use reth_cli_commands::common::{AccessRights, Environment, EnvironmentArgs};
use reth_cli_runner::CliRunner;
use reth_ethereum_cli::chainspec::EthereumChainSpecParser;
use reth_node_core::args::StageEnum;
use reth_provider::{
    DBProvider, DatabaseProviderFactory, StageCheckpointReader, StageCheckpointWriter,
};
use reth_stages::stages::MerkleStage;
use reth_stages_api::{ExecInput, ExecOutput, Stage, StageId, UnwindInput, UnwindOutput};
use std::time::Instant;
use tracing::info;

/// Runs the merkle stage over a range (reth's `stage run merkle`, with overdrive's stage).
#[derive(Debug, Parser)]
pub struct MerkleRunCommand {
    #[command(flatten)]
    env: EnvironmentArgs<EthereumChainSpecParser>,

    /// The name of the stage to run (only `merkle` with `--overdrive.merkle-stage`).
    #[arg(value_enum)]
    stage: StageEnum,

    /// The height to start at.
    #[arg(long)]
    from: u64,

    /// The end of the stage.
    #[arg(long, short)]
    to: u64,

    /// Skip the unwinding phase (for a range the stage has not run over before).
    #[arg(long, short)]
    skip_unwind: bool,

    /// Commits the changes in the database. WARNING: potentially destructive. Required with
    /// more than one thread: the stage's workers read the tables through transactions of their
    /// own, which see only what is committed.
    #[arg(long, short)]
    commit: bool,

    /// Save stage checkpoints.
    #[arg(long)]
    checkpoints: bool,

    /// The switches, set by the launcher from the command line's `--overdrive.*` flags.
    #[arg(skip)]
    pub overdrive: OverdriveArgs,
}

impl MerkleRunCommand {
    /// Runs the stage on `runner` (reth's CLI runner: the tokio runtime and Ctrl-C handling).
    pub fn run(self, runner: CliRunner) -> eyre::Result<()> {
        let runtime = runner.runtime();
        runner.run_blocking_until_ctrl_c(self.execute(runtime))
    }

    async fn execute(self, runtime: reth_tasks::Runtime) -> eyre::Result<()> {
        if self.stage != StageEnum::Merkle {
            eyre::bail!(
                "--overdrive.merkle-stage applies to `stage run merkle`, not `stage run {}`",
                self.stage
            );
        }
        let stage_config = self.overdrive.merkle_config();
        check_commit(&stage_config, self.commit)?;
        let Environment {
            provider_factory,
            config,
            ..
        } = self.env.init::<OverdriveNode>(AccessRights::RW, runtime)?;
        let stage_config = stage_config.with_reth_thresholds(&config.stages.merkle);
        info!(target: "reth::cli", "overdrive-reth stage run: {}", self.overdrive.summary());

        let mut provider_rw = provider_factory.database_provider_rw()?;
        let mut exec_stage = ParallelMerkleStage::new(provider_factory.clone(), stage_config);
        let mut unwind_stage = MerkleStage::default_unwind();
        let checkpoint = provider_rw
            .get_stage_checkpoint(StageId::MerkleExecute)?
            .unwrap_or_default();

        let mut unwind = UnwindInput {
            checkpoint: checkpoint.with_block_number(self.to),
            unwind_to: self.from,
            bad_block: None,
        };
        if !self.skip_unwind {
            while unwind.checkpoint.block_number > self.from {
                let UnwindOutput { checkpoint } = unwind_stage.unwind(&provider_rw, unwind)?;
                unwind.checkpoint = checkpoint;
                if self.checkpoints {
                    provider_rw.save_stage_checkpoint(StageId::MerkleUnwind, checkpoint)?;
                }
                if self.commit {
                    provider_rw.commit()?;
                    provider_rw = provider_factory.database_provider_rw()?;
                }
            }
        }

        let mut input = ExecInput {
            target: Some(self.to),
            checkpoint: Some(checkpoint.with_block_number(self.from)),
        };
        let start = Instant::now();
        info!(target: "reth::cli", stage = %self.stage, "Executing stage");
        loop {
            let ExecOutput { checkpoint, done } = exec_stage.execute(&provider_rw, input)?;
            input.checkpoint = Some(checkpoint);
            if self.checkpoints {
                provider_rw.save_stage_checkpoint(StageId::MerkleExecute, checkpoint)?;
            }
            if self.commit {
                provider_rw.commit()?;
                provider_rw = provider_factory.database_provider_rw()?;
            }
            if done {
                break;
            }
        }
        info!(target: "reth::cli", stage = %self.stage, time = ?start.elapsed(), "Finished stage");
        Ok(())
    }
}

/// Without `--commit` every call of the stage runs in one uncommitted transaction, which the
/// workers' own transactions do not see: only a one-thread stage can run that way.
fn check_commit(config: &MerkleStageConfig, commit: bool) -> eyre::Result<()> {
    if config.threads > 1 && !commit {
        eyre::bail!(
            "`stage run merkle --overdrive.merkle-stage` on {} threads needs --commit: the stage's workers read the tables through transactions of their own, which see only committed writes (or pass --overdrive.merkle-stage.threads 1)",
            config.threads
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn more_than_one_thread_needs_commit() {
        let config = |threads| MerkleStageConfig {
            threads,
            ..MerkleStageConfig::default()
        };
        assert!(check_commit(&config(2), false).is_err());
        assert!(check_commit(&config(2), true).is_ok());
        assert!(check_commit(&config(1), false).is_ok());
    }
}
