//! The state hook of `ParallelExecutor::execute_with_state_hook`: what a node's state-root task
//! hears while a block executes. Applied in order as reth's task applies them (an untouched
//! account is skipped, a self-destructed one is wiped, any other sets its info and its changed
//! slots), the parallel executor's updates must leave the same state as the sequential
//! executor's (alloy-evm's over `revm::State`, each commit reaching the hook), and that state
//! must be the block's own (its bundle) for every account the block changed.

mod common;

use alloy_primitives::{Address, U256, map::HashMap};
use common::{Fork, Gen, parallel, parallel_eager, seed_base, soak};
use overdrive_executor::ParallelExecutor;
use overdrive_primitives::{BlockWithSenders, ChainParams, MemState};
use revm::{database::BundleState, state::EvmState};
use std::sync::{Arc, Mutex};

/// The state the hook's updates describe, as reth's state-root task reads them: per account,
/// its info fields (`None`: destroyed) and its slots.
#[derive(Debug, Default, PartialEq, Eq)]
struct Heard {
    accounts: HashMap<Address, Option<(U256, u64, alloy_primitives::B256)>>,
    storage: HashMap<Address, HashMap<U256, U256>>,
    updates: usize,
}

impl Heard {
    fn apply(&mut self, update: &EvmState) {
        self.updates += 1;
        for (&address, account) in update {
            if !account.is_touched() {
                continue;
            }
            if account.is_selfdestructed() {
                self.accounts.insert(address, None);
                self.storage.remove(&address);
                continue;
            }
            let info = &account.info;
            self.accounts
                .insert(address, Some((info.balance, info.nonce, info.code_hash)));
            let slots = self.storage.entry(address).or_default();
            for (&slot, value) in &account.storage {
                if value.is_changed() {
                    slots.insert(slot, value.present_value);
                }
            }
        }
    }
}

/// Runs `block` on `executor` with a hook that records what it hears.
fn heard(
    executor: &ParallelExecutor,
    spec: &ChainParams,
    block: &BlockWithSenders,
    state: &MemState,
) -> (Heard, BundleState) {
    let record = Arc::new(Mutex::new(Heard::default()));
    let hook = {
        let record = Arc::clone(&record);
        Box::new(move |update: EvmState| record.lock().unwrap().apply(&update))
    };
    let (output, _) = executor
        .execute_with_state_hook(spec, block, state, Some(hook))
        .expect("valid block");
    let heard = std::mem::take(&mut *record.lock().unwrap());
    (heard, output.bundle)
}

/// Every account and slot the block changed, as the hook left it, equals the bundle's.
fn assert_matches_bundle(heard: &Heard, bundle: &BundleState, what: &str) {
    for (address, account) in &bundle.state {
        let expected = account
            .info
            .as_ref()
            .map(|i| (i.balance, i.nonce, i.code_hash));
        if account.info != account.original_info || account.was_destroyed() {
            let got = heard.accounts.get(address);
            // A destroyed account never seen alive again may be absent or `None`.
            assert!(
                got == Some(&expected) || (expected.is_none() && got.is_none()),
                "{what}: account {address}: heard {got:?}, bundle {expected:?}"
            );
        }
        for (slot, value) in &account.storage {
            if value.present_value != value.previous_or_original_value {
                let got = heard.storage.get(address).and_then(|s| s.get(slot));
                assert_eq!(
                    got.copied().unwrap_or_default(),
                    value.present_value,
                    "{what}: {address} slot {slot}"
                );
            }
        }
    }
}

/// The accounts whose info or slots differ between two [`Heard`]s, for a failure message.
fn differences(got: &Heard, expected: &Heard) -> String {
    let mut addresses: Vec<&Address> = got
        .accounts
        .keys()
        .chain(expected.accounts.keys())
        .chain(got.storage.keys())
        .chain(expected.storage.keys())
        .collect();
    addresses.sort();
    addresses.dedup();
    addresses
        .into_iter()
        .filter(|a| {
            got.accounts.get(*a) != expected.accounts.get(*a)
                || got.storage.get(*a) != expected.storage.get(*a)
        })
        .take(5)
        .map(|a| {
            format!(
                "\n  {a}: heard {:?} {:?}, expected {:?} {:?}",
                got.accounts.get(a),
                got.storage.get(a),
                expected.accounts.get(a),
                expected.storage.get(a)
            )
        })
        .collect()
}

#[test]
fn streamed_updates_equal_the_sequential_executors() {
    let rounds = if soak() { 12 } else { 3 };
    // One thread: the sequential path, alloy-evm's executor with the hook on its state (the
    // reference). Then the parallel path: the default and the test configurations (pool
    // folding, speculate-all), and the coinbase paid eagerly.
    let reference = ParallelExecutor::new(overdrive_executor::ParallelConfig {
        threads: 1,
        ..Default::default()
    });
    let executors = [parallel(2), parallel(3), parallel(4), parallel_eager(2)];
    for round in 0..rounds {
        for fork in [Fork::Cancun, Fork::Prague, Fork::Osaka] {
            let (mut generator, mut state) = Gen::new(fork, 70_000 + seed_base() + round);
            for b in 0..3 {
                let block = generator.block(&state, 60);
                let what = format!("{fork:?} round {round} block {b}");
                let (expected, bundle) = heard(&reference, &generator.spec, &block, &state);
                assert!(expected.updates > 0, "{what}: the reference heard nothing");
                assert_matches_bundle(&expected, &bundle, &what);
                for (i, executor) in executors.iter().enumerate() {
                    let (got, _) = heard(executor, &generator.spec, &block, &state);
                    assert!(
                        got.accounts == expected.accounts && got.storage == expected.storage,
                        "{what}: executor {i} heard another state: {}",
                        differences(&got, &expected)
                    );
                }
                state.apply_bundle(&bundle);
                state.block_hashes.insert(block.number(), block.hash);
            }
        }
    }
}
