//! Reads memoised for one batch.

use std::{cell::RefCell, collections::HashMap, hash::Hash};

/// Values read once per key for the life of one batch.
///
/// The transactions of one batch are validated against one state, so a second read of the
/// same key can only return what the first did; a sender with many transactions in the batch
/// is read once. Errors are not kept: the next call reads again. One memo serves one worker
/// (it is not `Sync`), and it is dropped with its batch, so it never holds stale state.
#[derive(Debug)]
pub struct ReadMemo<K, V> {
    values: RefCell<HashMap<K, V>>,
}

impl<K, V> Default for ReadMemo<K, V> {
    fn default() -> Self {
        Self {
            values: RefCell::new(HashMap::new()),
        }
    }
}

impl<K: Eq + Hash + Clone, V: Clone> ReadMemo<K, V> {
    /// The value for `key`: the one read before, or `read`'s (kept when it succeeds).
    pub fn get_or_read<E>(&self, key: &K, read: impl FnOnce() -> Result<V, E>) -> Result<V, E> {
        if let Some(value) = self.values.borrow().get(key) {
            return Ok(value.clone());
        }
        let value = read()?;
        self.values.borrow_mut().insert(key.clone(), value.clone());
        Ok(value)
    }

    /// Keys read so far.
    pub fn len(&self) -> usize {
        self.values.borrow().len()
    }

    /// Whether nothing was read yet.
    pub fn is_empty(&self) -> bool {
        self.values.borrow().is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    #[test]
    fn each_key_is_read_once_and_errors_are_not_kept() {
        let memo = ReadMemo::<u8, u32>::default();
        let reads = Cell::new(0);
        let read = |v: u32| {
            reads.set(reads.get() + 1);
            Ok::<_, ()>(v)
        };
        assert_eq!(memo.get_or_read(&1, || read(10)), Ok(10));
        assert_eq!(memo.get_or_read(&1, || read(99)), Ok(10));
        assert_eq!(memo.get_or_read(&2, || read(20)), Ok(20));
        assert_eq!(reads.get(), 2);
        assert_eq!(memo.get_or_read(&3, || Err::<u32, _>("down")), Err("down"));
        assert_eq!(memo.get_or_read(&3, || read(30)), Ok(30));
        assert_eq!(memo.len(), 3);
    }
}
