//! The end-of-block merge of `revm::State`'s transitions into the bundle, split across two
//! threads.
//!
//! `State::merge_transitions` on a block's fresh `State` (empty bundle) takes, for every changed
//! account independently, the transition's present bundle account and its revert. The two are
//! independent of each other too, so the work is split by kind rather than by address: this thread
//! builds the present accounts (and the new contracts) straight into the bundle's map, the pool
//! thread builds the reverts, in address order — the canonical order both executors use (see
//! [`crate::canonical_reverts`]) — by walking the transitions sorted by address. Both only read the
//! transitions, so nothing is moved to split them and no second map is merged into the first
//! afterwards (moving the transitions into two halves and joining the halves' maps was measured to
//! take as long as the merge itself).

use alloy_primitives::{Address, B256, map::AddressMap};
use overdrive_primitives::prefetch;
use revm::{
    bytecode::Bytecode,
    database::{
        AccountStatus, BundleAccount, BundleState, State, TransitionAccount, TransitionState,
        states::{
            bundle_state::BundleRetention,
            reverts::{AccountInfoRevert, AccountRevert, RevertToSlot},
        },
    },
    primitives::StorageKeyMap,
    state::AccountInfo,
};

/// How many transitions ahead of its use the reverts' walk prefetches one.
const PREFETCH_AHEAD: usize = 8;

/// Transitions below this count are merged on the calling thread alone.
const PARALLEL_MERGE_MIN: usize = 1024;

/// `transition`'s revert, as `create_revert` builds it, except that the account infos leave
/// out the cached code.
///
/// A revert restores balance, nonce and code hash; the code an `AccountInfo` may carry is a cache
/// of its hash, which `AccountInfo`'s equality ignores and reth's revert tables do not store.
/// Copying it would cost an atomic reference-count update per info on a counter the other thread
/// updates at the same time (every code-less account shares one empty `Bytecode`): the two halves
/// of the merge were measured spending most of their time passing that counter's cache line back
/// and forth.
///
/// The transitions a block's execution leaves on a fresh bundle (an account changed, created or
/// touched) get their revert built directly; `create_revert` would copy the transition, collect its
/// changed slots into one map and insert all its slots into a second one it then drops (for a token
/// that every transfer of the block writes, the longest job of the merge). Any other status pair
/// takes revm's own path on a copy.
fn revert_of(transition: &TransitionAccount) -> Option<AccountRevert> {
    let without_code = |info: &AccountInfo| AccountInfo {
        balance: info.balance,
        nonce: info.nonce,
        code_hash: info.code_hash,
        code: None,
        account_id: info.account_id,
    };
    // `BundleAccount::update_and_create_revert` on the empty-storage account
    // `original_bundle_account` gives, for these pairs, exactly this revert.
    let deleted = match (transition.status, transition.previous_status) {
        (
            AccountStatus::Changed,
            AccountStatus::Changed | AccountStatus::Loaded | AccountStatus::LoadedEmptyEIP161,
        )
        | (
            AccountStatus::InMemoryChange,
            AccountStatus::Loaded
            | AccountStatus::InMemoryChange
            | AccountStatus::LoadedEmptyEIP161,
        ) => false,
        (AccountStatus::InMemoryChange, AccountStatus::LoadedNotExisting) => true,
        (
            AccountStatus::Loaded
            | AccountStatus::LoadedNotExisting
            | AccountStatus::LoadedEmptyEIP161,
            _,
        ) => return None,
        _ => {
            return TransitionAccount {
                info: transition.info.as_ref().map(without_code),
                status: transition.status,
                previous_info: transition.previous_info.as_ref().map(without_code),
                previous_status: transition.previous_status,
                storage: transition.storage.clone(),
                storage_was_destroyed: transition.storage_was_destroyed,
            }
            .create_revert();
        }
    };
    let account = if deleted {
        AccountInfoRevert::DeleteIt
    } else if transition.previous_info != transition.info {
        AccountInfoRevert::RevertTo(
            transition
                .previous_info
                .as_ref()
                .map(without_code)
                .unwrap_or_default(),
        )
    } else {
        AccountInfoRevert::DoNothing
    };
    // The slots' own hasher, so that they are written in order (see `presents`).
    let mut storage = StorageKeyMap::with_capacity_and_hasher(
        transition.storage.len(),
        transition.storage.hasher().clone(),
    );
    storage.extend(
        transition
            .storage
            .iter()
            .filter(|(_, slot)| slot.is_changed())
            .map(|(key, slot)| (*key, RevertToSlot::Some(slot.previous_or_original_value))),
    );
    Some(AccountRevert {
        account,
        storage,
        previous_status: transition.previous_status,
        wipe_storage: false,
    })
    .filter(|revert| !revert.is_empty())
}

/// The present half of the merge: the bundle's accounts and contracts.
#[derive(Default)]
struct Presents {
    accounts: AddressMap<BundleAccount>,
    contracts: Vec<(B256, Bytecode)>,
    state_size: usize,
}

