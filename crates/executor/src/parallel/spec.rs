//! Speculative execution of one transaction against the multi-version memory.
//!
//! The EVM is alloy-evm's own (same context, same precompiles) driven by a handler that differs
//! from revm's mainnet handler in one point: while it pays the block's beneficiary its fee, the
//! database knows it, so that load of the coinbase is recorded as a lazy read (the fee is rebased
//! onto the exact coinbase balance at commit) instead of a read that every transaction would
//! conflict on.

use super::bloom::BloomCache;
use super::mv::{AccountRead, Location, MvMemory, MvValue, StorageRead, TxIdx};
use crate::StateReader;
use alloy_consensus::{TxEnvelope, transaction::Recovered};
use alloy_evm::{
    EvmEnv, ToTxEnv,
    eth::{EthEvmBuilder, EthEvmContext},
    precompiles::PrecompilesMap,
};
use alloy_primitives::{Address, B256, Bloom, U256, map::HashMap};
use revm::{
    Database,
    bytecode::Bytecode,
    context::{ContextSetters, ContextTr, JournalTr, TxEnv},
    context_interface::result::{EVMError, ExecutionResult, HaltReason, InvalidTransaction},
    database_interface::DBErrorMarker,
    handler::{
        EthFrame, EvmTr, FrameResult, Handler, instructions::EthInstructions, post_execution,
    },
    inspector::NoOpInspector,
    interpreter::interpreter::EthInterpreter,
    primitives::KECCAK_EMPTY,
    state::{Account, AccountInfo, EvmState},
};
use std::{
    sync::{PoisonError, RwLock},
    thread::ThreadId,
};

/// The account fields a transaction's result can depend on. The code follows from the hash,
/// but whether the answer carried it can matter: the journal keeps the `code` field as it got
/// it, and the bundle records a contract from the final `code` field when the hash changed
/// (see [`Seen::answers`] for where it does not).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Observed {
    pub balance: U256,
    pub nonce: u64,
    pub code_hash: B256,
    pub has_code: bool,
}

impl Observed {
    pub(crate) fn of(info: &Option<AccountInfo>) -> Option<Self> {
        info.as_ref().map(Self::from_info)
    }

    pub(crate) fn from_info(i: &AccountInfo) -> Self {
        Self {
            balance: i.balance,
            nonce: i.nonce,
            code_hash: i.code_hash,
            has_code: i.code.is_some(),
        }
    }
}

/// How an account read is validated at commit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ReadMode {
    /// Every field (and existence) must be unchanged.
    Strict,
    /// The coinbase, loaded only to pay the fee: any value works, the fee is rebased.
    LazyCoinbase,
    /// A code-less recipient of a plain transfer: only "still has no code" must hold; the
    /// transferred value is rebased onto its balance.
    LazyRecipient,
}

/// One database read of a speculative execution.
#[derive(Debug, Clone)]
pub(crate) enum Read {
    Account {
        address: Address,
        seen: Seen,
        mode: ReadMode,
    },
    Storage {
        address: Address,
        slot: U256,
        value: U256,
        /// The value came from the pre-state reader (see [`Seen::Base`]).
        base: bool,
    },
}

/// What a speculative execution saw of an account.
///
/// One of two, never both: a read of the pre-state is kept whole, and what it observed is
/// derived from it. Keeping both took a read to 200 bytes; every read list goes from the
/// worker's core to the committer's, a cache line at a time (see
/// `overdrive_bench::core_round_trip`).
#[derive(Debug, Clone)]
pub(crate) enum Seen {
    /// What the pre-state reader returned, when nothing in the block had written the account
    /// yet: the committer seeds `revm::State`'s cache with it instead of reading the pre-state
    /// a second time.
    Base(Option<AccountInfo>),
    /// A value from the multi-version memory (an earlier transaction's write, or the pre-state
    /// plus lazy credits).
    Written(Option<Observed>),
}

impl Seen {
    /// What the execution observed.
    pub(crate) fn observed(&self) -> Option<Observed> {
        match self {
            Self::Base(info) => Observed::of(info),
            Self::Written(observed) => *observed,
        }
    }

