//! Invalid transactions (the parallel executor must reject the block with the sequential
//! executor's exact error), scheduler stress (one conflicting block executed hundreds of times
//! across thread counts must always give the same output), and worker panics (a panic becomes
//! `ExecutionError::WorkerPanic`, never a hang or a crash).

mod common;

use alloy_consensus::{Header, TxEip1559, TxEnvelope, transaction::Recovered};
use alloy_primitives::{Address, Bytes, TxKind, U256};
use common::{CHAIN_ID, Fork, Gen, Key, assert_equal, parallel};
use overdrive_executor::{ExecuteBlock, ExecutionError, SequentialExecutor};
use overdrive_primitives::{BlockWithSenders, MemState};
use rand::Rng;
use revm::{
    DatabaseRef,
    bytecode::Bytecode,
    primitives::{B256, StorageKey, StorageValue},
    state::AccountInfo,
};

fn transfer(
    key: &Key,
    nonce: u64,
    to: Address,
    value: U256,
    gas_limit: u64,
) -> Recovered<TxEnvelope> {
    key.sign(TxEip1559 {
        chain_id: CHAIN_ID,
        nonce,
        gas_limit,
        max_fee_per_gas: 10_000,
        max_priority_fee_per_gas: 3,
        to: TxKind::Call(to),
        value,
        access_list: Default::default(),
        input: Bytes::new(),
    })
}

fn block_of(txs: Vec<Recovered<TxEnvelope>>, gas_limit: u64) -> BlockWithSenders {
    let header = Header {
        number: 9,
        gas_limit,
        timestamp: 2_000,
        base_fee_per_gas: Some(7),
        beneficiary: Address::new([0xcb; 20]),
        parent_beacon_block_root: Some(B256::ZERO),
        excess_blob_gas: Some(0),
        blob_gas_used: Some(0),
        ..Default::default()
    };
    BlockWithSenders::from_parts(header, txs, Vec::new(), Some(Vec::new()))
}

/// A block of `n` transfers (with many conflicts: few senders, one hot recipient), with one
/// transaction at `bad` replaced by `make_bad`.
fn block_with_bad(
    generator: &Gen,
    state: &MemState,
    n: usize,
    bad: usize,
    make_bad: impl Fn(&Key, u64) -> Recovered<TxEnvelope>,
    gas_limit: u64,
) -> BlockWithSenders {
    let mut nonces = vec![0u64; generator.senders.len()];
    for (i, k) in generator.senders.iter().enumerate() {
        nonces[i] = state.accounts[&k.address].info.nonce;
    }
    let txs = (0..n)
        .map(|i| {
            let s = i % 5;
            let key = &generator.senders[s];
            let nonce = nonces[s];
            nonces[s] += 1;
            if i == bad {
                make_bad(key, nonce)
            } else {
                let to = if i % 3 == 0 {
                    generator.hot
                } else {
                    generator.senders[(i + 7) % 20].address
                };
                transfer(key, nonce, to, U256::from(1_000 + i), 21_000)
            }
        })
        .collect();
    block_of(txs, gas_limit)
}

/// A block of `n` conflicting transfers (as [`block_with_bad`] makes them) with `extra`
/// transactions inserted at their positions (ascending), none of them consuming a nonce of
/// the block's own senders.
fn block_with_inserted(
    generator: &Gen,
    state: &MemState,
    n: usize,
    extra: Vec<(usize, Recovered<TxEnvelope>)>,
) -> BlockWithSenders {
    let base = block_with_bad(
        generator,
        state,
        n,
        usize::MAX,
        |_, _| unreachable!(),
        30_000_000,
    );
    let mut txs = base.transactions.clone();
    for (position, tx) in extra {
        txs.insert(position, tx);
    }
    block_of(txs, 30_000_000)
}

