//! Multi-version memory: every speculative write of the block, keyed by location and ordered by
//! transaction index, so a transaction executing at index `j` can read what the highest
//! transaction below `j` wrote.
//!
//! The memory is an optimisation, not an authority: whatever a transaction reads here is
//! checked again, value by value, against the committed `revm::State` before its result is
//! committed (see `commit.rs`). An imperfect answer here costs a re-execution, never a wrong
//! block.

use alloy_primitives::{Address, U256, map::HashMap};
use revm::state::AccountInfo;
use smallvec::SmallVec;
use std::sync::{
    Mutex, PoisonError,
    atomic::{AtomicBool, AtomicU64, Ordering},
};

/// Index of a transaction in its block.
pub(crate) type TxIdx = u32;

/// What a transaction can write.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Location {
    /// Nonce, balance, code hash and existence of an account.
    Account(Address),
    /// One storage slot.
    Storage(Address, U256),
    /// The account's whole storage was cleared (self-destruct, EIP-161 removal, creation).
    Wipe(Address),
}

/// A written value.
#[derive(Debug, Clone)]
pub(crate) enum MvValue {
    /// The account after the write; `None` when it no longer exists.
    Account(Option<AccountInfo>),
    /// A lazy balance increment of an account (a plain transfer to a hot recipient): the value
    /// below it plus this amount.
    Delta(U256),
    /// A storage value.
    Storage(U256),
    /// The storage of the account was cleared at this transaction.
    Wipe,
}

#[derive(Debug, Clone)]
enum Entry {
    Data {
        /// 0 for the speculative execution, 1 for the exact re-execution by the committer.
        incarnation: u32,
        value: MvValue,
    },
    /// The writer is being re-executed: readers must wait for its new values.
    Estimate,
}

/// How an account read resolved.
#[derive(Debug, Clone)]
pub(crate) enum AccountRead {
    /// A write below the reader determines the account (deltas on it already added).
    Value(Option<AccountInfo>),
    /// No absolute write below the reader: take the base state and add `delta`.
    Base { delta: U256 },
    /// A write below the reader is being re-executed; wait for that transaction.
    Blocked(TxIdx),
}

/// How a storage read resolved.
#[derive(Debug, Clone, Copy)]
pub(crate) enum StorageRead {
    Value(U256),
    Base,
    Blocked(TxIdx),
}

const SHARDS: usize = 128;

/// Versions of one location, sorted by transaction index (each index at most once).
///
/// The indices are kept apart from the entries: every access binary-searches the indices, and an
/// entry is 104 bytes (an account), so searching pairs of both touched a cache line per step (on
/// Uniswap blocks, most of the reads' time went to that search's loads).
///
/// Most locations have one writer in a block, and its version lives in the map's slot itself:
/// no allocation when it is written, and no pointer to follow when it is read.
#[derive(Debug, Default)]
struct Versions {
    txs: SmallVec<[TxIdx; 2]>,
    entries: SmallVec<[Entry; 1]>,
}

impl Versions {
    /// How many versions are below `reader`.
    fn below(&self, reader: TxIdx) -> usize {
        self.txs.partition_point(|tx| *tx < reader)
    }

    /// The position of `writer`'s version, or where it would go.
    fn find(&self, writer: TxIdx) -> Result<usize, usize> {
        self.txs.binary_search(&writer)
    }

    fn insert(&mut self, i: usize, writer: TxIdx, entry: Entry) {
        self.txs.insert(i, writer);
        self.entries.insert(i, entry);
    }

    fn remove(&mut self, i: usize) {
        self.txs.remove(i);
        self.entries.remove(i);
    }
}

/// One shard, alone on its cache lines: both threads lock shards all the time, and two
/// mutexes on one line would make each lock bounce the other's line between the cores.
#[derive(Debug)]
#[repr(align(128))]
struct Shard {
    map: Mutex<HashMap<Location, Versions>>,
}

