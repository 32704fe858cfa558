//! State readers the parallel executor can share across its threads, built from sources it
//! cannot share directly: a database handle that is `Send` but not `Sync` (one is opened per
//! thread), and the changes of earlier blocks not yet written to that database (read through).

use crate::StateReader;
use alloy_primitives::{Address, B256, U256};
use revm::{
    DatabaseRef,
    database::BundleState,
    state::{AccountInfo, Bytecode},
};
use std::fmt;
use thread_local::ThreadLocal;

/// The state after the blocks of `bundle` on top of `base`: what revm's `State` reads when the
/// bundle is preloaded (`use_preloaded_bundle`). An account the bundle holds is read from it
/// whole; a slot it does not hold is zero when the account's storage is known there (created
/// or destroyed within the bundle's blocks) and `base`'s otherwise.
///
/// A block executor that keeps one `State` over several blocks accumulates them in its bundle
/// while its database stays at the first block's parent: this is the next block's pre-state.
pub struct BundleOverlay<'a, R> {
    bundle: &'a BundleState,
    base: R,
}

impl<'a, R> BundleOverlay<'a, R> {
    /// `base` with `bundle`'s present values on top.
    pub fn new(bundle: &'a BundleState, base: R) -> Self {
        Self { bundle, base }
    }
}

impl<R: fmt::Debug> fmt::Debug for BundleOverlay<'_, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BundleOverlay")
            .field("accounts", &self.bundle.state.len())
            .field("base", &self.base)
            .finish()
    }
}

impl<R: DatabaseRef> DatabaseRef for BundleOverlay<'_, R> {
    type Error = R::Error;

    fn basic_ref(&self, address: Address) -> Result<Option<AccountInfo>, Self::Error> {
        match self.bundle.state.get(&address) {
            Some(account) => Ok(account.info.clone()),
            None => self.base.basic_ref(address),
        }
    }

    fn code_by_hash_ref(&self, code_hash: B256) -> Result<Bytecode, Self::Error> {
        match self.bundle.contracts.get(&code_hash) {
            Some(code) => Ok(code.clone()),
            None => self.base.code_by_hash_ref(code_hash),
        }
    }

    fn storage_ref(&self, address: Address, index: U256) -> Result<U256, Self::Error> {
        if let Some(account) = self.bundle.state.get(&address) {
            if let Some(slot) = account.storage.get(&index) {
                return Ok(slot.present_value);
            }
            if account.status.is_storage_known() {
                return Ok(U256::ZERO);
            }
        }
        self.base.storage_ref(address, index)
    }

    fn block_hash_ref(&self, number: u64) -> Result<B256, Self::Error> {
        self.base.block_hash_ref(number)
    }
}

/// One reader per thread, each opened by `open` on the thread's first read and kept until this
/// is dropped: shares a source whose handles are `Send` but not `Sync` (a read-only database
/// transaction) without sharing a handle. Every handle must read the same state; `open` is
/// where that is decided.
pub struct PerThreadReader<D: Send, F> {
    open: F,
    readers: ThreadLocal<D>,
}

impl<D: Send, F> PerThreadReader<D, F> {
    /// A reader whose threads each open their own handle with `open`.
    pub fn new(open: F) -> Self {
        Self {
            open,
            readers: ThreadLocal::new(),
        }
    }

    /// [`Self::new`], with `current` as the calling thread's handle (opened already, e.g. to
    /// check that the state exists before a block starts).
    pub fn with_current(open: F, current: D) -> Self {
        let reader = Self::new(open);
        reader.readers.get_or(|| current);
        reader
    }

    /// How many threads opened a handle so far.
    pub fn opened(&mut self) -> usize {
        self.readers.iter_mut().count()
    }
}

impl<D: Send, F> fmt::Debug for PerThreadReader<D, F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PerThreadReader").finish_non_exhaustive()
    }
}

impl<D, F> PerThreadReader<D, F>
where
    D: DatabaseRef + Send,
    F: Fn() -> Result<D, D::Error>,
{
    fn reader(&self) -> Result<&D, D::Error> {
        self.readers.get_or_try(&self.open)
    }
}

