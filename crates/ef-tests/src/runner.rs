use crate::fixture::{Fixture, FixtureAccount, FixtureConfig};
use alloy_consensus::{Block, Header, TxEnvelope};
use alloy_eips::eip7840::BlobParams;
use alloy_genesis::{ChainConfig, Genesis};
use alloy_primitives::{B256, map::HashMap};
use alloy_rlp::Decodable;
use overdrive_consensus::{
    validate_body, validate_header, validate_post_execution, validate_state_root,
    validate_system_contracts,
};
use overdrive_executor::{
    BlockOutput, CommitStats, ExecuteBlock, ExecutionError, ParallelConfig, ParallelExecutor,
    Scheduling, SequentialExecutor, TransitionFolding,
};
use overdrive_primitives::{
    BlockWithSenders, ChainParams, EthereumHardfork, MemState, merged_chain_config,
};
use overdrive_trie::{HashedStateChanges, MemNodeStore, StateTrie, TrieConfig};
use revm::primitives::KECCAK_EMPTY;
use std::{
    collections::BTreeMap,
    panic::AssertUnwindSafe,
    path::{Path, PathBuf},
    sync::Arc,
    sync::atomic::{AtomicU64, AtomicUsize, Ordering},
    time::{Duration, Instant},
};

/// Which executor imports the blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ExecutorChoice {
    /// alloy-evm's `EthBlockExecutor`, the reference.
    #[default]
    Sequential,
    /// overdrive's parallel executor with this many threads. The sequential fallback for small
    /// blocks is switched off: fixture blocks are tiny, and the point is to test the parallel
    /// path.
    Parallel {
        /// Threads, the committing thread included.
        threads: usize,
    },
}

/// Which trie computes state roots.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum StateRootChoice {
    /// overdrive's trie, updated incrementally block by block (side chains fork a copy).
    #[default]
    Overdrive,
    /// A full alloy-trie `HashBuilder` build of the whole state, the reference.
    Reference,
}

/// How to run the fixtures.
#[derive(Debug, Clone, Copy, Default)]
pub struct RunOptions {
    /// Executor to import blocks with.
    pub executor: ExecutorChoice,
    /// Trie to compute state roots with.
    pub state_root: StateRootChoice,
    /// Workers of overdrive's trie (0 and 1: one thread, no splitting). With more, each test's
    /// trie gets its own pool and splits every subtree with two or more changes, so that the
    /// fixtures' small tries take the parallel paths (tasks, their merge, wipes across a split).
    pub trie_threads: usize,
}

/// The outcome of one test.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Every block behaved as the fixture says and head and post-state match.
    Passed,
    /// Something differed; the reason says what.
    Failed(String),
    /// Not run; the reason says why.
    Skipped(String),
}

/// One test's result.
#[derive(Debug, Clone)]
pub struct TestResult {
    /// Fixture file.
    pub file: PathBuf,
    /// Test name inside the file.
    pub name: String,
    /// Network (fork schedule) of the test, or `?` for an unreadable fixture.
    pub network: String,
    /// What happened.
    pub outcome: Outcome,
    /// How the parallel executor ran the test's blocks (zero with the sequential one).
    pub executed: ExecCounts,
}

/// How the parallel executor ran a test's blocks: evidence that the fixtures exercise its
/// parallel path rather than its sequential fallback.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ExecCounts {
    /// Imported blocks the parallel path executed (one rejected, by the executor or by a check
    /// after it, is not counted).
    pub parallel_blocks: usize,
    /// Their transactions committed from a speculative result that passed validation.
    pub speculated: usize,
    /// Their transactions the committer executed exactly: the runner's parallel executor
    /// speculates every transaction, so only those whose speculative result failed validation.
    pub exact: usize,
    /// Of the parallel blocks, those whose state transitions the pool folded (the runner asks
    /// for [`TransitionFolding::Pool`]; a block that went sequential hands them back).
    pub pool_folded: usize,
}

impl std::ops::AddAssign for ExecCounts {
    fn add_assign(&mut self, other: Self) {
        self.parallel_blocks += other.parallel_blocks;
        self.speculated += other.speculated;
        self.exact += other.exact;
        self.pool_folded += other.pool_folded;
    }
}

/// Results of a run.
#[derive(Debug, Default)]
pub struct Summary {
    /// Every test's result, in file order.
    pub results: Vec<TestResult>,
}

