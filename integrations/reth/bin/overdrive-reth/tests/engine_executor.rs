//! overdrive's block executor inside reth against reth's own, on a reth database.
//!
//! Each block runs twice on the same database: through reth's `EthEvmConfig` and through
//! `OverdriveEvmConfig`, the way reth drives them. The engine creates an executor per payload,
//! feeds it one transaction at a time and merges the state itself; the pipeline and the
//! backfill run batches of blocks on one state (`batch_executor`). Receipts, gas, requests,
//! the bundle reth persists and what the state-root hook hears must all be equal, errors
//! included.

mod support;

#[path = "../../../../../crates/executor/tests/common/mod.rs"]
#[allow(unused_imports)]
mod common;

use alloy_consensus::BlockHeader;
use alloy_primitives::B256;
use overdrive_executor::{ParallelConfig, Scheduling};
use overdrive_reth_components::{
    BlockLog, ExecutedBy, FactoryOpener, OverdriveEvmConfig, ParallelBlocks,
};
use reth_chainspec::ChainSpec;
use reth_ethereum_primitives::{Block, EthPrimitives, Receipt};
use reth_evm::{ConfigureEvm, execute::Executor};
use reth_evm_ethereum::{EthEvmConfig, factory::RethEvmFactory};
use reth_primitives_traits::RecoveredBlock;
use reth_provider::StateRootProvider;
use reth_revm::database::StateProviderDatabase;
use reth_trie::HashedPostState;
use revm::database::{
    BundleState, OriginalValuesKnown, State, states::bundle_state::BundleRetention,
};
use revm::state::EvmState;
use std::sync::{Arc, Mutex};
use support::Factory;

/// reth's configuration and overdrive's over it, the parallel executor on `threads` threads
/// with every block on its parallel path, reth's state hook hearing each commit (`stream`) or
/// the block folded at its end.
fn configs(
    spec: &Arc<ChainSpec>,
    factory: &Factory,
    threads: usize,
    stream: bool,
) -> (
    EthEvmConfig<ChainSpec, RethEvmFactory>,
    OverdriveEvmConfig,
    Arc<BlockLog>,
) {
    let reth = EthEvmConfig::new_with_evm_factory(spec.clone(), RethEvmFactory::default());
    let log = Arc::new(BlockLog::default());
    let config = ParallelConfig {
        threads,
        min_txs_for_parallel: 1,
        min_gas_for_parallel: 0,
        scheduling: Scheduling {
            speculate_all: true,
            ..Scheduling::default()
        },
    };
    let parallel = ParallelBlocks::with_config(
        spec,
        config,
        Arc::new(FactoryOpener(factory.clone())),
        log.clone(),
    )
    .stream_state_hook(stream);
    let ours = OverdriveEvmConfig::new(reth.clone(), Some(Arc::new(parallel)));
    (reth, ours, log)
}

/// What one engine-style execution left behind.
#[derive(Debug)]
struct EngineRun {
    result: Result<(Vec<Receipt>, u64, u64, alloy_eips::eip7685::Requests), String>,
    bundle: BundleState,
    hook: Vec<EvmState>,
}

/// Executes `block` as reth's engine does (`payload_validator.rs`, `execute_block`): a fresh
/// `State` over the parent's provider with a state hook, one transaction at a time, `finish`,
/// then `merge_transitions` and `take_bundle`.
fn engine_run<C: ConfigureEvm<Primitives = EthPrimitives>>(
    config: &C,
    factory: &Factory,
    block: &RecoveredBlock<Block>,
) -> EngineRun {
    engine_run_at(config, factory, block, block.parent_hash())
}

/// [`engine_run`] on the state after `parent`, whatever the block names as its parent.
fn engine_run_at<C: ConfigureEvm<Primitives = EthPrimitives>>(
    config: &C,
    factory: &Factory,
    block: &RecoveredBlock<Block>,
    parent: B256,
) -> EngineRun {
    let provider = factory.history_by_block_hash(parent).unwrap();
    let mut db = State::builder()
        .with_database(StateProviderDatabase::new(provider))
        .with_bundle_update()
        .build();
    let heard = Arc::new(Mutex::new(Vec::new()));
    let sink = heard.clone();
    db.set_state_hook(Some(Box::new(move |state: EvmState| {
        sink.lock().unwrap().push(state)
    })));
    let result = {
        let evm = config.evm_with_env(&mut db, config.evm_env(block.header()).unwrap());
        let ctx = config.context_for_block(block.sealed_block()).unwrap();
        let mut executor = config.create_executor(evm, ctx);
        (|| {
            use alloy_evm::block::BlockExecutor;
            executor.apply_pre_execution_changes()?;
            for tx in block.transactions_recovered() {
                executor.execute_transaction(tx)?;
            }
            executor.finish()
        })()
        .map(|(_, r)| (r.receipts, r.gas_used, r.blob_gas_used, r.requests))
        .map_err(|e| e.to_string())
    };
    // Whichever executor ran the block, reth's hook is back on reth's state.
    assert!(db.state_hook.is_some(), "the state hook was not put back");
    db.merge_transitions(BundleRetention::Reverts);
    let bundle = db.take_bundle();
    let hook = std::mem::take(&mut *heard.lock().unwrap());
    EngineRun {
        result,
        bundle,
        hook,
    }
}