/// The transactions that make a later one invalid, or valid, come earlier in the same block:
/// the case where a speculative execution sees a different pre-state than the exact one.
#[test]
fn validity_decided_inside_the_block_matches_the_sequential_executor() {
    let (generator, mut state) = Gen::new(Fork::Prague, 78);
    let once_rich = Key::new(78, 1_000);
    let balance = U256::from(10u64.pow(18));
    state.insert_account(once_rich.address, balance, 0, None, Default::default());
    let fresh = Key::new(78, 1_001);
    let funder = Key::new(78, 1_002);
    state.insert_account(funder.address, balance, 0, None, Default::default());
    state
        .accounts
        .get_mut(&generator.contracts[0])
        .expect("a generated contract")
        .info
        .balance = balance;
    // One transfer's maximum fee (gas limit at the maximum fee per gas). The draining transfer
    // leaves less than twice that, which the later one needs for its value and its fee.
    let fee = U256::from(21_000u64 * 10_000);
    let executors = [parallel(2), parallel(3), parallel(4)];
    let n = 100;
    for (early, late) in [(0, 1), (3, 50), (40, 41), (10, 99)] {
        let drained = block_with_inserted(
            &generator,
            &state,
            n,
            vec![
                (
                    early,
                    transfer(
                        &once_rich,
                        0,
                        generator.hot,
                        balance - fee * U256::from(2),
                        21_000,
                    ),
                ),
                (late, transfer(&once_rich, 1, generator.hot, fee, 21_000)),
            ],
        );
        let funded = block_with_inserted(
            &generator,
            &state,
            n,
            vec![
                (
                    early,
                    transfer(&funder, 0, fresh.address, balance / U256::from(2), 21_000),
                ),
                (
                    late,
                    transfer(&fresh, 0, generator.hot, balance / U256::from(4), 21_000),
                ),
            ],
        );
        // Funded by a contract's inner call: no hint links the two transactions, so the
        // second is likely speculated before the first commits, on an empty account.
        let pay = {
            let mut input = vec![2u8];
            input.extend_from_slice(
                &U256::from_be_slice(fresh.address.as_slice()).to_be_bytes::<32>(),
            );
            input.extend_from_slice(&(balance / U256::from(2)).to_be_bytes::<32>());
            funder.sign(TxEip1559 {
                chain_id: CHAIN_ID,
                nonce: 0,
                gas_limit: 100_000,
                max_fee_per_gas: 10_000,
                max_priority_fee_per_gas: 3,
                to: TxKind::Call(generator.contracts[0]),
                value: U256::ZERO,
                access_list: Default::default(),
                input: input.into(),
            })
        };
        let funded_inside = block_with_inserted(
            &generator,
            &state,
            n,
            vec![
                (early, pay),
                (
                    late,
                    transfer(&fresh, 0, generator.hot, balance / U256::from(4), 21_000),
                ),
            ],
        );
        let expected = SequentialExecutor.execute(&generator.spec, &drained, &state);
        assert!(
            expected.is_err(),
            "drained at {early}, spent at {late}: the block should be invalid"
        );
        assert!(
            SequentialExecutor
                .execute(&generator.spec, &funded, &state)
                .is_ok(),
            "funded at {early}, spent at {late}: the block should be valid"
        );
        for executor in &executors {
            let actual = executor.execute(&generator.spec, &drained, &state);
            assert_eq!(actual, expected, "drained at {early}, spent at {late}");
            for (what, block) in [
                ("funded", &funded),
                ("funded by a contract", &funded_inside),
            ] {
                let out = assert_equal(
                    executor,
                    &generator.spec,
                    block,
                    &state,
                    &format!("{what} at {early}, spent at {late}"),
                )
                .expect("valid");
                assert!(
                    out.receipts.iter().all(|r| r.status()),
                    "{what}: a transfer failed"
                );
            }
        }
    }
}

