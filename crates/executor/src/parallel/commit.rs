//! The committer: takes transactions in block order, checks each speculative result against
//! the exact committed state, and commits it through alloy-evm's `EthBlockExecutor` over
//! `revm::State` — the reference executor's own state, receipts and gas accounting — or, when
//! the check fails, re-executes the transaction exactly there.
//!
//! Why a checked result is exact: the EVM is deterministic given the answers its database
//! calls return. Every account and storage answer of the speculative run is recorded; code and
//! ancestor hashes cannot change within a block. If each recorded answer equals what the
//! committed state answers now, the exact run would have asked the same questions, got the same
//! answers and produced the same result and state diff (the `original_value` of each slot
//! included, which the bundle's reverts are built from). The two lazy reads (the coinbase paid
//! its fee, a code-less recipient credited a plain transfer) are the exception the EVM cannot
//! observe: their written balance is rebased onto the committed one.

use super::{
    mv::{Location, TxIdx},
    recycle::{Recycler, SpentResult},
    sched::{DONE, PENDING, RUNNING, Scheduler},
    spec::{
        Observed, Read, ReadMode, SpecOutcome, SpecRun, SpecShared, Speculator, extract_writes,
    },
    transitions::{Pending, Writer},
    upstream,
};
use crate::{ExecutionError, StateReader};
use alloy_consensus::{Transaction, TxEnvelope, transaction::Recovered};
use alloy_evm::{
    Evm,
    block::BlockExecutor as _,
    eth::{EthBlockExecutor, EthEvm, receipt_builder::AlloyReceiptBuilder},
    precompiles::PrecompilesMap,
};
use alloy_primitives::{Address, Log, U256, map::hash_map};
use overdrive_primitives::{BlockWithSenders, ChainParams};
use revm::{
    Database, DatabaseCommit,
    context::result::{ExecutionResult, HaltReason},
    database::{State, WrapDatabaseRef, states::CacheAccount},
    inspector::NoOpInspector,
    primitives::KECCAK_EMPTY,
    state::{Account, AccountInfo, EvmState},
};
use std::borrow::Cow;

/// The logs of `result`, as `ExecutionResult::into_logs` gives them, leaving the rest.
///
/// `into_logs` drops the rest (the output bytes) here, on the committer, which did not allocate
/// them: a pool thread executed the transaction. Left in the result, they go back to that thread
/// with the rest of the speculative result (`recycle.rs`).
fn take_logs(result: &mut ExecutionResult<HaltReason>) -> Vec<Log> {
    match result {
        ExecutionResult::Success { logs, .. }
        | ExecutionResult::Revert { logs, .. }
        | ExecutionResult::Halt { logs, .. } => std::mem::take(logs),
    }
}

/// The reference executor the committer drives.
pub(crate) type CommitExecutor<'s, 'a, DB> = EthBlockExecutor<
    'a,
    EthEvm<&'s mut State<WrapDatabaseRef<&'a DB>>, NoOpInspector, PrecompilesMap>,
    &'a ChainParams,
    AlloyReceiptBuilder,
>;

pub(crate) struct Committer<'c, 's, 'a, DB: StateReader> {
    pub executor: &'c mut CommitExecutor<'s, 'a, DB>,
    pub block: &'a BlockWithSenders,
    pub sched: &'c Scheduler,
    pub shared: &'c SpecShared<'c, DB>,
    pub speculator: Speculator<'c, DB>,
    /// Whether Cancun is active (blob gas is counted).
    pub cancun: bool,
    /// Statistics for the benchmark log.
    pub stats: CommitStats,
    /// Coinbase fees committed but not yet credited in `revm::State` (see [`DeferredFees`]).
    pub fees: DeferredFees,
    /// Where committed speculative results go to be freed by a pool thread.
    pub recycler: &'c Recycler,
    /// Committed speculative results not yet handed to `recycler`.
    pub spent: Vec<SpentResult>,
    /// Storage maps still to size up front (see [`Presize`]); `None` until the hints are read.
    pub presize: Option<Vec<Presize>>,
    /// Never execute a pending transaction exactly ahead of speculation (see
    /// [`crate::Scheduling::speculate_all`]).
    pub speculate_all: bool,
    /// Where the committed transitions go to be folded by the pool (see `transitions.rs`);
    /// `None` when `revm::State` folds them, from the start or since the block went
    /// sequential.
    pub transitions: Option<Writer<'c>>,
}