impl Summary {
    /// (passed, failed, skipped).
    pub fn counts(&self) -> (usize, usize, usize) {
        let mut c = (0, 0, 0);
        for r in &self.results {
            match r.outcome {
                Outcome::Passed => c.0 += 1,
                Outcome::Failed(_) => c.1 += 1,
                Outcome::Skipped(_) => c.2 += 1,
            }
        }
        c
    }

    /// How the parallel executor ran the blocks of every test.
    pub fn executed(&self) -> ExecCounts {
        let mut total = ExecCounts::default();
        for r in &self.results {
            total += r.executed;
        }
        total
    }

    /// The skipped tests, by reason.
    pub fn skipped_by_reason(&self) -> BTreeMap<&str, Vec<&TestResult>> {
        let mut m: BTreeMap<&str, Vec<&TestResult>> = BTreeMap::new();
        for r in &self.results {
            if let Outcome::Skipped(why) = &r.outcome {
                m.entry(why.as_str()).or_default().push(r);
            }
        }
        m
    }

    /// (passed, failed, skipped) per network.
    pub fn by_network(&self) -> BTreeMap<&str, (usize, usize, usize)> {
        let mut m: BTreeMap<&str, (usize, usize, usize)> = BTreeMap::new();
        for r in &self.results {
            let e = m.entry(r.network.as_str()).or_default();
            match r.outcome {
                Outcome::Passed => e.0 += 1,
                Outcome::Failed(_) => e.1 += 1,
                Outcome::Skipped(_) => e.2 += 1,
            }
        }
        m
    }
}

/// All `.json` files under the given files or directories, sorted.
pub fn collect_files(paths: &[PathBuf]) -> std::io::Result<Vec<PathBuf>> {
    fn walk(path: &Path, out: &mut Vec<PathBuf>) -> std::io::Result<()> {
        if path.is_dir() {
            let with_path = |e: std::io::Error| {
                std::io::Error::new(e.kind(), format!("{}: {e}", path.display()))
            };
            for entry in std::fs::read_dir(path).map_err(with_path)? {
                walk(&entry.map_err(with_path)?.path(), out)?;
            }
        } else if path.extension().is_some_and(|e| e == "json") {
            out.push(path.to_path_buf());
        } else if !path.exists() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::NotFound,
                format!("{} does not exist", path.display()),
            ));
        }
        Ok(())
    }
    let mut out = Vec::new();
    for p in paths {
        walk(p, &mut out)?;
    }
    out.sort();
    Ok(out)
}

/// Runs every test in every fixture file under `paths`, files in parallel.
pub fn run_paths(paths: &[PathBuf], options: RunOptions) -> std::io::Result<Summary> {
    Runner::new(options).run_paths(paths)
}

/// Runs every test of one fixture file. An unreadable file is one failed test.
pub fn run_file(path: &Path, options: RunOptions) -> Vec<TestResult> {
    Runner::new(options).run_file(path)
}

/// Tests skipped on purpose, by identity: the fixture file's name and a part of the test's name
/// (its key in the file). Nothing else is ever skipped: an unknown network, field or file is a
/// failed test.
pub const KNOWN_SKIPS: &[KnownSkip] = &[
    // ethereum/tests: every test of these files (their names start with the file's stem).
    KnownSkip::new(
        "create2collisionStorageParis.json",
        "create2collisionStorageParis_",
        EIP7610,
    ),
    KnownSkip::new(
        "RevertInCreateInInit_Paris.json",
        "RevertInCreateInInit_Paris_",
        EIP7610,
    ),
    KnownSkip::new(
        "RevertInCreateInInitCreate2Paris.json",
        "RevertInCreateInInitCreate2Paris_",
        EIP7610,
    ),
    KnownSkip::new(
        "create2collisionStorage.json",
        "create2collisionStorage_",
        EIP7610,
    ),
    KnownSkip::new(
        "RevertInCreateInInit.json",
        "RevertInCreateInInit_",
        EIP7610,
    ),
    KnownSkip::new(
        "RevertInCreateInInitCreate2.json",
        "RevertInCreateInInitCreate2_",
        EIP7610,
    ),
    KnownSkip::new(
        "dynamicAccountOverwriteEmpty.json",
        "dynamicAccountOverwriteEmpty_",
        EIP7610,
    ),
    KnownSkip::new(
        "dynamicAccountOverwriteEmpty_Paris.json",
        "dynamicAccountOverwriteEmpty_Paris_",
        EIP7610,
    ),
    KnownSkip::new("InitCollision.json", "InitCollision_", EIP7610),
    KnownSkip::new("InitCollisionParis.json", "InitCollisionParis_", EIP7610),
    // execution-spec-tests: the collision tests whose target holds storage and a balance, but
    // no code and nonce 0 (those with code or a nonce collide under revm's rule too, and run).
    KnownSkip::new(
        "test_init_collision_create_opcode.json",
        "-non-empty-balance-",
        EIP7610,
    ),
    KnownSkip::new(
        "test_init_collision_create_tx.json",
        "-non-empty-balance-",
        EIP7610,
    ),
];
const EIP7610: &str = "EIP-7610 create collision with a storage-only account: impossible on \
    mainnet, not implemented by revm 42 (reth v2.5.1's EVM); reth's ef-tests skip it too";

