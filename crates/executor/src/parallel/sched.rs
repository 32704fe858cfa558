//! Who runs which transaction when.
//!
//! Each transaction goes PENDING → RUNNING → DONE → TAKEN → COMMITTED (or PENDING → RUNNING →
//! COMMITTED when the committer runs it exactly itself). Every claim is a compare-and-swap,
//! so exactly one thread runs a transaction or takes its result: a worker claims PENDING, the
//! committer claims DONE as TAKEN. The one step back is DONE → RUNNING, when a pool thread
//! finds a result doomed before the committer took it and executes the transaction again (see
//! [`Scheduler::reclaim`]).
//!
//! Transactions are handed out in block order from a cursor. One whose hinted dependencies
//! have not finished is parked on the first unfinished one; when that finishes, the thread that
//! finished it continues with the lowest parked dependant itself, so a chain of dependent
//! transactions runs in one worker, in order, without a hand-off per link.

use super::{hints::BlockHints, mv::TxIdx, spec::SpecOutcome};
use std::{
    cmp::Reverse,
    collections::BinaryHeap,
    sync::{
        Condvar, Mutex, MutexGuard, OnceLock, PoisonError,
        atomic::{AtomicBool, AtomicU8, AtomicU64, AtomicUsize, Ordering, fence},
    },
    thread::Thread,
    time::{Duration, Instant},
};

pub(crate) const PENDING: u8 = 0;
pub(crate) const RUNNING: u8 = 1;
pub(crate) const DONE: u8 = 2;
pub(crate) const TAKEN: u8 = 3;
pub(crate) const COMMITTED: u8 = 4;

/// Pool threads take results back to run them again while their re-runs pay: at most this
/// many in a block, plus [`RERUNS_PER_PAID`] per re-run result that passed validation, and
/// never more than one per [`RERUNS_BLOCK_SHARE`] of the block's transactions.
///
/// Each re-run can make the next writer's result stale in turn. Where the hints miss a location
/// that most transactions write, re-runs come in waves from every out-of-order finish, and most go
/// stale again before the committer reaches them: with conflicts hidden from the DAG's learning,
/// the router workload on 10 pairs re-ran more than one result per transaction on 16 threads and
/// ran well below the sequential speed. (Calls of an undecoded contract are chained once they
/// conflict often, re-runs counted: see `BlockHints::call_checked`.)
pub(crate) const RERUNS_FREE: usize = 64;
/// See [`RERUNS_FREE`].
pub(crate) const RERUNS_PER_PAID: usize = 2;
/// See [`RERUNS_FREE`]: re-runs stop in a block once they reach this fraction (1/N) of its
/// transactions, so that hidden hot spots cost at most that much extra execution. On the
/// router workload over 300 pairs, 16 threads re-ran 270–600 of 6,000.
pub(crate) const RERUNS_BLOCK_SHARE: usize = 4;

/// How far ahead of the transaction it waits for the committer asks to be woken: waking it per
/// transaction costs more than it commits.
const WAKE_BATCH: usize = 16;

/// Locks `m`, poisoned or not. Poisoning means a thread panicked: the block is being aborted
/// and the data is only read to wind down, or it is statistics and scheduling memory (the
/// executor's), which steer and never decide an output.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

#[derive(Debug)]
pub(crate) struct Scheduler {
    n: usize,
    status: Box<[AtomicU8]>,
    /// The speculative outcome of each transaction: written by its executor before its status
    /// becomes DONE, taken by the committer after (or back by a pool thread that runs it
    /// again, see [`Self::reclaim`]).
    outcomes: Box<[Mutex<Option<Box<SpecOutcome>>>]>,
    /// Transactions parked until this one is DONE (or COMMITTED). Guarded by its mutex; a
    /// parker re-checks the status under the lock, a finisher sets the status before taking
    /// the lock, so no wake-up is lost.
    waiters: Box<[Mutex<Vec<TxIdx>>]>,
    /// The block's hints, built by a worker while the committer already executes the first
    /// transactions exactly. Nothing is handed out for speculation before they are set; a
    /// block whose hints show one long chain never gets them (see `sequential`).
    hints: OnceLock<BlockHints>,
    /// Set instead of `hints` when the hints show that the block is essentially one chain of
    /// dependent transactions: speculation cannot help, so none happens and the committer
    /// executes everything exactly (and publishes nothing to the multi-version memory).
    sequential: AtomicBool,
    cursor: AtomicUsize,