/// The revert half of the merge.
#[derive(Default)]
struct Reverts {
    /// In address order.
    reverts: Vec<(Address, AccountRevert)>,
    reverts_size: usize,
    /// Accounts whose transition creates no revert: revm leaves them out of the bundle.
    unchanged: Vec<Address>,
}

/// The present account of every transition, as the vacant-entry branch of
/// `BundleState::apply_transitions_and_create_reverts` builds it (kept there only when the
/// transition has a revert; [`into_bundle`] removes the others).
fn presents(maps: &[TransitionState]) -> Presents {
    let len = maps.iter().map(|m| m.transitions.len()).sum();
    let mut part = Presents {
        // The transitions' own hasher (the maps share one): walked in table order, the transitions
        // then land in the same order in a table of the same hasher, so the ≈ 200-byte accounts are
        // written one after another instead of all over the table (each map has its own random
        // seed, and with a fresh one the presents were measured markedly slower).
        accounts: AddressMap::with_capacity_and_hasher(
            len,
            maps.first()
                .map(|m| m.transitions.hasher().clone())
                .unwrap_or_default(),
        ),
        ..Presents::default()
    };
    for (address, transition) in maps.iter().flat_map(|m| &m.transitions) {
        if let Some((hash, code)) = transition.has_new_contract() {
            part.contracts.push((hash, code.clone()));
        }
        let present = transition.present_bundle_account();
        part.state_size += present.size_hint();
        part.accounts.insert(*address, present);
    }
    part
}

/// The revert of every transition, in address order, built from the transitions in place (the
/// other thread reads them meanwhile; see [`revert_of`]).
fn reverts(maps: &[TransitionState]) -> Reverts {
    let mut sorted: Vec<(Address, &TransitionAccount)> = maps
        .iter()
        .flat_map(|m| &m.transitions)
        .map(|(a, t)| (*a, t))
        .collect();
    // Sorting the 28-byte references, not the reverts, keeps the sort cheap.
    sorted.sort_unstable_by_key(|(address, _)| *address);
    let mut part = Reverts {
        reverts: Vec::with_capacity(sorted.len()),
        ..Reverts::default()
    };
    for (i, &(address, transition)) in sorted.iter().enumerate() {
        // In address order the transitions are scattered over the map's table: ask for the
        // ones a few steps ahead so that their misses overlap.
        if let Some((_, ahead)) = sorted.get(i + PREFETCH_AHEAD) {
            prefetch(
                (*ahead as *const TransitionAccount).cast(),
                size_of::<TransitionAccount>().div_ceil(64),
            );
        }
        match revert_of(transition) {
            Some(revert) => {
                part.reverts_size += revert.size_hint();
                part.reverts.push((address, revert));
            }
            None => part.unchanged.push(address),
        }
    }
    part
}

/// Merges a block's transitions, `maps` (each address in one of them at most), into
/// `state`'s bundle with reverts (`BundleRetention::Reverts`) and takes the bundle, using
/// `pool` for half of the work. The result equals `merge_transitions(Reverts)` + `take_bundle()`
/// on a `State` holding those transitions, with the reverts in canonical order and without the
/// cached code in their account infos (see [`revert_of`]). The second value is the consumed
/// transitions, for the caller to drop off the critical path.
pub(crate) fn merge_and_take<DB: revm::Database>(
    pool: &rayon::ThreadPool,
    state: &mut State<DB>,
    maps: Vec<TransitionState>,
) -> (BundleState, Vec<TransitionState>) {
    if !state.bundle_state.is_empty()
        || !state.bundle_state.reverts.is_empty()
        || !state.bundle_state.contracts.is_empty()
    {
        // Not a fresh block state: let revm merge into what is there.
        let transitions = &mut state
            .transition_state
            .get_or_insert_with(TransitionState::default)
            .transitions;
        for map in maps {
            transitions.extend(map.transitions);
        }
        state.merge_transitions(BundleRetention::Reverts);
        let mut bundle = state.take_bundle();
        crate::canonical_reverts(&mut bundle);
        return (bundle, Vec::new());
    }
    let len: usize = maps.iter().map(|m| m.transitions.len()).sum();
    let bundle = if len < PARALLEL_MERGE_MIN {
        // Waking the pool thread costs more than splitting a small merge saves.
        into_bundle(presents(&maps), reverts(&maps))
    } else {
        // The reverts on the pool thread, the presents here (`ThreadPool::join` would run both
        // on the pool while this thread waits).
        let mut reverts_part = None;
        let presents_part = pool.in_place_scope(|scope| {
            scope.spawn(|_| reverts_part = Some(reverts(&maps)));
            presents(&maps)
        });
        // The scope returns only after its spawned job ran.
        let reverts_part = reverts_part.unwrap_or_else(|| reverts(&maps));
        into_bundle(presents_part, reverts_part)
    };
    (bundle, maps)
}

