//! A block's state changes with hashed keys: the input of [`crate::StateTrie::apply`].

use alloy_primitives::{B256, U256, keccak256, map::B256Map};
use overdrive_primitives::MemState;
use revm::{database::BundleState, state::AccountInfo};

/// The parts of an account the account trie stores, apart from the storage root (which the
/// trie computes).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HashedAccount {
    /// Nonce.
    pub nonce: u64,
    /// Balance in wei.
    pub balance: U256,
    /// Keccak of the code (`KECCAK_EMPTY` for none).
    pub code_hash: B256,
}

impl From<&AccountInfo> for HashedAccount {
    fn from(info: &AccountInfo) -> Self {
        Self {
            nonce: info.nonce,
            balance: info.balance,
            code_hash: info.code_hash,
        }
    }
}

/// Changes to one account's storage.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HashedStorageChanges {
    /// Drop all existing slots before applying `slots` (self-destruct; with `slots`, a
    /// self-destruct and re-create in one block).
    pub wiped: bool,
    /// New values by hashed slot; zero deletes the slot.
    pub slots: B256Map<U256>,
}

/// One block's (or any span's) state changes, keyed by keccak of address and slot.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HashedStateChanges {
    /// New account values; `None` deletes the account and its storage.
    pub accounts: B256Map<Option<HashedAccount>>,
    /// Storage changes by hashed address.
    pub storages: B256Map<HashedStorageChanges>,
}

impl HashedStateChanges {
    /// The changes a revm bundle describes (its present values).
    ///
    /// An account the bundle marks destroyed gets `wiped = true`, so self-destruct then
    /// re-create in one block keeps only the storage written after the re-create; an account
    /// whose present info is `None` is deleted.
    pub fn from_bundle(bundle: &BundleState) -> Self {
        let mut state = Self::default();
        state.accounts.reserve(bundle.state.len());
        for (address, account) in &bundle.state {
            let hashed = keccak256(address);
            let Some(info) = &account.info else {
                state.accounts.insert(hashed, None);
                continue;
            };
            state
                .accounts
                .insert(hashed, Some(HashedAccount::from(info)));
            let wiped = account.was_destroyed();
            if wiped || !account.storage.is_empty() {
                let slots = account
                    .storage
                    .iter()
                    .map(|(slot, value)| (keccak256(slot.to_be_bytes::<32>()), value.present_value))
                    .collect();
                state
                    .storages
                    .insert(hashed, HashedStorageChanges { wiped, slots });
            }
        }
        state
    }

    /// A full state as a diff against the empty trie.
    pub fn from_state(state: &MemState) -> Self {
        let mut out = Self::default();
        out.accounts.reserve(state.accounts.len());
        for (address, account) in &state.accounts {
            let hashed = keccak256(address);
            out.accounts
                .insert(hashed, Some(HashedAccount::from(&account.info)));
            if !account.storage.is_empty() {
                let slots = account
                    .storage
                    .iter()
                    .map(|(slot, value)| (keccak256(slot.to_be_bytes::<32>()), *value))
                    .collect();
                out.storages.insert(
                    hashed,
                    HashedStorageChanges {
                        wiped: false,
                        slots,
                    },
                );
            }
        }
        out
    }

    /// Folds `later` into `self`, as if both were applied in order.
    pub fn extend(&mut self, later: Self) {
        for (address, account) in later.accounts {
            // An account deleted on either side and set again after it (later in `later`, or
            // by `later` itself) must not see the storage from before the deletion. A deletion
            // already in `self` carries no wipe of its own (`from_bundle` records it as `None`
            // alone), so re-creating the account in `later` adds one here.
            let deleted_before = matches!(self.accounts.get(&address), Some(None));
            if account.is_none() || deleted_before {
                self.storages.insert(
                    address,
                    HashedStorageChanges {
                        wiped: true,
                        slots: B256Map::default(),
                    },
                );
            }
            self.accounts.insert(address, account);
        }
        for (address, storage) in later.storages {
            let entry = self.storages.entry(address).or_default();
            if storage.wiped {
                entry.wiped = true;
                entry.slots.clear();
            }
            entry.slots.extend(storage.slots);
        }
    }

