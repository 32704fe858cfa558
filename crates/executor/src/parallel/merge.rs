//! The end-of-block merge of `revm::State`'s transitions into the bundle, split across two
//! threads.
//!
//! `State::merge_transitions` on a block's fresh `State` (empty bundle) takes, for every
//! changed account independently, the transition's present bundle account and its revert. The
//! accounts are independent, so they are split into two parts of equal cost (see
//! [`split_by_weight`]), one per thread. Each part is exactly what revm computes for those
//! accounts; the reverts come out sorted by address, the canonical order both executors use
//! (see [`crate::canonical_reverts`]).

use alloy_primitives::{Address, B256, map::AddressMap};
use revm::{
    bytecode::Bytecode,
    database::{
        BundleAccount, BundleState, State, TransitionAccount, TransitionState,
        states::{bundle_state::BundleRetention, reverts::AccountRevert},
    },
};

/// What one half of the merge produces.
#[derive(Default)]
struct Part {
    accounts: AddressMap<BundleAccount>,
    reverts: Vec<(Address, AccountRevert)>,
    contracts: Vec<(B256, Bytecode)>,
    state_size: usize,
    reverts_size: usize,
}

/// The vacant-entry branch of `BundleState::apply_transitions_and_create_reverts`, for a bundle
/// that starts empty.
fn merge_part(transitions: Vec<(Address, TransitionAccount)>, capacity: usize) -> Part {
    let mut part = Part {
        accounts: AddressMap::with_capacity_and_hasher(capacity, Default::default()),
        reverts: Vec::with_capacity(transitions.len()),
        ..Part::default()
    };
    for (address, transition) in transitions {
        if let Some((hash, code)) = transition.has_new_contract() {
            part.contracts.push((hash, code.clone()));
        }
        let present = transition.present_bundle_account();
        if let Some(revert) = transition.create_revert() {
            part.state_size += present.size_hint();
            part.accounts.insert(address, present);
            part.reverts_size += revert.size_hint();
            part.reverts.push((address, revert));
        }
    }
    part.reverts.sort_unstable_by_key(|(address, _)| *address);
    part
}

/// Splits the transitions into two parts of about equal merge cost. A contract with thousands of
/// changed slots (an ERC20 token) costs as much as thousands of plain accounts, so an even split
/// by address would leave one thread with most of the work: the heavy accounts are placed
/// first, then every other account goes to the lighter part.
fn split_by_weight(
    mut transitions: AddressMap<TransitionAccount>,
) -> [Vec<(Address, TransitionAccount)>; 2] {
    // Measured: merging a slot costs about a quarter of merging an account.
    let weight = |t: &TransitionAccount| 4 + t.storage.len();
    let total: usize = transitions.values().map(weight).sum();
    let heavy: Vec<Address> = transitions
        .iter()
        .filter(|(_, t)| weight(t) * 16 > total)
        .map(|(address, _)| *address)
        .collect();
    let mut parts = [
        Vec::with_capacity(transitions.len()),
        Vec::with_capacity(transitions.len()),
    ];
    let mut loads = [0usize; 2];
    let heavy = heavy
        .into_iter()
        .filter_map(|address| transitions.remove_entry(&address));
    for (address, transition) in heavy.collect::<Vec<_>>().into_iter().chain(transitions) {
        let lighter = usize::from(loads[1] < loads[0]);
        loads[lighter] += weight(&transition);
        parts[lighter].push((address, transition));
    }
    parts
}

/// Merges two lists sorted by address into one.
fn merge_sorted(
    a: Vec<(Address, AccountRevert)>,
    b: Vec<(Address, AccountRevert)>,
) -> Vec<(Address, AccountRevert)> {
    let mut out = Vec::with_capacity(a.len() + b.len());
    let (mut a, mut b) = (a.into_iter().peekable(), b.into_iter().peekable());
    while let (Some((x, _)), Some((y, _))) = (a.peek(), b.peek()) {
        let next = if x <= y { a.next() } else { b.next() };
        out.extend(next);
    }
    out.extend(a);
    out.extend(b);
    out
}

/// Merges `state`'s transitions into its bundle with reverts (`BundleRetention::Reverts`) and
/// takes the bundle, using `pool` for half of the work. The result equals
/// `merge_transitions(Reverts)` + `take_bundle()` with the reverts in canonical order.
pub(crate) fn merge_and_take<DB: revm::Database>(
    pool: &rayon::ThreadPool,
    state: &mut State<DB>,
) -> BundleState {
    let transitions = state
        .transition_state
        .as_mut()
        .map(TransitionState::take)
        .unwrap_or_default();
    if !state.bundle_state.is_empty()
        || !state.bundle_state.reverts.is_empty()
        || !state.bundle_state.contracts.is_empty()
    {
        // Not a fresh block state: let revm merge into what is there.
        state
            .transition_state
            .get_or_insert_with(TransitionState::default)
            .transitions
            .extend(transitions.transitions);
        state.merge_transitions(BundleRetention::Reverts);
        let mut bundle = state.take_bundle();
        crate::canonical_reverts(&mut bundle);
        return bundle;
    }
    let n = transitions.transitions.len();
    let [first, second] = split_by_weight(transitions.transitions);
    // One part on the pool thread, the other here (`ThreadPool::join` would run both on the
    // pool while this thread waits). The first part's map is sized for both, so adding the
    // second does not rehash it.
    let mut second_part = None;
    let mut first = pool.in_place_scope(|scope| {
        scope.spawn(|_| {
            let len = second.len();
            second_part = Some(merge_part(second, len));
        });
        merge_part(first, n)
    });
    let second = second_part.unwrap_or_default();
    first.accounts.extend(second.accounts);
    let reverts = merge_sorted(first.reverts, second.reverts);
    let mut bundle = BundleState {
        state: first.accounts,
        state_size: first.state_size + second.state_size,
        reverts_size: first.reverts_size + second.reverts_size,
        ..BundleState::default()
    };
    bundle
        .contracts
        .extend(first.contracts.into_iter().chain(second.contracts));
    bundle.reverts.push(reverts);
    bundle
}