/// The memory. Each shard's mutex guards the version lists of the locations that hash to it;
/// no code path holds two shard locks at once.
#[derive(Debug)]
pub(crate) struct MvMemory {
    shards: Box<[Shard]>,
    /// A one-hash Bloom filter of the written locations: a bit is set before its location's first
    /// write. Most reads are of locations nothing writes (most transactions publish nothing), and
    /// the filter answers them without a shard's lock and map lookup (on an ERC20 block, most
    /// lookups no longer lock). On two threads that made no measurable difference; the lock traffic
    /// it removes grows with the threads. A reader that misses a concurrent first write reads as if
    /// it came just before it, which any speculative read may; the committer checks every read
    /// anyway.
    written: Box<[AtomicU64]>,
    /// Set once any transaction wrote a `Wipe`: until then storage reads skip the wipe lookup.
    any_wipe: AtomicBool,
}

/// A cheap hash of `location`. Addresses and (hashed) slots are close to uniformly
/// distributed; a few bytes of each spread the keys well without hashing the whole key.
fn mix(location: &Location) -> u64 {
    let (address, extra) = match location {
        Location::Account(a) => (a, 0u64),
        Location::Storage(a, slot) => (a, slot.as_limbs()[0]),
        Location::Wipe(a) => (a, 1u64),
    };
    let a = u64::from_le_bytes(address.0[12..20].try_into().unwrap_or_default());
    a ^ extra ^ (extra >> 29)
}

fn shard_of(location: &Location) -> usize {
    (mix(location) as usize) % SHARDS
}

/// The word and bit of `location` in a filter of `words` words (a power of two). The
/// multiplication spreads all of `mix`'s bits into the high ones, which pick the bit, so the
/// filter's bit is independent of the shard (`mix`'s low bits).
fn filter_bit(location: &Location, words: usize) -> (usize, u64) {
    let h = mix(location).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    let bit = (h >> 32) as usize & (words * 64 - 1);
    (bit / 64, 1u64 << (bit % 64))
}

impl MvMemory {
    #[cfg(test)]
    pub(crate) fn new() -> Self {
        Self::with_capacity(0, 0)
    }

    /// A memory for a block of `txs` transactions whose maps have room for `locations`
    /// written locations; they grow if the block writes more.
    ///
    /// Blocks write very different numbers of locations (from a fraction of one per transaction in
    /// a block of transfers to several in a block of swaps): most transactions publish nothing. The
    /// executor sizes a block's memory from the block before, because a larger table spreads the
    /// same entries over more memory: sized at four locations per transaction, a mega-block's table
    /// outgrew the L3 cache, and the block ran measurably slower than at one per transaction.
    pub(crate) fn with_capacity(locations: usize, txs: usize) -> Self {
        let per_shard = locations / SHARDS;
        // Sixteen bits per transaction: a few percent of them set on a block whose transactions
        // mostly publish nothing, a fifth when every one publishes four locations.
        let words = (txs.saturating_mul(16) / 64).next_power_of_two().max(64);
        Self {
            shards: (0..SHARDS)
                .map(|_| Shard {
                    map: Mutex::new(HashMap::with_capacity_and_hasher(
                        per_shard,
                        Default::default(),
                    )),
                })
                .collect(),
            written: (0..words).map(|_| AtomicU64::new(0)).collect(),
            any_wipe: AtomicBool::new(false),
        }
    }

    /// How many distinct locations were written (each shard locked in turn).
    pub(crate) fn locations(&self) -> usize {
        self.shards
            .iter()
            .map(|shard| {
                shard
                    .map
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .len()
            })
            .sum()
    }