    /// Whether an account whose value is now `now` (in the committed state, or in the
    /// transaction's own result) still answers this read as it was answered.
    ///
    /// Balance, nonce and code hash must be equal. Whether the answer carried the code must be
    /// equal too, except for a read of the pre-state whose code hash is still the pre-state's
    /// (a change and back — a destroy and same-code re-create before Cancun — included). A
    /// database answers without the code (reth's does, and so does `MemState`), while an
    /// account an execution has called carries it in `revm::State`'s cache from then on:
    /// comparing it there failed every later speculative read of every contract once one call
    /// of it was committed.
    ///
    /// Ignoring it there changes no output. Execution loads code by its hash before using it,
    /// and the pre-state's hash has its code in the database. The one output that reads the
    /// field, the bundle's list of new contracts, reads it only for an account whose final
    /// code hash differs from its pre-state one, and every code change (a creation, an
    /// EIP-7702 delegation) sets the code along with the hash, so a `None` committed here is
    /// replaced by any later change. The field itself may then be `None` in a committed or
    /// bundled account where the sequential executor's has the code (as it already was for
    /// lazily credited recipients); `AccountInfo`'s equality, reth's `Account` and the state
    /// root do not read it.
    pub(crate) fn answers(&self, now: Option<Observed>) -> bool {
        match (self, now) {
            (Self::Base(Some(base)), Some(now)) => {
                base.balance == now.balance
                    && base.nonce == now.nonce
                    && base.code_hash == now.code_hash
            }
            _ => self.observed() == now,
        }
    }

    /// The pre-state reader's value, if that is what was seen.
    pub(crate) fn base(&self) -> Option<&Option<AccountInfo>> {
        match self {
            Self::Base(info) => Some(info),
            Self::Written(_) => None,
        }
    }
}

/// Why the speculative database refused a read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum SpecDbError {
    /// A value below the reader is being re-executed.
    #[error("blocked on transaction {0}")]
    Blocked(TxIdx),
    /// The pre-state reader failed; the committer re-executes and reports the real error.
    #[error("state read failed: {0}")]
    Db(String),
}
impl DBErrorMarker for SpecDbError {}

/// Bytecode deployed by transactions of this block, by hash. Content-addressed, so a
/// speculative insert that is later discarded can never be wrong. The lock guards the map.
#[derive(Debug, Default)]
pub(crate) struct NewCode(RwLock<HashMap<B256, Bytecode>>);

impl NewCode {
    fn get(&self, hash: &B256) -> Option<Bytecode> {
        self.0
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(hash)
            .cloned()
    }
    pub(crate) fn insert(&self, hash: B256, code: Bytecode) {
        self.0
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(hash)
            .or_insert(code);
    }
}

/// Per-block facts every speculative execution shares.
#[derive(Debug)]
pub(crate) struct SpecShared<'a, DB> {
    pub db: &'a DB,
    pub mv: &'a MvMemory,
    pub new_code: &'a NewCode,
    pub coinbase: Address,
    pub lazy_coinbase: bool,
}

/// The database a speculative EVM reads: multi-version memory over the pre-state, recording
/// every read.
#[derive(Debug)]
pub(crate) struct SpecDb<'a, DB> {
    shared: &'a SpecShared<'a, DB>,
    tx: TxIdx,
    lazy_recipient: Option<Address>,
    /// Set by the handler around the fee payment only.
    reward_phase: bool,
    reads: Vec<Read>,
    blocked: Option<TxIdx>,
    failed: bool,
    /// Code by hash, per thread: code never changes under a hash.
    code_cache: HashMap<B256, Bytecode>,
}

impl<DB: StateReader> SpecDb<'_, DB> {
    fn db_err(&mut self, e: impl std::fmt::Display) -> SpecDbError {
        self.failed = true;
        SpecDbError::Db(e.to_string())
    }

    /// The account as transaction `tx` sees it, and how it saw it (the read's record).
    fn resolve_account(
        &mut self,
        address: Address,
    ) -> Result<(Option<AccountInfo>, Seen), SpecDbError> {
        let written = |info: Option<AccountInfo>| {
            let observed = Observed::of(&info);
            (info, Seen::Written(observed))
        };
        match self.shared.mv.read_account(address, self.tx) {
            AccountRead::Value(info) => Ok(written(info)),
            AccountRead::Blocked(tx) => {
                self.blocked = Some(tx);
                Err(SpecDbError::Blocked(tx))
            }
            AccountRead::Base { delta } => {
                let base = self
                    .shared
                    .db
                    .basic_ref(address)
                    .map_err(|e| self.db_err(e))?;
                if delta.is_zero() {
                    return Ok((base.clone(), Seen::Base(base)));
                }
                Ok(written(Some(match base {
                    Some(mut info) if !info.is_empty() => {
                        info.balance = info.balance.saturating_add(delta);
                        info
                    }
                    // Lazy credits created the account, or credited one that exists empty:
                    // `revm::State` caches an empty account as `AccountInfo::default()` (its
                    // empty code attached), and validation compares against that.
                    _ => AccountInfo {
                        balance: delta,
                        ..Default::default()
                    },
                })))
            }
        }
    }
}

