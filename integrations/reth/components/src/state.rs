//! Handing a block executed elsewhere to the `revm::State` reth executes blocks on.
//!
//! reth builds a `State` with bundle tracking, lets a block executor commit each transaction
//! into it, then merges the transitions (`merge_transitions`) and takes the bundle. A block
//! overdrive executed arrives as a finished bundle instead; [`BlockState::apply_block`] puts it
//! where reth takes it from, so that what reth writes, and what its state-root task hears,
//! equal what committing the transactions one by one would have given.

use alloy_primitives::U256;
use revm::{
    Database,
    database::{BundleAccount, BundleState, State},
    state::{
        Account, AccountInfo, AccountStatus, EvmState, EvmStorage, EvmStorageSlot, TransactionId,
    },
};

/// A `revm::State` as the executor sees it through reth's generic database bound.
pub trait BlockState {
    /// Changes of the blocks executed on this state so far (merged), on top of its database.
    fn bundle(&self) -> &BundleState;

    /// Gets the state ready for a block: a state that took a finished block last time records
    /// transitions again (reth's executor commits through them).
    fn prepare(&mut self);

    /// Adds `block`, the changes of one block with its reverts, executed on the state this one
    /// reads. Afterwards:
    /// - the bundle is this one's extended with `block` (as `BundleState::extend` joins
    ///   consecutive blocks), and `merge_transitions` adds nothing to it, so reth takes it as is;
    /// - the account cache is empty and reads go through the bundle, so that reth's own executor
    ///   can run the next block on this state;
    /// - the state hook, if any, has heard the block's changes (see [`hook_updates`]).
    fn apply_block(&mut self, block: BundleState);
}

impl<DB: Database> BlockState for State<DB> {
    fn bundle(&self) -> &BundleState {
        &self.bundle_state
    }

    fn prepare(&mut self) {
        // Only `apply_block` leaves a state preloaded without transitions.
        if self.use_preloaded_bundle && self.transition_state.is_none() {
            self.transition_state = Some(Default::default());
        }
    }

    fn apply_block(&mut self, block: BundleState) {
        if let Some(hook) = self.state_hook.as_mut() {
            for update in hook_updates(&block) {
                hook.on_state(update);
            }
        }
        if self.bundle_state.is_empty() {
            self.bundle_state = block;
        } else {
            self.bundle_state.extend(block);
        }
        // The cache holds values from before the block; the bundle has the new ones.
        self.cache.accounts.clear();
        self.cache.contracts.clear();
        self.use_preloaded_bundle = true;
        self.transition_state = None;
    }
}

/// The updates a state hook hears for one block's bundle: what it would have heard from the
/// block's commits, folded. reth's state-root task turns each update into hashed state (an
/// account whose info differs from its original, and the changed slots of accounts not
/// destroyed), and applies them in order.
///
/// The first update destroys the accounts the block destroyed; the second sets every account's
/// final info and changed slots, and the slots of accounts created again after their
/// destruction.
pub fn hook_updates(block: &BundleState) -> Vec<EvmState> {
    let mut destroyed = EvmState::default();
    let mut changed = EvmState::default();
    for (&address, account) in &block.state {
        let original = account.original_info.clone().unwrap_or_default();
        let wiped = account.was_destroyed();
        if wiped || account.info.is_none() {
            destroyed.insert(
                address,
                hook_account(
                    original.clone(),
                    AccountInfo::default(),
                    AccountStatus::SelfDestructed,
                ),
            );
        }
        if let Some(info) = &account.info {
            // After a destruction the account starts from nothing again.
            let from = if wiped {
                AccountInfo::default()
            } else {
                original
            };
            let mut update = hook_account(from, info.clone(), AccountStatus::empty());
            update.storage = changed_slots(account, wiped);
            changed.insert(address, update);
        }
    }
    [destroyed, changed]
        .into_iter()
        .filter(|update| !update.is_empty())
        .collect()
}

fn hook_account(original: AccountInfo, info: AccountInfo, status: AccountStatus) -> Account {
    let mut account = Account::from(info);
    *account.original_info_mut() = original;
    account.status |= status;
    account.mark_touch();
    account
}

/// The slots of `account` whose value the block changed; after a destruction, every non-zero
/// slot (the destruction cleared the rest).
fn changed_slots(account: &BundleAccount, wiped: bool) -> EvmStorage {
    account
        .storage
        .iter()
        .filter_map(|(&slot, value)| {
            let original = if wiped {
                U256::ZERO
            } else {
                value.original_value()
            };
            (original != value.present_value).then(|| {
                (
                    slot,
                    EvmStorageSlot::new_changed(original, value.present_value, TransactionId::ZERO),
                )
            })
        })
        .collect()
}
