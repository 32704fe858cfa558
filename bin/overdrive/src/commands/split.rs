//! `bench exec --split-reference`: the speedup of an ideal partitioned executor on the
//! benchmark's own blocks, measured beside the parallel executor's.
//!
//! Partitioned executors (Grevm 1.0, several roll-up clients) cut a block into groups of
//! transactions that share no account and run each group sequentially on its own thread. The
//! split reference is that, ideal: the block's transactions are cut into `threads` parts that
//! share no sender and no plain-transfer recipient, and each part is executed by the sequential
//! executor on its own `revm::State`, first one after another on one thread, then all at once on
//! `threads` threads. `serial / concurrent` is what such an executor would gain on this machine
//! at that moment if it paid nothing to find the groups, check them or merge their outputs.
//!
//! It is a yardstick, not a bound. Two threads running the same kind of work slow each other on
//! this VM's shared cores more than a committer and a speculating worker do (BENCHMARKS.md,
//! twenty-fourth round), so the parallel executor can beat it. The parts are not a valid
//! execution of the block either (a contract that two parts call keeps two diverging copies of
//! its storage); their outputs are dropped unchecked, and only their cost counts.

use alloy_consensus::Transaction as _;
use alloy_primitives::{Address, KECCAK256_EMPTY, map::HashMap};
use eyre::WrapErr;
use overdrive_executor::{ExecuteBlock, SequentialExecutor};
use overdrive_primitives::{BlockWithSenders, ChainParams, MemState};
use std::time::{Duration, Instant};

/// A block cut into independent parts, and the threads that run them at once (started once
/// per benchmark, so that every block's parts run on warm threads).
pub(super) struct SplitReference {
    parts: Vec<BlockWithSenders>,
    pool: overdrive_tasks::WorkerPool,
}

/// The serial and the concurrent time of one measurement.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct SplitTiming {
    /// The parts one after another on the calling thread (the sum of their walls).
    pub serial: Duration,
    /// The parts at once, one per thread (the wall until the last finished).
    pub concurrent: Duration,
}

impl SplitReference {
    /// A pool of `threads - 1` threads beside the calling one, and no block yet. `None` on
    /// one thread: there is nothing to split.
    pub fn new(threads: usize) -> eyre::Result<Option<Self>> {
        if threads < 2 {
            return Ok(None);
        }
        let pool = overdrive_tasks::worker_pool(
            "overdrive-split",
            threads - 1,
            overdrive_tasks::Pinning::Off,
        )
        .wrap_err("starting the split reference's threads")?;
        Ok(Some(Self {
            parts: Vec::new(),
            pool,
        }))
    }

    /// Measures `block` from now on, cut into as many parts as there are threads (see
    /// [`independent_parts`]) on `state`, its pre-state.
    pub fn cut(&mut self, block: &BlockWithSenders, state: &MemState) {
        self.parts = independent_parts(block, state, self.pool.current_num_threads() + 1);
    }

    /// One measurement: the parts one after another, then at once. Their outputs are
    /// dropped outside the timed spans.
    pub fn measure(&self, spec: &ChainParams, state: &MemState) -> eyre::Result<SplitTiming> {
        let run = |part: &BlockWithSenders| {
            SequentialExecutor
                .execute(spec, part, state)
                .wrap_err("a split-reference part failed (its senders depend on another part)")
        };
        let mut serial = Duration::ZERO;
        for part in &self.parts {
            let started = Instant::now();
            let out = run(part)?;
            serial += started.elapsed();
            drop(out);
        }
        let (first, rest) = self
            .parts
            .split_first()
            .ok_or_else(|| eyre::eyre!("no parts"))?;
        let mut outputs: Vec<Option<eyre::Result<_>>> = rest.iter().map(|_| None).collect();
        let started = Instant::now();
        let own = self.pool.in_place_scope(|scope| {
            for (part, slot) in rest.iter().zip(outputs.iter_mut()) {
                scope.spawn(move |_| *slot = Some(run(part)));
            }
            run(first)
        });
        let concurrent = started.elapsed();
        own?;
        for out in outputs {
            out.ok_or_else(|| eyre::eyre!("a split-reference part did not run"))??;
        }
        Ok(SplitTiming { serial, concurrent })
    }
}

/// Whether `address` has no code in `state` (an account that does not exist has none): a
/// transaction to it is a plain transfer, which ties its recipient to its sender.
fn code_less(state: &MemState, address: &Address) -> bool {
    state
        .accounts
        .get(address)
        .is_none_or(|a| a.info.code_hash == KECCAK256_EMPTY)
}

