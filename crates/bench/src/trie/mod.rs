//! The `overdrive bench trie` workload: ERC20-shaped blocks over a large state, rooted four
//! ways.
//!
//! Each block is `transfers` token transfers: every sender's account changes (nonce and
//! balance, as paying gas does) and the token contract's storage changes in two balance slots
//! (sender and receiver). The token holds one balance slot per account, so its storage trie is
//! as large as the account trie. Keys are hashed before timing starts. The four roots:
//!
//! - (a) `full_rebuild`: alloy-trie `HashBuilder` over every leaf of the token storage and of
//!   the account trie.
//! - (b) `reth_style`: a serial incremental root over stored branch nodes (the `reth_style`
//!   module), storage trie then account trie, including the update of its stored nodes. Its
//!   inputs are laid out as reth keeps them: sorted hashed accounts without storage
//!   roots, sorted hashed slots, and contract storage roots looked up for every account leaf it
//!   re-hashes. Writing the new leaf values into the sorted maps is not timed (reth's hashing
//!   stages do that before its merkle stage).
//! - (c) `overdrive_1t`: [`StateTrie::apply`] with one thread, including the store write.
//! - (d) `overdrive`: the same with `threads` threads.
//!
//! All four must agree on every block's root.
//!
//! With [`TrieBenchConfig::co_run_reference`], each block also measures a yardstick for (d)
//! (the `co_run` module): `threads` one-thread tries, each on its own core and its own copy of
//! the state, apply other blocks one after another and then all at once.

mod co_run;
mod evict;
mod reth_style;

use crate::{BenchError, RoundTrips};
use alloy_primitives::{Address, B256, U256, keccak256, map::B256Map};
use alloy_rlp::Encodable;
use alloy_trie::{EMPTY_ROOT_HASH, HashBuilder, KECCAK_EMPTY, Nibbles, TrieAccount};
use co_run::CoRun;
use evict::Evictor;
use overdrive_trie::{
    HashedAccount, HashedStateChanges, HashedStorageChanges, MemNodeStore, StateTrie, TrieConfig,
};
use rand::{Rng, SeedableRng, rngs::SmallRng};
use reth_style::StoredBranches;
use serde::Serialize;
use std::{collections::BTreeMap, fmt, time::Instant};

/// Settings of one benchmark run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TrieBenchConfig {
    /// Accounts in the state (and balance slots in the token's storage).
    pub accounts: usize,
    /// Measured blocks (one more, unmeasured, warms up).
    pub blocks: usize,
    /// Threads of the parallel run (d).
    pub threads: usize,
    /// Token transfers per block.
    pub transfers: usize,
    /// Seed of the state and the blocks.
    pub seed: u64,
    /// Pin the tries' workers to cores ([`TrieConfig::pin_workers`]).
    pub pin_workers: bool,
    /// MiB of heap to touch and free after the set-up, before the first block
    /// ([`crate::prefault_heap`]); 0 measures on the heap the set-up left.
    pub prefault_heap_mib: usize,
    /// After each block, measure a round of the co-run reference (the `co_run` module).
    pub co_run_reference: bool,
    /// Keep one copy of the trie's nodes instead of two, which lets 10M accounts run in 24
    /// GiB: (c) and (d) take turns on one store, each applying the block after its own
    /// untimed take-back of it (an apply of the block's previous values; see `hand_over`).
    /// Implies `evict_caches`, so that neither finds what the take-back touched in a cache.
    pub one_store: bool,
    /// Before (c) and before (d), every core writes twice its share of each cache, so that
    /// both start with nothing of the trie in any cache (the `evict` module).
    pub evict_caches: bool,
}

impl Default for TrieBenchConfig {
    fn default() -> Self {
        Self {
            accounts: 100_000,
            blocks: 10,
            threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
            transfers: 6_000,
            seed: 1,
            pin_workers: true,
            prefault_heap_mib: 0,
            co_run_reference: false,
            one_store: false,
            evict_caches: false,
        }
    }
}

/// A millisecond figure to the microsecond in the JSON, without float noise in the last
/// places (`147.85725000000002`).
fn micros<S: serde::Serializer>(ms: &f64, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(crate::round(*ms, 3))
}

/// A ratio to three decimals in the JSON.
fn thousandths<S: serde::Serializer>(x: &Option<f64>, s: S) -> Result<S::Ok, S::Error> {
    match x {
        Some(x) => s.serialize_some(&crate::round(*x, 3)),
        None => s.serialize_none(),
    }
}