    /// Transactions whose dependencies finished, lowest first, not yet claimed.
    ready: Mutex<BinaryHeap<Reverse<TxIdx>>>,
    ready_len: AtomicUsize,
    /// Idle workers wait here for `ready` to fill or the block to end.
    idle: Condvar,
    /// Workers waiting on `idle`. Changed and read only with `ready` locked, so a notifier that
    /// sees zero cannot miss a sleeper; it skips the notification, which is a system call (one per
    /// released batch of dependants otherwise, a noticeable share of a worker's time on a block of
    /// transfers).
    sleepers: AtomicUsize,
    /// Set when the committer is finished (success or error) or a thread panicked.
    stop: AtomicBool,
    /// The first panic message, if any thread panicked.
    panic: Mutex<Option<String>>,
    committer: Thread,
    /// Wake the committer once a transaction at or above this index is DONE (`usize::MAX`: it
    /// is not waiting).
    wake_committer_at: AtomicUsize,
    /// The transaction the committer waits for (meaningful while `wake_committer_at` is set).
    awaited: AtomicUsize,
    /// Nanoseconds the pool threads had to spare: waiting with nothing to execute, or folding
    /// transitions (see [`Self::spare_ns`]).
    spare_ns: AtomicU64,
    /// DONE transactions whose result may have been made stale by a write below them since,
    /// lowest first (see [`Self::suspect`]); `None` when re-speculation is off.
    suspects: Option<Mutex<BinaryHeap<Reverse<TxIdx>>>>,
    suspects_len: AtomicUsize,
    /// Re-run results that then passed validation (see [`Self::rerun_paid`]).
    reruns_paid: AtomicUsize,
    /// Suspects that were still RUNNING when queued: their run may have read before the write
    /// that made them suspect, so `finish` queues them once DONE.
    recheck: Box<[AtomicBool]>,
    /// Transactions a pool thread executed again after finding their result stale.
    respeculated: AtomicUsize,
}

impl Scheduler {
    pub(crate) fn new(n: usize, committer: Thread, respeculate: bool) -> Self {
        Self {
            n,
            status: (0..n).map(|_| AtomicU8::new(PENDING)).collect(),
            outcomes: (0..n).map(|_| Mutex::new(None)).collect(),
            waiters: (0..n).map(|_| Mutex::new(Vec::new())).collect(),
            hints: OnceLock::new(),
            sequential: AtomicBool::new(false),
            cursor: AtomicUsize::new(0),

            ready: Mutex::new(BinaryHeap::new()),
            ready_len: AtomicUsize::new(0),
            idle: Condvar::new(),
            sleepers: AtomicUsize::new(0),
            stop: AtomicBool::new(false),
            panic: Mutex::new(None),
            committer,
            wake_committer_at: AtomicUsize::new(usize::MAX),
            awaited: AtomicUsize::new(usize::MAX),
            spare_ns: AtomicU64::new(0),
            suspects: respeculate.then(|| Mutex::new(BinaryHeap::new())),
            suspects_len: AtomicUsize::new(0),
            reruns_paid: AtomicUsize::new(0),
            recheck: (0..if respeculate { n } else { 0 })
                .map(|_| AtomicBool::new(false))
                .collect(),
            respeculated: AtomicUsize::new(0),
        }
    }

