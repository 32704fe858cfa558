//! Taking overdrive's trie up again when it no longer reaches the chain: the blocks reth's
//! strategy validated meanwhile are kept, a trie rebuilt from the database follows them to
//! the newest, and replaces the old one.

use super::{Shared, TARGET, Tip};
use alloy_primitives::B256;
use overdrive_trie::{HashedStateChanges, TrieError};
use std::{
    collections::VecDeque,
    sync::{Arc, atomic::Ordering},
    time::{Duration, Instant},
};
use tracing::{debug, info, warn};

/// A block reth's strategy validated while overdrive's trie did not reach it: what a trie
/// rebuilt from the database needs to follow the chain up to it.
#[derive(Debug)]
pub(super) struct Missed {
    pub(super) block: B256,
    pub(super) parent: B256,
    /// The header's root, which reth's matched.
    pub(super) root: B256,
    pub(super) changes: HashedStateChanges,
}

/// The blocks missed since the trie stopped reaching the chain, and the rebuild.
#[derive(Debug, Default)]
pub(super) struct CatchUp {
    /// Oldest first, at most [`CatchUp::KEPT`].
    pub(super) missed: VecDeque<Missed>,
    /// A rebuild is running.
    pub(super) running: bool,
    /// When the last rebuild ended.
    pub(super) ended: Option<Instant>,
}

impl CatchUp {
    /// Missed blocks kept for a rebuild to replay.
    const KEPT: usize = 512;
    /// The shortest time between two rebuilds: a fork the trie steps off is not worth one
    /// rebuild a block.
    const PAUSE: Duration = Duration::from_secs(30);

    pub(super) fn record(&mut self, missed: Missed) {
        if self.missed.len() == Self::KEPT {
            self.missed.pop_front();
        }
        self.missed.push_back(missed);
    }

    /// Whether a rebuild should start now; marks it running when it should.
    pub(super) fn start(&mut self) -> bool {
        if self.running
            || self
                .ended
                .is_some_and(|ended| ended.elapsed() < Self::PAUSE)
        {
            return false;
        }
        self.running = true;
        true
    }
}

/// Why a rebuilt trie could not follow the missed blocks.
#[derive(Debug, thiserror::Error)]
enum CatchUpError {
    #[error(transparent)]
    Trie(#[from] TrieError),
    #[error("block {block}: overdrive's root {ours}, the header's {header}")]
    Root {
        block: B256,
        ours: B256,
        header: B256,
    },
}

impl Tip {
    /// Brings the trie from its block to the newest of `missed` through that block's
    /// ancestors among them, checking each root; returns how many it followed (none when the
    /// newest block does not descend from the trie's).
    fn follow(&mut self, missed: &VecDeque<Missed>) -> Result<usize, CatchUpError> {
        let mut path = Vec::new();
        let mut at = missed.back();
        while let Some(block) = at {
            if block.block == self.block {
                break;
            }
            path.push(block);
            at = missed.iter().rev().find(|m| m.block == block.parent);
        }
        if path.last().is_none_or(|first| first.parent != self.block) {
            return Ok(0);
        }
        for next in path.iter().rev() {
            let output = self.compute(&next.changes)?;
            if output.root != next.root {
                return Err(CatchUpError::Root {
                    block: next.block,
                    ours: output.root,
                    header: next.root,
                });
            }
            self.advance(next.block, &output)?;
        }
        Ok(path.len())
    }
}

impl Shared {
    /// Installs a trie rebuilt from the database, once it followed the blocks missed since
    /// (under both locks, so that no block is missed between the two).
    pub(super) fn install(&self, rebuilt: eyre::Result<Tip>, started: Instant) {
        let mut tip = self.tip();
        let mut catch_up = self.catch_up();
        catch_up.running = false;
        catch_up.ended = Some(Instant::now());
        if self.failed.load(Ordering::Relaxed) {
            return;
        }
        let mut rebuilt = match rebuilt {
            Ok(rebuilt) => rebuilt,
            Err(error) => {
                warn!(target: TARGET, %error, "Could not rebuild overdrive's trie: reth's state root goes on");
                return;
            }
        };
        match rebuilt.follow(&catch_up.missed) {
            // Only a trie that reached the newest block reth validated is worth more than the
            // one it would replace (which may be at the chain's head, and only a side block
            // missed).
            Ok(_)
                if catch_up
                    .missed
                    .back()
                    .is_none_or(|m| m.block != rebuilt.block) =>
            {
                debug!(target: TARGET, block = %rebuilt.block, "The rebuilt trie does not reach the newest block: dropped");
            }
            Ok(followed) => {
                info!(
                    target: TARGET,
                    block = %rebuilt.block,
                    followed,
                    elapsed = ?started.elapsed(),
                    "overdrive's trie caught up with the chain"
                );
                metrics::counter!("overdrive_state_root_catch_ups_total").increment(1);
                catch_up.missed.clear();
                *tip = Some(rebuilt);
            }
            Err(error) => {
                let block = rebuilt.block;
                self.give_up(
                    &mut tip,
                    block,
                    &format!("following the missed blocks: {error}"),
                );
            }
        }
    }

    /// Starts a rebuild of the trie from the database on a thread of its own, unless one runs
    /// or ran a moment ago.
    pub(super) fn catch_up_in_background(self: &Arc<Self>) {
        if self.failed.load(Ordering::Relaxed) || !self.catch_up().start() {
            return;
        }
        info!(target: TARGET, "overdrive's trie no longer reaches the chain: rebuilding it from the database");
        let shared = self.clone();
        let spawned = std::thread::Builder::new()
            .name("overdrive-trie".into())
            .spawn(move || {
                let started = Instant::now();
                let rebuilt = (shared.rebuild)();
                shared.install(rebuilt, started);
            });
        if let Err(error) = spawned {
            warn!(target: TARGET, %error, "Could not start rebuilding overdrive's trie");
            self.catch_up().running = false;
        }
    }
}