/// A contract the hints expect to change many storage slots (`BlockHints::many_slots`): its cached
/// storage and its transition's are sized for them once they exist, instead of doubling again and
/// again during the block (each doubling rehashes every slot so far, on the committer, whose time
/// caps the speedup). Capacity changes no output.
#[derive(Debug)]
pub(crate) struct Presize {
    address: Address,
    slots: usize,
    cache_done: bool,
    transition_done: bool,
}

/// The fees of validated transactions, held back from `revm::State` until something reads the
/// coinbase there.
///
/// Every transaction pays the coinbase, so committing each payment costs one of the two or
/// three account transitions a transaction commits. A transaction that loaded the coinbase only
/// to pay it (a lazy read) changes nothing else on it, so its payment is held here and credited
/// in one commit, of the last such transaction's account with the summed credit, before any
/// other read of the coinbase in `revm::State`: an exact execution, a validated transaction that
/// read the coinbase strictly, the switch to sequential, the end of the block. `revm::State`
/// merges consecutive transitions of an account into one that keeps the first previous value
/// and the last present value, so one commit of the sum leaves the same cache, transitions and
/// bundle as one commit per fee. That holds while the coinbase exists and is not empty (then a
/// fee only changes its balance, and it cannot become empty); otherwise fees are committed per
/// transaction as before.
#[derive(Debug, Default)]
pub(crate) struct DeferredFees {
    /// The last deferred transaction's coinbase account and the credits held back.
    pending: Option<(Account, U256)>,
}

/// What the committer did, per block.
#[derive(Debug, Default, Clone, Copy)]
pub struct CommitStats {
    /// Speculative results committed after validation.
    pub validated: usize,
    /// Transactions re-executed (or executed first) exactly by the committer.
    pub exact: usize,
    /// Speculative results that failed validation (each re-executed exactly, so counted in
    /// `exact` too).
    pub invalid: usize,
    /// Transactions the committer executed speculatively while it waited.
    pub helped: usize,
    /// Nanoseconds spent validating and committing speculative results, the exact re-runs of
    /// those that failed validation included.
    pub commit_ns: u64,
    /// Nanoseconds spent executing exactly.
    pub exact_ns: u64,
    /// Nanoseconds spent helping.
    pub help_ns: u64,
    /// Nanoseconds spent waiting.
    pub wait_ns: u64,
    /// Nanoseconds from the call to the first transaction (state set-up, system calls).
    pub start_ns: u64,
    /// Nanoseconds from the last commit to the return (post-execution changes, bundle merge).
    pub finish_ns: u64,
    /// Nanoseconds the pool threads had to spare, summed over them: waiting with nothing to
    /// execute, or folding transitions (see [`crate::TransitionFolding`]).
    pub pool_spare_ns: u64,
    /// Whether the pool folded the block's transitions to the end (not the committer, and not
    /// `revm::State` after a switch to sequential).
    pub pool_folded: bool,
    /// Speculative results a pool thread found stale and executed again before the committer
    /// took them (see [`crate::Scheduling::respeculate`]).
    pub respeculated: usize,
}

impl CommitStats {
    /// The committing thread's time on work no other thread takes from it: setting the block
    /// up, validating and committing each result in order (with the exact re-runs of those
    /// that failed), executing exactly, and finishing. Helping and waiting are left out: they
    /// only fill the committer's idle time. By Amdahl's law the parallel path cannot run a
    /// block faster than this, whatever the thread count, so sequential time over this bounds
    /// its speedup. The bound is conservative where the committer executed transactions
    /// exactly because it was ahead of the workers: with more threads those go to workers.
    pub fn serial_ns(&self) -> u64 {
        self.start_ns + self.commit_ns + self.exact_ns + self.finish_ns
    }

    /// Whether the block's transactions ran on more than one thread: some committed results
    /// were speculated by pool threads, known when the validated results outnumber those the
    /// committer speculated itself. False for a block the committer ran alone (a chain left
    /// to it, one thread on the forced parallel path, workers that never got ahead); a block
    /// with a few pool results, all fewer than the committer's own, is counted so too.
    pub fn multi_threaded(&self) -> bool {
        self.validated > self.helped
    }
}

/// A lazily read account: its address, its committed value, what speculation saw.
type LazyRead = (Address, Option<AccountInfo>, Option<Observed>);