impl<D, F> DatabaseRef for PerThreadReader<D, F>
where
    D: DatabaseRef + Send,
    F: Fn() -> Result<D, D::Error>,
{
    type Error = D::Error;

    fn basic_ref(&self, address: Address) -> Result<Option<AccountInfo>, Self::Error> {
        self.reader()?.basic_ref(address)
    }

    fn code_by_hash_ref(&self, code_hash: B256) -> Result<Bytecode, Self::Error> {
        self.reader()?.code_by_hash_ref(code_hash)
    }

    fn storage_ref(&self, address: Address, index: U256) -> Result<U256, Self::Error> {
        self.reader()?.storage_ref(address, index)
    }

    fn block_hash_ref(&self, number: u64) -> Result<B256, Self::Error> {
        self.reader()?.block_hash_ref(number)
    }
}

/// Reads of a state that does not change while this is used (a block's pre-state), each
/// location read from `inner` once: the first thread to ask reads it, later ones find it.
///
/// The parallel executor reads a location on the thread that speculates a transaction and
/// again on the committer, which checks the speculation against its own state; a transaction
/// executed again reads it a third time. From memory that costs little; from a database each
/// read is a lookup.
pub struct CachedReader<R> {
    inner: R,
    accounts: Shards<Address, Option<AccountInfo>>,
    storage: Shards<(Address, U256), U256>,
    code: Shards<B256, Bytecode>,
}

/// A map split over locks, so that threads reading different keys rarely wait on each other.
struct Shards<K, V> {
    shards: Box<[std::sync::Mutex<alloy_primitives::map::HashMap<K, V>>]>,
    hasher: alloy_primitives::map::DefaultHashBuilder,
}

impl<K: std::hash::Hash + Eq + Copy, V: Clone> Shards<K, V> {
    /// Enough shards that two or three dozen threads rarely meet on one.
    const COUNT: usize = 64;

    fn new() -> Self {
        Self {
            shards: (0..Self::COUNT).map(|_| Default::default()).collect(),
            hasher: Default::default(),
        }
    }

    /// The value at `key`, read with `read` (outside the lock) when absent. Two threads may
    /// both read a new key; the first value stored is kept (both read the same state).
    fn get_or_read<E>(&self, key: K, read: impl FnOnce() -> Result<V, E>) -> Result<V, E> {
        use std::hash::BuildHasher;
        let shard = &self.shards[self.hasher.hash_one(key) as usize % Self::COUNT];
        let lock = || shard.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(value) = lock().get(&key) {
            return Ok(value.clone());
        }
        let value = read()?;
        Ok(lock().entry(key).or_insert(value).clone())
    }
}

impl<R> CachedReader<R> {
    /// `inner`, cached.
    pub fn new(inner: R) -> Self {
        Self {
            inner,
            accounts: Shards::new(),
            storage: Shards::new(),
            code: Shards::new(),
        }
    }
}

impl<R: fmt::Debug> fmt::Debug for CachedReader<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CachedReader")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

impl<R: DatabaseRef> DatabaseRef for CachedReader<R> {
    type Error = R::Error;

    fn basic_ref(&self, address: Address) -> Result<Option<AccountInfo>, Self::Error> {
        self.accounts
            .get_or_read(address, || self.inner.basic_ref(address))
    }

    fn code_by_hash_ref(&self, code_hash: B256) -> Result<Bytecode, Self::Error> {
        self.code
            .get_or_read(code_hash, || self.inner.code_by_hash_ref(code_hash))
    }

    fn storage_ref(&self, address: Address, index: U256) -> Result<U256, Self::Error> {
        self.storage
            .get_or_read((address, index), || self.inner.storage_ref(address, index))
    }

    fn block_hash_ref(&self, number: u64) -> Result<B256, Self::Error> {
        self.inner.block_hash_ref(number)
    }
}