#[test]
fn invalid_transactions_give_the_sequential_error() {
    let (generator, mut state) = Gen::new(Fork::Prague, 77);
    // A poor sender: enough for gas of one transfer, not for a large value.
    let poor = Key::new(77, 999);
    state.insert_account(
        poor.address,
        U256::from(500_000_000u64),
        0,
        None,
        Default::default(),
    );
    // Senders that have sent before, so that a nonce too low exists at every position.
    for key in &generator.senders {
        if let Some(account) = state.accounts.get_mut(&key.address) {
            account.info.nonce = 3;
        }
    }
    let executors = [parallel(2), parallel(3), parallel(4)];
    let n = 120;
    for bad in [0, 1, 37, 60, n - 2, n - 1] {
        let cases: Vec<(&str, BlockWithSenders)> = vec![
            (
                "nonce gap",
                block_with_bad(
                    &generator,
                    &state,
                    n,
                    bad,
                    |k, nonce| transfer(k, nonce + 1, generator.hot, U256::from(1), 21_000),
                    30_000_000,
                ),
            ),
            (
                "nonce too low",
                block_with_bad(
                    &generator,
                    &state,
                    n,
                    bad,
                    |k, nonce| {
                        let low = nonce.checked_sub(1).expect("senders start at nonce 3");
                        transfer(k, low, generator.hot, U256::from(1), 21_000)
                    },
                    30_000_000,
                ),
            ),
            (
                "insufficient funds",
                block_with_bad(
                    &generator,
                    &state,
                    n,
                    bad,
                    |_, _| transfer(&poor, 0, generator.hot, U256::from(10u64.pow(18)), 21_000),
                    30_000_000,
                ),
            ),
            (
                "gas above remaining block gas",
                block_with_bad(
                    &generator,
                    &state,
                    n,
                    bad,
                    |k, nonce| transfer(k, nonce, generator.hot, U256::from(1), 25_000_000),
                    21_000 * n as u64 + 100_000,
                ),
            ),
            (
                // Within the block's limit, above what the transactions before it left.
                "gas above the gas the block has left",
                block_with_bad(
                    &generator,
                    &state,
                    n,
                    bad,
                    |k, nonce| {
                        let limit = 21_000 * n as u64 + 100_000;
                        let left = limit - 21_000 * bad as u64;
                        transfer(k, nonce, generator.hot, U256::from(1), left + 1)
                    },
                    21_000 * n as u64 + 100_000,
                ),
            ),
        ];
        for (what, block) in cases {
            let expected = SequentialExecutor.execute(&generator.spec, &block, &state);
            assert!(
                expected.is_err(),
                "{what} at {bad}: the block should be invalid"
            );
            for executor in &executors {
                let actual = executor.execute(&generator.spec, &block, &state);
                assert_eq!(actual, expected, "{what} at {bad}");
            }
        }
    }
}

#[test]
fn the_same_conflicting_block_always_gives_the_same_output() {
    let (mut generator, mut state) = Gen::new(Fork::Cancun, 4242);
    // Let a few blocks create and destroy things first.
    generator.advance(&mut state, 3, 40);
    let block = generator.block(&state, 150);
    let expected = SequentialExecutor
        .execute(&generator.spec, &block, &state)
        .expect("valid");
    let rounds = if common::soak() { 2_000 } else { 150 };
    // Results the pool found stale and executed again: a few in about half of the runs on a
    // 2-core machine (over 2,000 in all), so the path is exercised here whatever the timing.
    let mut respeculated = 0;
    for threads in [2, 3, 4, 8] {
        let executor = parallel(threads);
        for round in 0..rounds {
            let actual = executor
                .execute(&generator.spec, &block, &state)
                .expect("valid");
            assert!(
                actual == expected,
                "threads {threads} round {round}: output differs:\n{}",
                common::describe_diff(&expected, &actual)
            );
            respeculated += executor.last_stats().map_or(0, |s| s.respeculated);
            // Every block's freeing job ends (a count that leaked would hang here).
            executor.wait_for_freeing();
        }
    }
    assert!(respeculated > 0, "no stale result was executed again");
}

/// A block whose first transaction runs long (a loop that burns 20 Mgas), then `n` calls of
/// `contract` that read what this block's beacon-root system call wrote. The system call's
/// writes are invisible to speculation, so each call speculated while the first transaction
/// still runs fails validation: the conflicts do not depend on how the threads interleave.
fn conflicting_block(
    generator: &Gen,
    state: &MemState,
    contract: Address,
    n: usize,
) -> BlockWithSenders {
    let mut nonces: Vec<u64> = generator
        .senders
        .iter()
        .map(|k| state.accounts[&k.address].info.nonce)
        .collect();
    let txs = (0..=n)
        .map(|i| {
            let s = i % generator.senders.len();
            let nonce = nonces[s];
            nonces[s] += 1;
            // Op 10 (loop) first, then op 16 (read the system contracts) with argument 0.
            let (op, gas_limit) = if i == 0 {
                (10, 20_000_000)
            } else {
                (16, 100_000)
            };
            let mut input = vec![op];
            input.extend_from_slice(&[0u8; 64]);
            generator.senders[s].sign(TxEip1559 {
                chain_id: CHAIN_ID,
                nonce,
                gas_limit,
                max_fee_per_gas: 10_000,
                max_priority_fee_per_gas: 3,
                to: TxKind::Call(contract),
                value: U256::ZERO,
                access_list: Default::default(),
                input: input.into(),
            })
        })
        .collect();
    block_of(txs, 30_000_000)
}