/// Result of a run: medians over the measured blocks. Serializes to exactly the JSON fields
/// of `overdrive bench trie --json`; the skipped fields are for the human-readable print.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TrieBenchReport {
    /// Always `"trie"`.
    pub bench: String,
    /// Accounts in the state.
    pub accounts: usize,
    /// Threads of run (d).
    pub threads: usize,
    /// (a) Full `HashBuilder` rebuild, ms per block.
    #[serde(serialize_with = "micros")]
    pub full_rebuild_ms: f64,
    /// (b) reth-style serial incremental root, ms per block.
    #[serde(serialize_with = "micros")]
    pub reth_style_ms: f64,
    /// (c) overdrive on one thread, ms per block.
    #[serde(serialize_with = "micros")]
    pub overdrive_1t_ms: f64,
    /// (d) overdrive on `threads` threads, ms per block.
    #[serde(serialize_with = "micros")]
    pub overdrive_ms: f64,
    /// Keccak calls of (d) per block.
    pub keccak_calls: u64,
    /// Nodes (d) re-encoded and wrote per block.
    pub dirty_nodes: u64,
    /// Whether all four roots agreed on every block.
    pub roots_equal: bool,
    /// With the co-run reference: what `threads` one-thread tries side by side gain over the
    /// same run one after another, summed over the blocks (the `co_run` module).
    #[serde(
        skip_serializing_if = "Option::is_none",
        serialize_with = "thousandths"
    )]
    pub co_run_speedup: Option<f64>,
    /// Measured blocks.
    #[serde(skip)]
    pub blocks: usize,
    /// Changed accounts per block (median).
    #[serde(skip)]
    pub changed_accounts: usize,
    /// Changed token slots per block (median).
    #[serde(skip)]
    pub changed_slots: usize,
    /// Time of (d) computing the root only, without the store write, ms per block.
    #[serde(skip)]
    pub overdrive_compute_ms: f64,
    /// Seconds spent building the initial state for all four.
    #[serde(skip)]
    pub setup_s: f64,
    /// Whether (c) and (d) took turns on one store ([`TrieBenchConfig::one_store`]); in the
    /// JSON only when they did.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub one_store: bool,
    /// Whether every core's caches were evicted before (c) and (d)
    /// ([`TrieBenchConfig::evict_caches`]); in the JSON only when they were.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub evicted_caches: bool,
    /// The core-to-core round trip before each measured block
    /// ([`crate::core_round_trip`]): the state of the machine the (d) figure was
    /// taken in.
    #[serde(skip)]
    pub core_round_trips: RoundTrips,
}

impl fmt::Display for TrieBenchReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ratio = |a: f64, b: f64| if b > 0.0 { a / b } else { f64::NAN };
        writeln!(
            f,
            "trie bench: {} accounts, token storage of {} slots, {} blocks of ~{} changed accounts + ~{} changed slots (setup {:.1} s)",
            self.accounts,
            self.accounts,
            self.blocks,
            self.changed_accounts,
            self.changed_slots,
            self.setup_s
        )?;
        writeln!(f, "  median ms per block")?;
        writeln!(
            f,
            "  (a) full HashBuilder rebuild     {:>9.2}",
            self.full_rebuild_ms
        )?;
        writeln!(
            f,
            "  (b) reth-style incremental       {:>9.2}",
            self.reth_style_ms
        )?;
        writeln!(
            f,
            "  (c) overdrive, 1 thread          {:>9.2}   {:.2}x faster than (b)",
            self.overdrive_1t_ms,
            ratio(self.reth_style_ms, self.overdrive_1t_ms)
        )?;
        writeln!(
            f,
            "  (d) overdrive, {} threads         {:>9.2}   {:.2}x faster than (c)   (root only, no store write: {:.2})",
            self.threads,
            self.overdrive_ms,
            ratio(self.overdrive_1t_ms, self.overdrive_ms),
            self.overdrive_compute_ms
        )?;
        writeln!(
            f,
            "  keccak calls {} / dirty nodes {} per block",
            self.keccak_calls, self.dirty_nodes
        )?;
        if let Some(summary) = self.core_round_trips.summary() {
            writeln!(f, "  {summary}")?;
        }
        if let Some(co_run) = self.co_run_speedup {
            writeln!(
                f,
                "  co-run reference: {} one-thread tries side by side, {co_run:.2}x their time one after another; (c)/(d) is {:.2} of it",
                self.threads,
                ratio(self.overdrive_1t_ms, self.overdrive_ms) / co_run
            )?;
        }
        if self.one_store {
            writeln!(
                f,
                "  (c) and (d) took turns on one store, taken back to each block's pre-state between them"
            )?;
        }
        if self.evicted_caches {
            writeln!(f, "  every core's caches evicted before (c) and (d)")?;
        }
        write!(f, "  roots equal: {}", self.roots_equal)
    }
}

