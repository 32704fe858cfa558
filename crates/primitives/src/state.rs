use alloy_genesis::GenesisAccount;
use alloy_primitives::{Address, B256, U256, keccak256, map::HashMap};
use revm::{
    bytecode::Bytecode,
    database::BundleState,
    database_interface::DBErrorMarker,
    primitives::{KECCAK_EMPTY, StorageKey, StorageValue},
    state::AccountInfo,
};
use std::{collections::BTreeMap, convert::Infallible};

/// Account code as the state holds it: an EIP-7702 delegation when the bytes are one
/// (`0xef0100` and a 20-byte address, exactly 23 bytes), plain (legacy) code otherwise.
///
/// revm's `Bytecode::new_raw` panics on bytes that start with `0xef01` but are not a valid
/// delegation; such code can only come from a genesis file or a test fixture (EIP-3541 keeps
/// it from being deployed), and geth runs it as the plain code it is (`0xef` is an invalid
/// opcode), so it is taken as legacy code here rather than aborting the process.
pub fn bytecode_from_raw(bytes: alloy_primitives::Bytes) -> Bytecode {
    Bytecode::new_raw_checked(bytes.clone()).unwrap_or_else(|_| Bytecode::new_legacy(bytes))
}

/// One account of a [`MemState`]. Storage holds non-zero slots only.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MemAccount {
    /// Nonce, balance and code hash. `code` is kept `None`; bytecode lives in
    /// [`MemState::contracts`] so it is stored once per hash.
    pub info: AccountInfo,
    /// Non-zero storage slots.
    pub storage: HashMap<U256, U256>,
}

/// A plain in-memory world state.
///
/// It is the pre-state reader for executors (`DatabaseRef`) and the post-state that tests
/// compare. It is cheap to clone for small fixture states; large benchmark states are built
/// once and shared by reference.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MemState {
    /// Accounts that exist (touched-and-empty accounts are removed by EIP-161 before they get
    /// here, exactly as the bundle reports them).
    pub accounts: HashMap<Address, MemAccount>,
    /// Bytecode by code hash.
    pub contracts: HashMap<B256, Bytecode>,
    /// Hashes of ancestor blocks, for BLOCKHASH.
    pub block_hashes: BTreeMap<u64, B256>,
}

/// Error type of [`MemState`]'s `DatabaseRef`: reading memory cannot fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("infallible")]
pub struct MemStateError(Infallible);
impl DBErrorMarker for MemStateError {}