/// A speculative result the exact state disagrees with.
struct Invalid;

impl<'a, DB: StateReader> Committer<'_, '_, 'a, DB> {
    /// Commits every transaction in order.
    pub(crate) fn run(&mut self) -> Result<(), ExecutionError> {
        let n = self.block.transactions.len() as TxIdx;
        // One clock read per action (each is a few microseconds; two reads would be a few
        // percent of it): the scheduling between two actions counts towards the second.
        let mut clock = std::time::Instant::now();
        // The system calls' changes, committed before the first transaction.
        self.queue_state_transitions();
        for k in 0..n {
            if self.sched.is_sequential() {
                // Nothing else runs in this block any more (see `Scheduler::go_sequential`):
                // the rest executes exactly as the sequential executor does, without the
                // per-transaction scheduling and publishing.
                self.flush_fees()?;
                self.hand_back_transitions();
                for tx in &self.block.transactions[k as usize..] {
                    self.executor.execute_transaction(tx)?;
                }
                self.stats.exact += (n - k) as usize;
                self.stats.exact_ns += lap(&mut clock);
                return Ok(());
            }
            loop {
                if self.sched.stopped() {
                    return Err(ExecutionError::WorkerPanic(
                        self.sched
                            .panic_message()
                            .unwrap_or_else(|| "block aborted".into()),
                    ));
                }
                match self.sched.status(k) {
                    // A pool thread may take a result back (DONE → RUNNING) until this claims it.
                    DONE if self.sched.try_take(k) => {
                        let outcome = self.sched.take_outcome(k).ok_or_else(|| {
                            ExecutionError::Other(format!("transaction {k} has no outcome"))
                        })?;
                        self.commit_speculative(k, outcome)?;
                        self.stats.commit_ns += lap(&mut clock);
                        break;
                    }
                    // A block that went sequential meanwhile never gets hints, so nothing
                    // would speculate `k`: the committer takes it whatever the mode.
                    PENDING if !self.speculate_all || self.sched.is_sequential() => {
                        // Folding costs less than executing `k` here, and a worker may take
                        // `k` meanwhile.
                        if let Some(transitions) = &mut self.transitions
                            && transitions.shared().committer_should_fold()
                        {
                            transitions.flush();
                            if transitions.shared().fold_some(0) {
                                self.stats.help_ns += lap(&mut clock);
                                continue;
                            }
                        }
                        if self.sched.try_claim(k) {
                            self.commit_exact(k, &[])?;
                            self.stats.exact_ns += lap(&mut clock);
                            break;
                        }
                    }
                    // Running elsewhere, or (under `speculate_all`) left to speculation:
                    // help speculate meanwhile.
                    status @ (PENDING | RUNNING) => match self.sched.next_task() {
                        Some(j) => {
                            self.help(j);
                            self.stats.help_ns += lap(&mut clock);
                        }
                        None if status == RUNNING => {
                            self.sched.committer_wait(k);
                            self.stats.wait_ns += lap(&mut clock);
                        }
                        None => {
                            // The hints are being built, or `k` waits on its dependencies'
                            // release, and a worker takes it then. A short sleep rather than
                            // `yield_now`: spinning on the system call doubled the system time
                            // of a fixture run.
                            std::thread::park_timeout(std::time::Duration::from_micros(20));
                            self.stats.wait_ns += lap(&mut clock);
                        }
                    },
                    // Taken back by a pool thread since the status was read.
                    DONE => {}
                    other => {
                        return Err(ExecutionError::Other(format!(
                            "transaction {k} in unexpected state {other}"
                        )));
                    }
                }
            }
            self.sched.committed(k);
        }
        self.flush_fees()?;
        if let Some(transitions) = &mut self.transitions {
            transitions.flush();
        }
        Ok(())
    }

    /// Credits the deferred fees to the coinbase in `revm::State`.
    fn flush_fees(&mut self) -> Result<(), ExecutionError> {
        let Some((mut account, credit)) = self.fees.pending.take() else {
            return Ok(());
        };
        let coinbase = self.shared.coinbase;
        let db = self.executor.evm.db_mut();
        let now = db
            .basic(coinbase)
            .map_err(|e| ExecutionError::Database(e.to_string()))?;
        // The coinbase existed when the fees were deferred, and only this type commits to it
        // until now.
        let mut info = now.ok_or_else(|| {
            ExecutionError::Other("coinbase vanished while its fees were deferred".into())
        })?;
        info.balance = info
            .balance
            .checked_add(credit)
            .ok_or_else(|| ExecutionError::Other("coinbase balance overflow".into()))?;
        account.info = info;
        db.commit(std::iter::once((coinbase, account)).collect());
        self.queue_state_transitions();
        Ok(())
    }