/// The flat state the baselines read, laid out as reth keeps it: hashed accounts (without
/// storage roots) and the token's hashed slots, sorted, plus the storage roots of contracts,
/// which the baseline looks up for every account leaf it re-hashes (reth computes or seeks one
/// per leaf, too).
struct FlatState {
    accounts: BTreeMap<B256, HashedAccount>,
    storage_roots: B256Map<B256>,
    slots: BTreeMap<B256, U256>,
}

fn encode_account(roots: &B256Map<B256>) -> impl FnMut(&B256, &HashedAccount, &mut Vec<u8>) + '_ {
    |address, account, out| {
        let root = roots.get(address).copied().unwrap_or(EMPTY_ROOT_HASH);
        TrieAccount {
            nonce: account.nonce,
            balance: account.balance,
            storage_root: root,
            code_hash: account.code_hash,
        }
        .encode(out);
    }
}

fn encode_slot(_: &B256, value: &U256, out: &mut Vec<u8>) {
    value.encode(out);
}

/// The generated world: plain values by account index, with every key hashed once up front.
struct World {
    hashed_addresses: Vec<B256>,
    hashed_slots: Vec<B256>,
    nonces: Vec<u64>,
    balances: Vec<U256>,
    token_balances: Vec<U256>,
    token: B256,
    token_code_hash: B256,
}

impl World {
    fn new(accounts: usize, rng: &mut SmallRng) -> Self {
        let hashed_addresses: Vec<B256> = (0..accounts as u64)
            .map(|i| keccak256(Address::from_word(B256::from(U256::from(i + 1)))))
            .collect();
        let hashed_slots: Vec<B256> = (0..accounts as u64)
            .map(|i| keccak256(U256::from(i).to_be_bytes::<32>()))
            .collect();
        Self {
            hashed_addresses,
            hashed_slots,
            nonces: (0..accounts).map(|_| rng.random_range(0..1_000)).collect(),
            balances: (0..accounts)
                .map(|_| U256::from(rng.random::<u64>()) << 8)
                .collect(),
            token_balances: (0..accounts)
                .map(|_| U256::from(rng.random_range(1u64 << 40..1u64 << 50)))
                .collect(),
            token: keccak256(Address::repeat_byte(0x70)),
            token_code_hash: keccak256(b"erc20"),
        }
    }

    fn account(&self, i: usize) -> HashedAccount {
        HashedAccount {
            nonce: self.nonces[i],
            balance: self.balances[i],
            code_hash: KECCAK_EMPTY,
        }
    }

    fn token_account(&self) -> HashedAccount {
        HashedAccount {
            nonce: 1,
            balance: U256::ZERO,
            code_hash: self.token_code_hash,
        }
    }

