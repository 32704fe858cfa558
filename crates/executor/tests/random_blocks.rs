//! Differential tests on randomized blocks: the parallel executor must return exactly what the
//! sequential one returns (receipts, logs, gas, requests, bundle with reverts) on chains of
//! random conflicting blocks, for every fork family and several thread counts.
//!
//! `OVERDRIVE_SOAK=1` runs many more seeds and blocks.

mod common;

use common::{Fork, Gen, assert_equal, parallel};
use rand::Rng;

fn soak() -> bool {
    std::env::var("OVERDRIVE_SOAK").is_ok_and(|v| v != "0" && !v.is_empty())
}

/// Runs `blocks` random blocks of a chain, each through every executor, applying the
/// reference output before the next.
fn run_chain(fork: Fork, seed: u64, blocks: usize, max_txs: usize, threads: &[usize]) -> usize {
    let (mut generator, mut state) = Gen::new(fork, seed);
    let executors: Vec<_> = threads.iter().map(|t| parallel(*t)).collect();
    let mut txs = 0;
    for b in 0..blocks {
        let n = generator.rng.random_range(2..=max_txs);
        let block = generator.block(&state, n);
        let mut reference = None;
        for (executor, t) in executors.iter().zip(threads) {
            let what = format!("{fork:?} seed {seed} block {b} ({n} txs) threads {t}");
            reference = Some(assert_equal(
                executor,
                &generator.spec,
                &block,
                &state,
                &what,
            ));
        }
        match reference.expect("at least one executor") {
            Ok(output) => {
                state.apply_bundle(&output.bundle);
                state.block_hashes.insert(block.number(), block.hash);
                txs += n;
            }
            Err(e) => panic!("{fork:?} seed {seed} block {b}: generated block is invalid: {e}"),
        }
    }
    txs
}

fn run_fork(fork: Fork) {
    let (seeds, blocks) = if soak() { (200, 40) } else { (40, 12) };
    for seed in 0..seeds {
        let threads: &[usize] = match seed % 3 {
            0 => &[2],
            1 => &[2, 3],
            _ => &[4],
        };
        run_chain(fork, seed, blocks, 60, threads);
    }
}

#[test]
fn random_blocks_homestead() {
    run_fork(Fork::Homestead);
}

#[test]
fn random_blocks_byzantium() {
    run_fork(Fork::Byzantium);
}

#[test]
fn random_blocks_london() {
    run_fork(Fork::London);
}

#[test]
fn random_blocks_paris() {
    run_fork(Fork::Paris);
}

#[test]
fn random_blocks_shanghai() {
    run_fork(Fork::Shanghai);
}

#[test]
fn random_blocks_cancun() {
    run_fork(Fork::Cancun);
}

#[test]
fn random_blocks_prague() {
    run_fork(Fork::Prague);
}

/// Large blocks: long dependency chains through the hot senders and contracts.
#[test]
fn random_large_blocks() {
    let rounds = if soak() { 20 } else { 3 };
    for seed in 0..rounds {
        for fork in [Fork::Shanghai, Fork::Prague] {
            run_chain(fork, 1_000 + seed, 3, 400, &[2, 3]);
        }
    }
}