/// What reth writes for a bundle, one line a row: plain accounts (nonce, balance, code hash:
/// reth stores no more), storage, contracts and each block's reverts, sorted.
fn written(bundle: &BundleState) -> Vec<String> {
    let account = |info: &Option<revm::state::AccountInfo>| {
        info.as_ref().map(|i| (i.nonce, i.balance, i.code_hash))
    };
    let (changes, reverts) = bundle
        .clone()
        .to_plain_state_and_reverts(OriginalValuesKnown::Yes);
    let mut rows = Vec::new();
    for (address, info) in &changes.accounts {
        rows.push(format!("account {address} {:?}", account(info)));
    }
    for storage in &changes.storage {
        rows.push(format!("wipe {} {}", storage.address, storage.wipe_storage));
        for (slot, value) in &storage.storage {
            rows.push(format!("slot {} {slot} {value}", storage.address));
        }
    }
    for (hash, code) in &changes.contracts {
        rows.push(format!("code {hash} {}", code.original_bytes()));
    }
    for (block, accounts) in reverts.accounts.iter().enumerate() {
        for (address, info) in accounts {
            rows.push(format!(
                "revert {block} account {address} {:?}",
                account(info)
            ));
        }
    }
    for (block, storages) in reverts.storage.iter().enumerate() {
        for storage in storages {
            rows.push(format!(
                "revert {block} wipe {} {}",
                storage.address, storage.wiped
            ));
            for (slot, value) in &storage.storage_revert {
                rows.push(format!(
                    "revert {block} slot {} {slot} {value:?}",
                    storage.address
                ));
            }
        }
    }
    rows.sort();
    rows
}

/// Fails with the rows only one side has.
fn assert_same_rows(got: Vec<String>, expected: Vec<String>, what: &str) {
    if got != expected {
        let only = |a: &[String], b: &[String]| -> Vec<String> {
            a.iter()
                .filter(|r| !b.contains(r))
                .take(12)
                .cloned()
                .collect()
        };
        panic!(
            "{what}: the bundles differ\nonly overdrive's:\n{}\nonly reth's:\n{}",
            only(&got, &expected).join("\n"),
            only(&expected, &got).join("\n")
        );
    }
}

/// The state root the hook's updates give on top of the parent, as reth's state-root task
/// would compute it from them.
fn hook_root(factory: &Factory, parent: B256, hook: &[EvmState]) -> B256 {
    let mut folded = HashedPostState::default();
    for update in hook {
        folded.extend(
            reth_trie_parallel::state_root_task::evm_state_to_hashed_post_state(update.clone()),
        );
    }
    factory
        .history_by_block_hash(parent)
        .unwrap()
        .state_root(folded)
        .unwrap()
}