    /// The whole state as diffs against the empty trie, `chunk` accounts and as many token
    /// slots each: applied one after another they build the state a piece at a time, so that
    /// a large state's set-up never holds the whole state as one diff and its node writes
    /// besides the trie.
    fn genesis(&self, chunk: usize) -> impl Iterator<Item = HashedStateChanges> + '_ {
        let n = self.nonces.len();
        (0..n).step_by(chunk.max(1)).map(move |start| {
            let end = (start + chunk.max(1)).min(n);
            let mut diff = HashedStateChanges::default();
            diff.accounts.reserve(end - start + 1);
            for i in start..end {
                diff.accounts
                    .insert(self.hashed_addresses[i], Some(self.account(i)));
            }
            if start == 0 {
                diff.accounts.insert(self.token, Some(self.token_account()));
            }
            let slots: B256Map<U256> = (start..end)
                .map(|i| (self.hashed_slots[i], self.token_balances[i]))
                .collect();
            diff.storages.insert(
                self.token,
                HashedStorageChanges {
                    wiped: false,
                    slots,
                },
            );
            diff
        })
    }

    fn flat(&self, token_root: B256) -> FlatState {
        let mut accounts: BTreeMap<B256, HashedAccount> = self
            .hashed_addresses
            .iter()
            .enumerate()
            .map(|(i, h)| (*h, self.account(i)))
            .collect();
        accounts.insert(self.token, self.token_account());
        let slots = self
            .hashed_slots
            .iter()
            .copied()
            .zip(self.token_balances.iter().copied())
            .collect();
        let storage_roots = B256Map::from_iter([(self.token, token_root)]);
        FlatState {
            accounts,
            storage_roots,
            slots,
        }
    }

    /// One block of transfers: updates the world and returns the block's diff, the diff that
    /// takes it back, and the changed account and slot indices.
    fn block(&mut self, transfers: usize, rng: &mut SmallRng) -> Block {
        let n = self.nonces.len();
        // Drawn first, then applied: the previous values of what the block changes are read
        // in between (the draws are in the same order as when each was applied as drawn).
        let moves: Vec<(usize, usize, U256)> = (0..transfers)
            .map(|_| {
                let from = rng.random_range(0..n);
                let to = rng.random_range(0..n);
                (from, to, U256::from(rng.random_range(1u64..1_000_000)))
            })
            .collect();
        let mut senders: Vec<usize> = moves.iter().map(|&(from, ..)| from).collect();
        let mut slots: Vec<usize> = moves.iter().flat_map(|&(from, to, _)| [from, to]).collect();
        senders.sort_unstable();
        senders.dedup();
        slots.sort_unstable();
        slots.dedup();
        let undo = self.diff(&senders, &slots);
        for &(from, to, amount) in &moves {
            self.nonces[from] += 1;
            self.balances[from] = self.balances[from].saturating_sub(U256::from(21_000u64 * 7));
            self.token_balances[from] = self.token_balances[from]
                .saturating_sub(amount)
                .max(U256::from(1));
            self.token_balances[to] += amount;
        }
        Block {
            diff: self.diff(&senders, &slots),
            undo,
            senders,
            slots,
        }
    }

    /// The current values of the given accounts and token slots, as a diff.
    fn diff(&self, senders: &[usize], slots: &[usize]) -> HashedStateChanges {
        let mut diff = HashedStateChanges::default();
        for &i in senders {
            diff.accounts
                .insert(self.hashed_addresses[i], Some(self.account(i)));
        }
        let storage = slots
            .iter()
            .map(|&i| (self.hashed_slots[i], self.token_balances[i]))
            .collect();
        diff.storages.insert(
            self.token,
            HashedStorageChanges {
                wiped: false,
                slots: storage,
            },
        );
        diff
    }
}

/// One generated block.
struct Block {
    /// What the block changes.
    diff: HashedStateChanges,
    /// The same accounts and slots at their values before the block: applied after `diff`,
    /// it takes a trie back to the nodes it had (a Merkle-Patricia trie's nodes follow from
    /// its keys and values alone).
    undo: HashedStateChanges,
    /// Indices of the changed accounts, sorted.
    senders: Vec<usize>,
    /// Indices of the changed token slots, sorted.
    slots: Vec<usize>,
}

fn full_rebuild(flat: &FlatState, token: B256) -> B256 {
    let mut buf = Vec::with_capacity(128);
    let mut storage = HashBuilder::default();
    for (key, value) in &flat.slots {
        buf.clear();
        value.encode(&mut buf);
        storage.add_leaf(Nibbles::unpack(key), &buf);
    }
    let token_root = storage.root();
    let roots = B256Map::from_iter([(token, token_root)]);
    let mut encode = encode_account(&roots);
    let mut accounts = HashBuilder::default();
    for (key, account) in &flat.accounts {
        buf.clear();
        encode(key, account, &mut buf);
        accounts.add_leaf(Nibbles::unpack(key), &buf);
    }
    accounts.root()
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    match values.len() {
        0 => 0.0,
        n if n % 2 == 1 => values[n / 2],
        n => (values[n / 2 - 1] + values[n / 2]) / 2.0,
    }
}

fn median_u64(values: &mut [u64]) -> u64 {
    values.sort_unstable();
    values.get(values.len() / 2).copied().unwrap_or_default()
}

fn ms(start: Instant) -> f64 {
    start.elapsed().as_secs_f64() * 1e3
}