/// Calls of a contract the hints cannot decode run unordered until they conflict; the
/// executor then remembers the contract for `LEARNED_BLOCKS` parallel blocks, and forgets it
/// after. Outputs equal the sequential executor's throughout.
#[test]
fn conflicting_calls_are_learned_and_forgotten() {
    let (generator, state) = Gen::new(Fork::Prague, 31);
    let contract = generator.contracts[0];
    let block = conflicting_block(&generator, &state, contract, 100);
    let executor = parallel(2);
    let fresh = parallel(2);
    assert!(executor.learned_conflicts().is_empty());
    assert_equal(&executor, &generator.spec, &block, &state, "conflicting").expect("valid");
    let stats = executor.last_stats().expect("parallel");
    assert!(stats.exact > 1, "{stats:?}");
    assert_eq!(executor.learned_conflicts(), [contract]);
    // A snapshot restores both ways (what a benchmark repeating one block does).
    let learned = executor.learned();
    executor.restore_learned(fresh.learned());
    assert!(executor.learned_conflicts().is_empty());
    executor.restore_learned(learned.clone());
    assert_eq!(executor.learned(), learned);
    // Learned: the next block chains the calls from the start.
    assert_equal(&executor, &generator.spec, &block, &state, "learned").expect("valid");
    // That block and the ones after, without conflicts of it, age it out.
    let transfers = block_with_bad(
        &generator,
        &state,
        40,
        usize::MAX,
        |_, _| unreachable!(),
        30_000_000,
    );
    for _ in 2..overdrive_executor::LEARNED_BLOCKS {
        assert_equal(&executor, &generator.spec, &transfers, &state, "transfers").expect("valid");
        assert_eq!(executor.learned_conflicts(), [contract]);
    }
    assert_equal(&executor, &generator.spec, &transfers, &state, "transfers").expect("valid");
    assert!(executor.learned_conflicts().is_empty());

    // Without learning, every such contract's calls are chained and nothing is remembered.
    let config = parallel(4).config().clone();
    let ordered = overdrive_executor::ParallelExecutor::new(overdrive_executor::ParallelConfig {
        scheduling: overdrive_executor::Scheduling {
            learn_conflicts: false,
            ..config.scheduling
        },
        ..config
    });
    assert_equal(&ordered, &generator.spec, &block, &state, "ordered").expect("valid");
    assert!(ordered.learned_conflicts().is_empty());
}