/// A test skipped on purpose: see [`KNOWN_SKIPS`].
#[derive(Debug, Clone, Copy)]
pub struct KnownSkip {
    /// The fixture file's name.
    pub file: &'static str,
    /// A part of the test's name.
    pub test: &'static str,
    /// Why it is skipped.
    pub reason: &'static str,
}

impl KnownSkip {
    const fn new(file: &'static str, test: &'static str, reason: &'static str) -> Self {
        Self { file, test, reason }
    }

    /// The known skip `name` in `file` is, if any.
    pub fn find(file: &Path, name: &str) -> Option<&'static Self> {
        let file = file.file_name()?;
        KNOWN_SKIPS
            .iter()
            .find(|skip| file == skip.file && name.contains(skip.test))
    }
}

/// Stack of a test thread: deep EVM call chains in unoptimised test builds need more than
/// the 2 MiB default.
const TEST_THREAD_STACK: usize = 64 << 20;

/// How often a run over many files logs how far it has got.
const PROGRESS_EVERY: Duration = Duration::from_secs(10);

/// Files done out of a run's total, and when to say so next. Shared by the test threads;
/// only atomics, so a thread that finishes a file never waits on another.
struct Progress {
    started: Instant,
    every: Duration,
    total: usize,
    done: AtomicUsize,
    /// Milliseconds since `started` from which the next report is due.
    next_report_ms: AtomicU64,
}

impl Progress {
    fn new(total: usize, every: Duration) -> Self {
        Self {
            started: Instant::now(),
            every,
            total,
            done: AtomicUsize::new(0),
            next_report_ms: AtomicU64::new(every.as_millis() as u64),
        }
    }

    /// Counts a finished file; returns the files done when a report is due (to one thread
    /// only, however many finish at once).
    fn file_done(&self) -> Option<usize> {
        let done = self.done.fetch_add(1, Ordering::Relaxed) + 1;
        let now = self.started.elapsed().as_millis() as u64;
        let due = self.next_report_ms.load(Ordering::Relaxed);
        let next = now + self.every.as_millis() as u64;
        (now >= due
            && self
                .next_report_ms
                .compare_exchange(due, next, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok())
        .then_some(done)
    }
}

/// The executors of one run, built once and shared by every test.
pub struct Runner {
    options: RunOptions,
    parallel: Option<ParallelExecutor>,
}

impl Runner {
    /// Builds the executor pools the options ask for.
    pub fn new(options: RunOptions) -> Self {
        let parallel = match options.executor {
            ExecutorChoice::Sequential => None,
            ExecutorChoice::Parallel { threads } => Some(ParallelExecutor::new(ParallelConfig {
                threads,
                // Every fixture block with a transaction takes the parallel path, and every
                // transaction is speculated and validated: also one alone in its block (the
                // committer would execute it itself), also a chain of one sender's (most
                // multi-transaction fixture blocks are).
                min_txs_for_parallel: 0,
                min_gas_for_parallel: 0,
                scheduling: Scheduling {
                    chain_fallback: false,
                    speculate_all: true,
                    // The pool folds the state transitions: the fixtures' self-destructs,
                    // re-creations and system calls go through that path too (the committer's
                    // is `revm::State`'s own, which the sequential executor runs).
                    transition_folding: TransitionFolding::Pool,
                    ..Scheduling::default()
                },
            })),
        };
        Self { options, parallel }
    }