impl<DB: StateReader> Database for SpecDb<'_, DB> {
    type Error = SpecDbError;

    fn basic(&mut self, address: Address) -> Result<Option<AccountInfo>, Self::Error> {
        if self.reward_phase && self.shared.lazy_coinbase && address == self.shared.coinbase {
            // The coinbase is never published to the multi-version memory; its base value is
            // only the anchor the fee delta is measured from.
            let info = self
                .shared
                .db
                .basic_ref(address)
                .map_err(|e| self.db_err(e))?;
            self.reads.push(Read::Account {
                address,
                seen: Seen::Base(info.clone()),
                mode: ReadMode::LazyCoinbase,
            });
            return Ok(info);
        }
        let (info, seen) = self.resolve_account(address)?;
        let lazy = self.lazy_recipient == Some(address)
            && info.as_ref().is_none_or(|i| i.code_hash == KECCAK_EMPTY);
        let mode = if lazy {
            ReadMode::LazyRecipient
        } else {
            ReadMode::Strict
        };
        self.reads.push(Read::Account {
            address,
            seen,
            mode,
        });
        Ok(info)
    }

    fn code_by_hash(&mut self, code_hash: B256) -> Result<Bytecode, Self::Error> {
        if let Some(code) = self.code_cache.get(&code_hash) {
            return Ok(code.clone());
        }
        let code = match self.shared.new_code.get(&code_hash) {
            Some(code) => code,
            None => self
                .shared
                .db
                .code_by_hash_ref(code_hash)
                .map_err(|e| self.db_err(e))?,
        };
        // Validation trusts code to follow from its hash, so a hash this block deployed but we
        // do not know yet must not run as whatever the reader answers for unknown hashes.
        if code.is_empty() && code_hash != KECCAK_EMPTY {
            // Not cached: every transaction that runs into the unknown hash must fail alike.
            self.failed = true;
            return Ok(code);
        }
        self.code_cache.insert(code_hash, code.clone());
        Ok(code)
    }

    fn storage(&mut self, address: Address, slot: U256) -> Result<U256, Self::Error> {
        let (value, base) = match self.shared.mv.read_storage(address, slot, self.tx) {
            StorageRead::Value(v) => (v, false),
            StorageRead::Blocked(tx) => {
                self.blocked = Some(tx);
                return Err(SpecDbError::Blocked(tx));
            }
            StorageRead::Base => (
                self.shared
                    .db
                    .storage_ref(address, slot)
                    .map_err(|e| self.db_err(e))?,
                true,
            ),
        };
        self.reads.push(Read::Storage {
            address,
            slot,
            value,
            base,
        });
        Ok(value)
    }

    fn block_hash(&mut self, number: u64) -> Result<B256, Self::Error> {
        // Ancestor hashes do not change within a block.
        self.shared
            .db
            .block_hash_ref(number)
            .map_err(|e| self.db_err(e))
    }
}

type SpecCtx<'a, DB> = EthEvmContext<SpecDb<'a, DB>>;
type SpecEvm<'a, DB> = revm::context::Evm<
    SpecCtx<'a, DB>,
    NoOpInspector,
    EthInstructions<EthInterpreter, SpecCtx<'a, DB>>,
    PrecompilesMap,
    EthFrame,
>;

/// revm's mainnet handler, except that the database is told when the fee is being paid.
struct SpecHandler<'a, DB>(std::marker::PhantomData<SpecDb<'a, DB>>);

impl<'a, DB: StateReader> Handler for SpecHandler<'a, DB> {
    type Evm = SpecEvm<'a, DB>;
    type Error = EVMError<SpecDbError, InvalidTransaction>;
    type HaltReason = HaltReason;