#[test]
fn random_thread_counts_and_thresholds() {
    let (mut generator, mut state) = Gen::new(Fork::Shanghai, 99);
    for b in 0..30 {
        let n = generator.rng.random_range(0..80);
        let block = generator.block(&state, n);
        let threads = generator.rng.random_range(1..6);
        let executor =
            overdrive_executor::ParallelExecutor::new(overdrive_executor::ParallelConfig {
                threads,
                min_txs_for_parallel: generator.rng.random_range(0..40),
                min_gas_for_parallel: generator.rng.random_range(0..2_000_000),
                scheduling: overdrive_executor::Scheduling {
                    speculate_all: generator.rng.random_bool(0.5),
                    transition_folding: [
                        overdrive_executor::TransitionFolding::Auto,
                        overdrive_executor::TransitionFolding::Committer,
                        overdrive_executor::TransitionFolding::Pool,
                    ][generator.rng.random_range(0..3)],
                    respeculate: generator.rng.random_bool(0.5),
                    force_parallel_path: generator.rng.random_bool(0.3),
                    ..Default::default()
                },
            });
        let out = assert_equal(
            &executor,
            &generator.spec,
            &block,
            &state,
            &format!("block {b}"),
        )
        .expect("valid");
        // The path taken is the one the thresholds ask for (statistics come from the parallel
        // path only), and the output is the same as `execute`'s.
        let config = executor.config();
        let started = std::time::Instant::now();
        let (again, stats) = executor
            .execute_with_stats(&generator.spec, &block, &state)
            .expect("valid");
        let wall = started.elapsed().as_nanos() as u64;
        if let Some(stats) = stats {
            // The committer's serial time (the benchmark's Amdahl bound) is a part of the
            // calling thread's time in this call, and it commits every transaction once.
            assert!(
                stats.serial_ns() <= wall,
                "block {b}: serial {} ns in a {wall} ns call",
                stats.serial_ns()
            );
            assert_eq!(stats.validated + stats.exact, n, "block {b}: {stats:?}");
        }
        let parallel = if config.scheduling.force_parallel_path {
            n > 0
        } else {
            threads > 1
                && n >= config.min_txs_for_parallel.max(1)
                && overdrive_executor::block_gas_estimate(&block) >= config.min_gas_for_parallel
        };
        // One thread has no pool thread to speculate: the committer ran the block alone.
        if threads == 1 {
            assert!(
                !stats.is_some_and(|s| s.multi_threaded()),
                "block {b}: {stats:?}"
            );
        }
        assert_eq!(
            stats.is_some(),
            parallel,
            "block {b}: {n} txs, {threads} threads"
        );
        assert!(
            again == out,
            "block {b}: execute_with_stats differs from execute"
        );
        state.apply_bundle(&out.bundle);
        state.block_hashes.insert(block.number(), block.hash);
    }
}

/// A pre-state reader that panics when one address is read (or, with `trap_storage`, one
/// address's storage), and takes its time over another.
#[derive(Debug)]
struct Exploding {
    inner: MemState,
    trap: Address,
    /// Reading any slot of it panics.
    trap_storage: Option<Address>,
    /// Reading it takes [`SLOW_READ`].
    slow: Option<Address>,
    /// How often the trap was read.
    trap_reads: std::sync::atomic::AtomicUsize,
}

const SLOW_READ: std::time::Duration = std::time::Duration::from_millis(200);

impl Exploding {
    fn new(inner: MemState, trap: Address, slow: Option<Address>) -> Self {
        Self {
            inner,
            trap,
            trap_storage: None,
            slow,
            trap_reads: Default::default(),
        }
    }
}

impl DatabaseRef for Exploding {
    type Error = <MemState as DatabaseRef>::Error;
    fn basic_ref(&self, address: Address) -> Result<Option<AccountInfo>, Self::Error> {
        if Some(address) == self.slow {
            std::thread::sleep(SLOW_READ);
        }
        if address == self.trap {
            self.trap_reads
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            panic!("trap account read");
        }
        self.inner.basic_ref(address)
    }
    fn code_by_hash_ref(&self, code_hash: B256) -> Result<Bytecode, Self::Error> {
        self.inner.code_by_hash_ref(code_hash)
    }
    fn storage_ref(
        &self,
        address: Address,
        index: StorageKey,
    ) -> Result<StorageValue, Self::Error> {
        if Some(address) == self.trap_storage {
            panic!("trap storage read");
        }
        self.inner.storage_ref(address, index)
    }
    fn block_hash_ref(&self, number: u64) -> Result<B256, Self::Error> {
        self.inner.block_hash_ref(number)
    }
}

/// Runs `test` on its own thread and fails if it does not finish in `limit`: a hang must fail
/// the test rather than stall the suite.
fn within(limit: std::time::Duration, test: impl FnOnce() + Send + 'static) {
    let (done, finished) = std::sync::mpsc::channel();
    let handle = std::thread::spawn(move || {
        test();
        let _ = done.send(());
    });
    match finished.recv_timeout(limit) {
        Ok(()) => handle.join().expect("test thread"),
        // The test panicked: re-raise its panic.
        Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
            std::panic::resume_unwind(handle.join().expect_err("test thread panicked"))
        }
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => panic!("no result after {limit:?}"),
    }
}

#[test]
fn a_panicking_worker_rejects_the_block() {
    within(std::time::Duration::from_secs(300), panicking_worker);
}