    /// Queues what `revm::State` folded into its own transition state since this was last
    /// called: one commit's changes, made through `revm::State` rather than by
    /// `commit_speculative`.
    fn queue_state_transitions(&mut self) {
        if let Some(transitions) = &mut self.transitions
            && let Some(state) = self.executor.evm.db_mut().transition_state.as_mut()
        {
            transitions.push_folded(state);
        }
    }

    /// Folds the queued transitions into `revm::State`'s, which folds the rest of the block's
    /// itself: nothing but the committer runs any more.
    fn hand_back_transitions(&mut self) {
        let Some(mut transitions) = self.transitions.take() else {
            return;
        };
        let db = self.executor.evm.db_mut();
        transitions.flush();
        transitions
            .shared()
            .fold_into(db.transition_state.get_or_insert_with(Default::default));
    }

    /// Executes `j` speculatively on the committer's thread (while the transaction it waits
    /// for is still running elsewhere). Its dependants go to the ready queue, never to the
    /// committer.
    fn help(&mut self, j: TxIdx) {
        self.stats.helped += 1;
        let tx = &self.block.transactions[j as usize];
        // `next_task` hands out nothing before the hints are published.
        let (lazy, publish) = self.sched.hints().map_or((None, true), |h| {
            (h.lazy_recipient[j as usize], h.publish[j as usize])
        });
        let outcome = match self.speculator.run(j, tx, lazy, publish, &[]) {
            SpecRun::Done(outcome) => outcome,
            // Only the committer sets estimates and it clears them before helping, so this is
            // not expected; leave the transaction to the exact path rather than wait on itself.
            SpecRun::Blocked(_) => SpecOutcome::failed(Vec::new(), self.speculator.thread()),
        };
        self.sched.finish(j, outcome, false);
        self.sched.suspect(&self.speculator.next_writers);
    }

    /// The block gas-limit rule of `execute_transaction_without_commit`, applied in order.
    fn check_block_gas(&self, tx: &Recovered<TxEnvelope>) -> Result<(), ExecutionError> {
        let evm = &self.executor.evm;
        let used = if evm.cfg_env().enable_amsterdam_eip8037 {
            self.executor.block_regular_gas_used
        } else {
            self.executor.cumulative_tx_gas_used
        };
        let available = evm.block().gas_limit - used;
        let mut max_usage = tx.gas_limit();
        if let Some(cap) = evm.cfg_env().tx_gas_limit_cap {
            max_usage = max_usage.min(cap);
        }
        if max_usage > available {
            return Err(ExecutionError::BlockGasExceeded {
                gas_limit: tx.gas_limit(),
                available,
            });
        }
        Ok(())
    }