/// When `copies` copies of `bytes_each` bytes do not fit in `available_mib` MiB (unknown:
/// assumed to fit) with a tenth to spare: the MiB they need and the MiB available, so that a
/// run that cannot hold them gets an error before it starts copying, not the out-of-memory
/// killer halfway through. An eighth is added for the allocator's rounding: at 1M accounts a
/// copy estimated at 882 MiB took 955.
fn shortfall(
    copies: usize,
    bytes_each: usize,
    available_mib: Option<usize>,
) -> Option<(usize, usize)> {
    let available_mib = available_mib?;
    let needed_mib = (copies.saturating_mul(bytes_each) >> 20).saturating_mul(9) / 8;
    (needed_mib > available_mib / 10 * 9).then_some((needed_mib, available_mib))
}

/// Accounts per piece of the set-up's state (see [`World::genesis`]).
const GENESIS_CHUNK: usize = 1_000_000;

/// With [`TrieBenchConfig::one_store`]: hands the shared store, at a block's post-state, from
/// `from` to `to`, which takes it back to the pre-state with the block's undo (untimed). The
/// block's paths are then laid out as `to`'s own pool last wrote them, whichever trie is
/// timed next. (A first version took the store back on (d)'s side only: at 1M accounts its
/// (c)/(d) came out at 1.97–2.66 where two stores gave 1.61–2.15, in alternating runs.)
fn hand_over(
    from: &mut StateTrie,
    to: &mut StateTrie,
    block: &Block,
    pre_root: B256,
) -> Result<(), BenchError> {
    to.replace_store(from.replace_store(MemNodeStore::new())?)?;
    to.apply(&block.undo)?;
    if to.root() != pre_root {
        return Err(BenchError::Invariant(
            "a block's undo did not take the shared store back to the block's pre-state",
        ));
    }
    Ok(())
}

/// The most accounts the benchmark accepts: 100M accounts already take far more memory than a
/// 128 GiB machine has; a few digits more would overflow the allocations' sizes.
pub const MAX_ACCOUNTS: usize = 100_000_000;

/// The most transfers per block the benchmark accepts (the executor benchmark's limit on a
/// workload's transactions).
pub const MAX_TRANSFERS: usize = 10_000_000;