    /// Queues those of `txs` that are DONE for a pool thread to check against the
    /// multi-version memory: `txs` are the next writers above a location just (re)written,
    /// which most likely read it before the write (`MvMemory::write`).
    ///
    /// Without this, one stale result makes a cascade on many threads: the committer executes
    /// it again exactly, so its published values change; the next transaction on the same
    /// location ran on the old ones and fails validation too, and so on down the block. On the
    /// router workload most failed validations were such (a read of a speculative value whose
    /// writer the committer had re-executed since), and their exact re-runs were all on the
    /// committer, one after another. A pool thread that finds the result stale executes it
    /// again before the committer reaches it.
    pub(crate) fn suspect(&self, txs: &[TxIdx]) {
        let Some(suspects) = &self.suspects else {
            return;
        };
        let mut done = txs
            .iter()
            .copied()
            .filter(|&tx| match self.status(tx) {
                DONE => true,
                RUNNING => {
                    // The other half of `finish`'s fence: either it sees the flag, or this
                    // sees its DONE and queues the transaction now (and clears the flag, which
                    // would queue it again after a re-run). Release: the thread that takes the
                    // flag sees the write that made `tx` a suspect.
                    let flag = &self.recheck[tx as usize];
                    flag.store(true, Ordering::Release);
                    fence(Ordering::SeqCst);
                    let done = self.status(tx) == DONE;
                    if done {
                        flag.store(false, Ordering::Relaxed);
                    }
                    done
                }
                _ => false,
            })
            .peekable();
        if done.peek().is_none() {
            return;
        }
        let mut heap = lock(suspects);
        heap.extend(done.map(Reverse));
        self.suspects_len.store(heap.len(), Ordering::Release);
        drop(heap);
        // Idle pool threads wait on `ready` (see `idle_wait`, which re-checks the suspects
        // under the same lock).
        let _ready = lock(&self.ready);
        if self.sleepers.load(Ordering::Relaxed) > 0 {
            self.idle.notify_one();
        }
    }

    /// The lowest queued suspect, if any.
    pub(crate) fn next_suspect(&self) -> Option<TxIdx> {
        let suspects = self.suspects.as_ref()?;
        if self.suspects_len.load(Ordering::Acquire) == 0 {
            return None;
        }
        let mut heap = lock(suspects);
        let popped = heap.pop();
        self.suspects_len.store(heap.len(), Ordering::Release);
        popped.map(|Reverse(tx)| tx)
    }

    /// Takes back the result of DONE transaction `tx` for its executor to run it again, when
    /// `stale` says so (called with the result's lock held, so the committer waits rather than
    /// take it meanwhile). The transaction is RUNNING again; its caller must `finish` it.
    /// `None` when the committer took it first, it is not stale, or re-runs stopped paying
    /// (see [`RERUNS_FREE`]).
    pub(crate) fn reclaim(
        &self,
        tx: TxIdx,
        stale: impl FnOnce(&SpecOutcome) -> bool,
    ) -> Option<Box<SpecOutcome>> {
        let paid = self.reruns_paid.load(Ordering::Relaxed);
        let budget = RERUNS_FREE
            .saturating_add(paid.saturating_mul(RERUNS_PER_PAID))
            .min(self.n / RERUNS_BLOCK_SHARE);
        // A re-run is reserved before the check, so that threads checking at once cannot
        // pass the budget together, and handed back if none happens.
        self.respeculated
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |r| {
                (r < budget).then_some(r + 1)
            })
            .ok()?;
        let taken = {
            let mut outcome = lock(&self.outcomes[tx as usize]);
            // The CAS fails when the committer claimed it meanwhile (DONE → TAKEN, before it
            // locks).
            (self.status(tx) == DONE
                && outcome.as_deref().is_some_and(stale)
                && self.status[tx as usize]
                    .compare_exchange(DONE, RUNNING, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok())
            .then(|| outcome.take())
            .flatten()
        };
        if taken.is_none() {
            self.respeculated.fetch_sub(1, Ordering::Relaxed);
        }
        taken
    }

    /// Counts a re-run result that passed validation: the committer did not execute it again.
    pub(crate) fn rerun_paid(&self) {
        self.reruns_paid.fetch_add(1, Ordering::Relaxed);
    }

    /// How many results pool threads took back and executed again.
    pub(crate) fn respeculated(&self) -> usize {
        self.respeculated.load(Ordering::Relaxed)
    }

    /// Wakes the committer if it waits for a batch of results: a pool thread with nothing to
    /// execute will not finish one, so it would sleep out its timeout.
    pub(crate) fn wake_waiting_committer(&self) {
        if self.wake_committer_at.swap(usize::MAX, Ordering::AcqRel) != usize::MAX {
            self.committer.unpark();
        }
    }

    /// Adds a pool thread's spare time since `since`.
    pub(crate) fn add_spare(&self, since: Instant) {
        self.spare_ns
            .fetch_add(since.elapsed().as_nanos() as u64, Ordering::Relaxed);
    }

    /// The pool threads' spare time so far, summed: waiting with nothing to execute, and
    /// folding the committer's transitions instead (work they take for having time to spare,
    /// so that moving it to them does not make their time look taken).
    pub(crate) fn spare_ns(&self) -> u64 {
        self.spare_ns.load(Ordering::Relaxed)
    }