    /// Runs every test in every fixture file under `paths`, files in parallel.
    ///
    /// Files are spread over plain scoped threads rather than rayon's global pool: a rayon
    /// worker that waits on another pool (the trie's, the parallel executor's) steals queued
    /// work from its own pool meanwhile, which would nest one test inside another on the same
    /// stack until it overflows.
    pub fn run_paths(&self, paths: &[PathBuf]) -> std::io::Result<Summary> {
        let files = collect_files(paths)?;
        let next = AtomicUsize::new(0);
        let progress = Progress::new(files.len(), PROGRESS_EVERY);
        let workers = std::thread::available_parallelism().map_or(1, |n| n.get());
        let mut results: Vec<(usize, Vec<TestResult>)> = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..workers)
                .map(|i| {
                    std::thread::Builder::new()
                        .name(format!("ef-tests-{i}"))
                        .stack_size(TEST_THREAD_STACK)
                        .spawn_scoped(scope, || {
                            let mut done = Vec::new();
                            loop {
                                let i = next.fetch_add(1, Ordering::Relaxed);
                                let Some(file) = files.get(i) else { break done };
                                done.push((i, self.run_file(file)));
                                if let Some(files_done) = progress.file_done() {
                                    tracing::info!(
                                        files = files_done,
                                        of = progress.total,
                                        elapsed = ?progress.started.elapsed(),
                                        "ef-tests progress"
                                    );
                                }
                            }
                        })
                })
                .collect::<std::io::Result<_>>()?;
            let mut all = Vec::new();
            for handle in handles {
                // run_file catches panics per test, so a worker only dies on a bug here.
                all.extend(
                    handle
                        .join()
                        .map_err(|_| std::io::Error::other("a test worker died"))?,
                );
            }
            Ok::<_, std::io::Error>(all)
        })?;
        results.sort_by_key(|(i, _)| *i);
        Ok(Summary {
            results: results.into_iter().flat_map(|(_, r)| r).collect(),
        })
    }

    /// Runs every test of one fixture file. An unreadable file is one failed test.
    pub fn run_file(&self, path: &Path) -> Vec<TestResult> {
        let failed = |why: String| {
            vec![TestResult {
                file: path.to_path_buf(),
                name: path
                    .file_stem()
                    .map(|s| s.to_string_lossy().into_owned())
                    .unwrap_or_default(),
                network: "?".into(),
                outcome: Outcome::Failed(why),
                executed: ExecCounts::default(),
            }]
        };
        let bytes = match std::fs::read(path) {
            Ok(b) => b,
            Err(e) => return failed(format!("cannot read fixture: {e}")),
        };
        let tests: BTreeMap<String, serde_json::Value> = match serde_json::from_slice(&bytes) {
            Ok(t) => t,
            Err(e) => return failed(format!("malformed fixture file: {e}")),
        };
        tests
            .into_iter()
            .map(|(name, value)| {
                let network = value
                    .get("network")
                    .and_then(|n| n.as_str())
                    .unwrap_or("?")
                    .to_string();
                if let Some(skip) = KnownSkip::find(path, &name) {
                    let outcome = Outcome::Skipped(skip.reason.to_string());
                    return TestResult {
                        file: path.to_path_buf(),
                        name,
                        network,
                        outcome,
                        executed: ExecCounts::default(),
                    };
                }
                let mut executed = ExecCounts::default();
                let outcome = std::panic::catch_unwind(AssertUnwindSafe(|| {
                    self.run_test(value, &mut executed)
                }))
                .unwrap_or_else(|panic| {
                    let msg = panic
                        .downcast_ref::<String>()
                        .cloned()
                        .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                        .unwrap_or_default();
                    Outcome::Failed(format!("panicked: {msg}"))
                });
                TestResult {
                    file: path.to_path_buf(),
                    name,
                    network,
                    outcome,
                    executed,
                }
            })
            .collect()
    }
}

