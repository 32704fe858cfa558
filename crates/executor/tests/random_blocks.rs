//! Differential tests on randomized blocks: the parallel executor must return exactly what the
//! sequential one returns (receipts, logs, gas, requests, bundle with reverts) on chains of
//! random conflicting blocks, for every fork family and several thread counts.
//!
//! `OVERDRIVE_SOAK=1` runs many more seeds and blocks; `OVERDRIVE_SOAK_SEED=N` starts the seeds
//! at `N` (default 0), so that each soak can explore new chains.

mod common;

use alloy_consensus::{TxEip1559, TxEnvelope, transaction::Recovered};
use alloy_primitives::{Address, Bytes, TxKind, U256};
use common::{CHAIN_ID, Fork, Gen, Key, assert_equal, parallel, parallel_eager, seed_base, soak};
use overdrive_executor::{BlockOutput, ExecuteBlock, ParallelExecutor, SequentialExecutor};
use overdrive_primitives::{BlockWithSenders, MemState};
use rand::{Rng, seq::IndexedRandom};
use revm::database::BundleState;

/// Runs `blocks` random blocks of a chain, each through every executor, applying the
/// reference output before the next.
fn run_chain(fork: Fork, seed: u64, blocks: usize, max_txs: usize, threads: &[usize]) -> usize {
    run_chain_with(fork, seed, blocks, max_txs, threads, parallel)
}