    /// Publishes the hints: speculation may start.
    pub(crate) fn set_hints(&self, hints: BlockHints) {
        // Only one thread builds them; a second set would be a bug, and ignoring it is safe.
        let _unused = self.hints.set(hints);
        let _guard = lock(&self.ready);
        self.idle.notify_all();
    }

    /// The hints, once published.
    pub(crate) fn hints(&self) -> Option<&BlockHints> {
        self.hints.get()
    }

    /// Gives up speculation for this block (see `sequential`).
    pub(crate) fn go_sequential(&self) {
        self.sequential.store(true, Ordering::Release);
        let _guard = lock(&self.ready);
        self.idle.notify_all();
    }

    /// Whether the block runs without speculation.
    pub(crate) fn is_sequential(&self) -> bool {
        self.sequential.load(Ordering::Acquire)
    }

    pub(crate) fn status(&self, tx: TxIdx) -> u8 {
        self.status[tx as usize].load(Ordering::Acquire)
    }

    pub(crate) fn try_claim(&self, tx: TxIdx) -> bool {
        self.status[tx as usize]
            .compare_exchange(PENDING, RUNNING, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    pub(crate) fn stopped(&self) -> bool {
        self.stop.load(Ordering::Acquire)
    }

    /// Ends the block for every thread.
    pub(crate) fn stop(&self) {
        self.stop.store(true, Ordering::Release);
        let _guard = lock(&self.ready);
        self.idle.notify_all();
        drop(_guard);
        self.committer.unpark();
    }

    /// Records a panic and stops the block.
    pub(crate) fn record_panic(&self, message: String) {
        lock(&self.panic).get_or_insert(message);
        self.stop();
    }

    pub(crate) fn panic_message(&self) -> Option<String> {
        lock(&self.panic).clone()
    }

    /// True when every hinted dependency of `tx` (those known before execution and the one
    /// found since, see `BlockHints::conflict_dep`) has finished; otherwise parks `tx` on an
    /// unfinished one and returns false.
    fn deps_ready_or_park(&self, hints: &BlockHints, tx: TxIdx) -> bool {
        let known = hints.deps[tx as usize].iter().copied();
        for dep in known.chain(hints.conflict_dep(tx)) {
            if self.status(dep) >= DONE {
                continue;
            }
            let mut waiters = lock(&self.waiters[dep as usize]);
            if self.status(dep) >= DONE {
                continue;
            }
            waiters.push(tx);
            return false;
        }
        true
    }

    /// The next transaction to execute speculatively, claimed; `None` when none is available
    /// right now.
    pub(crate) fn next_task(&self) -> Option<TxIdx> {
        let hints = self.hints.get()?;
        loop {
            if self.ready_len.load(Ordering::Acquire) > 0 {
                let popped = {
                    let mut ready = lock(&self.ready);
                    let popped = ready.pop();
                    self.ready_len.store(ready.len(), Ordering::Release);
                    popped
                };
                if let Some(Reverse(tx)) = popped {
                    if self.try_claim(tx) {
                        return Some(tx);
                    }
                    continue;
                }
            }
            let next = self.cursor.fetch_add(1, Ordering::AcqRel);
            if next >= self.n {
                return None;
            }
            let tx = next as TxIdx;
            if self.status(tx) == PENDING
                && self.deps_ready_or_park(hints, tx)
                && self.try_claim(tx)
            {
                return Some(tx);
            }
        }
    }

    /// Stores the outcome of `tx`, marks it DONE and releases its dependants. When
    /// `keep_one`, the lowest dependant that is now ready is claimed and returned for the
    /// caller to run next; the others go to the ready queue.
    pub(crate) fn finish(
        &self,
        tx: TxIdx,
        outcome: Box<SpecOutcome>,
        keep_one: bool,
    ) -> Option<TxIdx> {
        *lock(&self.outcomes[tx as usize]) = Some(outcome);
        self.status[tx as usize].store(DONE, Ordering::Release);
        let next = self.release_waiters(tx, keep_one);
        // The other half of `committer_wait`'s fence: of this thread's store of DONE and the
        // committer's store of `wake_committer_at`, each side sees the other's, so the
        // committer does not park on a transaction finished unseen.
        fence(Ordering::SeqCst);
        if self
            .recheck
            .get(tx as usize)
            .is_some_and(|r| r.load(Ordering::Relaxed) && r.swap(false, Ordering::Acquire))
        {
            self.suspect(&[tx]);
        }
        // A thread running a chain in order (`next` is the following transaction) wakes the
        // committer only every WAKE_BATCH transactions; anything else wakes it as soon as the
        // transaction it waits for is done.
        let at = self.wake_committer_at.load(Ordering::Acquire);
        let wake = tx as usize >= at
            || (at != usize::MAX
                && tx as usize == self.awaited.load(Ordering::Acquire)
                && next != Some(tx + 1));
        if wake && self.wake_committer_at.swap(usize::MAX, Ordering::AcqRel) != usize::MAX {
            self.committer.unpark();
        }
        next
    }

    /// Marks `tx` committed (its status may have been RUNNING or TAKEN) and releases anything
    /// still parked on it. A transaction that was DONE released its dependants then, and
    /// nothing parks on a finished transaction (`deps_ready_or_park` checks under the lock).
    pub(crate) fn committed(&self, tx: TxIdx) {
        if self.status[tx as usize].swap(COMMITTED, Ordering::AcqRel) < DONE {
            self.release_waiters(tx, false);
        }
    }

    fn release_waiters(&self, tx: TxIdx, keep_one: bool) -> Option<TxIdx> {
        let mut woken = std::mem::take(&mut *lock(&self.waiters[tx as usize]));
        if woken.is_empty() {
            return None;
        }
        // Only transactions handed out after the hints were published are ever parked.
        let hints = self.hints.get()?;
        woken.sort_unstable();
        let mut kept = None;
        let mut queued = Vec::new();
        for w in woken {
            if self.status(w) != PENDING || !self.deps_ready_or_park(hints, w) {
                continue;
            }
            if keep_one && kept.is_none() && self.try_claim(w) {
                kept = Some(w);
            } else {
                queued.push(w);
            }
        }
        if !queued.is_empty() {
            let mut ready = lock(&self.ready);
            ready.extend(queued.into_iter().map(Reverse));
            self.ready_len.store(ready.len(), Ordering::Release);
            if self.sleepers.load(Ordering::Relaxed) > 0 {
                self.idle.notify_all();
            }
        }
        kept
    }

    /// Claims DONE `tx` for the committer (DONE → TAKEN): false when a pool thread took it
    /// back meanwhile to execute it again.
    pub(crate) fn try_take(&self, tx: TxIdx) -> bool {
        self.status[tx as usize]
            .compare_exchange(DONE, TAKEN, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    /// The committer's outcome of `tx`, once TAKEN.
    pub(crate) fn take_outcome(&self, tx: TxIdx) -> Option<Box<SpecOutcome>> {
        lock(&self.outcomes[tx as usize]).take()
    }

    /// A worker with nothing to do waits for work or the end of the block. Before sleeping it
    /// wakes the committer, which may be waiting for a batch that will not fill.
    pub(crate) fn idle_wait(&self) {
        self.wake_waiting_committer();
        let ready = lock(&self.ready);
        if ready.is_empty()
            && self.suspects_len.load(Ordering::Acquire) == 0
            && !self.stopped()
            && !self.is_sequential()
        {
            let since = Instant::now();
            self.sleepers.fetch_add(1, Ordering::Relaxed);
            let (_ready, _timeout) = self
                .idle
                .wait_timeout(ready, Duration::from_micros(500))
                .unwrap_or_else(PoisonError::into_inner);
            // `_ready` holds the lock again here.
            self.sleepers.fetch_sub(1, Ordering::Relaxed);
            self.add_spare(since);
        }
    }

    /// The committer waits for `tx` (RUNNING in a worker) to become DONE: first spinning
    /// briefly, then parking until a batch beyond it is done.
    pub(crate) fn committer_wait(&self, tx: TxIdx) {
        for _ in 0..200 {
            if self.status(tx) != RUNNING || self.stopped() {
                return;
            }
            std::hint::spin_loop();
        }
        let target = (tx as usize + WAKE_BATCH).min(self.n - 1);
        self.awaited.store(tx as usize, Ordering::Release);
        self.wake_committer_at.store(target, Ordering::Release);
        // Store, fence, load on both sides (here and in `finish`): without the fence the
        // re-check below could read the status before the target is visible to a finishing
        // worker (a store-load reordering x86 makes), both would miss the other, and the
        // committer would nap the full timeout.
        fence(Ordering::SeqCst);
        // Re-check after publishing the target: a finish before this point may have missed it.
        if self.status(tx) == RUNNING && self.status(target as TxIdx) < DONE && !self.stopped() {
            std::thread::park_timeout(Duration::from_micros(300));
        }
        self.wake_committer_at.store(usize::MAX, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn outcome() -> Box<SpecOutcome> {
        SpecOutcome::failed(Vec::new(), std::thread::current().id())
    }

    /// A result can be taken back until the committer claims it, and only then; the committer
    /// cannot claim a result taken back until it is finished again.
    #[test]
    fn a_result_is_taken_back_or_taken_never_both() {
        let sched = Scheduler::new(4, std::thread::current(), true);
        for tx in 0..3 {
            assert!(sched.try_claim(tx));
            sched.finish(tx, outcome(), false);
        }
        // Not stale: left where it is.
        assert!(sched.reclaim(0, |_| false).is_none());
        assert_eq!(sched.status(0), DONE);
        // Stale: RUNNING again, and the committer cannot take it.
        assert!(sched.reclaim(0, |_| true).is_some());
        assert_eq!(sched.status(0), RUNNING);
        assert!(!sched.try_take(0));
        assert!(sched.reclaim(0, |_| true).is_none());
        sched.finish(0, outcome(), false);
        assert!(sched.try_take(0));
        assert!(sched.take_outcome(0).is_some());
        // Taken by the committer: no longer reclaimable, even once committed.
        assert!(sched.reclaim(0, |_| true).is_none());
        sched.committed(0);
        assert!(sched.reclaim(0, |_| true).is_none());
        assert_eq!(sched.status(0), COMMITTED);
        // Never finished: nothing to reclaim.
        assert!(sched.reclaim(3, |_| true).is_none());
        assert_eq!(sched.respeculated(), 1);
    }

    /// Suspects come out lowest first; those not DONE are left out, and one still running is
    /// queued when it finishes.
    #[test]
    fn suspects_are_done_results_lowest_first() {
        let sched = Scheduler::new(6, std::thread::current(), true);
        for tx in [1, 2, 4] {
            assert!(sched.try_claim(tx));
            sched.finish(tx, outcome(), false);
        }
        assert!(sched.try_claim(5));
        sched.suspect(&[4, 0, 2, 5, 3]);
        assert_eq!(sched.next_suspect(), Some(2));
        assert_eq!(sched.next_suspect(), Some(4));
        assert_eq!(sched.next_suspect(), None);
        sched.finish(5, outcome(), false);
        assert_eq!(sched.next_suspect(), Some(5));
        // `finish` cleared the flag: finishing again does not queue it twice.
        assert!(sched.reclaim(5, |_| true).is_some());
        sched.finish(5, outcome(), false);
        assert_eq!(sched.next_suspect(), None);
        // Off: nothing is queued.
        let off = Scheduler::new(2, std::thread::current(), false);
        assert!(off.try_claim(0));
        off.finish(0, outcome(), false);
        off.suspect(&[0]);
        assert_eq!(off.next_suspect(), None);
    }

    /// Re-runs stop at the block's budget: [`RERUNS_FREE`], two more per re-run that paid,
    /// and never more than a quarter of the block.
    #[test]
    fn re_runs_stop_when_they_do_not_pay() {
        let sched = Scheduler::new(400, std::thread::current(), true);
        let taken = |sched: &Scheduler| {
            (0..400)
                .filter(|&tx| {
                    if sched.status(tx) == PENDING {
                        assert!(sched.try_claim(tx));
                        sched.finish(tx, outcome(), false);
                    }
                    let back = sched.reclaim(tx, |_| true).is_some();
                    if back {
                        sched.finish(tx, outcome(), false);
                    }
                    back
                })
                .count()
        };
        assert_eq!(taken(&sched), RERUNS_FREE);
        assert_eq!(taken(&sched), 0);
        for _ in 0..10 {
            sched.rerun_paid();
        }
        assert_eq!(taken(&sched), 10 * RERUNS_PER_PAID);
        for _ in 0..100 {
            sched.rerun_paid();
        }
        assert_eq!(
            sched.respeculated() + taken(&sched),
            400 / RERUNS_BLOCK_SHARE
        );
    }
}