    fn reward_beneficiary(
        &self,
        evm: &mut Self::Evm,
        exec_result: &mut FrameResult,
    ) -> Result<(), Self::Error> {
        evm.ctx().db_mut().reward_phase = true;
        let paid = post_execution::reward_beneficiary(evm.ctx(), exec_result.gas());
        evm.ctx().db_mut().reward_phase = false;
        paid.map_err(From::from)
    }
}

/// A finished speculative execution.
#[derive(Debug)]
pub(crate) struct SpecExec {
    pub result: ExecutionResult<HaltReason>,
    pub state: EvmState,
    /// Bloom of the logs, computed here so the committer does not.
    pub bloom: Bloom,
}

/// What the committer needs from a speculative execution.
#[derive(Debug)]
pub(crate) struct SpecOutcome {
    pub reads: Vec<Read>,
    /// `None` when the execution failed (invalid transaction, database error): the committer
    /// re-executes it exactly and reports whatever the exact execution says.
    pub exec: Option<SpecExec>,
    /// Locations published to the multi-version memory for this transaction.
    pub written: Vec<Location>,
    /// The thread that executed it, and so allocated its parts: the committer frees the
    /// results it speculated itself and hands the others back (see `recycle.rs`).
    pub origin: ThreadId,
    /// A pool thread ran it again after finding an earlier result stale.
    pub rerun: bool,
}

impl SpecOutcome {
    /// This failed outcome, still owning the locations an earlier run published: the
    /// committer's exact run replaces or removes them.
    fn keeping(mut self: Box<Self>, previous: &[Location]) -> Box<Self> {
        self.written = previous.to_vec();
        self
    }

    /// A speculation that produced no result: the committer executes the transaction exactly.
    pub(crate) fn failed(reads: Vec<Read>, origin: ThreadId) -> Box<Self> {
        Box::new(Self {
            reads,
            exec: None,
            written: Vec::new(),
            origin,
            rerun: false,
        })
    }
}

/// Result of one attempt.
pub(crate) enum SpecRun {
    /// A value it needs is being re-executed by the committer: retry after that commits.
    Blocked(TxIdx),
    /// Executed (successfully or not); its writes are published.
    Done(Box<SpecOutcome>),
}

/// One thread's speculative EVM, reused for every transaction it runs in the block.
pub(crate) struct Speculator<'a, DB: StateReader> {
    evm: SpecEvm<'a, DB>,
    /// The writes of the transaction being published; kept to reuse its allocation.
    writes: Vec<(Location, MvValue)>,
    /// The next writers above the last published transaction's locations (see
    /// `MvMemory::write`), for `Scheduler::suspect` (which ignores them when re-speculation
    /// is off).
    pub(crate) next_writers: Vec<TxIdx>,
    /// Capacity for the next transaction's read list.
    reads_hint: usize,
    bloom: BloomCache,
    /// An account with no boxed `original_info` and no code, cloned without allocating or
    /// touching a shared reference count (see [`shed_original_info`]).
    blank: Account,
    /// The thread this speculator runs on (it is made there and never moves).
    thread: ThreadId,
    /// What it was made from, to start afresh after a panic (see [`Speculator::run`]).
    shared: &'a SpecShared<'a, DB>,
    env: EvmEnv,
}

impl<'a, DB: StateReader> Speculator<'a, DB> {
    /// The thread this speculator runs on.
    pub(crate) fn thread(&self) -> ThreadId {
        self.thread
    }

    pub(crate) fn new(shared: &'a SpecShared<'a, DB>, env: EvmEnv) -> Self {
        let db = SpecDb {
            shared,
            tx: 0,
            lazy_recipient: None,
            reward_phase: false,
            reads: Vec::new(),
            blocked: None,
            failed: false,
            code_cache: HashMap::default(),
        };
        Self {
            evm: EthEvmBuilder::new(db, env.clone()).build().into_inner(),
            writes: Vec::with_capacity(8),
            next_writers: Vec::new(),
            reads_hint: 8,
            bloom: BloomCache::default(),
            blank: {
                let mut blank = Account::new_not_existing(Default::default());
                blank.info.code = None;
                blank
            },
            thread: std::thread::current().id(),
            shared,
            env,
        }
    }