    /// Number of changed accounts plus changed slots.
    pub fn len(&self) -> usize {
        self.accounts.len() + self.storages.values().map(|s| s.slots.len()).sum::<usize>()
    }

    /// Whether nothing changes.
    pub fn is_empty(&self) -> bool {
        self.accounts.is_empty()
            && self
                .storages
                .values()
                .all(|s| !s.wiped && s.slots.is_empty())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloy_primitives::{Address, map::HashMap};
    use revm::{database::AccountStatus, primitives::KECCAK_EMPTY};

    fn info(nonce: u64) -> AccountInfo {
        AccountInfo {
            nonce,
            balance: U256::from(nonce * 10),
            code_hash: KECCAK_EMPTY,
            code: None,
            account_id: None,
        }
    }

    #[test]
    fn from_bundle_marks_destroyed_and_deleted() {
        let (a, b, c) = (
            Address::repeat_byte(1),
            Address::repeat_byte(2),
            Address::repeat_byte(3),
        );
        let slot = |k: u64, old: u64, new: u64| (U256::from(k), (U256::from(old), U256::from(new)));
        let mut bundle = BundleState::new(
            [
                (
                    a,
                    Some(info(1)),
                    Some(info(2)),
                    HashMap::from_iter([slot(1, 5, 6)]),
                ),
                (b, Some(info(1)), None, HashMap::default()),
                (
                    c,
                    Some(info(1)),
                    Some(info(0)),
                    HashMap::from_iter([slot(9, 0, 7)]),
                ),
            ],
            Vec::<Vec<(Address, Option<Option<AccountInfo>>, Vec<(U256, U256)>)>>::new(),
            [],
        );
        bundle.state.get_mut(&c).unwrap().status = AccountStatus::DestroyedChanged;
        let diff = HashedStateChanges::from_bundle(&bundle);

        assert_eq!(
            diff.accounts[&keccak256(a)],
            Some(HashedAccount::from(&info(2)))
        );
        assert_eq!(diff.accounts[&keccak256(b)], None);
        let sa = &diff.storages[&keccak256(a)];
        assert!(!sa.wiped);
        assert_eq!(
            sa.slots[&keccak256(U256::from(1).to_be_bytes::<32>())],
            U256::from(6)
        );
        let sc = &diff.storages[&keccak256(c)];
        assert!(sc.wiped);
        assert_eq!(sc.slots.len(), 1);
        assert!(!diff.storages.contains_key(&keccak256(b)));
    }

    #[test]
    fn extend_applies_in_order() {
        let k = B256::repeat_byte(1);
        let s1 = B256::repeat_byte(2);
        let s2 = B256::repeat_byte(3);
        let mut first = HashedStateChanges::default();
        first.accounts.insert(k, Some(HashedAccount::default()));
        first.storages.insert(
            k,
            HashedStorageChanges {
                wiped: false,
                slots: B256Map::from_iter([(s1, U256::from(1))]),
            },
        );
        let mut second = HashedStateChanges::default();
        second.storages.insert(
            k,
            HashedStorageChanges {
                wiped: true,
                slots: B256Map::from_iter([(s2, U256::from(2))]),
            },
        );
        first.extend(second);
        let st = &first.storages[&k];
        assert!(st.wiped);
        assert_eq!(st.slots.len(), 1);
        assert_eq!(st.slots[&s2], U256::from(2));
        let mut third = HashedStateChanges::default();
        third.accounts.insert(k, None);
        first.extend(third);
        assert!(first.storages[&k].wiped && first.storages[&k].slots.is_empty());
        assert_eq!(first.len(), 1);
    }
}
