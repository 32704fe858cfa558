//! The stage: changed storage tries on a worker pool in committed chunks, then the account
//! trie, with reth's trie code doing every hash.

use super::{Progress, Side, Subtree};
use alloy_consensus::BlockHeader;
use alloy_primitives::{
    Address, B256, BlockNumber, Sealable,
    map::{B256Map, HashMap, HashSet},
};
use overdrive_tasks::largest_first;
use reth_consensus::ConsensusError;
use reth_db_api::{tables, transaction::DbTxMut};
use reth_primitives_traits::{GotExpected, SealedHeader};
use reth_provider::{
    ChangeSetReader, DBProvider, HeaderProvider, ProviderError, ProviderFactory,
    StageCheckpointReader, StageCheckpointWriter, StatsReader, StorageChangeSetReader,
    StorageSettingsCache, TrieWriter, providers::ProviderNodeTypes,
};
use reth_stages::stages::MerkleStage;
use reth_stages_api::{
    BlockErrorKind, EntitiesCheckpoint, ExecInput, ExecOutput, Stage, StageCheckpoint, StageError,
    StageId, UnwindInput, UnwindOutput,
};
use reth_trie::{
    BranchNodeCompact, Nibbles, StateRoot, StorageRoot, TrieType,
    metrics::TrieRootMetrics,
    prefix_set::{PrefixSet, TriePrefixSets},
    trie_cursor::InMemoryTrieCursorFactory,
    updates::{StorageTrieUpdatesSorted, TrieUpdatesSorted},
};
use reth_trie_db::{
    DatabaseHashedCursorFactory, DatabaseTrieCursorFactory, load_prefix_sets_with_provider,
    with_adapter,
};
use std::{fmt::Debug, ops::RangeInclusive, time::Instant};
use tracing::{debug, error, info};

const TARGET: &str = "sync::stages::merkle::exec";

/// Settings of [`ParallelMerkleStage`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MerkleStageConfig {
    /// Threads hashing storage tries (the stage's own thread included).
    pub threads: usize,
    /// Changed storage slots whose tries are written per committed chunk: a kill loses at most
    /// one chunk, and a chunk's trie updates are what the stage holds in memory.
    pub chunk_slots: u64,
    /// A storage trie with at least this many changed slots is hashed as sixteen subtrees.
    pub split_slots: u64,
    /// Above this many blocks the trie is rebuilt from the hashed state (reth's
    /// `stages.merkle.rebuild_threshold`).
    pub rebuild_threshold: u64,
    /// reth's `stages.merkle.incremental_threshold`, for the runs handed to reth's stage, and
    /// the longest range whose changes are read to decide whether to hand it over.
    pub incremental_threshold: u64,
    /// Hand a run to reth's serial stage where it is the faster one: on one thread, and a
    /// rebuild from genesis over a range in which no storage trie has `split_slots` changed
    /// slots.
    pub fallback: bool,
}

impl MerkleStageConfig {
    /// These settings with reth's thresholds from its `[stages.merkle]` configuration.
    pub const fn with_reth_thresholds(self, reth: &reth_config::config::MerkleConfig) -> Self {
        Self {
            rebuild_threshold: reth.rebuild_threshold,
            incremental_threshold: reth.incremental_threshold,
            ..self
        }
    }
}

impl Default for MerkleStageConfig {
    fn default() -> Self {
        Self {
            threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
            chunk_slots: 1_000_000,
            split_slots: 4_096,
            rebuild_threshold: reth_stages::stages::MERKLE_STAGE_DEFAULT_REBUILD_THRESHOLD,
            incremental_threshold: reth_stages::stages::MERKLE_STAGE_DEFAULT_INCREMENTAL_THRESHOLD,
            fallback: true,
        }
    }
}