    fn commit_speculative(
        &mut self,
        k: TxIdx,
        mut outcome: Box<SpecOutcome>,
    ) -> Result<(), ExecutionError> {
        let tx = &self.block.transactions[k as usize];
        self.check_block_gas(tx)?;
        self.presize_storage();
        // The result is used where it lies in the worker's allocation, never moved out:
        // moving it copied all of it (≈ 400 bytes, the logs' bloom included), and each of its
        // cache lines comes from the worker's core (see `overdrive_bench::core_round_trip`).
        let Some(exec) = outcome.exec.as_mut() else {
            let result = self.commit_exact(k, &outcome.written);
            self.recycle(outcome);
            return result;
        };
        let coinbase = self.shared.coinbase;
        if self.fees.pending.is_some()
            && outcome.reads.iter().any(|r| {
                matches!(r, Read::Account { address, mode, .. }
                    if *address == coinbase && *mode != ReadMode::LazyCoinbase)
            })
        {
            self.flush_fees()?;
        }
        let valid = self
            .validate_and_rebase(&outcome.reads, &mut exec.state)
            .is_ok();
        if let Some(hints) = self.sched.hints() {
            hints.call_checked(k, !valid);
        }
        if !valid {
            self.stats.invalid += 1;
            let result = self.commit_exact(k, &outcome.written);
            self.recycle(outcome);
            return result;
        }
        self.stats.validated += 1;
        if outcome.rerun {
            self.sched.rerun_paid();
        }
        let executor = &mut *self.executor;
        let logs = take_logs(&mut exec.result);
        upstream::commit_gas_and_receipt(
            executor,
            &exec.result,
            logs,
            exec.bloom,
            tx.tx_type(),
            tx.blob_gas_used().unwrap_or_default(),
            self.cancun,
        );
        // The cache is updated here, as `commit_iter` updates it; the transitions are queued
        // for the pool to fold, in order per address, as `commit_iter` would fold them
        // (`transitions.rs`). Draining keeps the map's table; it and the rest of the result
        // (its output bytes) stay in `outcome` for their owner to free.
        let db = executor.evm.db_mut();
        // The speculator shed the accounts' `original_info` (`spec::shed_original_info`),
        // which `revm::State` reads only for an account missing from its cache, and its
        // block-access-list builder always.
        debug_assert!(db.bal_state.bal_builder.is_none());
        debug_assert!(
            exec.state
                .iter()
                .all(|(address, a)| !a.is_touched() || db.cache.accounts.contains_key(address)),
            "a touched account of transaction {k} is missing from the committed cache"
        );
        // Without a block-access-list builder (checked above), `commit_iter` is exactly this
        // cache update and fold, and then hands the changes to the state hook, if any.
        if let Some(transitions) = &mut self.transitions {
            // The hook gets a copy: the map is drained into the cache.
            let for_hook = db.state_hook.is_some().then(|| exec.state.clone());
            for (address, transition) in db.cache.apply_evm_state(exec.state.drain(), |_, _| {}) {
                // The storage is the transaction's own map, moved (`apply_evm_state` borrows
                // nothing).
                let transition = transition.map_storage(|s| s.map(Cow::into_owned));
                transitions.push(address, Pending::Evm(transition));
            }
            if let (Some(hook), Some(changes)) = (db.state_hook.as_mut(), for_hook) {
                hook.on_state(changes);
            }
        } else {
            db.commit_iter(&mut exec.state.drain());
        }
        self.recycle(outcome);
        Ok(())
    }

    /// Sizes the storage maps of [`Presize`] contracts that exist by now.
    fn presize_storage(&mut self) {
        let pending = match &mut self.presize {
            Some(pending) if pending.is_empty() => return,
            Some(pending) => pending,
            None => {
                // Speculative results exist only once the hints are published.
                let Some(hints) = self.sched.hints() else {
                    return;
                };
                self.presize.insert(
                    hints
                        .many_slots
                        .iter()
                        .map(|&(address, slots)| Presize {
                            address,
                            slots,
                            cache_done: false,
                            transition_done: false,
                        })
                        .collect(),
                )
            }
        };
        let transitions = self.transitions.as_ref().map(Writer::shared);
        let db = self.executor.evm.db_mut();
        pending.retain_mut(|p| {
            if !p.cache_done
                && let Some(account) = db
                    .cache
                    .accounts
                    .get_mut(&p.address)
                    .and_then(|cached| cached.account.as_mut())
            {
                account.storage.reserve(p.slots);
                p.cache_done = true;
            }
            if !p.transition_done {
                p.transition_done = if let Some(transitions) = transitions {
                    transitions.reserve_storage(p.address, p.slots)
                } else if let Some(transition) = db
                    .transition_state
                    .as_mut()
                    .and_then(|t| t.transitions.get_mut(&p.address))
                {
                    transition.storage.reserve(p.slots);
                    true
                } else {
                    false
                };
            }
            !(p.cache_done && p.transition_done)
        });
    }

    /// Frees a consumed speculative result the committer speculated itself, and queues any
    /// other for the pool thread that made it (see `recycle.rs`).
    fn recycle(&mut self, outcome: Box<SpecOutcome>) {
        if outcome.origin == self.speculator.thread() {
            // Its allocations are this thread's own: freeing them here is the local path.
            drop(outcome);
            return;
        }
        self.spent.push(SpentResult { _outcome: outcome });
        self.recycler.give(&mut self.spent);
    }

