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
    database::{BundleAccount, BundleState, OnStateHook, State},
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

    /// Takes the state hook (reth's state-root task listens through it), so that the
    /// executor that runs the block can hand it each change as it commits it.
    fn take_state_hook(&mut self) -> Option<Box<dyn OnStateHook>>;

    /// Puts a hook taken with [`Self::take_state_hook`] back.
    fn set_state_hook(&mut self, hook: Option<Box<dyn OnStateHook>>);
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

    fn take_state_hook(&mut self) -> Option<Box<dyn OnStateHook>> {
        self.state_hook.take()
    }

    fn set_state_hook(&mut self, hook: Option<Box<dyn OnStateHook>>) {
        State::set_state_hook(self, hook);
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

#[cfg(test)]
mod tests {
    use super::*;
    use alloy_evm::{
        EvmFactory,
        block::BlockExecutor as _,
        eth::{EthBlockExecutor, EthEvmFactory, receipt_builder::AlloyReceiptBuilder},
    };
    use overdrive_executor::{ExecuteBlock as _, SequentialExecutor, evm_env, execution_ctx};
    use overdrive_primitives::{BlockWithSenders, ChainParams, MemState};
    use overdrive_workload::{WorkloadConfig, WorkloadKind};
    use revm::database::{WrapDatabaseRef, states::bundle_state::BundleRetention};

    /// Executes `block` on `state` with alloy-evm's executor, as reth's does, and merges it.
    fn execute_here(
        spec: &ChainParams,
        block: &BlockWithSenders,
        state: &mut State<WrapDatabaseRef<&MemState>>,
    ) {
        state.prepare();
        let evm = EthEvmFactory::default().create_evm(&mut *state, evm_env(spec, block));
        let executor = EthBlockExecutor::new(
            evm,
            execution_ctx(block),
            spec,
            AlloyReceiptBuilder::default(),
        );
        executor.execute_block(block.transactions.iter()).unwrap();
        state.merge_transitions(BundleRetention::Reverts);
    }

    /// What reth writes for a bundle, sorted.
    fn written(bundle: BundleState) -> String {
        let (mut changes, mut reverts) =
            bundle.to_plain_state_and_reverts(revm::database::OriginalValuesKnown::Yes);
        changes.accounts.sort_by_key(|(a, _)| *a);
        changes.storage.sort_by_key(|s| s.address);
        for s in &mut changes.storage {
            s.storage.sort_by_key(|(k, _)| *k);
        }
        for block in &mut reverts.accounts {
            block.sort_by_key(|(a, _)| *a);
        }
        for block in &mut reverts.storage {
            block.sort_by_key(|s| s.address);
            for s in block.iter_mut() {
                s.storage_revert.sort_by_key(|(k, _)| *k);
            }
        }
        let strip = |i: &Option<AccountInfo>| i.as_ref().map(|i| (i.nonce, i.balance, i.code_hash));
        let accounts: Vec<_> = changes
            .accounts
            .iter()
            .map(|(a, i)| (a, strip(i)))
            .collect();
        let reverted: Vec<Vec<_>> = reverts
            .accounts
            .iter()
            .map(|b| b.iter().map(|(a, i)| (a, strip(i))).collect())
            .collect();
        format!(
            "{accounts:?}\n{:?}\n{reverted:?}\n{:?}",
            changes.storage, reverts.storage
        )
    }

    /// A state that took whole blocks (their bundles) and then executes one itself, through its
    /// transitions, holds what one that executed every block itself holds; and whole blocks read
    /// through the bundle, after a block the state executed itself.
    #[test]
    fn whole_blocks_and_executed_ones_mix_on_one_state() {
        let workload = overdrive_workload::generate(&WorkloadConfig {
            accounts: 200,
            txs_per_block: 60,
            blocks: 4,
            ..WorkloadConfig::new(WorkloadKind::Hybrid)
        })
        .unwrap();
        let spec = &workload.chain_spec;
        let blocks = &workload.blocks;
        let genesis = &workload.genesis;

        let mut reference = State::builder()
            .with_database_ref(genesis)
            .with_bundle_update()
            .build();
        for block in blocks {
            execute_here(spec, block, &mut reference);
        }

        // Blocks 1 and 3 arrive whole (executed on what the state reads), 2 and 4 execute here.
        let mut mixed = State::builder()
            .with_database_ref(genesis)
            .with_bundle_update()
            .build();
        let mut seen = genesis.clone();
        for (i, block) in blocks.iter().enumerate() {
            if i % 2 == 0 {
                let output = SequentialExecutor.execute(spec, block, &seen).unwrap();
                seen.apply_bundle(&output.bundle);
                mixed.apply_block(output.bundle);
            } else {
                execute_here(spec, block, &mut mixed);
                let mut own = mixed.bundle_state.clone();
                // What the state reads now, for the next whole block.
                seen = genesis.clone();
                own.reverts.clear();
                seen.apply_bundle(&own);
            }
            seen.block_hashes.insert(block.header.number, block.hash);
        }
        assert_eq!(
            written(mixed.take_bundle()),
            written(reference.take_bundle())
        );
    }

    /// Each account the block destroyed is destroyed first, then every account's final info and
    /// changed slots follow.
    #[test]
    fn hook_updates_destroy_first() {
        use alloy_primitives::Address;
        use revm::database::states::{StorageSlot, reverts::AccountRevert};
        let created_again = Address::repeat_byte(1);
        let changed = Address::repeat_byte(2);
        let gone = Address::repeat_byte(3);
        let info = |balance: u64| AccountInfo {
            balance: U256::from(balance),
            ..Default::default()
        };
        let slot = |original: u64, present: u64| {
            StorageSlot::new_changed(U256::from(original), U256::from(present))
        };
        let mut bundle = BundleState::default();
        bundle.state.insert(
            created_again,
            BundleAccount::new(
                Some(info(5)),
                Some(info(6)),
                [(U256::from(1), slot(9, 9)), (U256::from(2), slot(0, 0))]
                    .into_iter()
                    .collect(),
                revm::database::AccountStatus::DestroyedChanged,
            ),
        );
        bundle.state.insert(
            changed,
            BundleAccount::new(
                Some(info(1)),
                Some(info(2)),
                [(U256::from(1), slot(3, 4)), (U256::from(2), slot(7, 7))]
                    .into_iter()
                    .collect(),
                revm::database::AccountStatus::Changed,
            ),
        );
        bundle.state.insert(
            gone,
            BundleAccount::new(
                Some(info(8)),
                None,
                Default::default(),
                revm::database::AccountStatus::Destroyed,
            ),
        );
        bundle.reverts = revm::database::states::reverts::Reverts::new(vec![vec![(
            gone,
            AccountRevert::default(),
        )]]);
        let updates = hook_updates(&bundle);
        assert_eq!(updates.len(), 2);
        let (first, second) = (&updates[0], &updates[1]);
        assert_eq!(first.len(), 2, "the destroyed accounts");
        assert!(
            first
                .values()
                .all(|a| a.is_selfdestructed() && a.is_touched())
        );
        assert_eq!(first[&gone].original_info(), info(8));
        // After its destruction the created-again account's non-zero slots are all new.
        let again = &second[&created_again];
        assert_eq!(again.info.balance, U256::from(6));
        assert_eq!(again.original_info(), AccountInfo::default());
        assert_eq!(again.storage.len(), 1);
        assert_eq!(again.storage[&U256::from(1)].present_value, U256::from(9));
        // Elsewhere only the slots that changed.
        let kept = &second[&changed];
        assert_eq!(kept.original_info(), info(1));
        assert_eq!(kept.storage.len(), 1);
        assert!(!second.contains_key(&gone));
    }
}