/// Engine-style and batch runs of `blocks` (block 1 on, at the database's genesis) agree
/// between reth's executor and overdrive's; returns how many blocks took the parallel path.
fn assert_agree(
    spec: &Arc<ChainSpec>,
    factory: &Factory,
    blocks: &[RecoveredBlock<Block>],
    what: &str,
) -> usize {
    let (reth, ours, log) = configs(spec, factory, 2, true);

    // The engine: block 1 on its parent.
    let first = &blocks[0];
    let expected = engine_run(&reth, factory, first);
    let (_, folded, folded_log) = configs(spec, factory, 2, false);
    for stream in [true, false] {
        let (ours, runs) = if stream {
            (&ours, &log)
        } else {
            (&folded, &folded_log)
        };
        let what = &format!("{what} (hook streamed: {stream})");
        let got = engine_run(ours, factory, first);
        assert_eq!(
            got.result, expected.result,
            "{what}: engine result of block 1"
        );
        assert_same_rows(
            written(&got.bundle),
            written(&expected.bundle),
            &format!("{what}: engine, block 1"),
        );
        if expected.result.is_ok() {
            let root = factory
                .history_by_block_hash(first.parent_hash())
                .unwrap()
                .state_root(HashedPostState::from_bundle_state::<
                    reth_trie::KeccakKeyHasher,
                >(&expected.bundle.state))
                .unwrap();
            assert_eq!(
                hook_root(factory, first.parent_hash(), &expected.hook),
                root,
                "{what}: reth's hook root"
            );
            assert_eq!(
                hook_root(factory, first.parent_hash(), &got.hook),
                root,
                "{what}: overdrive's hook root"
            );
            let txs = first.body().transactions.len();
            if stream {
                // The hook heard the block as it was committed (one update a transaction at
                // least), not folded at its end.
                assert!(
                    got.hook.len() >= txs,
                    "{what}: {} updates for {txs} transactions",
                    got.hook.len()
                );
            } else if got.hook.len() > 2 {
                // Folded: the block's destructions, then its changes (reth's executor hears each
                // commit where overdrive's left the block to it).
                assert!(
                    runs.records()
                        .iter()
                        .all(|r| r.executed_by == ExecutedBy::Reth),
                    "{what}: {} updates, folded",
                    got.hook.len()
                );
            }
        }
    }

    // The pipeline: all blocks on one state.
    let base =
        || StateProviderDatabase::new(factory.history_by_block_number(first.number() - 1).unwrap());
    let expected = reth.run(base(), blocks);
    let got = ours.run(base(), blocks);
    assert_eq!(got.0, expected.0, "{what}: batch results");
    assert_same_rows(
        written(&got.1),
        written(&expected.1),
        &format!("{what}: batch"),
    );

    log.records()
        .iter()
        .filter(|r| r.executed_by == ExecutedBy::Parallel)
        .count()
}

/// Runs a batch of blocks on one executor, stopping at the first error.
trait BatchRunner {
    fn run(
        &self,
        db: StateProviderDatabase<reth_provider::StateProviderBox>,
        blocks: &[RecoveredBlock<Block>],
    ) -> (Vec<Result<String, String>>, BundleState);
}

impl<C: ConfigureEvm<Primitives = EthPrimitives>> BatchRunner for C {
    fn run(
        &self,
        db: StateProviderDatabase<reth_provider::StateProviderBox>,
        blocks: &[RecoveredBlock<Block>],
    ) -> (Vec<Result<String, String>>, BundleState) {
        let mut executor = self.batch_executor(db);
        let mut results = Vec::new();
        for block in blocks {
            let result = executor.execute_one(block);
            let failed = result.is_err();
            results.push(
                result
                    .map(|r| {
                        format!(
                            "{:?} {} {} {:?}",
                            r.receipts, r.gas_used, r.blob_gas_used, r.requests
                        )
                    })
                    .map_err(|e| e.to_string()),
            );
            if failed {
                break;
            }
        }
        (results, executor.into_state().take_bundle())
    }
}

/// A datadir initialized with `genesis`, its chain spec, and a read-only view of it.
fn database(
    genesis: &alloy_genesis::Genesis,
    label: &str,
) -> (tempfile::TempDir, Arc<ChainSpec>, Factory) {
    let dir = support::temp_dir(label);
    let genesis_path = support::write_genesis(dir.path(), genesis);
    let datadir = dir.path().join("data");
    support::init_datadir(&genesis_path, &datadir);
    let spec = support::reth_spec(&genesis_path);
    let factory = support::open(spec.clone(), &datadir);
    (dir, spec, factory)
}

/// A random-block generator of the executor's differential tests and a database holding its
/// genesis; its blocks start at 1, on the database's genesis.
fn generator(
    fork: common::Fork,
    seed: u64,
    label: &str,
) -> (
    common::Gen,
    overdrive_primitives::MemState,
    tempfile::TempDir,
    Arc<ChainSpec>,
    Factory,
) {
    let (mut generator, state) = common::Gen::new(fork, seed);
    generator.number = 0;
    let mut genesis = generator.spec.genesis.clone();
    genesis.alloc = support::alloc(&state);
    let (dir, spec, factory) = database(&genesis, label);
    (generator, state, dir, spec, factory)
}