    /// Executes transaction `index` speculatively; publishes its writes when `publish`.
    /// `previous` are the locations an earlier run of it published (empty on its first run):
    /// those the new run does not write are removed.
    ///
    /// A panic becomes a failed speculation: the committer then executes the transaction
    /// exactly, on the committed state. A speculative run reads a mix of committed and not yet
    /// committed values, a state no exact execution ever sees, and code that assumes a
    /// consistent state (the EVM, a database reader) may panic on it: a reader asked for a key
    /// the exact execution would never read, say. Such a panic must not reject a valid block.
    /// A panic that any execution of the transaction meets happens again in the exact run, on
    /// the committer, and rejects the block there (`ExecutionError::WorkerPanic`). Nothing is
    /// lost by the recovery: the multi-version memory's locks are never held while the EVM or
    /// the reader runs, and writes the run may have published before it panicked only steer
    /// speculation; every speculative read is validated against the committed state.
    pub(crate) fn run(
        &mut self,
        index: TxIdx,
        tx: &Recovered<TxEnvelope>,
        lazy_recipient: Option<Address>,
        publish: bool,
        previous: &[Location],
    ) -> SpecRun {
        self.next_writers.clear();
        // Emptied now, so that after a panic it holds this run's writes or none.
        self.writes.clear();
        let attempt = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            {
                let db = self.evm.ctx().db_mut();
                db.tx = index;
                db.lazy_recipient = lazy_recipient;
                db.reward_phase = false;
                // As many as the previous transaction read: blocks repeat their shapes, and
                // growing the list copies every read recorded so far.
                db.reads = Vec::with_capacity(self.reads_hint);
                db.blocked = None;
                db.failed = false;
            }
            let tx_env: TxEnv = tx.to_tx_env();
            self.evm.ctx().set_tx(tx_env);
            let result = SpecHandler(std::marker::PhantomData).run(&mut self.evm);
            let mut state = self.evm.ctx().journal_mut().finalize();
            let db = self.evm.ctx().db_mut();
            if let Some(tx) = db.blocked {
                return SpecRun::Blocked(tx);
            }
            let reads = std::mem::take(&mut db.reads);
            self.reads_hint = reads.len().clamp(8, 64);
            let shared = db.shared;
            match result {
                Ok(result) if !db.failed => {
                    let writes = &mut self.writes;
                    writes.clear();
                    // Run even when not publishing: it also records deployed code.
                    extract_writes(&state, &reads, shared, writes);
                    // A run that does not publish had no earlier run that did (`publish` is
                    // fixed per transaction by the hints).
                    let written = if publish {
                        shared
                            .mv
                            .write(index, 0, writes, previous, &mut self.next_writers);
                        writes.iter().map(|(l, _)| *l).collect()
                    } else {
                        Vec::new()
                    };
                    let bloom = self.bloom.bloom(result.logs());
                    shed_original_info(&mut state, &self.blank);
                    SpecRun::Done(Box::new(SpecOutcome {
                        reads,
                        exec: Some(SpecExec {
                            result,
                            state,
                            bloom,
                        }),
                        written,
                        origin: self.thread,
                        rerun: false,
                    }))
                }
                _ => SpecRun::Done(SpecOutcome::failed(reads, self.thread).keeping(previous)),
            }
        }));
        attempt.unwrap_or_else(|panic| {
            tracing::warn!(
                tx = index,
                message = super::panic_message(panic.as_ref()),
                "speculative execution panicked; the transaction is executed exactly"
            );
            // What this run may have published before the panic, with what the one before it
            // did: the committer's exact run replaces or removes all of it. (Listing one it
            // did not publish costs nothing there.)
            let published: Vec<Location> = previous
                .iter()
                .copied()
                .chain(self.writes.iter().map(|(l, _)| *l))
                .collect();
            // The EVM may have stopped in the middle of the transaction: start afresh.
            *self = Self::new(self.shared, self.env.clone());
            SpecRun::Done(SpecOutcome::failed(Vec::new(), self.thread).keeping(&published))
        })
    }
}