    /// Checks every recorded read against the committed state and rebases the lazy balances.
    fn validate_and_rebase(&mut self, reads: &[Read], state: &mut EvmState) -> Result<(), Invalid> {
        let db: &mut State<WrapDatabaseRef<&'a DB>> = self.executor.evm.db_mut();
        let mut lazy: [Option<LazyRead>; 2] = [None, None];
        // A lazy coinbase read whose fee is deferred: the coinbase's observed value.
        let mut defer: Option<(Address, Option<Observed>)> = None;
        for read in reads {
            match read {
                Read::Account {
                    address,
                    seen,
                    mode,
                } => {
                    let observed = seen.observed();
                    let base = seen.base();
                    if *mode == ReadMode::Strict {
                        // `State::basic` without the clone: the cached account, or the
                        // pre-state value seeded as a cache miss would load it (and then equal
                        // to what speculation saw, which was that very value).
                        match db.cache.accounts.entry(*address) {
                            hash_map::Entry::Occupied(entry) => {
                                let now = entry.get().account.as_ref().map(|a| &a.info);
                                if !seen.answers(now.map(Observed::from_info)) {
                                    return Err(Invalid);
                                }
                                continue;
                            }
                            hash_map::Entry::Vacant(entry) => {
                                if let Some(base) = base {
                                    entry.insert(cache_account(base));
                                    continue;
                                }
                            }
                        }
                    }
                    if let Some(base) = base {
                        seed_account(db, *address, base);
                    }
                    if *mode == ReadMode::LazyCoinbase
                        && db.cache.accounts.get(address).is_some_and(|cached| {
                            cached.account.as_ref().is_some_and(|a| !a.info.is_empty())
                        })
                    {
                        defer = Some((*address, observed));
                        continue;
                    }
                    let now = db.basic(*address).map_err(|_| Invalid)?;
                    match mode {
                        ReadMode::Strict => {
                            if !seen.answers(Observed::of(&now)) {
                                return Err(Invalid);
                            }
                        }
                        ReadMode::LazyCoinbase => lazy[0] = Some((*address, now, observed)),
                        ReadMode::LazyRecipient => {
                            if now.as_ref().is_some_and(|i| i.code_hash != KECCAK_EMPTY) {
                                return Err(Invalid);
                            }
                            lazy[1] = Some((*address, now, observed));
                        }
                    }
                }
                Read::Storage {
                    address,
                    slot,
                    value,
                    base,
                } => {
                    if *base && seed_storage(db, *address, *slot, *value) {
                        continue;
                    }
                    if db.storage(*address, *slot).map_err(|_| Invalid)? != *value {
                        return Err(Invalid);
                    }
                }
            }
        }
        for (address, now, observed) in lazy.into_iter().flatten() {
            rebase(state, address, now, observed)?;
        }
        if let Some((address, observed)) = defer
            && let Some((account, credit)) = take_fee(state, address, observed)?
        {
            // Summed before anything is replaced: an overflow fails validation with the held
            // credit still pending, for the exact re-run's flush to pay.
            let total = match &self.fees.pending {
                Some((_, held)) => held.checked_add(credit).ok_or(Invalid)?,
                None => credit,
            };
            self.fees.pending = Some((account, total));
        }
        Ok(())
    }

    /// Executes transaction `k` exactly on the committed state and commits it. `written` are
    /// the locations its last speculative run published (with an earlier run's, if that one
    /// failed): they are estimates until the exact writes replace them.
    fn commit_exact(&mut self, k: TxIdx, written: &[Location]) -> Result<(), ExecutionError> {
        self.stats.exact += 1;
        self.flush_fees()?;
        let mv = self.shared.mv;
        let tx = &self.block.transactions[k as usize];
        if self.sched.is_sequential() {
            // Nothing speculates in this block any more, so nothing reads the memory: commit
            // exactly as the sequential executor does.
            self.hand_back_transitions();
            self.executor.execute_transaction(tx)?;
            return Ok(());
        }
        mv.mark_estimates(k, written);
        let output = self.executor.execute_transaction_without_commit(tx)?;
        let mut writes = Vec::with_capacity(output.result.state.len() + 2);
        extract_writes(&output.result.state, &[], self.shared, &mut writes);
        // Like the speculative run, a transaction nothing is hinted to read from publishes
        // nothing (unless its speculative run did: those entries must be replaced).
        let publish = self
            .sched
            .hints()
            .is_none_or(|h| h.publish[k as usize] || !written.is_empty());
        if publish {
            let mut next_writers = Vec::new();
            mv.write(k, 1, &writes, written, &mut next_writers);
            self.sched.suspect(&next_writers);
        }
        self.executor.commit_transaction(output);
        self.queue_state_transitions();
        Ok(())
    }
}