fn panicking_worker() {
    let (generator, state) = Gen::new(Fork::Prague, 5);
    let trap = Address::new([0x99; 20]);
    let db = Exploding::new(state.clone(), trap, None);
    for position in [0, 30, 99] {
        let block = block_with_bad(
            &generator,
            &state,
            100,
            position,
            |k, nonce| transfer(k, nonce, trap, U256::from(1), 21_000),
            30_000_000,
        );
        for threads in [2, 4] {
            let result = parallel(threads).execute(&generator.spec, &block, &db);
            assert!(
                matches!(result, Err(ExecutionError::WorkerPanic(ref m)) if m.contains("trap")),
                "position {position} threads {threads}: {result:?}"
            );
        }
        // The executor stays usable after a panic.
        let executor = parallel(2);
        let _ = executor.execute(&generator.spec, &block, &db);
        let ok = block_with_bad(
            &generator,
            &state,
            100,
            0,
            |k, nonce| transfer(k, nonce, generator.hot, U256::from(1), 21_000),
            30_000_000,
        );
        assert_equal(&executor, &generator.spec, &ok, &state, "after panic").expect("valid");
    }
    // The sequential path of the parallel executor (one thread, or a block below the
    // thresholds) turns a panic into the same error.
    let small = block_with_bad(
        &generator,
        &state,
        3,
        1,
        |k, nonce| transfer(k, nonce, trap, U256::from(1), 21_000),
        30_000_000,
    );
    let one_thread = overdrive_executor::ParallelExecutor::with_threads(1);
    let below = overdrive_executor::ParallelExecutor::with_threads(2);
    for executor in [&one_thread, &below] {
        let result = executor.execute(&generator.spec, &small, &db);
        assert!(
            matches!(result, Err(ExecutionError::WorkerPanic(ref m)) if m.contains("trap")),
            "sequential path: {result:?}"
        );
    }
}

/// Random Cancun and Prague blocks over a reader whose storage reads of one shared contract
/// panic (a database failing mid-block). The parallel executor must give what the sequential
/// executor meets first in block order: the panic as `WorkerPanic`, the output of a block that
/// never reads that storage, or — with a transaction left out, so that a nonce gap comes
/// before — the nonce error, however far speculation ran past it into the panic.
#[test]
fn storage_read_panics_in_random_blocks() {
    within(std::time::Duration::from_secs(300), storage_read_panics);
}

fn storage_read_panics() {
    use std::panic::{AssertUnwindSafe, catch_unwind};
    let executors = [parallel(2), parallel(4)];
    // Blocks that panicked, stayed valid, and hit the gap before a panic they would meet later.
    let (mut panicked, mut valid, mut gap_first) = (0, 0, 0);
    for seed in 0..6 {
        for fork in [Fork::Cancun, Fork::Prague] {
            let (mut generator, mut state) = Gen::new(fork, 9_000 + seed);
            generator.advance(&mut state, 1, 20);
            let mut db = Exploding::new(state.clone(), Address::ZERO, None);
            db.trap_storage = Some(generator.contracts[3]);
            for b in 0..4 {
                let n = generator.rng.random_range(8..=40);
                let block = generator.block(&state, n);
                // A block with the first transaction whose sender sends again later left out.
                let gap = (0..n)
                    .find(|&i| {
                        block.transactions[i + 1..]
                            .iter()
                            .any(|tx| tx.signer() == block.transactions[i].signer())
                    })
                    .map(|i| {
                        let mut txs = block.transactions.clone();
                        txs.remove(i);
                        BlockWithSenders::from_parts(
                            block.header.clone(),
                            txs,
                            Vec::new(),
                            block.withdrawals.clone(),
                        )
                    });
                let mut block_panicked = false;
                for (what, block) in
                    std::iter::once(("whole", &block)).chain(gap.iter().map(|g| ("gap", g)))
                {
                    let expected = catch_unwind(AssertUnwindSafe(|| {
                        SequentialExecutor.execute(&generator.spec, block, &db)
                    }));
                    for (executor, t) in executors.iter().zip([2, 4]) {
                        let what = format!("{fork:?} seed {seed} block {b} {what} threads {t}");
                        let result = executor.execute(&generator.spec, block, &db);
                        match &expected {
                            Err(_) => assert!(
                                matches!(&result, Err(ExecutionError::WorkerPanic(m)) if m.contains("trap")),
                                "{what}: the sequential executor panicked, parallel gave {result:?}"
                            ),
                            Ok(expected) => {
                                assert!(
                                    &result == expected,
                                    "{what}: parallel differs (errors: parallel {:?}, sequential {:?})",
                                    result.as_ref().err(),
                                    expected.as_ref().err()
                                )
                            }
                        }
                    }
                    match (what, &expected) {
                        ("whole", Err(_)) => {
                            block_panicked = true;
                            panicked += 1
                        }
                        ("whole", Ok(_)) => valid += 1,
                        (_, Ok(Err(ExecutionError::InvalidTransaction { .. })))
                            if block_panicked =>
                        {
                            gap_first += 1
                        }
                        _ => {}
                    }
                }
                let out = SequentialExecutor
                    .execute(&generator.spec, &block, &state)
                    .expect("a valid block");
                state.apply_bundle(&out.bundle);
                state.block_hashes.insert(block.number(), block.hash);
                db.inner = state.clone();
            }
        }
    }
    eprintln!(
        "blocks that panicked {panicked}, stayed valid {valid}, met the gap first {gap_first}"
    );
    assert!(
        panicked > 0 && valid > 0 && gap_first > 0,
        "blocks that panicked {panicked}, stayed valid {valid}, met the gap first {gap_first}"
    );
}