/// Whether the multi-version memory now answers one of `reads` (transaction `tx`'s) with
/// another value than the run saw: a write below `tx` came or changed since, so the committer
/// would find the result invalid. Only a changed answer counts. Lazy reads (rebased at
/// commit), writes being re-executed (when their writer publishes again, `tx` is queued again
/// if it is the next writer there), and answers that now come from the pre-state where the
/// run read a written value (knowing would take a pre-state read) count as unchanged: this
/// only decides whether a pool thread executes `tx` again early, and the committer checks
/// every read anyway.
pub(crate) fn stale_in(mv: &MvMemory, tx: TxIdx, reads: &[Read]) -> bool {
    reads.iter().any(|read| match read {
        Read::Account {
            address,
            seen,
            mode: ReadMode::Strict,
        } => match mv.read_account(*address, tx) {
            AccountRead::Value(info) => !seen.answers(Observed::of(&info)),
            AccountRead::Base { delta } => seen.base().is_some() && !delta.is_zero(),
            AccountRead::Blocked(_) => false,
        },
        Read::Account { .. } => false,
        Read::Storage {
            address,
            slot,
            value,
            ..
        } => match mv.read_storage(*address, *slot, tx) {
            StorageRead::Value(now) => now != *value,
            StorageRead::Base | StorageRead::Blocked(_) => false,
        },
    })
}

/// Frees, here on the thread that allocated them, the copies of the loaded accounts' info the
/// journal boxes for each (`Account::original_info`), by moving each account's data into a
/// clone of `blank`.
///
/// Left in place, each box was freed by the committer inside `revm::State`'s commit: a
/// cross-thread free (an atomic push the allocating thread collects later) of a cache line the
/// committer read from this core first. Nothing the committer does reads them:
/// `revm::State` consults `original_info` only for an account missing from its cache, and
/// the committer has put every account a result touches there while validating its reads
/// (each account the journal holds was loaded through [`SpecDb`], which records the read).
/// The block-access-list builder reads them too; the committer's state has none (asserted
/// there).
fn shed_original_info(state: &mut EvmState, blank: &Account) {
    for account in state.values_mut() {
        let mut fresh = blank.clone();
        fresh.transaction_id = account.transaction_id;
        fresh.status = account.status;
        std::mem::swap(&mut fresh.info, &mut account.info);
        std::mem::swap(&mut fresh.storage, &mut account.storage);
        *account = fresh;
    }
}