/// Compile-time check that both readers qualify as a [`StateReader`] when their parts do.
#[allow(dead_code)]
fn readers_are_state_readers<R: StateReader, D: DatabaseRef<Error = R::Error> + Send>(
    bundle: &BundleState,
    base: R,
    open: impl Fn() -> Result<D, R::Error> + Sync,
) {
    fn check<S: StateReader>(_: &S) {}
    check(&BundleOverlay::new(bundle, CachedReader::new(base)));
    check(&PerThreadReader::new(open));
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloy_primitives::{address, map::HashMap};
    use revm::{
        Database, DatabaseCommit,
        database::{CacheDB, EmptyDB, State, states::bundle_state::BundleRetention},
        state::{Account, AccountStatus, EvmStorageSlot},
    };
    use std::sync::atomic::{AtomicUsize, Ordering};

    const A: Address = address!("0x00000000000000000000000000000000000000aa");
    const B: Address = address!("0x00000000000000000000000000000000000000bb");
    const C: Address = address!("0x00000000000000000000000000000000000000cc");

    fn info(balance: u64, nonce: u64) -> AccountInfo {
        AccountInfo {
            balance: U256::from(balance),
            nonce,
            ..Default::default()
        }
    }

    /// A base with A (slots 1, 2) and B (slot 1); C absent.
    fn base() -> CacheDB<EmptyDB> {
        let mut db = CacheDB::new(EmptyDB::new());
        db.insert_account_info(A, info(10, 1));
        db.insert_account_storage(A, U256::from(1), U256::from(11))
            .unwrap();
        db.insert_account_storage(A, U256::from(2), U256::from(12))
            .unwrap();
        db.insert_account_info(B, info(20, 2));
        db.insert_account_storage(B, U256::from(1), U256::from(21))
            .unwrap();
        db
    }

    fn touched(info: AccountInfo, storage: &[(u64, u64, u64)], status: AccountStatus) -> Account {
        let mut account =
            Account::from(info).with_storage(storage.iter().map(|&(slot, original, present)| {
                (
                    U256::from(slot),
                    EvmStorageSlot::new_changed(
                        U256::from(original),
                        U256::from(present),
                        revm::state::TransactionId::ZERO,
                    ),
                )
            }));
        account.status |= status;
        account.mark_touch();
        account
    }

    /// Two blocks on a `State` over `base()`: A's slot 1 changes, B is destroyed (pre-Cancun
    /// rules), C is created with a slot.
    fn two_blocks() -> State<CacheDB<EmptyDB>> {
        let mut state = State::builder()
            .with_database(base())
            .with_bundle_update()
            .build();
        for address in [A, B, C] {
            state.basic(address).unwrap();
        }
        state.storage(A, U256::from(1)).unwrap();
        state.commit(HashMap::from_iter([(
            A,
            touched(info(9, 2), &[(1, 11, 111)], AccountStatus::empty()),
        )]));
        state.merge_transitions(BundleRetention::Reverts);
        state.commit(HashMap::from_iter([
            (B, touched(info(0, 0), &[], AccountStatus::SelfDestructed)),
            (
                C,
                touched(info(5, 1), &[(7, 0, 77)], AccountStatus::Created),
            ),
        ]));
        state.merge_transitions(BundleRetention::Reverts);
        state
    }

    /// The overlay reads what revm's `State` reads with the same bundle preloaded.
    #[test]
    fn overlay_reads_as_a_preloaded_state() {
        let bundle = two_blocks().take_bundle();
        let overlay = BundleOverlay::new(&bundle, base());
        let mut preloaded = State::builder()
            .with_database(base())
            .with_bundle_prestate(bundle.clone())
            .build();
        for address in [
            A,
            B,
            C,
            address!("0x00000000000000000000000000000000000000dd"),
        ] {
            assert_eq!(
                overlay
                    .basic_ref(address)
                    .unwrap()
                    .map(|i| (i.balance, i.nonce)),
                preloaded
                    .basic(address)
                    .unwrap()
                    .map(|i| (i.balance, i.nonce)),
                "account {address}"
            );
            for slot in [1u64, 2, 7] {
                assert_eq!(
                    overlay.storage_ref(address, U256::from(slot)).unwrap(),
                    preloaded.storage(address, U256::from(slot)).unwrap(),
                    "slot {slot} of {address}"
                );
            }
        }
        // The values themselves: A's changed and unchanged slots, B's storage gone, C's new.
        assert_eq!(
            overlay.storage_ref(A, U256::from(1)).unwrap(),
            U256::from(111)
        );
        assert_eq!(
            overlay.storage_ref(A, U256::from(2)).unwrap(),
            U256::from(12)
        );
        assert_eq!(overlay.basic_ref(B).unwrap(), None);
        assert_eq!(overlay.storage_ref(B, U256::from(1)).unwrap(), U256::ZERO);
        assert_eq!(
            overlay.storage_ref(C, U256::from(7)).unwrap(),
            U256::from(77)
        );
        assert_eq!(overlay.storage_ref(C, U256::from(8)).unwrap(), U256::ZERO);
    }

    /// A cached reader reads each location once, and answers as its inner reader.
    #[test]
    fn cached_reader_reads_each_location_once() {
        let opened = AtomicUsize::new(0);
        struct Counting<'a>(CacheDB<EmptyDB>, &'a AtomicUsize);
        impl DatabaseRef for Counting<'_> {
            type Error = std::convert::Infallible;
            fn basic_ref(&self, a: Address) -> Result<Option<AccountInfo>, Self::Error> {
                self.1.fetch_add(1, Ordering::Relaxed);
                self.0.basic_ref(a)
            }
            fn code_by_hash_ref(&self, h: B256) -> Result<Bytecode, Self::Error> {
                self.1.fetch_add(1, Ordering::Relaxed);
                self.0.code_by_hash_ref(h)
            }
            fn storage_ref(&self, a: Address, i: U256) -> Result<U256, Self::Error> {
                self.1.fetch_add(1, Ordering::Relaxed);
                self.0.storage_ref(a, i)
            }
            fn block_hash_ref(&self, n: u64) -> Result<B256, Self::Error> {
                self.0.block_hash_ref(n)
            }
        }
        let cached = CachedReader::new(Counting(base(), &opened));
        std::thread::scope(|s| {
            for _ in 0..3 {
                s.spawn(|| {
                    for _ in 0..4 {
                        assert_eq!(
                            cached.basic_ref(A).unwrap().unwrap().balance,
                            U256::from(10)
                        );
                        assert_eq!(cached.basic_ref(C).unwrap(), None);
                        assert_eq!(
                            cached.storage_ref(A, U256::from(2)).unwrap(),
                            U256::from(12)
                        );
                    }
                });
            }
        });
        // Three locations; two threads may race on a first read, never more than once each.
        let reads = opened.load(Ordering::Relaxed);
        assert!((3..=9).contains(&reads), "{reads} reads");
        assert_eq!(cached.basic_ref(A).unwrap().unwrap().nonce, 1);
        assert_eq!(opened.load(Ordering::Relaxed), reads);
    }

    /// Each thread opens its own handle once, and reads through it. (A thread that has exited
    /// hands its handle on to a later one: the threads here overlap.)
    #[test]
    fn per_thread_reader_opens_once_per_thread() {
        let opened = AtomicUsize::new(0);
        let all_opened = std::sync::Barrier::new(3);
        let mut reader = PerThreadReader::new(|| {
            opened.fetch_add(1, Ordering::Relaxed);
            Ok::<_, std::convert::Infallible>(base())
        });
        std::thread::scope(|s| {
            for _ in 0..3 {
                s.spawn(|| {
                    reader.basic_ref(A).unwrap();
                    all_opened.wait();
                    for _ in 0..5 {
                        assert_eq!(
                            reader.basic_ref(A).unwrap().unwrap().balance,
                            U256::from(10)
                        );
                        assert_eq!(
                            reader.storage_ref(B, U256::from(1)).unwrap(),
                            U256::from(21)
                        );
                    }
                });
            }
        });
        assert_eq!(opened.load(Ordering::Relaxed), 3);
        assert_eq!(reader.opened(), 3);
    }

    #[derive(Debug, thiserror::Error)]
    #[error("database closed")]
    struct Closed;
    impl revm::database_interface::DBErrorMarker for Closed {}

    /// An `open` that fails fails the read with its error, and is tried again on the next read.
    #[test]
    fn per_thread_reader_passes_open_errors_on() {
        let attempts = AtomicUsize::new(0);
        let reader = PerThreadReader::new(|| {
            if attempts.fetch_add(1, Ordering::Relaxed) == 0 {
                Err(Closed)
            } else {
                Ok(revm::database::EmptyDBTyped::<Closed>::new())
            }
        });
        assert!(matches!(reader.basic_ref(A), Err(Closed)));
        assert_eq!(reader.basic_ref(A).unwrap(), None);
        assert_eq!(reader.basic_ref(B).unwrap(), None);
        assert_eq!(attempts.load(Ordering::Relaxed), 2);
    }
}
