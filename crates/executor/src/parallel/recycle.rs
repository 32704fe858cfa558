//! Hands the allocations of committed speculative results back to the pool thread that made
//! them, to be freed there.
//!
//! A speculative result (its state map, read set, write list) is allocated by the thread that
//! executed it and consumed by the committer. Freed by the committer, each allocation takes the
//! allocator's cross-thread path: an atomic push onto the owner's list, which the owner later walks
//! when it runs out of free blocks. Profiles of transfer blocks put the allocator at a far larger
//! share of the parallel path's CPU than of the sequential executor's. Returned in batches and
//! freed by their owner, the blocks go back to its local free lists and are reused by its next
//! transactions (keeping them until the block ends instead was measured slower: nothing is reused
//! within the block then). Results the committer speculated itself, while helping, are its own
//! allocations: it frees those on the spot (`Committer::recycle`).

use super::spec::SpecOutcome;
use std::sync::{
    Mutex, PoisonError,
    atomic::{AtomicBool, Ordering},
};

/// Results handed back per batch: one lock per batch rather than per transaction.
const BATCH: usize = 32;

/// What is left of a committed speculative result, held only to be dropped by a pool thread:
/// its read set and write list, and its execution if it had one (the state map emptied, its
/// table still allocated, when it was committed; whole when validation rejected it; the
/// result's output bytes).
#[derive(Debug)]
pub(crate) struct SpentResult {
    pub _outcome: Box<SpecOutcome>,
}

/// The returned results of one block. The committer fills `bin`; a pool thread empties it.
#[derive(Debug, Default)]
pub(crate) struct Recycler {
    bin: Mutex<Vec<SpentResult>>,
    /// Set when `bin` has something; lets the pool thread skip the lock otherwise.
    full: AtomicBool,
}

impl Recycler {
    /// The committer's side: moves `batch` to the bin once it holds a batch.
    pub(crate) fn give(&self, batch: &mut Vec<SpentResult>) {
        if batch.len() >= BATCH {
            self.give_all(batch);
        }
    }

    /// Moves all of `batch` to the bin (the rest of a block: the bin is freed with the block's
    /// other data).
    pub(crate) fn give_all(&self, batch: &mut Vec<SpentResult>) {
        let mut bin = self.bin.lock().unwrap_or_else(PoisonError::into_inner);
        bin.append(batch);
        self.full.store(true, Ordering::Release);
    }

    /// A pool thread's side, between two transactions: frees whatever was handed back.
    pub(crate) fn free_returned(&self) {
        // A plain load first: called once per transaction, and a swap would take the flag's
        // cache line from the committer every time.
        if !self.full.load(Ordering::Acquire) || !self.full.swap(false, Ordering::AcqRel) {
            return;
        }
        let returned =
            std::mem::take(&mut *self.bin.lock().unwrap_or_else(PoisonError::into_inner));
        drop(returned);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spent() -> SpentResult {
        SpentResult {
            _outcome: SpecOutcome::failed(Vec::new(), std::thread::current().id()),
        }
    }

    #[test]
    fn batches_reach_the_bin_and_are_freed_once() {
        let recycler = Recycler::default();
        let mut batch: Vec<SpentResult> = (0..BATCH - 1).map(|_| spent()).collect();
        recycler.give(&mut batch);
        // Below a batch, the committer keeps them.
        assert_eq!(batch.len(), BATCH - 1);
        assert!(!recycler.full.load(Ordering::Acquire));
        batch.push(spent());
        recycler.give(&mut batch);
        assert!(batch.is_empty());
        assert_eq!(recycler.bin.lock().unwrap().len(), BATCH);
        recycler.free_returned();
        assert!(recycler.bin.lock().unwrap().is_empty());
        assert!(!recycler.full.load(Ordering::Acquire));
        // Nothing handed back: nothing to do, and the flag stays clear.
        recycler.free_returned();
        assert!(!recycler.full.load(Ordering::Acquire));
        // The end of a block hands over whatever is left, however little.
        let mut rest = vec![spent()];
        recycler.give_all(&mut rest);
        assert!(rest.is_empty());
        assert_eq!(recycler.bin.lock().unwrap().len(), 1);
        assert!(recycler.full.load(Ordering::Acquire));
    }
}
