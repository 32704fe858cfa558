//! Differential tests on the workload generators (ETH transfers, ERC20, Uniswap V2, hybrid,
//! chained) at several seeds, skews and thread counts.

mod common;

use overdrive_executor::{ParallelConfig, ParallelExecutor};
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
                txs_per_block: if soak { 1_000 } else { 250 },
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
            executors.push(ParallelExecutor::new(ParallelConfig {
                lazy_coinbase: false,
                lazy_recipients: false,
                ..common::parallel(2).config().clone()
            }));
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
                    if executor.config().lazy_coinbase {
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