/// Runs the benchmark.
pub fn run(cfg: &TrieBenchConfig) -> Result<TrieBenchReport, BenchError> {
    if cfg.accounts < 2 || cfg.blocks == 0 || cfg.threads == 0 || cfg.transfers == 0 {
        return Err(BenchError::InvalidConfig(format!(
            "need accounts >= 2 and blocks, threads, transfers >= 1 (got {cfg:?})"
        )));
    }
    if cfg.accounts > MAX_ACCOUNTS || cfg.transfers > MAX_TRANSFERS {
        return Err(BenchError::InvalidConfig(format!(
            "need accounts <= {MAX_ACCOUNTS} and transfers <= {MAX_TRANSFERS} (got {} and {})",
            cfg.accounts, cfg.transfers
        )));
    }
    if cfg.one_store && cfg.co_run_reference {
        // The reference's blocks change the generated world without touching the measured
        // tries, so a block's previous values in the world are not the shared store's.
        return Err(BenchError::InvalidConfig(
            "one_store and co_run_reference cannot be combined".into(),
        ));
    }
    let setup = Instant::now();
    let mut rng = SmallRng::seed_from_u64(cfg.seed);
    let mut world = World::new(cfg.accounts, &mut rng);
    tracing::info!(accounts = cfg.accounts, elapsed = ?setup.elapsed(), "state generated");

    let config = |threads| TrieConfig {
        threads,
        pin_workers: cfg.pin_workers,
        ..TrieConfig::default()
    };
    // With `one_store` the serial trie holds an empty store between its turns on the
    // parallel trie's (see `TrieBenchConfig::one_store`).
    let mut serial = StateTrie::new(MemNodeStore::new(), config(1))?;
    let mut parallel = StateTrie::new(MemNodeStore::new(), config(cfg.threads))?;
    // Applies the genesis state in pieces and logs how far the set-up got.
    let build = |trie: &mut StateTrie<MemNodeStore>, done: &str| -> Result<(), BenchError> {
        for chunk in world.genesis(GENESIS_CHUNK) {
            trie.apply(&chunk)?;
        }
        tracing::info!(
            elapsed = ?setup.elapsed(),
            resident_mib = crate::resident_mib(),
            "{done}"
        );
        Ok(())
    };
    // Built on the parallel trie's pool, then the serial trie gets its own copy of the nodes.
    build(&mut parallel, "genesis trie built")?;
    if !cfg.one_store {
        let bytes = parallel.store().heap_bytes();
        if let Some((needed_mib, available_mib)) = shortfall(1, bytes, crate::available_mib()) {
            return Err(BenchError::InvalidConfig(format!(
                "the one-thread trie's own copy of the state needs about {needed_mib} MiB and \
                 {available_mib} MiB are available: use --one-store (or fewer --accounts)"
            )));
        }
        build(&mut serial, "one-thread trie's copy built")?;
    }

    let token_root = parallel.storage_root(world.token)?;
    let mut flat = world.flat(token_root);
    let mut reth_storage = StoredBranches::build(&flat.slots, encode_slot);
    let mut reth_accounts =
        StoredBranches::build(&flat.accounts, encode_account(&flat.storage_roots));
    let mut roots_equal =
        reth_accounts.update(&flat.accounts, &[], encode_account(&flat.storage_roots))
            == parallel.root()
            && (cfg.one_store || serial.root() == parallel.root());
    // Without it, the two-thread trie's first blocks pay for the heap's growth: on a
    // 1M-account run it took 500–4,500 page faults a block (the one-thread trie none), each
    // 1–12 µs of one of its two threads (BENCHMARKS.md, the trie's twelfth round).
    let mut co_run = if cfg.co_run_reference {
        Some(CoRun::new(&serial, cfg)?)
    } else {
        None
    };
    let evictor = if cfg.evict_caches || cfg.one_store {
        let evictor = Evictor::new(cfg.pin_workers)?;
        tracing::info!(
            mib_per_core = evictor.bytes() >> 20,
            "caches evicted before (c) and (d)"
        );
        Some(evictor)
    } else {
        None
    };
    crate::prefault_heap(cfg.prefault_heap_mib);
    let setup_s = setup.elapsed().as_secs_f64();
    tracing::info!(
        elapsed = ?setup.elapsed(),
        resident_mib = crate::resident_mib(),
        "reference tries built, measuring"
    );

    let (mut full_ms, mut reth_ms, mut one_ms, mut par_ms, mut compute_ms) =
        (vec![], vec![], vec![], vec![], vec![]);
    let (mut keccak_calls, mut dirty_nodes, mut changed_accounts, mut changed_slots) =
        (vec![], vec![], vec![], vec![]);
    let mut round_trips = RoundTrips::default();
    for block in 0..=cfg.blocks {
        let block_data = world.block(cfg.transfers, &mut rng);
        let (diff, senders, slots) = (&block_data.diff, &block_data.senders, &block_data.slots);
        // The flat state is the baselines' input, written before their timers start (as
        // reth's hashing stages run before its merkle stage).
        for &i in senders {
            flat.accounts
                .insert(world.hashed_addresses[i], world.account(i));
        }
        for &i in slots {
            flat.slots
                .insert(world.hashed_slots[i], world.token_balances[i]);
        }

        // (a)
        let start = Instant::now();
        let full_root = full_rebuild(&flat, world.token);
        let full_time = ms(start);

        // (b)
        let start = Instant::now();
        let mut changed: Vec<Nibbles> = slots
            .iter()
            .map(|&i| Nibbles::unpack(world.hashed_slots[i]))
            .collect();
        changed.sort_unstable();
        let token_root = reth_storage.update(&flat.slots, &changed, encode_slot);
        flat.storage_roots.insert(world.token, token_root);
        let mut changed: Vec<Nibbles> = senders
            .iter()
            .map(|&i| Nibbles::unpack(world.hashed_addresses[i]))
            .collect();
        changed.push(Nibbles::unpack(world.token));
        changed.sort_unstable();
        let reth_root = reth_accounts.update(
            &flat.accounts,
            &changed,
            encode_account(&flat.storage_roots),
        );
        let reth_time = ms(start);

        // Untimed: what a hand-off between the two cores costs right now.
        if block > 0 {
            round_trips.measure();
        }

        // (c)
        let pre_root = parallel.root();
        if cfg.one_store {
            parallel.apply(diff)?;
            hand_over(&mut parallel, &mut serial, &block_data, pre_root)?;
        }
        if let Some(evictor) = &evictor {
            evictor.evict();
        }
        let start = Instant::now();
        // The output is dropped after (d), as (d)'s is: freeing its node writes is not timed.
        let one = serial.apply(diff)?;
        let one_time = ms(start);

        // (d), root alone then the store write
        if cfg.one_store {
            hand_over(&mut serial, &mut parallel, &block_data, pre_root)?;
        }
        if let Some(evictor) = &evictor {
            evictor.evict();
        }
        let start = Instant::now();
        let output = parallel.compute(diff)?;
        let compute_time = ms(start);
        parallel.commit(&output)?;
        let par_time = ms(start);

        roots_equal &= full_root == reth_root && reth_root == one.root && one.root == output.root;
        // After (d), so that (a) to (d) run in the same order with or without it.
        if let Some(co_run) = co_run.as_mut() {
            co_run.round(&mut world, cfg.transfers, block > 0)?;
        }
        tracing::info!(
            block,
            of = cfg.blocks,
            full_rebuild_ms = full_time,
            reth_style_ms = reth_time,
            overdrive_1t_ms = one_time,
            overdrive_ms = par_time,
            roots_equal,
            warm_up = block == 0,
            "block"
        );
        if block == 0 {
            continue;
        }
        full_ms.push(full_time);
        reth_ms.push(reth_time);
        one_ms.push(one_time);
        par_ms.push(par_time);
        compute_ms.push(compute_time);
        keccak_calls.push(output.stats.keccak_calls);
        dirty_nodes.push(output.stats.dirty_nodes);
        changed_accounts.push(senders.len() as u64 + 1);
        changed_slots.push(slots.len() as u64);
    }

    Ok(TrieBenchReport {
        bench: "trie".to_string(),
        accounts: cfg.accounts,
        threads: cfg.threads,
        full_rebuild_ms: median(&mut full_ms),
        reth_style_ms: median(&mut reth_ms),
        overdrive_1t_ms: median(&mut one_ms),
        overdrive_ms: median(&mut par_ms),
        keccak_calls: median_u64(&mut keccak_calls),
        dirty_nodes: median_u64(&mut dirty_nodes),
        roots_equal,
        co_run_speedup: co_run.map(|c| c.speedup()),
        blocks: cfg.blocks,
        changed_accounts: median_u64(&mut changed_accounts) as usize,
        changed_slots: median_u64(&mut changed_slots) as usize,
        overdrive_compute_ms: median(&mut compute_ms),
        setup_s,
        one_store: cfg.one_store,
        evicted_caches: evictor.is_some(),
        core_round_trips: round_trips,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_run_agrees_and_serializes_exact_fields() {
        let cfg = TrieBenchConfig {
            accounts: 3_000,
            blocks: 2,
            threads: 2,
            transfers: 500,
            seed: 3,
            pin_workers: true,
            prefault_heap_mib: 4,
            co_run_reference: false,
            one_store: false,
            evict_caches: false,
        };
        let report = run(&cfg).unwrap();
        assert!(report.roots_equal);
        assert!(report.keccak_calls <= report.dirty_nodes);
        assert!(report.dirty_nodes > 500);
        let json = serde_json::to_value(&report).unwrap();
        let keys: Vec<&str> = json
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        let mut expected = vec![
            "bench",
            "accounts",
            "threads",
            "full_rebuild_ms",
            "reth_style_ms",
            "overdrive_1t_ms",
            "overdrive_ms",
            "keccak_calls",
            "dirty_nodes",
            "roots_equal",
        ];
        let mut keys_sorted = keys.clone();
        keys_sorted.sort_unstable();
        expected.sort_unstable();
        assert_eq!(keys_sorted, expected);
        assert_eq!(json["bench"], "trie");
        assert!(report.to_string().contains("roots equal: true"));
        // At most one round trip per measured block (none where two cores cannot be
        // pinned, and a loaded machine may miss one), and the line that reports them.
        let trips = &report.core_round_trips;
        assert!(trips.len() <= cfg.blocks);
        if crate::core_round_trip(10).is_some() {
            assert!(!trips.is_empty());
        }
        assert_eq!(
            report.to_string().contains("core-to-core round trip"),
            !trips.is_empty()
        );
    }

    #[test]
    fn co_run_reference_adds_its_field() {
        let cfg = TrieBenchConfig {
            accounts: 2_000,
            blocks: 2,
            threads: 2,
            transfers: 200,
            seed: 4,
            pin_workers: true,
            prefault_heap_mib: 0,
            co_run_reference: true,
            one_store: false,
            evict_caches: false,
        };
        let report = run(&cfg).unwrap();
        assert!(report.roots_equal);
        let speedup = report.co_run_speedup.expect("asked for");
        assert!(speedup.is_finite() && speedup > 0.0, "{speedup}");
        let json = serde_json::to_value(&report).unwrap();
        // In the JSON to three decimals.
        assert_eq!(
            json["co_run_speedup"].as_f64(),
            Some((speedup * 1e3).round() / 1e3)
        );
        assert!(
            report
                .to_string()
                .contains("co-run reference: 2 one-thread tries")
        );
    }

    /// One shared store measures the same blocks as two: same roots, same work per block.
    #[test]
    fn one_store_runs_the_same_blocks() {
        let cfg = TrieBenchConfig {
            accounts: 2_500,
            blocks: 3,
            threads: 2,
            transfers: 300,
            seed: 6,
            ..TrieBenchConfig::default()
        };
        let two = run(&cfg).unwrap();
        let one = run(&TrieBenchConfig {
            one_store: true,
            ..cfg
        })
        .unwrap();
        assert!(one.roots_equal && two.roots_equal);
        assert_eq!(
            (one.keccak_calls, one.dirty_nodes, one.changed_slots),
            (two.keccak_calls, two.dirty_nodes, two.changed_slots)
        );
        // The JSON says how the figures were taken, and only when they were taken so.
        let json = serde_json::to_value(&one).unwrap();
        assert_eq!(json["one_store"], true);
        assert_eq!(json["evicted_caches"], true);
        let json = serde_json::to_value(&two).unwrap();
        assert!(json.get("one_store").is_none() && json.get("evicted_caches").is_none());
    }

    /// The set-up's state built in pieces is the state built at once, node for node, and a
    /// block's undo takes it back there.
    #[test]
    fn genesis_in_pieces_and_undo() {
        let mut world = World::new(2_000, &mut SmallRng::seed_from_u64(8));
        let build = |world: &World, chunk: usize| {
            let mut trie =
                StateTrie::new(MemNodeStore::new(), TrieConfig::with_threads(1)).unwrap();
            for piece in world.genesis(chunk) {
                trie.apply(&piece).unwrap();
            }
            trie
        };
        let whole = build(&world, usize::MAX);
        let mut pieces = build(&world, 700);
        assert_eq!(world.genesis(700).count(), 3);
        assert_eq!(whole.root(), pieces.root());
        assert_eq!(whole.store().len(), pieces.store().len());
        let token = overdrive_trie::TrieId::Storage(world.token);
        assert_eq!(whole.store().nodes(token), pieces.store().nodes(token));

        let block = world.block(400, &mut SmallRng::seed_from_u64(9));
        let before = pieces.store().nodes(overdrive_trie::TrieId::Account);
        assert_ne!(pieces.apply(&block.diff).unwrap().root, whole.root());
        assert_eq!(pieces.apply(&block.undo).unwrap().root, whole.root());
        assert_eq!(
            pieces.store().nodes(overdrive_trie::TrieId::Account),
            before
        );
        assert_eq!(pieces.store().nodes(token), whole.store().nodes(token));
    }

    #[test]
    fn copies_that_do_not_fit_are_refused() {
        assert_eq!(
            shortfall(16, 2 << 30, Some(24 << 10)),
            Some((36 << 10, 24 << 10))
        );
        assert_eq!(shortfall(2, 2 << 30, Some(24 << 10)), None);
        assert!(shortfall(usize::MAX, usize::MAX, Some(1)).is_some());
        assert_eq!(
            shortfall(16, 2 << 30, None),
            None,
            "unknown memory: assumed to fit"
        );
    }

    #[test]
    fn bad_config_is_an_error() {
        for cfg in [
            TrieBenchConfig {
                accounts: 0,
                ..TrieBenchConfig::default()
            },
            TrieBenchConfig {
                accounts: usize::MAX,
                ..TrieBenchConfig::default()
            },
            TrieBenchConfig {
                transfers: MAX_TRANSFERS + 1,
                ..TrieBenchConfig::default()
            },
            TrieBenchConfig {
                one_store: true,
                co_run_reference: true,
                ..TrieBenchConfig::default()
            },
        ] {
            assert!(
                matches!(run(&cfg), Err(BenchError::InvalidConfig(_))),
                "{cfg:?}"
            );
        }
    }
}
