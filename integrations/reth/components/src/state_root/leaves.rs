//! The leaves a trie that keeps only its top levels (`--overdrive.trie.cache-mb`) reads back:
//! reth's hashed state tables with the blocks the engine holds in memory on top, at one block,
//! through the overlay provider reth's own state-root jobs read through.

use alloy_primitives::{B256, KECCAK256_EMPTY as KECCAK_EMPTY, U256};
use overdrive_trie::{HashedAccount, LeafSource, Nibbles};
use reth_provider::{ProviderError, ProviderResult};
use reth_storage_api::DatabaseProviderROFactory;
use reth_trie::hashed_cursor::{HashedCursor, HashedCursorFactory};
use std::sync::{Condvar, Mutex, PoisonError};

/// The leaves of the state at one block, read through `factory`'s providers.
///
/// The trie reads from several workers at once and a provider is one database transaction, so
/// the source holds one provider per worker, opened up front on the thread that creates it, and
/// a read takes an idle one and puts it back after. Opening a provider can build the overlay of
/// unpersisted blocks, which reth does on its own rayon pool: a trie worker (itself a rayon
/// thread) blocked there steals other trie tasks, which would wait on the overlay cache's lock
/// it holds.
pub(super) struct OverlayLeaves<P> {
    idle: Mutex<Vec<P>>,
    returned: Condvar,
}

impl<P> OverlayLeaves<P> {
    /// A source of `readers` providers from `factory`, for as many workers reading at once.
    pub(super) fn open<F>(factory: &F, readers: usize) -> ProviderResult<Self>
    where
        F: DatabaseProviderROFactory<Provider = P>,
    {
        let idle = (0..readers.max(1))
            .map(|_| factory.database_provider_ro())
            .collect::<ProviderResult<_>>()?;
        Ok(Self {
            idle: Mutex::new(idle),
            returned: Condvar::new(),
        })
    }

    fn with_provider<T>(&self, read: impl FnOnce(&P) -> ProviderResult<T>) -> ProviderResult<T> {
        let provider = {
            let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
            loop {
                match idle.pop() {
                    Some(provider) => break provider,
                    None => {
                        idle = self
                            .returned
                            .wait(idle)
                            .unwrap_or_else(PoisonError::into_inner)
                    }
                }
            }
        };
        let result = read(&provider);
        self.idle
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(provider);
        self.returned.notify_one();
        result
    }
}

/// The first key under `prefix`: its nibbles, then zeros.
fn first_key(prefix: &Nibbles) -> B256 {
    let mut key = B256::ZERO;
    for (i, nibble) in prefix.to_vec().into_iter().enumerate().take(64) {
        key.0[i / 2] |= nibble << (4 * (1 - i % 2));
    }
    key
}

/// Reads from `cursor` the entries whose key starts with `prefix`, in key order.
fn read_range<C: HashedCursor, T>(
    cursor: &mut C,
    prefix: &Nibbles,
    out: &mut Vec<(B256, T)>,
    convert: impl Fn(C::Value) -> T,
) -> ProviderResult<()> {
    let mut entry = cursor.seek(first_key(prefix))?;
    while let Some((key, value)) = entry {
        if !Nibbles::unpack(key).starts_with(prefix) {
            break;
        }
        out.push((key, convert(value)));
        entry = cursor.next()?;
    }
    Ok(())
}

impl<P> LeafSource for OverlayLeaves<P>
where
    P: HashedCursorFactory + Send,
{
    type Error = ProviderError;

    fn accounts(
        &self,
        prefix: &Nibbles,
        out: &mut Vec<(B256, HashedAccount)>,
    ) -> ProviderResult<()> {
        self.with_provider(|provider| {
            let mut cursor = provider.hashed_account_cursor()?;
            read_range(&mut cursor, prefix, out, |account| HashedAccount {
                nonce: account.nonce,
                balance: account.balance,
                code_hash: account.bytecode_hash.unwrap_or(KECCAK_EMPTY),
            })
        })
    }

    fn storage(
        &self,
        address: B256,
        prefix: &Nibbles,
        out: &mut Vec<(B256, U256)>,
    ) -> ProviderResult<()> {
        self.with_provider(|provider| {
            let mut cursor = provider.hashed_storage_cursor(address)?;
            read_range(&mut cursor, prefix, out, |value| value)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_key_under_a_prefix() {
        assert_eq!(first_key(&Nibbles::new()), B256::ZERO);
        let key = first_key(&Nibbles::from_nibbles([0xa, 0xb, 0xc]));
        assert_eq!(&key[..2], &[0xab, 0xc0]);
        assert!(key[2..].iter().all(|b| *b == 0));
        let full = B256::repeat_byte(0x5e);
        assert_eq!(first_key(&Nibbles::unpack(full)), full);
    }
}