/// The forks a fixture network may name after the merge, in activation order.
const NETWORK_FORKS: [(&str, EthereumHardfork); 10] = [
    ("Paris", EthereumHardfork::Paris),
    ("Shanghai", EthereumHardfork::Shanghai),
    ("Cancun", EthereumHardfork::Cancun),
    ("Prague", EthereumHardfork::Prague),
    ("Osaka", EthereumHardfork::Osaka),
    ("BPO1", EthereumHardfork::Bpo1),
    ("BPO2", EthereumHardfork::Bpo2),
    ("BPO3", EthereumHardfork::Bpo3),
    ("BPO4", EthereumHardfork::Bpo4),
    ("BPO5", EthereumHardfork::Bpo5),
];

/// When the second fork of a transition network (`CancunToPragueAtTime15k`) activates.
const TRANSITION_TIME: u64 = 15_000;

/// The chain a fixture runs on: its network's fork schedule (every fork up to the network's at
/// genesis; for `XToYAtTime15k`, up to X at genesis and Y at 15,000), and from `config` the
/// chain id and blob schedule. Without a config: chain 1, Ethereum's blob parameters.
fn network_spec(network: &str, config: Option<&FixtureConfig>) -> Result<ChainParams, String> {
    let index = |name: &str| {
        let name = if name == "Merge" { "Paris" } else { name };
        NETWORK_FORKS.iter().position(|(n, _)| *n == name)
    };
    let unknown = || format!("unknown network {network:?}");
    let (last_at_genesis, transition) = match network.split_once("To") {
        Some((from, rest)) => {
            let to = rest.strip_suffix("AtTime15k").ok_or_else(unknown)?;
            let (from, to) = (
                index(from).ok_or_else(unknown)?,
                index(to).ok_or_else(unknown)?,
            );
            if to != from + 1 {
                return Err(unknown());
            }
            (from, Some(to))
        }
        None => (index(network).ok_or_else(unknown)?, None),
    };
    let time = |i: usize| {
        if i <= last_at_genesis {
            Some(0)
        } else {
            (Some(i) == transition).then_some(TRANSITION_TIME)
        }
    };
    let time_of = |fork: EthereumHardfork| {
        NETWORK_FORKS
            .iter()
            .position(|(_, f)| *f == fork)
            .and_then(time)
    };
    let mut chain = ChainConfig {
        shanghai_time: time_of(EthereumHardfork::Shanghai),
        cancun_time: time_of(EthereumHardfork::Cancun),
        prague_time: time_of(EthereumHardfork::Prague),
        osaka_time: time_of(EthereumHardfork::Osaka),
        bpo1_time: time_of(EthereumHardfork::Bpo1),
        bpo2_time: time_of(EthereumHardfork::Bpo2),
        bpo3_time: time_of(EthereumHardfork::Bpo3),
        bpo4_time: time_of(EthereumHardfork::Bpo4),
        bpo5_time: time_of(EthereumHardfork::Bpo5),
        deposit_contract_address: ChainParams::mainnet().deposit_contract_address,
        ..merged_chain_config(1)
    };
    if let Some(config) = config {
        if config.network != network {
            return Err(format!(
                "config.network {:?} differs from network {network:?}",
                config.network
            ));
        }
        chain.chain_id = config.chainid.to();
        for (fork, params) in &config.blob_schedule {
            if index(fork).is_none() {
                return Err(format!("blob schedule names an unknown fork {fork:?}"));
            }
            let max = params.max.to::<u64>();
            let params = BlobParams {
                target_blob_count: params.target.to(),
                max_blob_count: max,
                update_fraction: params.base_fee_update_fraction.to(),
                max_blobs_per_tx: max,
                ..BlobParams::cancun()
            };
            // alloy reads the schedule by lower-case fork name and adds Osaka's per-transaction
            // limit and blob base cost to Osaka and later forks.
            chain.blob_schedule.insert(fork.to_lowercase(), params);
        }
    }
    Ok(ChainParams::from_genesis(Genesis {
        config: chain,
        ..Default::default()
    }))
}

fn to_mem_state(accounts: &BTreeMap<alloy_primitives::Address, FixtureAccount>) -> MemState {
    let mut state = MemState::default();
    for (address, a) in accounts {
        let code =
            (!a.code.is_empty()).then(|| overdrive_primitives::bytecode_from_raw(a.code.clone()));
        let storage = a
            .storage
            .iter()
            .filter(|(_, v)| !v.is_zero())
            .map(|(k, v)| (*k, *v))
            .collect();
        state.insert_account(*address, a.balance, a.nonce.to::<u64>(), code, storage);
    }
    state
}