/// The multi-version writes of a transaction's state changes. The coinbase is never published
/// (its fee is settled at commit); an account credited lazily is published as a delta.
pub(crate) fn extract_writes<DB>(
    state: &EvmState,
    reads: &[Read],
    shared: &SpecShared<'_, DB>,
    out: &mut Vec<(Location, MvValue)>,
) {
    for (address, account) in state {
        if !account.is_touched() || *address == shared.coinbase {
            continue;
        }
        let address = *address;
        if account.is_selfdestructed() {
            out.push((Location::Account(address), MvValue::Account(None)));
            out.push((Location::Wipe(address), MvValue::Wipe));
            continue;
        }
        if account.is_created() {
            if let Some(code) = &account.info.code {
                shared.new_code.insert(account.info.code_hash, code.clone());
            }
            out.push((
                Location::Account(address),
                MvValue::Account(Some(account.info.clone())),
            ));
            out.push((Location::Wipe(address), MvValue::Wipe));
        } else if account.is_empty() {
            // EIP-161: a touched empty account is removed with its storage (the journal has
            // already normalised pre-Spurious-Dragon accounts so that this rule applies).
            out.push((Location::Account(address), MvValue::Account(None)));
            out.push((Location::Wipe(address), MvValue::Wipe));
            continue;
        } else {
            let read = reads.iter().find_map(|r| match r {
                Read::Account {
                    address: a,
                    seen,
                    mode,
                } if *a == address => Some((seen, *mode)),
                _ => None,
            });
            let now = Observed::from_info(&account.info);
            // New code without creation: an EIP-7702 delegation set or cleared.
            if read.is_none_or(|(seen, _)| {
                seen.observed().is_none_or(|o| o.code_hash != now.code_hash)
            }) && let Some(code) = &account.info.code
                && !code.is_empty()
            {
                shared.new_code.insert(account.info.code_hash, code.clone());
            }
            match read {
                Some((seen, ReadMode::LazyRecipient)) => {
                    let before = seen.observed().map(|o| o.balance).unwrap_or_default();
                    let value = match account.info.balance.checked_sub(before) {
                        Some(delta) => MvValue::Delta(delta),
                        None => MvValue::Account(Some(account.info.clone())),
                    };
                    out.push((Location::Account(address), value));
                }
                // Unchanged (loading the code to run it is no change): nothing to publish.
                Some((seen, _)) if seen.answers(Some(now)) => {}
                _ => out.push((
                    Location::Account(address),
                    MvValue::Account(Some(account.info.clone())),
                )),
            }
        }
        for (slot, value) in account.changed_storage_slots() {
            out.push((
                Location::Storage(address, *slot),
                MvValue::Storage(value.present_value),
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloy_primitives::{Bytes, b256};

    fn contract(code: Option<Bytecode>) -> AccountInfo {
        AccountInfo {
            balance: U256::from(7),
            nonce: 1,
            code_hash: b256!("0x1111111111111111111111111111111111111111111111111111111111111111"),
            code,
            account_id: None,
        }
    }

    #[test]
    fn a_database_answer_without_code_still_answers_once_the_code_is_loaded() {
        let code = Some(Bytecode::new_raw(Bytes::from_static(&[0x00])));
        let seen = Seen::Base(Some(contract(None)));
        assert!(seen.answers(Some(Observed::from_info(&contract(code.clone())))));
        assert!(seen.answers(Some(Observed::from_info(&contract(None)))));
        // Any other field still counts.
        let mut richer = contract(code.clone());
        richer.balance += U256::from(1);
        assert!(!seen.answers(Some(Observed::from_info(&richer))));
        let mut redeployed = contract(code.clone());
        redeployed.code_hash = KECCAK_EMPTY;
        assert!(!seen.answers(Some(Observed::from_info(&redeployed))));
        assert!(!seen.answers(None));
        // A value the block wrote is compared whole, whether the code was carried included.
        let written = Seen::Written(Some(Observed::from_info(&contract(None))));
        assert!(!written.answers(Some(Observed::from_info(&contract(code)))));
        assert!(written.answers(Some(Observed::from_info(&contract(None)))));
        assert!(Seen::Base(None).answers(None));
        assert!(!Seen::Base(None).answers(Some(Observed::from_info(&contract(None)))));
    }

    /// A read is stale once the memory answers it with another value; the same value, lazy
    /// reads and writes being re-executed are not.
    #[test]
    fn stale_reads_are_changed_answers() {
        let mv = MvMemory::new();
        let (a, b, c) = (
            Address::repeat_byte(1),
            Address::repeat_byte(2),
            Address::repeat_byte(3),
        );
        let slot = U256::from(9);
        let account = Read::Account {
            address: a,
            seen: Seen::Base(Some(contract(None))),
            mode: ReadMode::Strict,
        };
        let storage = Read::Storage {
            address: b,
            slot,
            value: U256::from(5),
            base: true,
        };
        let lazy = Read::Account {
            address: c,
            seen: Seen::Base(None),
            mode: ReadMode::LazyRecipient,
        };
        let reads = [account, storage, lazy];
        assert!(!stale_in(&mv, 4, &reads));
        // The same values written below: still current.
        let same = [
            (Location::Account(a), MvValue::Account(Some(contract(None)))),
            (Location::Storage(b, slot), MvValue::Storage(U256::from(5))),
            (Location::Account(c), MvValue::Account(Some(contract(None)))),
        ];
        mv.put(1, &same);
        assert!(!stale_in(&mv, 4, &reads));
        // A write above the reader changes nothing for it.
        mv.put(
            6,
            &[(Location::Storage(b, slot), MvValue::Storage(U256::from(6)))],
        );
        assert!(!stale_in(&mv, 4, &reads));
        // Another value below it does.
        mv.put(
            2,
            &[(Location::Storage(b, slot), MvValue::Storage(U256::from(6)))],
        );
        assert!(stale_in(&mv, 4, &reads));
        assert!(!stale_in(&mv, 2, &reads));
        // Being re-executed: not known yet.
        mv.mark_estimates(2, &[Location::Storage(b, slot)]);
        assert!(!stale_in(&mv, 4, &reads));
        // An account changed below the reader, or credited lazily where it read the pre-state.
        let mut richer = contract(None);
        richer.balance += U256::from(1);
        mv.put(3, &[(Location::Account(a), MvValue::Account(Some(richer)))]);
        assert!(stale_in(&mv, 4, &reads[..1]));
        let fresh = MvMemory::new();
        fresh.put(0, &[(Location::Account(a), MvValue::Delta(U256::from(1)))]);
        assert!(stale_in(&fresh, 4, &reads[..1]));
    }
}