/// [`run_chain`] with executors made by `executor` from a thread count.
fn run_chain_with(
    fork: Fork,
    seed: u64,
    blocks: usize,
    max_txs: usize,
    threads: &[usize],
    executor: fn(usize) -> ParallelExecutor,
) -> usize {
    let (mut generator, mut state) = Gen::new(fork, seed);
    let executors: Vec<_> = threads.iter().map(|t| executor(*t)).collect();
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
    let base = seed_base();
    for seed in base..base + seeds {
        let threads: &[usize] = match seed % 3 {
            0 => &[2],
            1 => &[2, 3],
            _ => &[4],
        };
        // Every fifth chain with the shortcuts off (eager coinbase and recipients, no learned
        // ordering): the paths they replace meet the same kitchen sink at every fork.
        let executor = if seed % 5 == 4 {
            parallel_eager
        } else {
            parallel
        };
        run_chain_with(fork, seed, blocks, 60, threads, executor);
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

#[test]
fn random_blocks_osaka() {
    run_fork(Fork::Osaka);
}

#[test]
fn random_blocks_bpo1() {
    run_fork(Fork::Bpo1);
}

/// Large blocks: long dependency chains through the hot senders and contracts.
#[test]
fn random_large_blocks() {
    let rounds = if soak() { 20 } else { 3 };
    for seed in 0..rounds {
        for fork in [Fork::Shanghai, Fork::Cancun, Fork::Prague, Fork::Osaka] {
            run_chain(fork, 1_000 + seed_base() + seed, 3, 400, &[2, 3]);
        }
    }
}

/// A Prague chain of the generator whose kitchen sink `contracts[sink]` holds an ether, one of
/// its senders, and blocks on the generator's next header (base fee 7) — for tests that send
/// chosen kitchen-sink calls rather than random ones.
struct SinkChain {
    generator: Gen,
    state: MemState,
    sink: Address,
    key: Key,
    nonce: u64,
    template: BlockWithSenders,
}

/// A chain of the generator whose kitchen sink `contracts[sink]` holds an ether (enough for
/// the value its calls send on).
fn funded_sink(fork: Fork, seed: u64, sink: usize) -> (Gen, MemState, Address) {
    let (generator, mut state) = Gen::new(fork, seed);
    let sink = generator.contracts[sink];
    state
        .accounts
        .get_mut(&sink)
        .expect("a contract")
        .info
        .balance = U256::from(10u64.pow(18));
    (generator, state, sink)
}

impl SinkChain {
    fn new(seed: u64, sink: usize, sender: usize) -> Self {
        Self::at(Fork::Prague, seed, sink, sender)
    }

    fn at(fork: Fork, seed: u64, sink: usize, sender: usize) -> Self {
        let (mut generator, state, sink) = funded_sink(fork, seed, sink);
        let mut template = generator.block(&state, 1);
        template.header.base_fee_per_gas = Some(7);
        let key = generator.senders[sender].clone();
        let nonce = state.accounts[&key.address].info.nonce;
        Self {
            generator,
            state,
            sink,
            key,
            nonce,
            template,
        }
    }

    /// The sender's transaction number `i` from now.
    fn tx(
        &self,
        i: u64,
        to: Address,
        value: u64,
        input: Vec<u8>,
        gas: u64,
    ) -> Recovered<TxEnvelope> {
        self.key.sign(TxEip1559 {
            chain_id: CHAIN_ID,
            nonce: self.nonce + i,
            gas_limit: gas,
            max_fee_per_gas: 10_000,
            max_priority_fee_per_gas: 1,
            to: TxKind::Call(to),
            value: U256::from(value),
            access_list: Default::default(),
            input: Bytes::from(input),
        })
    }

    /// Transaction number `i` calling the kitchen sink's operation `op`.
    fn sink_call(&self, i: u64, op: u8, arg0: U256, arg1: u64, gas: u64) -> Recovered<TxEnvelope> {
        let mut input = vec![op];
        input.extend_from_slice(&arg0.to_be_bytes::<32>());
        input.extend_from_slice(&U256::from(arg1).to_be_bytes::<32>());
        self.tx(i, self.sink, 0, input, gas)
    }

    fn block(&self, txs: Vec<Recovered<TxEnvelope>>) -> BlockWithSenders {
        BlockWithSenders::from_parts(
            self.template.header.clone(),
            txs,
            Vec::new(),
            self.template.withdrawals.clone(),
        )
    }

    /// The sequential output, every transaction succeeded.
    fn execute(&self, block: &BlockWithSenders) -> BlockOutput {
        let out = SequentialExecutor
            .execute(&self.generator.spec, block, &self.state)
            .expect("valid");
        assert!(out.receipts.iter().all(|r| r.status()), "a call failed");
        out
    }

    fn assert_parallel_equal(&self, block: &BlockWithSenders, threads: &[usize], what: &str) {
        for &t in threads {
            assert_equal(&parallel(t), &self.generator.spec, block, &self.state, what)
                .expect("valid");
        }
    }
}

/// A slot's value in a block's bundle (zero when untouched).
fn slot(bundle: &BundleState, address: Address, slot: u64) -> U256 {
    bundle
        .account(&address)
        .and_then(|a| a.storage.get(&U256::from(slot)))
        .map(|s| s.present_value)
        .unwrap_or_default()
}

/// The generator's newer cases do what the random blocks rely on: a child created with value
/// is gone after its transaction (Cancun's rules), its CREATE2 address is then free for a
/// lasting child in the same block, and a transaction reads the beacon root and the parent
/// hash that this block's system calls stored; the sponsor's own authorizations take.
#[test]
fn generated_contracts_reach_their_cases() {
    let chain = SinkChain::new(3, 0, 5);
    let sink = chain.sink;
    let call = |i: u64, op: u8, arg0: u64| chain.sink_call(i, op, U256::from(arg0), 0, 250_000);
    // 15: ephemeral child at salt 1; 4: lasting child at salt 1; 16: beacon root, parent hash.
    let block = chain.block(vec![
        call(0, 15, 1),
        call(1, 4, 1),
        call(2, 16, 0),
        call(3, 16, 1),
    ]);
    let out = chain.execute(&block);
    let child = sink.create2(
        alloy_primitives::B256::from(U256::from(1)),
        alloy_primitives::keccak256(common::child_initcode()),
    );
    // CREATE2 returned the child's address both times: the first child was removed, so the
    // second found the address free.
    assert_eq!(
        slot(&out.bundle, sink, 13),
        U256::from_be_slice(child.as_slice())
    );
    assert_eq!(
        slot(&out.bundle, sink, 10),
        U256::from_be_slice(child.as_slice())
    );
    assert!(
        out.bundle
            .account(&child)
            .and_then(|a| a.info.as_ref())
            .is_some_and(|i| !i.is_empty_code_hash())
    );
    // The last call reads the parent hash (EIP-2935); the one before it, the beacon root.
    assert_eq!(slot(&out.bundle, sink, 14), U256::from(1));
    assert_eq!(
        slot(&out.bundle, sink, 15),
        U256::from_be_bytes(block.header.parent_hash.0)
    );
    assert_ne!(block.header.parent_hash, alloy_primitives::B256::ZERO);
    let out = chain.execute(&chain.block(vec![call(0, 16, 0)]));
    assert_eq!(
        Some(slot(&out.bundle, sink, 15)),
        block
            .header
            .parent_beacon_block_root
            .map(|r| U256::from_be_bytes(r.0))
    );
    chain.assert_parallel_equal(&block, &[2, 4], "new ops");

    // The sponsor's own authorizations take: it ends up delegated to the kitchen sink.
    let (mut generator, mut state) = Gen::new(Fork::Prague, 4);
    generator.advance(&mut state, 6, 60);
    let sponsor = &state.accounts[&generator.sponsor.address].info;
    let mut designator = vec![0xef, 0x01, 0x00];
    designator.extend_from_slice(generator.contracts[1].as_slice());
    assert_eq!(sponsor.code_hash, alloy_primitives::keccak256(&designator));
}

/// The generator's deposit contract and precompile calls do what the random blocks rely on:
/// a call of the deposit contract, direct or from a contract, becomes a deposit request of
/// the block; each precompile call succeeds or fails as `PRECOMPILE_CALLS` says and returns
/// what the precompile computes. Osaka, the fork with the most precompiles (P256VERIFY).
#[test]
fn deposits_and_precompile_calls_reach_the_block_output() {
    let chain = SinkChain::at(Fork::Osaka, 5, 1, 7);
    let sink = chain.sink;

    // Deposits: a plain transfer to the deposit contract and a contract's call of it.
    let deposit = U256::from_be_slice(common::DEPOSIT_CONTRACT.as_slice());
    let block = chain.block(vec![
        chain.tx(0, common::DEPOSIT_CONTRACT, 1, Vec::new(), 400_000),
        chain.sink_call(1, 2, deposit, 5, 400_000),
    ]);
    let out = chain.execute(&block);
    let mut one = common::deposit_event_data();
    one[common::DEPOSIT_INDEX_AT] = block.number() as u8;
    let fields: Vec<u8> = [(160, 48), (256, 32), (320, 8), (384, 96), (512, 8)]
        .iter()
        .flat_map(|&(at, len)| one[at + 32..at + 32 + len].to_vec())
        .collect();
    let deposits: Vec<_> = out.requests.iter().filter(|r| r[0] == 0).collect();
    assert_eq!(deposits.len(), 1, "{:?}", out.requests);
    assert_eq!(deposits[0][1..], [fields.clone(), fields].concat());
    chain.assert_parallel_equal(&block, &[2, 3], "deposits");

    // Precompiles, one block each: all succeed on zero input but the KZG point evaluation,
    // and each call stores what revm's precompile returns when called directly.
    let call =
        |i: u64, address: u64, len: u64| chain.sink_call(i, 17, U256::from(address), len, 400_000);
    let mut all = Vec::new();
    for (i, &(address, len)) in common::PRECOMPILE_CALLS.iter().enumerate() {
        all.push(call(i as u64, address, len));
        let out = chain.execute(&chain.block(vec![call(0, address, len)]));
        let slot = |n: u64| slot(&out.bundle, sink, n);
        let returned = direct_precompile(address, len);
        assert_eq!(
            returned.is_some(),
            address != 0x0a,
            "precompile {address:#x}"
        );
        assert_eq!(
            slot(16),
            U256::from(returned.is_some()),
            "precompile {address:#x}"
        );
        // The first word of the output, zero-padded; nothing is copied from a failed call.
        let mut word = [0u8; 32];
        let returned = returned.unwrap_or_default();
        let n = returned.len().min(32);
        word[..n].copy_from_slice(&returned[..n]);
        assert_eq!(
            slot(17),
            U256::from_be_bytes(word),
            "precompile {address:#x} returned"
        );
        if address == 0x02 {
            // sha256 of 32 zero bytes, as a check of the reference itself.
            assert_eq!(
                word,
                alloy_primitives::b256!(
                    "66687aadf862bd776c8fc18b8e9f8e20089714856ee233b3902a591d0d5f2925"
                )
                .0
            );
        }
    }
    chain.assert_parallel_equal(&chain.block(all), &[2, 4], "precompiles");
}

/// What Prague's precompile at `address` returns on `len` zero bytes with the kitchen sink's
/// 200,000 gas, run directly by revm (`None`: it fails): the reference for the calls above.
fn direct_precompile(address: u64, len: u64) -> Option<Bytes> {
    let address = Address::left_padding_from(&address.to_be_bytes());
    let precompile = revm::precompile::Precompiles::osaka().get(&address)?;
    let out = precompile
        .execute(&vec![0; len as usize], 200_000, 0)
        .ok()?;
    out.status.is_success().then_some(out.bytes)
}

/// One CREATE2 address raced over by several senders in one block, in random order: a child
/// created and destroyed in its transaction (op 15), a lasting child (op 4), plain transfers
/// funding the address before or after, calls to it (a lasting child's self-destruct only
/// moves its balance under Cancun's rules) and reads of its balance (op 14). Fresh salts keep
/// every trial's address unused, which the random chains run out of (a lasting child can never
/// be destroyed there).
#[test]
fn destroy_and_recreate_races() {
    let trials = if soak() { 300 } else { 40 };
    let (mut raced, mut blocks) = (0, 0);
    let executors = [parallel(2), parallel(3), parallel(4)];
    for trial in 0..trials {
        for fork in [Fork::Cancun, Fork::Prague, Fork::Osaka] {
            let (mut generator, state, sink) = funded_sink(fork, 11_000 + seed_base() + trial, 0);
            let salt = U256::from(100 + trial);
            let child = sink.create2(
                alloy_primitives::B256::from(salt),
                alloy_primitives::keccak256(common::child_initcode()),
            );
            let template = generator.block(&state, 1);
            let senders: Vec<Key> = generator.senders[..6].to_vec();
            let mut nonces: Vec<u64> = senders
                .iter()
                .map(|k| state.accounts[&k.address].info.nonce)
                .collect();
            let mut ops = Vec::new();
            let mut txs = Vec::new();
            for _ in 0..generator.rng.random_range(6..16) {
                let s = generator.rng.random_range(0..senders.len());
                let op: u8 = *[15, 4, 0, 1, 14].choose(&mut generator.rng).expect("ops");
                let sink_call = |op: u8, arg0: U256, arg1: U256| {
                    let mut input = vec![op];
                    input.extend_from_slice(&arg0.to_be_bytes::<32>());
                    input.extend_from_slice(&arg1.to_be_bytes::<32>());
                    (sink, 0, input)
                };
                let beneficiary = U256::from_be_slice(generator.hot.as_slice());
                let (to, value, input) = match op {
                    15 | 4 => sink_call(op, salt, U256::ZERO),
                    14 => sink_call(14, U256::ZERO, U256::from_be_slice(child.as_slice())),
                    // A plain transfer to the address, whatever is there.
                    0 => (child, generator.rng.random_range(1..1_000u64), Vec::new()),
                    // A call to it: a lasting child sends its balance to `hot`.
                    _ => (child, 0, beneficiary.to_be_bytes::<32>().to_vec()),
                };
                ops.push(op);
                txs.push(senders[s].sign(TxEip1559 {
                    chain_id: CHAIN_ID,
                    nonce: nonces[s],
                    gas_limit: 300_000,
                    max_fee_per_gas: template.header.base_fee_per_gas.unwrap_or(0) as u128 * 2 + 2,
                    max_priority_fee_per_gas: 1,
                    to: TxKind::Call(to),
                    value: U256::from(value),
                    access_list: Default::default(),
                    input: Bytes::from(input),
                }));
                nonces[s] += 1;
            }
            let block = BlockWithSenders::from_parts(
                template.header.clone(),
                txs,
                Vec::new(),
                template.withdrawals.clone(),
            );
            let mut out = None;
            for (executor, t) in executors.iter().zip([2, 3, 4]) {
                let what = format!("{fork:?} trial {trial} ops {ops:?} threads {t}");
                out = Some(
                    assert_equal(executor, &generator.spec, &block, &state, &what)
                        .unwrap_or_else(|e| panic!("{what}: invalid block: {e}")),
                );
            }
            // A child created and destroyed, then one created to last, in one block.
            let lasting = out
                .and_then(|o| o.bundle.account(&child)?.info.clone())
                .is_some_and(|i| !i.is_empty_code_hash());
            let first_ephemeral = ops.iter().position(|&o| o == 15);
            if lasting
                && first_ephemeral.is_some()
                && first_ephemeral < ops.iter().position(|&o| o == 4)
            {
                raced += 1;
            }
            blocks += 1;
        }
    }
    eprintln!("destroyed then re-created in {raced} of {blocks} blocks");
    assert!(
        raced > blocks / 10,
        "destroyed then re-created in {raced} of {blocks} blocks"
    );
}