/// A block the runner has imported, with the state (and trie) after it.
struct Imported {
    header: Header,
    state: Arc<MemState>,
    /// The trie after this block when roots come from overdrive's trie.
    trie: Option<StateTrie>,
}

impl Runner {
    fn run_test(&self, value: serde_json::Value, executed: &mut ExecCounts) -> Outcome {
        let fixture: Fixture = match serde_json::from_value(value) {
            Ok(f) => f,
            Err(e) => return Outcome::Failed(format!("malformed fixture: {e}")),
        };
        let spec = match network_spec(&fixture.network, fixture.config.as_ref()) {
            Ok(spec) => spec,
            Err(why) => return Outcome::Failed(why),
        };
        if fixture
            .seal_engine
            .as_deref()
            .is_some_and(|s| s != "NoProof")
        {
            return Outcome::Failed(format!(
                "seal engine {:?} (proof-of-work sealing) is not supported",
                fixture.seal_engine
            ));
        }
        let genesis = match Block::<TxEnvelope>::decode(&mut fixture.genesis_rlp.as_ref()) {
            Ok(b) => b.header,
            Err(e) => return Outcome::Failed(format!("genesis RLP does not decode: {e}")),
        };
        let mut genesis_state = to_mem_state(&fixture.pre);
        let (root, trie) = match self.genesis_root(&genesis_state) {
            Ok(r) => r,
            Err(e) => return Outcome::Failed(format!("genesis trie: {e}")),
        };
        if root != genesis.state_root {
            return Outcome::Failed(format!(
                "genesis state root {root} differs from the fixture's {}",
                genesis.state_root
            ));
        }
        let genesis_hash = genesis.hash_slow();
        genesis_state
            .block_hashes
            .insert(genesis.number, genesis_hash);
        let mut chain: HashMap<B256, Imported> = HashMap::default();
        let genesis = Imported {
            header: genesis,
            state: Arc::new(genesis_state),
            trie,
        };
        chain.insert(genesis_hash, genesis);
        let mut head = genesis_hash;

        for (i, block) in fixture.blocks.iter().enumerate() {
            match (
                self.import_block(&spec, &chain, &block.rlp, executed),
                &block.expect_exception,
            ) {
                (Ok((hash, imported)), None) => {
                    chain.insert(hash, imported);
                    head = hash;
                }
                (Ok(_), Some(expected)) => {
                    return Outcome::Failed(format!(
                        "block {i} was imported but must be rejected ({expected})"
                    ));
                }
                (Err(why), None) => return Outcome::Failed(format!("block {i} rejected: {why}")),
                // A panic or a component's failure is never how a block is meant to be
                // rejected.
                (Err(why @ (Rejection::Panic(_) | Rejection::Internal(_))), Some(expected)) => {
                    return Outcome::Failed(format!(
                        "block {i} must be rejected ({expected}), but {why}"
                    ));
                }
                (Err(Rejection::Invalid(_)), Some(_)) => {}
            }
        }

        if head != fixture.lastblockhash {
            return Outcome::Failed(format!(
                "head is {head}, fixture expects {}",
                fixture.lastblockhash
            ));
        }
        let head = &chain[&head];
        if let Some(expected) = &fixture.post_state
            && let Some(diff) = state_diff(&head.state, &to_mem_state(expected))
        {
            return Outcome::Failed(format!("post-state differs: {diff}"));
        }
        if let Some(expected) = fixture.post_state_hash {
            let root = head.header.state_root;
            if root != expected {
                return Outcome::Failed(format!(
                    "post-state root {root}, fixture expects {expected}"
                ));
            }
        }
        Outcome::Passed
    }

    /// The genesis state's root, and the trie that holds it when overdrive's trie is used.
    fn genesis_root(&self, state: &MemState) -> Result<(B256, Option<StateTrie>), String> {
        match self.options.state_root {
            StateRootChoice::Reference => Ok((overdrive_trie::reference::state_root(state), None)),
            StateRootChoice::Overdrive => {
                // One pool per test: tests already run in parallel across files, and a pool
                // shared between tests would let one test's trie job steal another's while it
                // waits in a join, nesting them on one stack. Unpinned: many tests' pools
                // share the cores.
                let config = TrieConfig {
                    parallel_threshold: 2,
                    pin_workers: false,
                    ..TrieConfig::with_threads(self.options.trie_threads.max(1))
                };
                let mut trie =
                    StateTrie::new(MemNodeStore::default(), config).map_err(|e| e.to_string())?;
                let out = trie
                    .apply(&HashedStateChanges::from_state(state))
                    .map_err(|e| e.to_string())?;
                Ok((out.root, Some(trie)))
            }
        }
    }