/// Every generated workload, sealed by `overdrive chain export`'s builder.
#[test]
fn workload_blocks_match_reth() {
    use overdrive_workload::{WorkloadConfig, WorkloadKind};
    for kind in [
        WorkloadKind::Transfer,
        WorkloadKind::Erc20,
        WorkloadKind::Uniswap,
        WorkloadKind::Hybrid,
        WorkloadKind::Chained,
    ] {
        let workload = overdrive_workload::generate(&WorkloadConfig {
            accounts: 300,
            txs_per_block: 120,
            blocks: 3,
            pairs: 8,
            ..WorkloadConfig::new(kind)
        })
        .unwrap();
        let chain = overdrive_chain::build(workload, overdrive_chain::Fork::Prague).unwrap();
        let (_dir, spec, factory) = database(&chain.genesis, "workload");
        assert_eq!(
            spec.genesis_hash(),
            chain.genesis_header.hash_slow(),
            "{kind}: reth's genesis hash"
        );
        let blocks: Vec<_> = chain
            .blocks
            .iter()
            .map(|b| {
                let senders = b
                    .body
                    .transactions
                    .iter()
                    .map(|tx| {
                        alloy_consensus::transaction::SignerRecoverable::recover_signer(tx).unwrap()
                    })
                    .collect();
                support::reth_block(b, senders)
            })
            .collect();
        let parallel = assert_agree(&spec, &factory, &blocks, &kind.to_string());
        assert_eq!(
            parallel,
            1 + blocks.len(),
            "{kind}: blocks on the parallel path"
        );
    }
}

/// Random blocks of the executor's differential tests (every transaction type, contracts that
/// create, destroy, call precompiles, read system-call writes...), at Cancun and Prague.
#[test]
fn random_blocks_match_reth() {
    use common::Fork;
    use overdrive_executor::{ExecuteBlock, SequentialExecutor};
    for fork in [Fork::Cancun, Fork::Prague] {
        for seed in 0..3 {
            let seed = common::seed_base() + seed;
            let (mut generator, mut state, _dir, spec, factory) = generator(fork, seed, "random");
            let mut blocks = Vec::new();
            for _ in 0..3 {
                let mut block = generator.block(&state, 40);
                if blocks.is_empty() {
                    block.header.parent_hash = spec.genesis_hash();
                }
                let output = SequentialExecutor
                    .execute(&generator.spec, &block, &state)
                    .unwrap();
                state.apply_bundle(&output.bundle);
                blocks.push(support::reth_recovered(&block));
            }
            let what = format!("{fork:?} seed {seed}");
            let parallel = assert_agree(&spec, &factory, &blocks, &what);
            assert_eq!(
                parallel,
                1 + blocks.len(),
                "{what}: blocks on the parallel path"
            );
        }
    }
}

/// A block with a transaction that is invalid where it stands (its nonce is ahead) is
/// rejected with reth's error, and leaves nothing behind.
#[test]
fn invalid_transactions_get_reths_error() {
    let (mut generator, state, _dir, spec, factory) = generator(common::Fork::Prague, 7, "invalid");
    let mut block = generator.block(&state, 20);
    block.header.parent_hash = spec.genesis_hash();
    let key = generator.senders[5].clone();
    let nonce = state.accounts[&key.address].info.nonce + 1_000;
    let tx = key.sign(alloy_consensus::TxLegacy {
        chain_id: Some(common::CHAIN_ID),
        nonce,
        gas_price: 1_000_000_000_000,
        gas_limit: 21_000,
        to: alloy_primitives::TxKind::Call(generator.hot),
        value: alloy_primitives::U256::from(1),
        input: Default::default(),
    });
    block.transactions.insert(10, tx);
    let block = support::reth_recovered(&block);
    assert_agree(&spec, &factory, std::slice::from_ref(&block), "nonce ahead");
    let (reth, _, _) = configs(&spec, &factory, 2, true);
    assert!(
        engine_run(&reth, &factory, &block).result.is_err(),
        "the block must be invalid"
    );
}

/// A payload whose parent the node's provider does not know (a side chain reth executes on a
/// state of its own) runs on reth's executor, with reth's result.
#[test]
fn unknown_parents_run_on_reths_executor() {
    let (mut generator, state, _dir, spec, factory) = generator(common::Fork::Prague, 11, "side");
    let mut block = generator.block(&state, 20);
    block.header.parent_hash = B256::repeat_byte(0x5e);
    let block = support::reth_recovered(&block);
    let (reth, ours, log) = configs(&spec, &factory, 2, true);
    let expected = engine_run_at(&reth, &factory, &block, spec.genesis_hash());
    let got = engine_run_at(&ours, &factory, &block, spec.genesis_hash());
    assert!(expected.result.is_ok());
    assert_eq!(got.result, expected.result);
    assert_same_rows(
        written(&got.bundle),
        written(&expected.bundle),
        "side chain",
    );
    let by: Vec<_> = log.records().iter().map(|r| r.executed_by).collect();
    assert_eq!(by, [ExecutedBy::Reth]);
}
