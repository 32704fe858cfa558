//! Differential tests on the workload generators (ETH transfers, ERC20, Uniswap V2, hybrid,
//! chained, allowances, router, compute) at several seeds, skews and thread counts.

mod common;

use overdrive_executor::{ParallelConfig, ParallelExecutor, Scheduling, TransitionFolding};
use overdrive_workload::{WorkloadConfig, WorkloadKind, generate};

#[test]
fn every_workload_equals_sequential() {
    let soak = common::soak();
    let seeds: &[u64] = if soak {
        &[1, 2, 3, 4, 5, 6, 7, 8]
    } else {
        &[1, 2]
    };
    for kind in WorkloadKind::ALL {
        // Speculative results committed, over the kind's blocks: none would mean the outputs
        // were equal only because everything ran exactly on the committer. (With the coinbase
        // paid eagerly every transaction conflicts on it, so those runs do not count.)
        let mut speculated = 0;
        for seed in seeds.iter().map(|s| s + common::seed_base()) {
            let config = WorkloadConfig {
                kind,
                accounts: 500,
                // A compute call costs as much as a hundred transfers.
                txs_per_block: match (kind, soak) {
                    (WorkloadKind::Compute, true) => 250,
                    (WorkloadKind::Compute, false) => 60,
                    (_, true) => 1_000,
                    (_, false) => 250,
                },
                blocks: 2,
                seed,
                hot_share: 0.3,
                sender_skew: if seed % 2 == 0 { 0.3 } else { 0.0 },
                pairs: 12,
            };
            let workload = match generate(&config) {
                Ok(w) => w,
                Err(e) => panic!("workload {kind} seed {seed}: {e}"),
            };
            // Two, three and four threads, and two threads paying the coinbase and hot
            // recipients eagerly.
            let mut executors: Vec<_> = [2, 3, 4].into_iter().map(common::parallel).collect();
            executors.push(common::parallel_eager(2));
            let names = ["2 threads", "3 threads", "4 threads", "2 threads, eager"];
            let mut state = workload.genesis.clone();
            for block in &workload.blocks {
                let mut reference = None;
                for (executor, name) in executors.iter().zip(names) {
                    let what = format!("{kind} seed {seed} block {} {name}", block.number());
                    reference = Some(common::assert_equal(
                        executor,
                        &workload.chain_spec,
                        block,
                        &state,
                        &what,
                    ));
                    let stats = executor.last_stats().expect("the parallel path ran");
                    // Every transaction is committed once, and committing takes time that is
                    // counted (the benchmark's committer bound is built on it; a chained block
                    // left to the committer alone once counted none).
                    assert_eq!(
                        stats.validated + stats.exact,
                        block.transactions.len(),
                        "{what}: {stats:?}"
                    );
                    assert!(stats.commit_ns + stats.exact_ns > 0, "{what}: {stats:?}");
                    // Nothing sends these blocks to the sequential path, which would hand the
                    // transitions back to `revm::State`.
                    if executor.config().scheduling.transition_folding == TransitionFolding::Pool {
                        assert!(stats.pool_folded, "{what}: {stats:?}");
                    }
                    if executor.config().scheduling.lazy_coinbase {
                        speculated += stats.validated;
                    }
                }
                let output = reference
                    .expect("executors")
                    .expect("workload blocks are valid");
                assert!(
                    output.receipts.iter().all(|r| r.status()),
                    "{kind}: a transaction reverted"
                );
                state.apply_bundle(&output.bundle);
                state.block_hashes.insert(block.number(), block.hash);
            }
        }
        assert!(
            speculated > 0,
            "{kind}: no speculative result was committed"
        );
    }
}

/// A database answers an account without its code, while `revm::State` holds a contract with
/// its code once a call of it was committed. Speculative reads of the contract made before
/// that must still validate: they failed, and every call of a contract after its first
/// committed one ran twice (the shipped workloads hid it, because each call also published
/// the contract's account, so most later calls read that instead of the database's answer).
#[test]
fn calls_of_a_contract_validate_after_one_was_committed() {
    let workload = generate(&WorkloadConfig {
        kind: WorkloadKind::Compute,
        accounts: 100,
        txs_per_block: 24,
        blocks: 1,
        ..WorkloadConfig::new(WorkloadKind::Compute)
    })
    .expect("compute workload");
    // Every transaction goes through speculation and validation: none is executed exactly
    // ahead of it, so an exact run can only come from a failed validation.
    let executor = ParallelExecutor::new(ParallelConfig {
        threads: 2,
        min_txs_for_parallel: 0,
        min_gas_for_parallel: 0,
        scheduling: Scheduling {
            speculate_all: true,
            ..Scheduling::default()
        },
    });
    let block = &workload.blocks[0];
    let state = &workload.genesis;
    assert!(
        state.accounts.values().all(|a| a.info.code.is_none()),
        "the pre-state answers without code, as a node's database does"
    );
    // Whether a read met the database's answer or an earlier call's write depends on timing,
    // so the block runs several times (the bug failed about two runs in three).
    for run in 0..8 {
        common::assert_equal(&executor, &workload.chain_spec, block, state, "compute")
            .expect("valid block");
        let stats = executor.last_stats().expect("the parallel path ran");
        // Each sender calls once and writes a slot of its own: nothing conflicts.
        assert_eq!(stats.exact, 0, "run {run}: {stats:?}");
        assert_eq!(
            stats.validated,
            block.transactions.len(),
            "run {run}: {stats:?}"
        );
    }
}

/// The forced parallel path on one thread (what `bench exec` divides by for its `scaling`):
/// every workload's blocks equal the sequential executor's, run on the parallel path, by the
/// committer alone; speculate-all, which needs a worker, is ignored there rather than waiting
/// forever.
#[test]
fn one_thread_on_the_forced_parallel_path_equals_sequential() {
    for speculate_all in [false, true] {
        let executor = ParallelExecutor::new(ParallelConfig {
            threads: 1,
            scheduling: Scheduling {
                force_parallel_path: true,
                speculate_all,
                ..Scheduling::default()
            },
            ..ParallelConfig::default()
        });
        for kind in WorkloadKind::ALL {
            let workload = generate(&WorkloadConfig {
                accounts: 200,
                txs_per_block: 40,
                blocks: 2,
                ..WorkloadConfig::new(kind)
            })
            .expect("workload");
            let mut state = workload.genesis.clone();
            for block in &workload.blocks {
                let what = format!("{kind} block {} one thread", block.number());
                let out =
                    common::assert_equal(&executor, &workload.chain_spec, block, &state, &what)
                        .expect("valid");
                let stats = executor.last_stats().expect("the parallel path ran");
                assert!(!stats.multi_threaded(), "{what}: {stats:?}");
                assert_eq!(stats.exact, block.transactions.len(), "{what}");
                state.apply_bundle(&out.bundle);
            }
        }
    }
}