/// `block`'s transactions in `n` parts of about equal gas (gas limits), each in block order,
/// such that every sender, and every code-less recipient of a transaction, belongs to one part
/// only: each part executes on its own state with the nonces and balances it would have had in
/// the block. Contracts are not followed (two parts may call one token).
pub(super) fn independent_parts(
    block: &BlockWithSenders,
    state: &MemState,
    n: usize,
) -> Vec<BlockWithSenders> {
    let txs = &block.transactions;
    // Union-find over the addresses that tie transactions together.
    let mut ids: HashMap<Address, usize> = HashMap::default();
    let mut parent: Vec<usize> = Vec::new();
    let mut id = |address: Address, parent: &mut Vec<usize>| {
        *ids.entry(address).or_insert_with(|| {
            parent.push(parent.len());
            parent.len() - 1
        })
    };
    fn root(parent: &mut [usize], mut x: usize) -> usize {
        while parent[x] != x {
            parent[x] = parent[parent[x]];
            x = parent[x];
        }
        x
    }
    let mut sender_node = Vec::with_capacity(txs.len());
    for tx in txs {
        let sender = id(tx.signer(), &mut parent);
        if let Some(to) = tx.to().filter(|to| code_less(state, to)) {
            let to = id(to, &mut parent);
            let (a, b) = (root(&mut parent, sender), root(&mut parent, to));
            parent[a] = b;
        }
        sender_node.push(sender);
    }
    // Each group's gas, then the groups, heaviest first, each to the lightest part so far.
    let groups: Vec<usize> = sender_node.iter().map(|&s| root(&mut parent, s)).collect();
    let mut gas: HashMap<usize, u64> = HashMap::default();
    for (tx, group) in txs.iter().zip(&groups) {
        *gas.entry(*group).or_default() += tx.gas_limit();
    }
    let mut by_gas: Vec<(usize, u64)> = gas.into_iter().collect();
    by_gas.sort_unstable_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    let mut load = vec![0u64; n.max(1)];
    let mut part_of: HashMap<usize, usize> = HashMap::default();
    for (group, g) in by_gas {
        let lightest = (0..load.len()).min_by_key(|&p| load[p]).unwrap_or(0);
        load[lightest] += g;
        part_of.insert(group, lightest);
    }
    let mut parts: Vec<BlockWithSenders> = (0..load.len())
        .map(|_| BlockWithSenders {
            header: block.header.clone(),
            transactions: Vec::new(),
            ommers: block.ommers.clone(),
            withdrawals: block.withdrawals.clone(),
            hash: block.hash,
        })
        .collect();
    for (tx, group) in txs.iter().zip(&groups) {
        parts[part_of[group]].transactions.push(tx.clone());
    }
    parts.retain(|p| !p.transactions.is_empty());
    parts
}

#[cfg(test)]
mod tests {
    use super::*;
    use overdrive_workload::{WorkloadConfig, WorkloadKind, generate};

    fn workload(kind: WorkloadKind) -> overdrive_workload::Workload {
        generate(&WorkloadConfig {
            kind,
            accounts: 2_000,
            txs_per_block: 400,
            blocks: 1,
            seed: 7,
            hot_share: 0.3,
            sender_skew: 0.0,
            pairs: 20,
        })
        .expect("workload")
    }

    #[test]
    fn parts_cover_the_block_in_order_and_share_no_sender_or_plain_recipient() {
        for kind in [
            WorkloadKind::Transfer,
            WorkloadKind::Erc20,
            WorkloadKind::Hybrid,
        ] {
            let w = workload(kind);
            let block = &w.blocks[0];
            let parts = independent_parts(block, &w.genesis, 2);
            let total: usize = parts.iter().map(|p| p.transactions.len()).sum();
            assert_eq!(total, block.transactions.len(), "{kind}");
            let mut owner: HashMap<Address, usize> = HashMap::default();
            for (i, part) in parts.iter().enumerate() {
                // Block order inside a part: positions in the block increase.
                let positions: Vec<usize> = part
                    .transactions
                    .iter()
                    .map(|tx| {
                        block
                            .transactions
                            .iter()
                            .position(|b| b.tx_hash() == tx.tx_hash())
                            .expect("from the block")
                    })
                    .collect();
                assert!(positions.windows(2).all(|w| w[0] < w[1]), "{kind}");
                // Every sender and code-less recipient belongs to this part only.
                for tx in &part.transactions {
                    let plain_to = tx.to().filter(|to| code_less(&w.genesis, to));
                    for address in std::iter::once(tx.signer()).chain(plain_to) {
                        assert_eq!(*owner.entry(address).or_insert(i), i, "{kind}");
                    }
                }
            }
        }
    }

    #[test]
    fn transfer_parts_are_balanced_and_execute_without_reverts() {
        let w = workload(WorkloadKind::Transfer);
        let block = &w.blocks[0];
        let parts = independent_parts(block, &w.genesis, 2);
        assert_eq!(parts.len(), 2);
        let (a, b) = (parts[0].transactions.len(), parts[1].transactions.len());
        assert!(a.abs_diff(b) <= block.transactions.len() / 10, "{a} / {b}");
        let mut split = SplitReference::new(2).expect("pool").expect("two threads");
        split.cut(block, &w.genesis);
        let timing = split.measure(&w.chain_spec, &w.genesis).expect("parts run");
        assert!(timing.serial > Duration::ZERO && timing.concurrent > Duration::ZERO);
        for part in &parts {
            let out = SequentialExecutor
                .execute(&w.chain_spec, part, &w.genesis)
                .expect("part executes");
            assert!(out.receipts.iter().all(|r| r.status()));
        }
    }

    #[test]
    fn nothing_to_split_on_one_thread() {
        assert!(SplitReference::new(1).expect("no pool needed").is_none());
    }

    #[test]
    fn a_block_of_one_transaction_is_one_part() {
        let w = workload(WorkloadKind::Transfer);
        let mut block = w.blocks[0].clone();
        block.transactions.truncate(1);
        assert_eq!(independent_parts(&block, &w.genesis, 4).len(), 1);
    }
}