/// A contract that reads `slow`'s balance, then sends 1 wei (what its caller sent it) to
/// `receiver`.
fn forwarder(slow: Address, receiver: Address) -> Vec<u8> {
    // PUSH20 slow, BALANCE, POP
    let mut code = vec![0x73];
    code.extend_from_slice(slow.as_slice());
    // PUSH1 0 (return size), PUSH1 0 (return offset), PUSH1 0 (input size), PUSH1 0 (input
    // offset), PUSH1 1 (value), PUSH20 receiver
    code.extend_from_slice(&[
        0x31, 0x50, 0x60, 0, 0x60, 0, 0x60, 0, 0x60, 0, 0x60, 1, 0x73,
    ]);
    code.extend_from_slice(receiver.as_slice());
    // GAS, CALL, POP, STOP
    code.extend_from_slice(&[0x5a, 0xf1, 0x50, 0x00]);
    code
}

/// A contract that reads `trap`'s balance while `receiver` has none.
fn checker(receiver: Address, trap: Address) -> Vec<u8> {
    // PUSH20 receiver, BALANCE, PUSH1 end, JUMPI, PUSH20 trap
    let mut code = vec![0x73];
    code.extend_from_slice(receiver.as_slice());
    code.extend_from_slice(&[0x31, 0x60, 0x30, 0x57, 0x73]);
    code.extend_from_slice(trap.as_slice());
    // BALANCE, POP; end (0x30): JUMPDEST, STOP
    code.extend_from_slice(&[0x31, 0x50, 0x5b, 0x00]);
    code
}