impl MemState {
    /// Builds a state from a genesis allocation.
    pub fn from_alloc<'a>(
        alloc: impl IntoIterator<Item = (&'a Address, &'a GenesisAccount)>,
    ) -> Self {
        let mut state = Self::default();
        for (address, account) in alloc {
            let code = account.code.as_ref().filter(|c| !c.is_empty());
            let code_hash = match code {
                Some(code) => {
                    let bytecode = bytecode_from_raw(code.clone());
                    let hash = bytecode.hash_slow();
                    state.contracts.insert(hash, bytecode);
                    hash
                }
                None => KECCAK_EMPTY,
            };
            let storage = account
                .storage
                .iter()
                .flatten()
                .map(|(k, v)| (U256::from_be_bytes(k.0), U256::from_be_bytes(v.0)))
                .filter(|(_, v)| !v.is_zero())
                .collect();
            state.accounts.insert(
                *address,
                MemAccount {
                    info: AccountInfo {
                        balance: account.balance,
                        nonce: account.nonce.unwrap_or_default(),
                        code_hash,
                        code: None,
                        account_id: None,
                    },
                    storage,
                },
            );
        }
        state
    }

    /// Inserts or replaces an account with the given code (empty code means an EOA).
    pub fn insert_account(
        &mut self,
        address: Address,
        balance: U256,
        nonce: u64,
        code: Option<Bytecode>,
        storage: HashMap<U256, U256>,
    ) {
        let code_hash = match code {
            Some(code) if !code.is_empty() => {
                let hash = code.hash_slow();
                self.contracts.insert(hash, code);
                hash
            }
            _ => KECCAK_EMPTY,
        };
        let info = AccountInfo {
            balance,
            nonce,
            code_hash,
            code: None,
            account_id: None,
        };
        self.accounts.insert(address, MemAccount { info, storage });
    }

    /// Applies the present values of a bundle: destroyed accounts lose their storage before
    /// the bundle's slots are written, so self-destruct then re-create in one block keeps only
    /// the new storage.
    pub fn apply_bundle(&mut self, bundle: &BundleState) {
        for (hash, code) in &bundle.contracts {
            self.contracts.insert(*hash, code.clone());
        }
        for (address, account) in &bundle.state {
            let Some(info) = &account.info else {
                self.accounts.remove(address);
                continue;
            };
            let entry = self.accounts.entry(*address).or_default();
            if account.was_destroyed() {
                entry.storage.clear();
            }
            entry.info = AccountInfo {
                code: None,
                account_id: None,
                ..info.clone()
            };
            for (slot, value) in &account.storage {
                if value.present_value.is_zero() {
                    entry.storage.remove(slot);
                } else {
                    entry.storage.insert(*slot, value.present_value);
                }
            }
        }
    }

    /// The account's code, empty for an EOA or a missing account.
    pub fn code_of(&self, address: &Address) -> Bytecode {
        self.accounts
            .get(address)
            .and_then(|a| self.contracts.get(&a.info.code_hash))
            .cloned()
            .unwrap_or_default()
    }

    /// Keccak of an address, the account trie key.
    pub fn hashed_address(address: &Address) -> B256 {
        keccak256(address)
    }
}

impl revm::DatabaseRef for MemState {
    type Error = MemStateError;

    fn basic_ref(&self, address: Address) -> Result<Option<AccountInfo>, Self::Error> {
        Ok(self.accounts.get(&address).map(|a| a.info.clone()))
    }

    fn code_by_hash_ref(&self, code_hash: B256) -> Result<Bytecode, Self::Error> {
        Ok(self.contracts.get(&code_hash).cloned().unwrap_or_default())
    }

    fn storage_ref(
        &self,
        address: Address,
        index: StorageKey,
    ) -> Result<StorageValue, Self::Error> {
        Ok(self
            .accounts
            .get(&address)
            .and_then(|a| a.storage.get(&index).copied())
            .unwrap_or_default())
    }

    fn block_hash_ref(&self, number: u64) -> Result<B256, Self::Error> {
        Ok(self.block_hashes.get(&number).copied().unwrap_or_default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloy_primitives::{Bytes, address, bytes};

    #[test]
    fn raw_code_is_a_delegation_only_when_well_formed() {
        let target = address!("0x1111111111111111111111111111111111111111");
        let mut delegation = vec![0xef, 0x01, 0x00];
        delegation.extend_from_slice(target.as_slice());
        assert!(bytecode_from_raw(Bytes::from(delegation)).is_eip7702());
        // Bytes `Bytecode::new_raw` panics on: too short, wrong version, too long.
        for code in [
            bytes!("ef01"),
            bytes!("ef0101"),
            Bytes::from([[0xef, 0x01, 0x00].as_slice(), &[0u8; 21]].concat()),
        ] {
            let bytecode = bytecode_from_raw(code.clone());
            assert!(!bytecode.is_eip7702(), "{code}");
            assert_eq!(bytecode.original_bytes(), code);
        }
    }

    #[test]
    fn genesis_with_malformed_delegation_code_loads_as_plain_code() {
        let account = GenesisAccount {
            code: Some(bytes!("ef01")),
            ..Default::default()
        };
        let address = address!("0x2222222222222222222222222222222222222222");
        let state = MemState::from_alloc([(&address, &account)]);
        let hash = state.accounts[&address].info.code_hash;
        assert_eq!(hash, keccak256([0xef, 0x01]));
        assert_eq!(state.contracts[&hash].original_bytes(), bytes!("ef01"));
    }
}
