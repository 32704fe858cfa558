//! The payload builder's state root from overdrive's trie.

use super::{Shared, TARGET, changes, trie_updates};
use alloy_primitives::B256;
use overdrive_trie::HashedStateChanges;
use reth_engine_tree::tree::state_root_strategy::{
    StateRootComputeOutcome, StateRootSink, StateRootTaskError, evm_state_to_hashed_post_state,
};
use reth_trie::HashedPostState;
use revm::state::EvmState;
use std::{
    sync::{Arc, Mutex, PoisonError, mpsc},
    time::Instant,
};
use tracing::debug;

/// The payload builder's state updates, folded as they come; when execution ends, the root
/// and rows of the fold from overdrive's trie at the parent.
pub(super) struct PayloadRootSink {
    pub(super) parent: B256,
    pub(super) shared: Arc<Shared>,
    /// The updates so far, as the trie's diff and as reth's hashed state (which the outcome
    /// carries).
    pub(super) folded: Mutex<(HashedStateChanges, HashedPostState)>,
    /// Taken when the root is sent; dropped unsent, the builder computes reth's root.
    pub(super) result:
        Mutex<Option<mpsc::Sender<Result<StateRootComputeOutcome, StateRootTaskError>>>>,
}

impl PayloadRootSink {
    fn fold(&self, update: HashedPostState) {
        let mut folded = self.folded.lock().unwrap_or_else(PoisonError::into_inner);
        folded.0.extend(changes(&update));
        folded.1.extend(update);
    }

    fn root(&self) -> Result<StateRootComputeOutcome, StateRootTaskError> {
        let (changes, hashed_state) =
            std::mem::take(&mut *self.folded.lock().unwrap_or_else(PoisonError::into_inner));
        let mut guard = self.shared.tip();
        let Some(tip) = guard.as_mut().filter(|tip| tip.block == self.parent) else {
            // The engine moved the trie on (or dropped it) while the payload executed.
            metrics::counter!("overdrive_state_root_payloads_total", "root" => "reth").increment(1);
            return Err(StateRootTaskError::Other(
                "overdrive's trie left the payload's parent".to_string(),
            ));
        };
        let started = Instant::now();
        let computed = tip
            .compute(&changes)
            .and_then(|output| Ok((tip.rows_of(&output)?, output)));
        let (rows, output) = match computed {
            Ok(computed) => computed,
            Err(error) => {
                self.shared
                    .give_up(&mut guard, self.parent, &error.to_string());
                return Err(StateRootTaskError::Other(error.to_string()));
            }
        };
        metrics::counter!("overdrive_state_root_payloads_total", "root" => "overdrive")
            .increment(1);
        debug!(
            target: TARGET,
            parent = %self.parent,
            root = %output.root,
            dirty_nodes = output.stats.dirty_nodes,
            elapsed = ?started.elapsed(),
            "overdrive's payload state root"
        );
        Ok(StateRootComputeOutcome {
            state_root: output.root,
            trie_updates: Arc::new(trie_updates(rows)),
            hashed_state: Arc::new(hashed_state),
        })
    }
}

impl StateRootSink for PayloadRootSink {
    fn on_state_update(&self, state: EvmState) {
        self.fold(evm_state_to_hashed_post_state(state));
    }

    fn on_hashed_state_update(&self, state: HashedPostState) {
        self.fold(state);
    }

    fn on_updates_finished(&self) {
        // Computed here, on the builder's thread, which waits for the root right after.
        let Some(sender) = self
            .result
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
        else {
            return;
        };
        let _ = sender.send(self.root());
    }
}