/// A speculative execution runs on a state no exact execution sees, and a reader may panic on
/// a key only such a run asks for. That must send the transaction to the exact path, not
/// reject a valid block.
#[test]
fn a_panic_only_speculation_meets_does_not_reject_the_block() {
    within(std::time::Duration::from_secs(300), || {
        let (generator, mut state) = Gen::new(Fork::Prague, 6);
        let (slow, trap) = (Address::new([0x98; 20]), Address::new([0x99; 20]));
        let receiver = Address::new([0x97; 20]);
        let (first, second) = (Address::new([0xf1; 20]), Address::new([0xf2; 20]));
        for (address, code) in [
            (first, forwarder(slow, receiver)),
            (second, checker(receiver, trap)),
        ] {
            let code = Bytecode::new_raw(code.into());
            state.insert_account(address, U256::ZERO, 1, Some(code), Default::default());
        }
        let call = |key: &Key, to: Address, value: u64| {
            key.sign(TxEip1559 {
                chain_id: CHAIN_ID,
                nonce: state.accounts[&key.address].info.nonce,
                gas_limit: 100_000,
                max_fee_per_gas: 10_000,
                max_priority_fee_per_gas: 3,
                to: TxKind::Call(to),
                value: U256::from(value),
                access_list: Default::default(),
                input: Bytes::new(),
            })
        };
        // The two calls name different contracts, so the hints do not order them.
        let block = block_of(
            vec![
                call(&generator.senders[0], first, 1),
                call(&generator.senders[1], second, 0),
            ],
            30_000_000,
        );
        let db = Exploding::new(state.clone(), trap, Some(slow));
        // In block order the receiver has its wei when the second call checks: no trap read.
        let expected = SequentialExecutor
            .execute(&generator.spec, &block, &db)
            .expect("valid block");
        assert_eq!(db.trap_reads.load(std::sync::atomic::Ordering::Relaxed), 0);
        for round in 0..3 {
            // Four threads: the committer only helps speculate, so the second call runs beside
            // the first (which waits on `slow` before it pays), sees no balance and reads the
            // trap.
            let executor = parallel(4);
            let actual = executor.execute(&generator.spec, &block, &db);
            assert_eq!(
                actual.as_ref().ok(),
                Some(&expected),
                "round {round}: {actual:?}"
            );
            let stats = executor.last_stats().expect("parallel path");
            assert!(stats.exact >= 1, "round {round}: {stats:?}");
        }
        // The case under test happened: speculation read the trap.
        assert!(db.trap_reads.load(std::sync::atomic::Ordering::Relaxed) >= 1);
    });
}

#[test]
fn small_blocks_take_the_sequential_path_by_gas() {
    let (mut generator, state) = Gen::new(Fork::Shanghai, 7);
    let mut block = generator.block(&state, 40);
    let limits: u64 = block
        .transactions
        .iter()
        .map(|tx| alloy_consensus::Transaction::gas_limit(tx.inner()))
        .sum();
    // Without a gas-used figure in the header the estimate is the sum of the gas limits.
    block.header.gas_used = 0;
    assert_eq!(overdrive_executor::block_gas_estimate(&block), limits);
    block.header.gas_used = 1_234;
    assert_eq!(overdrive_executor::block_gas_estimate(&block), 1_234);

    let executor = |min_gas| {
        overdrive_executor::ParallelExecutor::new(overdrive_executor::ParallelConfig {
            threads: 2,
            min_txs_for_parallel: 0,
            min_gas_for_parallel: min_gas,
            ..Default::default()
        })
    };
    // Below the threshold: the sequential path, which leaves no committer statistics.
    let small = executor(1_235);
    assert_equal(&small, &generator.spec, &block, &state, "below").expect("valid");
    assert!(small.last_stats().is_none());
    // At it: the parallel path.
    let large = executor(1_234);
    assert_equal(&large, &generator.spec, &block, &state, "at").expect("valid");
    assert!(large.last_stats().is_some());
}

/// An account that exists empty in the database (a genesis file may hold one), is credited
/// lazily and then sends. `revm::State` caches an empty account as `AccountInfo::default()`,
/// with its (empty) code attached; speculation must see the credited account the same way,
/// or the send fails validation and runs twice.
#[test]
fn an_empty_account_credited_lazily_then_sending_validates() {
    let (generator, mut state) = Gen::new(Fork::Prague, 8);
    let empty = Key::new(8_008, 0);
    state.insert_account(empty.address, U256::ZERO, 0, None, Default::default());
    let nonce = |key: &Key| state.accounts[&key.address].info.nonce;
    let ether = U256::from(10u64).pow(U256::from(18));
    let (a, b, c) = (
        &generator.senders[0],
        &generator.senders[1],
        &generator.senders[2],
    );
    // Two plain transfers to it make it a lazy recipient; then it sends.
    let block = block_of(
        vec![
            transfer(a, nonce(a), empty.address, ether, 21_000),
            transfer(b, nonce(b), empty.address, ether, 21_000),
            transfer(&empty, 0, c.address, U256::from(1), 21_000),
        ],
        30_000_000,
    );
    for run in 0..8 {
        // Four threads: every transaction is speculated and validated (`speculate_all`).
        let executor = parallel(4);
        assert_equal(&executor, &generator.spec, &block, &state, "empty account")
            .expect("valid block");
        let stats = executor.last_stats().expect("parallel path");
        assert_eq!(stats.exact, 0, "run {run}: {stats:?}");
    }
}