/// Nanoseconds since `clock`, which moves to now.
fn lap(clock: &mut std::time::Instant) -> u64 {
    let now = std::time::Instant::now();
    let ns = now.duration_since(*clock).as_nanos() as u64;
    *clock = now;
    ns
}

/// Puts the pre-state value of an account into `revm::State`'s cache exactly as a cache miss
/// would (`State::load_cache_account`), so the committer does not read the pre-state again.
fn seed_account<DB: StateReader>(
    state: &mut State<WrapDatabaseRef<&DB>>,
    address: Address,
    base: &Option<AccountInfo>,
) {
    if let hash_map::Entry::Vacant(entry) = state.cache.accounts.entry(address) {
        entry.insert(cache_account(base));
    }
}

/// The cache entry `State::load_cache_account` creates for a pre-state value.
fn cache_account(base: &Option<AccountInfo>) -> CacheAccount {
    match base {
        None => CacheAccount::new_loaded_not_existing(),
        Some(info) if info.is_empty() => CacheAccount::new_loaded_empty_eip161(Default::default()),
        Some(info) => CacheAccount::new_loaded(info.clone(), Default::default()),
    }
}

/// Like `State::storage` on a slot it has not cached yet, with the pre-state value already
/// known. Returns false (nothing done) when the case is not that one: the account is not
/// cached, does not exist, its storage is known (then the answer is zero, not the pre-state's),
/// or the slot is cached (then the cache decides).
fn seed_storage<DB: StateReader>(
    state: &mut State<WrapDatabaseRef<&DB>>,
    address: Address,
    slot: U256,
    value: U256,
) -> bool {
    let Some(account) = state.cache.accounts.get_mut(&address) else {
        return false;
    };
    if account.status.is_storage_known() {
        return false;
    }
    let Some(plain) = account.account.as_mut() else {
        return false;
    };
    match plain.storage.entry(slot) {
        hash_map::Entry::Vacant(entry) => {
            entry.insert(value);
            true
        }
        hash_map::Entry::Occupied(_) => false,
    }
}

/// Moves a lazily credited account's speculative credit onto its committed balance.
fn rebase(
    state: &mut EvmState,
    address: Address,
    now: Option<AccountInfo>,
    observed: Option<Observed>,
) -> Result<(), Invalid> {
    let Some(account) = state.get_mut(&address) else {
        return Ok(());
    };
    let Some(credit) = lazy_credit(account, observed)? else {
        return Ok(());
    };
    let mut info = now.unwrap_or_default();
    info.balance = info.balance.checked_add(credit).ok_or(Invalid)?;
    account.info = info;
    Ok(())
}

/// What a lazily read account was credited, when that credit is its only change: `None` when
/// the transaction left it untouched, `Invalid` when it did anything else to it. `observed` is
/// what speculation read (`None`: the account did not exist).
fn lazy_credit(account: &Account, observed: Option<Observed>) -> Result<Option<U256>, Invalid> {
    if !account.is_touched() {
        return Ok(None);
    }
    if account.is_selfdestructed()
        || account.is_created()
        || account.changed_storage_slots().next().is_some()
    {
        return Err(Invalid);
    }
    let (before, nonce, code_hash) = observed.map_or((U256::ZERO, 0, KECCAK_EMPTY), |o| {
        (o.balance, o.nonce, o.code_hash)
    });
    if account.info.nonce != nonce || account.info.code_hash != code_hash {
        return Err(Invalid);
    }
    account
        .info
        .balance
        .checked_sub(before)
        .ok_or(Invalid)
        .map(Some)
}

/// Removes a lazily loaded coinbase from a transaction's changes and returns it with the fee it
/// was credited, for [`DeferredFees`].
fn take_fee(
    state: &mut EvmState,
    address: Address,
    observed: Option<Observed>,
) -> Result<Option<(Account, U256)>, Invalid> {
    let Some(credit) = state
        .get(&address)
        .map(|account| lazy_credit(account, observed))
        .transpose()?
        .flatten()
    else {
        return Ok(None);
    };
    Ok(state.remove(&address).map(|account| (account, credit)))
}