/// The bundle of the two halves of one set of transitions.
fn into_bundle(presents: Presents, reverts: Reverts) -> BundleState {
    let (mut accounts, mut state_size) = (presents.accounts, presents.state_size);
    for address in &reverts.unchanged {
        if let Some(account) = accounts.remove(address) {
            state_size -= account.size_hint();
        }
    }
    let mut bundle = BundleState {
        state: accounts,
        state_size,
        reverts_size: reverts.reverts_size,
        ..BundleState::default()
    };
    bundle.contracts.extend(presents.contracts);
    bundle.reverts.push(reverts.reverts);
    bundle
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use alloy_primitives::{U256, keccak256};
    use revm::{
        Database, DatabaseCommit,
        database::InMemoryDB,
        state::{Account, EvmState, EvmStorageSlot, TransactionId},
    };

    fn address(i: usize) -> Address {
        // Spread over the whole first byte, as real addresses are.
        keccak256(i.to_be_bytes()).0[..20]
            .try_into()
            .map(Address::new)
            .unwrap()
    }

    /// A block's `State` over accounts that exist beforehand: the `i`-th of `addresses` with
    /// balance 1,000 + `i` and nonce 1, and slots 0..`slots` holding 0, 1, 0, …
    pub(in crate::parallel) fn funded_state(
        addresses: impl Iterator<Item = Address>,
        slots: u64,
    ) -> State<InMemoryDB> {
        let mut db = InMemoryDB::default();
        for (i, address) in addresses.enumerate() {
            db.insert_account_info(
                address,
                AccountInfo {
                    balance: U256::from(1_000 + i),
                    nonce: 1,
                    ..AccountInfo::default()
                },
            );
            for s in 0..slots {
                db.insert_account_storage(address, U256::from(s), U256::from(s % 2))
                    .expect("an in-memory database");
            }
        }
        State::builder()
            .with_database(db)
            .with_bundle_update()
            .build()
    }

    /// A block's `State` after two transactions' commits over `n` accounts: half of them exist
    /// beforehand, some get storage (one many slots), some are touched without a change, some
    /// are created with code, one is self-destructed.
    fn state_after_block(n: usize) -> State<InMemoryDB> {
        let mut state = funded_state((0..n).step_by(2).map(address), 0);
        for round in 0..2u64 {
            let mut changes = EvmState::default();
            for i in 0..n {
                let info = state.basic(address(i)).unwrap().unwrap_or_default();
                let mut account = Account::from(info);
                account.mark_touch();
                match i % 11 {
                    // Touched, unchanged.
                    0 => {}
                    3 if round == 0 => {
                        let code = revm::bytecode::Bytecode::new_raw(vec![0x60, i as u8].into());
                        account.info.code_hash = code.hash_slow();
                        account.info.code = Some(code);
                        account.info.nonce = 1;
                        account.mark_created();
                    }
                    5 if round == 1 && i % 2 == 0 => account.mark_selfdestruct(),
                    _ => account.info.balance += U256::from(round + 1),
                }
                let slots = if i == 7 {
                    BIG_SLOTS
                } else {
                    usize::from(i % 4 == 1) * 3
                };
                for s in 0..slots {
                    let original = U256::from(s * usize::from(round == 1));
                    account.storage.insert(
                        U256::from(s),
                        EvmStorageSlot::new_changed(
                            original,
                            U256::from(s + 1),
                            TransactionId::ZERO,
                        ),
                    );
                }
                changes.insert(address(i), account);
            }
            state.commit(changes);
        }
        state
    }

    // One transition has many slots, as an ERC20 token's does.
    const BIG_SLOTS: usize = 300;

    /// `merge_and_take` equals revm's own merge (reverts in canonical order), on the serial
    /// and on the two-thread path.
    #[test]
    fn equals_revm_merge() {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .build()
            .unwrap();
        for n in [40, PARALLEL_MERGE_MIN * 3] {
            let mut reference = state_after_block(n);
            let mut ours = state_after_block(n);
            reference.merge_transitions(BundleRetention::Reverts);
            let mut expected = reference.take_bundle();
            crate::canonical_reverts(&mut expected);
            let maps = vec![ours.transition_state.take().unwrap_or_default()];
            let (bundle, transitions) = merge_and_take(&pool, &mut ours, maps);
            assert!(transitions[0].transitions.len() > n / 2, "n = {n}");
            assert_eq!(bundle, expected, "n = {n}");
            // `BundleState`'s equality ignores the reverts' order; the canonical order is part
            // of the contract.
            let order = |b: &BundleState| -> Vec<Address> {
                b.reverts.iter().flatten().map(|(a, _)| *a).collect()
            };
            assert_eq!(order(&bundle), order(&expected), "n = {n}");
            assert!(!bundle.contracts.is_empty());
            assert!(
                bundle.state.len() < n,
                "some touched accounts are unchanged"
            );
        }
    }
}