    fn import_block(
        &self,
        spec: &ChainParams,
        chain: &HashMap<B256, Imported>,
        rlp: &[u8],
        executed: &mut ExecCounts,
    ) -> Result<(B256, Imported), Rejection> {
        let block = BlockWithSenders::decode(rlp).map_err(|e| e.to_string())?;
        let parent = chain
            .get(&block.header.parent_hash)
            .ok_or_else(|| format!("unknown parent {}", block.header.parent_hash))?;
        validate_header(spec, &block.header, &parent.header).map_err(|e| e.to_string())?;
        validate_body(spec, &block).map_err(|e| e.to_string())?;
        let (output, stats) = self.execute(spec, &block, &parent.state)?;
        validate_post_execution(
            spec,
            &block.header,
            &output.receipts,
            output.gas_used,
            &output.requests,
        )
        .map_err(|e| e.to_string())?;
        let mut state = MemState::clone(&parent.state);
        state.apply_bundle(&output.bundle);
        validate_system_contracts(spec, &block.header, |address| {
            state
                .accounts
                .get(&address)
                .is_some_and(|account| account.info.code_hash != KECCAK_EMPTY)
        })
        .map_err(|e| e.to_string())?;
        let (root, trie) = match &parent.trie {
            None => (overdrive_trie::reference::state_root(&state), None),
            Some(parent_trie) => {
                let mut trie = parent_trie.clone();
                let diff = HashedStateChanges::from_bundle(&output.bundle);
                let out = trie
                    .apply(&diff)
                    .map_err(|e| Rejection::Internal(format!("overdrive trie: {e}")))?;
                // A root that rejects the block must be the reference's too; otherwise the
                // trie is wrong, not the block, and a fixture that expects this block to be
                // rejected (for whatever reason) would hide it.
                if out.root != block.header.state_root {
                    let reference = overdrive_trie::reference::state_root(&state);
                    if out.root != reference {
                        return Err(Rejection::Internal(format!(
                            "overdrive trie root {} differs from the reference root {reference}",
                            out.root
                        )));
                    }
                }
                (out.root, Some(trie))
            }
        };
        validate_state_root(&block.header, root).map_err(|e| e.to_string())?;
        // Counted only for imported blocks.
        if let Some(stats) = stats {
            *executed += ExecCounts {
                parallel_blocks: 1,
                speculated: stats.validated,
                exact: stats.exact,
                pool_folded: usize::from(stats.pool_folded),
            };
        }
        state.block_hashes.insert(block.header.number, block.hash);
        let imported = Imported {
            header: block.header,
            state: Arc::new(state),
            trie,
        };
        Ok((block.hash, imported))
    }

    /// Executes `block` with the chosen executor. The parallel executor's result, output or
    /// error, must also equal the sequential executor's on the same block: the header commits
    /// to receipts, gas and the state root but not to the bundle's reverts, and a block the
    /// fixture expects to be rejected would pass on any rejection, including a wrong one.
    fn execute(
        &self,
        spec: &ChainParams,
        block: &BlockWithSenders,
        state: &MemState,
    ) -> Result<(BlockOutput, Option<CommitStats>), Rejection> {
        let rejection = |e: ExecutionError| match e {
            ExecutionError::WorkerPanic(_) => Rejection::Panic(e.to_string()),
            e => Rejection::Invalid(e.to_string()),
        };
        let Some(parallel) = &self.parallel else {
            return SequentialExecutor
                .execute(spec, block, state)
                .map(|output| (output, None))
                .map_err(rejection);
        };
        let result = parallel.execute_with_stats(spec, block, state);
        let reference = SequentialExecutor.execute(spec, block, state);
        let difference = match (&result, &reference) {
            (Ok((output, _)), Ok(expected)) => first_difference(output, expected)
                .map(|part| format!("its {part} differs from the sequential executor's")),
            (Err(error), Err(expected)) => (error != expected)
                .then(|| format!("error \"{error}\" against the sequential \"{expected}\"")),
            (Ok(_), Err(expected)) => Some(format!(
                "it executed the block, the sequential executor rejected it: {expected}"
            )),
            (Err(error), Ok(_)) => Some(format!(
                "it rejected the block ({error}), the sequential executor executed it"
            )),
        };
        if let Some(difference) = difference {
            return Err(Rejection::Internal(format!(
                "parallel executor differs: {difference}"
            )));
        }
        result.map_err(rejection)
    }
}