    fn shard(&self, location: &Location) -> std::sync::MutexGuard<'_, HashMap<Location, Versions>> {
        // A poisoned shard only means another worker panicked; the block is aborted by then and
        // nothing read here can reach a committed result unchecked.
        self.shards[shard_of(location)]
            .map
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// The shard of `location` locked, or `None` when `location` was certainly never written.
    fn used_shard(
        &self,
        location: &Location,
    ) -> Option<std::sync::MutexGuard<'_, HashMap<Location, Versions>>> {
        let (word, bit) = filter_bit(location, self.written.len());
        (self.written[word].load(Ordering::Acquire) & bit != 0).then(|| self.shard(location))
    }

    /// Resolves `Account(address)` as seen by transaction `reader`.
    pub(crate) fn read_account(&self, address: Address, reader: TxIdx) -> AccountRead {
        let location = Location::Account(address);
        let Some(shard) = self.used_shard(&location) else {
            return AccountRead::Base { delta: U256::ZERO };
        };
        let Some(versions) = shard.get(&location) else {
            return AccountRead::Base { delta: U256::ZERO };
        };
        let below = versions.below(reader);
        let mut delta = U256::ZERO;
        for (tx, entry) in versions.txs[..below]
            .iter()
            .zip(&versions.entries[..below])
            .rev()
        {
            match entry {
                Entry::Estimate => return AccountRead::Blocked(*tx),
                Entry::Data {
                    value: MvValue::Delta(d),
                    ..
                } => delta = delta.saturating_add(*d),
                Entry::Data {
                    value: MvValue::Account(info),
                    ..
                } => {
                    let info = info.clone().map(|mut info| {
                        info.balance = info.balance.saturating_add(delta);
                        info
                    });
                    return AccountRead::Value(info);
                }
                Entry::Data { .. } => {}
            }
        }
        AccountRead::Base { delta }
    }

    /// Resolves a storage slot as seen by transaction `reader`, honouring storage wipes.
    pub(crate) fn read_storage(&self, address: Address, slot: U256, reader: TxIdx) -> StorageRead {
        let (slot_tx, slot_value) =
            match self.latest_below(&Location::Storage(address, slot), reader) {
                Some((tx, Entry::Estimate)) => return StorageRead::Blocked(tx),
                Some((
                    tx,
                    Entry::Data {
                        value: MvValue::Storage(v),
                        ..
                    },
                )) => (Some(tx), v),
                _ => (None, U256::ZERO),
            };
        if self.any_wipe.load(Ordering::Acquire) {
            match self.latest_below(&Location::Wipe(address), reader) {
                Some((tx, Entry::Estimate)) => return StorageRead::Blocked(tx),
                // A wipe after the last slot write clears it; a wipe and a write by the same
                // transaction (a constructor storing) leave the written value.
                Some((tx, Entry::Data { .. })) if slot_tx.is_none_or(|s| tx > s) => {
                    return StorageRead::Value(U256::ZERO);
                }
                _ => {}
            }
        }
        match slot_tx {
            Some(_) => StorageRead::Value(slot_value),
            None => StorageRead::Base,
        }
    }

    fn latest_below(&self, location: &Location, reader: TxIdx) -> Option<(TxIdx, Entry)> {
        let shard = self.used_shard(location)?;
        let versions = shard.get(location)?;
        let below = versions.below(reader);
        below
            .checked_sub(1)
            .map(|i| (versions.txs[i], versions.entries[i].clone()))
    }

    /// Records the writes of `writer` (incarnation `incarnation`), replacing whatever it wrote
    /// before at the same locations; those of `previous` (the locations an earlier run of it
    /// published) that the new writes leave out are removed.
    ///
    /// It also adds to `next_writers`, per location given an absolute value (or removed), the
    /// lowest transaction above `writer` that wrote there already: the one most likely to have
    /// read that location before this write (a read-modify-write, such as the next swap on a
    /// pair) and so to have run on a value that is no longer the one below it. Lazy deltas are
    /// left out: a delta's readers are credited at commit, not invalidated.
    pub(crate) fn write(
        &self,
        writer: TxIdx,
        incarnation: u32,
        writes: &[(Location, MvValue)],
        previous: &[Location],
        next_writers: &mut Vec<TxIdx>,
    ) {
        for (location, value) in writes {
            if matches!(location, Location::Wipe(_)) {
                self.any_wipe.store(true, Ordering::Release);
            }
            let entry = Entry::Data {
                incarnation,
                value: value.clone(),
            };
            let (word, bit) = filter_bit(location, self.written.len());
            // A plain load first: a location written again (a re-execution, a hot account) is
            // in the filter already, and the read-modify-write would take the word's line from
            // the other core.
            if self.written[word].load(Ordering::Relaxed) & bit == 0 {
                self.written[word].fetch_or(bit, Ordering::Release);
            }
            let mut shard = self.shard(location);
            let versions = shard.entry(*location).or_default();
            let at = match versions.find(writer) {
                // A newer incarnation's data is never replaced by an older one's.
                Ok(i) => match &versions.entries[i] {
                    Entry::Data {
                        incarnation: newer, ..
                    } if *newer > incarnation => continue,
                    _ => {
                        versions.entries[i] = entry;
                        i
                    }
                },
                Err(i) => {
                    versions.insert(i, writer, entry);
                    i
                }
            };
            if !matches!(value, MvValue::Delta(_))
                && let Some(&above) = versions.txs.get(at + 1)
            {
                next_writers.push(above);
            }
        }
        let stale = previous
            .iter()
            .filter(|l| !writes.iter().any(|(w, _)| w == *l));
        for location in stale {
            let mut shard = self.shard(location);
            if let Some(versions) = shard.get_mut(location)
                && let Ok(i) = versions.find(writer)
            {
                versions.remove(i);
                next_writers.extend(versions.txs.get(i));
            }
        }
    }

    /// Marks every location `writer` wrote as an estimate while it is re-executed.
    pub(crate) fn mark_estimates(&self, writer: TxIdx, locations: &[Location]) {
        for location in locations {
            let mut shard = self.shard(location);
            if let Some(versions) = shard.get_mut(location)
                && let Ok(i) = versions.find(writer)
            {
                versions.entries[i] = Entry::Estimate;
            }
        }
    }

    /// Incarnation of `writer`'s entry at `location`, if it has a data entry there (tests).
    #[cfg(test)]
    pub(crate) fn incarnation(&self, location: &Location, writer: TxIdx) -> Option<u32> {
        let shard = self.shard(location);
        let versions = shard.get(location)?;
        let i = versions.find(writer).ok()?;
        match &versions.entries[i] {
            Entry::Data { incarnation, .. } => Some(*incarnation),
            Entry::Estimate => None,
        }
    }
}