/// reth's `MerkleStage::Execution` with the tries hashed in parallel: same id, same input,
/// same tables written, same root checked against the header.
///
/// A run over a block range first writes the storage tries of every account whose storage
/// changed in it, in chunks of about [`MerkleStageConfig::chunk_slots`] changed slots, each
/// committed with a [`Progress`]; inside a chunk the tries are hashed largest first on
/// [`MerkleStageConfig::threads`] threads, each reading through its own transaction, and a
/// large trie is cut into its sixteen subtrees ([`Subtree`]). Then the account trie is hashed
/// as its sixteen subtrees on the same threads, each account's storage root read from its
/// committed trie, and the root over the new top nodes. On one thread both steps run in the
/// stage's own transaction, as reth's stage does. Unwinding is reth's `MerkleStage::Unwind`,
/// which this stage leaves in place.
///
/// With [`MerkleStageConfig::fallback`], a run that starts where splitting cannot pay is handed
/// to reth's `MerkleStage::Execution` whole (see [`ParallelMerkleStage::reths_run`]); a run
/// reth's stage began (its own rebuild progress is saved) is always finished by reth's stage.
#[derive(Debug, Clone)]
pub struct ParallelMerkleStage<N: ProviderNodeTypes> {
    factory: ProviderFactory<N>,
    config: MerkleStageConfig,
    reth: MerkleStage,
    /// The range's prefix sets, kept from the storage phase for the next call of the same run
    /// (the range's changesets do not change in between).
    changes: Option<(RangeInclusive<BlockNumber>, TriePrefixSets)>,
}

impl<N: ProviderNodeTypes> ParallelMerkleStage<N> {
    /// The stage, opening its workers' read transactions on `factory`.
    pub const fn new(factory: ProviderFactory<N>, config: MerkleStageConfig) -> Self {
        let reth =
            MerkleStage::new_execution(config.rebuild_threshold, config.incremental_threshold);
        Self {
            factory,
            config,
            reth,
            changes: None,
        }
    }

    /// Whether a run that has no progress of this stage's own goes to reth's stage, and why.
    ///
    /// Splitting one large trie across the threads is what makes a rebuild faster; a rebuild
    /// from genesis over many small tries costs more here than in reth's stage (it hashes
    /// every storage trie before the account trie, with a commit in between), and on one
    /// thread there is nothing to gain at all. Incremental runs stay here: over small tries
    /// they are as fast or faster. A range longer than `incremental_threshold` is not read to
    /// decide.
    fn reths_run<Provider>(
        &self,
        provider: &Provider,
        range: &RangeInclusive<BlockNumber>,
    ) -> Result<Option<&'static str>, StageError>
    where
        Provider: StageCheckpointReader + StorageChangeSetReader,
    {
        if provider
            .get_stage_checkpoint_progress(StageId::MerkleExecute)?
            .is_some_and(|bytes| !bytes.is_empty())
        {
            return Ok(Some("reth's stage began this run"));
        }
        if !self.config.fallback {
            return Ok(None);
        }
        if self.config.threads == 1 {
            return Ok(Some("one thread"));
        }
        let blocks = range.end() - range.start() + 1;
        if *range.start() != 1
            || blocks > self.config.incremental_threshold
            || has_large_trie(provider, range.clone(), self.config.split_slots)?
        {
            return Ok(None);
        }
        Ok(Some(
            "a rebuild from genesis with no storage trie of split-slots changed slots",
        ))
    }

    /// Hashes the storage tries of `accounts` (each with its changed slots), returns their
    /// updates and how many slots were walked.
    fn storage_tries(
        &self,
        accounts: &[(B256, PrefixSet)],
        rebuild: bool,
    ) -> Result<(TrieUpdatesSorted, u64), StageError> {
        let mut jobs = Vec::new();
        for (index, (_, changed)) in accounts.iter().enumerate() {
            let weight = changed.len() as u64;
            if self.config.threads > 1 && weight >= self.config.split_slots {
                jobs.extend((0..16).map(|nibble| (weight / 16, (index, Some(nibble)))));
            } else {
                jobs.push((weight, (index, None)));
            }
        }
        let parts = largest_first(
            jobs.clone(),
            self.config.threads,
            || Ok::<_, StageError>(self.factory.provider()?),
            |provider, (index, nibble)| {
                let (address, changed) = &accounts[index];
                // A rebuild's tables were cleared: every slot is hashed, as nothing is stored.
                let changed = if rebuild {
                    PrefixSet::default()
                } else {
                    changed.clone()
                };
                let tx = provider.tx_ref();
                let metrics = TrieRootMetrics::new(TrieType::Storage);
                let result = with_adapter!(provider, |A| {
                    let nodes = DatabaseTrieCursorFactory::<_, A>::new(tx);
                    let slots = DatabaseHashedCursorFactory::new(tx);
                    match nibble {
                        None => StorageRoot::new_hashed(nodes, slots, *address, changed, metrics)
                            .root_with_updates(),
                        Some(nibble) => StorageRoot::new_hashed(
                            Subtree::new(nodes, Side::Storage, nibble),
                            Subtree::new(slots, Side::Storage, nibble),
                            *address,
                            changed,
                            metrics,
                        )
                        .root_with_updates(),
                    }
                });
                let (_, walked, updates) = result.map_err(fatal)?;
                // Sorted here, on the worker, rather than all at once before the write.
                Ok((walked as u64, updates.into_sorted()))
            },
        )?;

        let mut merged: Vec<Option<StorageTrieUpdatesSorted>> = vec![None; accounts.len()];
        let mut walked = 0;
        for ((_, (index, _)), (slots, part)) in jobs.into_iter().zip(parts) {
            walked += slots;
            match &mut merged[index] {
                slot @ None => *slot = Some(part),
                Some(whole) => {
                    // Subtrees touch disjoint paths and come in nibble order, so appending
                    // keeps the nodes sorted; a wiped trie (the account's storage is empty,
                    // which every part sees) stays wiped.
                    whole.is_deleted |= part.is_deleted;
                    whole.storage_nodes.extend(part.storage_nodes);
                }
            }
        }
        let mut tries = B256Map::default();
        for ((address, _), part) in accounts.iter().zip(merged) {
            let mut part = part.expect("every account has a part");
            if part.is_deleted {
                part.storage_nodes.clear();
            } else if part.storage_nodes.is_empty() {
                // Nothing to write, as reth's `insert_storage_updates` skips it.
                continue;
            } else {
                sort_if_needed(&mut part.storage_nodes);
            }
            tries.insert(*address, part);
        }
        Ok((TrieUpdatesSorted::new(Vec::new(), tries), walked))
    }