/// The first part of `output` that differs from `expected`, if any.
fn first_difference(output: &BlockOutput, expected: &BlockOutput) -> Option<&'static str> {
    if output == expected {
        None
    } else if output.receipts != expected.receipts {
        Some("receipts")
    } else if output.gas_used != expected.gas_used || output.blob_gas_used != expected.blob_gas_used
    {
        Some("gas used")
    } else if output.requests != expected.requests {
        Some("requests")
    } else if output.bundle.state != expected.bundle.state {
        Some("bundle state")
    } else if output.bundle.reverts != expected.bundle.reverts {
        Some("bundle reverts")
    } else {
        Some("bundle (contracts or sizes)")
    }
}

/// Why a block was not imported.
#[derive(Debug)]
enum Rejection {
    /// The block is invalid (what a fixture's `expectException` asks for).
    Invalid(String),
    /// Executing it panicked: a bug, whatever the fixture expects.
    Panic(String),
    /// A component failed or disagreed with its reference: a bug, whatever the fixture
    /// expects.
    Internal(String),
}

impl From<String> for Rejection {
    fn from(why: String) -> Self {
        Self::Invalid(why)
    }
}

impl std::fmt::Display for Rejection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Invalid(why) | Self::Panic(why) | Self::Internal(why) => f.write_str(why),
        }
    }
}

/// The first difference between two states, if any.
fn state_diff(got: &MemState, expected: &MemState) -> Option<String> {
    let mut addresses: Vec<_> = got
        .accounts
        .keys()
        .chain(expected.accounts.keys())
        .collect();
    addresses.sort();
    addresses.dedup();
    for address in addresses {
        match (got.accounts.get(address), expected.accounts.get(address)) {
            (None, Some(_)) => return Some(format!("account {address} is missing")),
            (Some(_), None) => return Some(format!("account {address} should not exist")),
            (Some(g), Some(e)) => {
                if g.info.balance != e.info.balance {
                    return Some(format!(
                        "{address} balance {} != {}",
                        g.info.balance, e.info.balance
                    ));
                }
                if g.info.nonce != e.info.nonce {
                    return Some(format!(
                        "{address} nonce {} != {}",
                        g.info.nonce, e.info.nonce
                    ));
                }
                if g.info.code_hash != e.info.code_hash {
                    return Some(format!("{address} code differs"));
                }
                if g.storage != e.storage {
                    return Some(format!("{address} storage differs"));
                }
            }
            (None, None) => {}
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn progress_is_reported_once_per_interval() {
        // Due at once: every file reports.
        let always = Progress::new(3, Duration::ZERO);
        assert_eq!(
            [always.file_done(), always.file_done(), always.file_done()],
            [Some(1), Some(2), Some(3)]
        );
        // Not due within the interval: files are counted, nothing is reported.
        let rarely = Progress::new(5, Duration::from_secs(3600));
        assert_eq!((0..5).filter_map(|_| rarely.file_done()).count(), 0);
        assert_eq!(rarely.done.load(Ordering::Relaxed), 5);
    }

    #[test]
    fn one_report_per_due_time_across_threads() {
        let progress = Progress::new(400, Duration::from_millis(1));
        std::thread::sleep(Duration::from_millis(2));
        let reports: usize = std::thread::scope(|scope| {
            let threads: Vec<_> = (0..4)
                .map(|_| scope.spawn(|| (0..100).filter_map(|_| progress.file_done()).count()))
                .collect();
            threads.into_iter().map(|t| t.join().unwrap()).sum()
        });
        let elapsed_ms = progress.started.elapsed().as_millis() as usize;
        assert!(reports >= 1, "the first file after the due time reports");
        assert!(
            reports <= elapsed_ms + 1,
            "{reports} reports in {elapsed_ms} ms"
        );
        assert_eq!(progress.done.load(Ordering::Relaxed), 400);
    }
}