#[cfg(test)]
impl MvMemory {
    /// A first run's writes, published (the tests' shorthand for [`MvMemory::write`]).
    pub(crate) fn put(&self, tx: TxIdx, writes: &[(Location, MvValue)]) {
        self.write(tx, 0, writes, &[], &mut Vec::new());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(balance: u64) -> Option<AccountInfo> {
        Some(AccountInfo {
            balance: U256::from(balance),
            ..Default::default()
        })
    }

    #[test]
    fn reads_latest_write_below_reader() {
        let mv = MvMemory::new();
        let a = Address::repeat_byte(1);
        let loc = Location::Account(a);
        mv.put(2, &[(loc, MvValue::Account(info(20)))]);
        mv.put(5, &[(loc, MvValue::Account(info(50)))]);
        assert!(matches!(mv.read_account(a, 2), AccountRead::Base { .. }));
        assert!(
            matches!(mv.read_account(a, 3), AccountRead::Value(Some(i)) if i.balance == U256::from(20))
        );
        assert!(
            matches!(mv.read_account(a, 9), AccountRead::Value(Some(i)) if i.balance == U256::from(50))
        );
        mv.mark_estimates(5, &[loc]);
        assert!(matches!(mv.read_account(a, 9), AccountRead::Blocked(5)));
        mv.write(5, 1, &[], &[loc], &mut Vec::new());
        assert!(
            matches!(mv.read_account(a, 9), AccountRead::Value(Some(i)) if i.balance == U256::from(20))
        );
        assert_eq!(mv.incarnation(&loc, 2), Some(0));
    }

    #[test]
    fn filter_skips_unwritten_locations_and_tolerates_collisions() {
        let mv = MvMemory::new();
        let words = mv.written.len();
        let written = Address::repeat_byte(7);
        mv.put(
            1,
            &[(Location::Account(written), MvValue::Account(info(5)))],
        );
        // An address whose filter bit is the written one's (a false positive) and one whose
        // bit is not set.
        let bit = filter_bit(&Location::Account(written), words);
        let address = |i: u64| {
            let mut a = Address::ZERO;
            a.0[12..20].copy_from_slice(&i.to_le_bytes());
            a
        };
        let colliding = (0u64..)
            .map(address)
            .find(|a| *a != written && filter_bit(&Location::Account(*a), words) == bit)
            .unwrap();
        let clear = (0u64..)
            .map(address)
            .find(|a| filter_bit(&Location::Account(*a), words) != bit)
            .unwrap();
        for a in [colliding, clear] {
            assert!(
                matches!(mv.read_account(a, 9), AccountRead::Base { delta } if delta.is_zero())
            );
        }
        assert!(
            matches!(mv.read_account(written, 9), AccountRead::Value(Some(i)) if i.balance == U256::from(5))
        );
        assert!(matches!(
            mv.read_storage(written, U256::from(1), 9),
            StorageRead::Base
        ));
    }

    #[test]
    fn deltas_stack_on_the_value_below() {
        let mv = MvMemory::new();
        let a = Address::repeat_byte(2);
        let loc = Location::Account(a);
        mv.put(1, &[(loc, MvValue::Delta(U256::from(3)))]);
        mv.put(3, &[(loc, MvValue::Account(info(10)))]);
        mv.put(4, &[(loc, MvValue::Delta(U256::from(7)))]);
        assert!(
            matches!(mv.read_account(a, 2), AccountRead::Base { delta } if delta == U256::from(3))
        );
        assert!(
            matches!(mv.read_account(a, 5), AccountRead::Value(Some(i)) if i.balance == U256::from(17))
        );
    }

    #[test]
    fn wipes_clear_older_slot_writes_only() {
        let mv = MvMemory::new();
        let a = Address::repeat_byte(3);
        let s = U256::from(9);
        mv.put(
            1,
            &[(Location::Storage(a, s), MvValue::Storage(U256::from(4)))],
        );
        mv.put(2, &[(Location::Wipe(a), MvValue::Wipe)]);
        mv.put(
            4,
            &[
                (Location::Wipe(a), MvValue::Wipe),
                (Location::Storage(a, s), MvValue::Storage(U256::from(6))),
            ],
        );
        assert!(matches!(mv.read_storage(a, s, 1), StorageRead::Base));
        assert!(matches!(mv.read_storage(a, s, 2), StorageRead::Value(v) if v == U256::from(4)));
        assert!(matches!(mv.read_storage(a, s, 3), StorageRead::Value(v) if v.is_zero()));
        assert!(matches!(mv.read_storage(a, s, 5), StorageRead::Value(v) if v == U256::from(6)));
        // The slot and the wipe, whatever the number of writers.
        assert_eq!(mv.locations(), 2);
    }

    /// Each write names, per location, the lowest writer above it; lazy deltas name none, and
    /// a removed version names the writer that now follows the one below it.
    #[test]
    fn writes_name_the_next_writer_above() {
        let mv = MvMemory::new();
        let (a, b) = (Address::repeat_byte(1), Address::repeat_byte(2));
        let (la, lb) = (Location::Account(a), Location::Storage(b, U256::from(1)));
        let slot = |v: u64| (lb, MvValue::Storage(U256::from(v)));
        // The next writers one write names.
        let write = |tx, incarnation, writes: &[(Location, MvValue)], previous: &[Location]| {
            let mut next = Vec::new();
            mv.write(tx, incarnation, writes, previous, &mut next);
            next
        };
        assert!(write(7, 0, &[(la, MvValue::Account(info(7)))], &[]).is_empty());
        assert!(write(9, 0, &[(la, MvValue::Account(info(9)))], &[]).is_empty());
        assert!(write(5, 0, &[slot(5)], &[]).is_empty());
        assert_eq!(
            write(3, 0, &[(la, MvValue::Account(info(3))), slot(3)], &[]),
            [7, 5]
        );
        assert!(write(2, 0, &[(la, MvValue::Delta(U256::from(1)))], &[]).is_empty());
        // Transaction 3 again, without `la`: its removal names 7.
        assert_eq!(write(3, 0, &[slot(4)], &[la, lb]), [5, 7]);
        // An older incarnation does not replace a newer one, and names nobody.
        write(5, 1, &[slot(6)], &[]);
        assert_eq!(write(3, 1, &[slot(4)], &[]), [5]);
        assert!(write(5, 0, &[slot(1)], &[]).is_empty());
        assert!(
            matches!(mv.read_storage(b, U256::from(1), 6), StorageRead::Value(v) if v == U256::from(6))
        );
    }
}