    /// Hashes the account trie as its sixteen subtrees on the workers, each reading the
    /// committed storage tries for its accounts' storage roots, then its root over the stage's
    /// transaction with the new nodes laid on top. Returns the root and the updates to write.
    fn account_trie<Provider>(
        &self,
        provider: &Provider,
        changes: TriePrefixSets,
    ) -> Result<(B256, TrieUpdatesSorted), StageError>
    where
        Provider: DBProvider + StorageSettingsCache,
    {
        let parts = largest_first(
            (0..16u8).map(|nibble| (1, nibble)).collect(),
            self.config.threads,
            || Ok::<_, StageError>(self.factory.provider()?),
            |worker, nibble| {
                let tx = worker.tx_ref();
                with_adapter!(worker, |A| {
                    StateRoot::new(
                        Subtree::new(
                            DatabaseTrieCursorFactory::<_, A>::new(tx),
                            Side::Accounts,
                            nibble,
                        ),
                        Subtree::new(DatabaseHashedCursorFactory::new(tx), Side::Accounts, nibble),
                    )
                    .with_prefix_sets(changes.clone())
                    .root_with_updates()
                })
                .map(|(_, updates)| updates.into_sorted())
                .map_err(fatal)
            },
        )?;
        // The subtrees' account nodes are disjoint and in nibble order; their storage tries
        // are disjoint too but for destroyed accounts, which every part marks wiped.
        let mut account_nodes = Vec::new();
        let mut storage_tries = B256Map::<StorageTrieUpdatesSorted>::default();
        for part in &parts {
            account_nodes.extend(part.account_nodes_ref().iter().cloned());
            for (address, trie) in part.storage_tries_ref() {
                match storage_tries.get_mut(address) {
                    Some(existing) => existing.extend_ref(trie),
                    None => {
                        storage_tries.insert(*address, trie.clone());
                    }
                }
            }
        }
        drop(parts);
        sort_if_needed(&mut account_nodes);
        let updates = TrieUpdatesSorted::new(account_nodes, storage_tries);
        let tx = provider.tx_ref();
        let root = with_adapter!(provider, |A| {
            StateRoot::new(
                InMemoryTrieCursorFactory::new(
                    DatabaseTrieCursorFactory::<_, A>::new(tx),
                    &updates,
                ),
                DatabaseHashedCursorFactory::new(tx),
            )
            .root()
        })
        .map_err(fatal)?;
        Ok((root, updates))
    }
}

/// Whether some account changed at least `split_slots` distinct slots over `range`, read from
/// the storage changesets block by block and stopping at the first such account: far cheaper
/// than reth's prefix sets, which hash every key.
fn has_large_trie<Provider: StorageChangeSetReader>(
    provider: &Provider,
    range: RangeInclusive<BlockNumber>,
    split_slots: u64,
) -> Result<bool, ProviderError> {
    let mut seen = HashSet::<(Address, B256)>::default();
    let mut per_account = HashMap::<Address, u64>::default();
    for block in range {
        for (key, entry) in provider.storage_changeset(block)? {
            if seen.insert((key.address(), entry.key)) {
                let changed = per_account.entry(key.address()).or_default();
                *changed += 1;
                if *changed >= split_slots {
                    return Ok(true);
                }
            }
        }
    }
    Ok(false)
}

/// Sorts trie nodes by path unless they already are (parts appended in nibble order are).
fn sort_if_needed(nodes: &mut [(Nibbles, Option<BranchNodeCompact>)]) {
    if !nodes.is_sorted_by_key(|(path, _)| *path) {
        nodes.sort_unstable_by_key(|(path, _)| *path);
    }
}

/// A trie error as the fatal stage error reth's merkle stage gives it.
fn fatal(error: impl std::error::Error + Send + Sync + 'static) -> StageError {
    error!(target: TARGET, %error, "State root computation failed");
    StageError::Fatal(Box::new(error))
}

impl<N, Provider> Stage<Provider> for ParallelMerkleStage<N>
where
    N: ProviderNodeTypes,
    Provider: DBProvider<Tx: DbTxMut>
        + TrieWriter
        + StatsReader
        + HeaderProvider
        + ChangeSetReader
        + StorageChangeSetReader
        + StorageSettingsCache
        + StageCheckpointReader
        + StageCheckpointWriter,
{
    fn id(&self) -> StageId {
        StageId::MerkleExecute
    }

    fn execute(&mut self, provider: &Provider, input: ExecInput) -> Result<ExecOutput, StageError> {
        let range = input.next_block_range();
        let (from_block, to_block) = range.clone().into_inner();
        let target = provider
            .header_by_number(to_block)?
            .ok_or_else(|| ProviderError::HeaderNotFound(to_block.into()))?;
        let total = || -> Result<u64, StageError> {
            Ok((provider.count_entries::<tables::HashedAccounts>()?
                + provider.count_entries::<tables::HashedStorages>()?) as u64)
        };
        if range.is_empty() {
            let entities = input
                .checkpoint()
                .entities_stage_checkpoint()
                .unwrap_or_default();
            return Ok(ExecOutput::done(
                StageCheckpoint::new(to_block).with_entities_stage_checkpoint(entities),
            ));
        }

        let started = Instant::now();
        let stale = Progress::load(provider)?;
        let saved = stale.filter(|p| p.target == to_block);
        // A rebuild this stage began for another target left cleared tables only it finishes.
        if stale.is_none_or(|p| !p.rebuild)
            && let Some(reason) = self.reths_run(provider, &range)?
        {
            info!(target: TARGET, from_block, to_block, reason, "Running reth's merkle stage");
            Progress::save(provider, None)?;
            return self.reth.execute(provider, input);
        }
        let mut entities = match saved {
            Some(_) => input.checkpoint().entities_stage_checkpoint(),
            None => None,
        }
        .unwrap_or(EntitiesCheckpoint {
            processed: 0,
            total: total()?,
        });
        let rebuild = match saved {
            Some(progress) => progress.rebuild,
            None => {
                let rebuild = stale.is_some_and(|p| p.rebuild)
                    || from_block == 1
                    || to_block - from_block > self.config.rebuild_threshold;
                if rebuild {
                    // Committed before any worker reads (the workers, even the one on this
                    // thread, read through transactions of their own, which would see the old
                    // trie): a rebuild hashes every key, as nothing is stored.
                    provider.tx_ref().clear::<tables::AccountsTrie>()?;
                    provider.tx_ref().clear::<tables::StoragesTrie>()?;
                    let progress = Progress {
                        target: to_block,
                        rebuild,
                        storage_done: false,
                        next_account: B256::ZERO,
                    };
                    Progress::save(provider, Some(progress))?;
                    info!(target: TARGET, from_block, to_block, "Cleared the trie tables to rebuild them");
                    return Ok(ExecOutput {
                        checkpoint: input.checkpoint().with_entities_stage_checkpoint(entities),
                        done: false,
                    });
                }
                rebuild
            }
        };

        let changes = match self.changes.take() {
            Some((loaded, changes)) if loaded == range => changes,
            _ => load_prefix_sets_with_provider(provider, range.clone())?,
        };
        if !saved.is_some_and(|p| p.storage_done) {
            let mut accounts: Vec<(B256, PrefixSet)> = changes
                .storage_prefix_sets
                .iter()
                .filter(|(address, _)| !changes.destroyed_accounts.contains(*address))
                .filter(|(address, _)| saved.is_none_or(|p| **address >= p.next_account))
                .map(|(address, changed)| (*address, changed.clone()))
                .collect();
            accounts.sort_unstable_by_key(|(address, _)| *address);

            // One chunk: accounts in address order up to the chunk's slot budget (at least one).
            let mut budget = 0u64;
            let chunk_len = accounts
                .iter()
                .position(|(_, changed)| {
                    budget += changed.len() as u64;
                    budget > self.config.chunk_slots
                })
                .map_or(accounts.len(), |i| i.max(1));
            let chunk = &accounts[..chunk_len];
            let (updates, walked) = self.storage_tries(chunk, rebuild)?;
            let written = provider.write_trie_updates_sorted(&updates)?;
            entities.processed += walked;
            info!(
                target: TARGET,
                from_block, to_block, rebuild,
                storage_tries = chunk.len(),
                changed_slots = chunk.iter().map(|(_, c)| c.len()).sum::<usize>(),
                remaining_tries = accounts.len() - chunk_len,
                nodes_written = written,
                elapsed = ?started.elapsed(),
                "Hashed storage tries"
            );
            let next = accounts.get(chunk_len).map(|(address, _)| *address);
            // The account trie's workers read through transactions of their own: what this
            // one wrote (and cleared) must be committed first.
            if next.is_some() || self.config.threads > 1 {
                let progress = Progress {
                    target: to_block,
                    rebuild,
                    storage_done: next.is_none(),
                    next_account: next.unwrap_or_default(),
                };
                Progress::save(provider, Some(progress))?;
                self.changes = Some((range, changes));
                return Ok(ExecOutput {
                    checkpoint: input.checkpoint().with_entities_stage_checkpoint(entities),
                    done: false,
                });
            }
        }

        // The account trie, over storage tries that are all current: nothing below an account
        // is marked changed, so each storage root is read from its trie's top nodes.
        let account_changes = if rebuild {
            TriePrefixSets::default()
        } else {
            TriePrefixSets {
                account_prefix_set: changes.account_prefix_set,
                storage_prefix_sets: Default::default(),
                destroyed_accounts: changes.destroyed_accounts,
            }
        };
        let accounts_started = Instant::now();
        let (root, updates) = if self.config.threads > 1 {
            self.account_trie(provider, account_changes)?
        } else {
            let tx = provider.tx_ref();
            with_adapter!(provider, |A| {
                StateRoot::new(
                    DatabaseTrieCursorFactory::<_, A>::new(tx),
                    DatabaseHashedCursorFactory::new(tx),
                )
                .with_prefix_sets(account_changes)
                .root_with_updates()
            })
            .map(|(root, updates)| (root, updates.into_sorted()))
            .map_err(fatal)?
        };
        provider.write_trie_updates_sorted(&updates)?;
        Progress::save(provider, None)?;
        debug!(target: TARGET, elapsed = ?accounts_started.elapsed(), "Hashed the account trie");
        validate_state_root(root, SealedHeader::seal_slow(target), to_block)?;
        info!(target: TARGET, to_block, %root, elapsed = ?started.elapsed(), "State root checked");

        let total = total()?;
        Ok(ExecOutput {
            checkpoint: StageCheckpoint::new(to_block).with_entities_stage_checkpoint(
                EntitiesCheckpoint {
                    processed: total,
                    total,
                },
            ),
            done: true,
        })
    }

    fn unwind(
        &mut self,
        provider: &Provider,
        input: UnwindInput,
    ) -> Result<UnwindOutput, StageError> {
        // As reth's execution variant: the tries are unwound by `MerkleStage::Unwind`, which
        // runs after the hashing stages unwind. A chunked run's progress no longer applies.
        Progress::save(provider, None)?;
        self.changes = None;
        Ok(UnwindOutput {
            checkpoint: StageCheckpoint::new(input.unwind_to),
        })
    }
}

/// reth's check of the computed root against the block's, with reth's error.
fn validate_state_root<H: BlockHeader + Sealable + Debug>(
    got: B256,
    expected: SealedHeader<H>,
    target_block: BlockNumber,
) -> Result<(), StageError> {
    if got == expected.state_root() {
        return Ok(());
    }
    error!(target: "sync::stages::merkle", ?target_block, ?got, ?expected, "Failed to verify block state root");
    Err(StageError::Block {
        error: BlockErrorKind::Validation(ConsensusError::BodyStateRootDiff(
            GotExpected {
                got,
                expected: expected.state_root(),
            }
            .into(),
        )),
        block: Box::new(expected.block_with_parent()),
    })
}
