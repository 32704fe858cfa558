//! Evicting the trie from every core's caches before a timed phase of `bench trie`.
//!
//! Which of a block's nodes a timed phase finds in cache depends on what ran before it, and on
//! which core last wrote them: a line another core holds modified is fetched from that core,
//! which can cost more than memory. (c) and (d) taking turns on one store
//! ([`super::TrieBenchConfig::one_store`]) changes both for (c), which would then read what
//! (d)'s two cores last wrote. Writing a buffer larger than the last-level cache on every core
//! before each timed phase starts (c) and (d) alike: nothing of the trie cached, everything
//! in memory.

use crate::error::TrieError;
use overdrive_tasks::{Pinning, worker_pool};
use rayon::ThreadPool;
use std::cell::RefCell;

/// Bytes each core writes when the last-level cache's size is unknown.
const DEFAULT_BYTES: usize = 64 << 20;

/// The most bytes each core writes.
const MAX_BYTES: usize = 512 << 20;

/// A cache line, or more: every line of the buffer is written once.
const LINE: usize = 64;

thread_local! {
    /// Each eviction thread's own buffer, kept between evictions so that only the first one
    /// pays for page faults.
    static BUFFER: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// A thread on every core, each writing its own buffer on [`Evictor::evict`].
pub(super) struct Evictor {
    pool: ThreadPool,
    bytes: usize,
}

impl Evictor {
    /// One thread per core this process may run on, pinned there when `pin`, each writing
    /// twice the last-level cache's size.
    pub(super) fn new(pin: bool) -> Result<Self, TrieError> {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let pinning = if pin { Pinning::Cores } else { Pinning::Off };
        let pool = worker_pool("overdrive-evict", cores, pinning)
            .map_err(|e| TrieError::InvalidConfig(format!("cache eviction threads: {e}")))?;
        let bytes = last_level_cache_bytes()
            .map_or(DEFAULT_BYTES, |size| 2 * size)
            .clamp(LINE, MAX_BYTES);
        Ok(Self { pool, bytes })
    }

    /// Bytes each core writes per eviction.
    pub(super) fn bytes(&self) -> usize {
        self.bytes
    }

    /// Writes every core's buffer once, returning when all are done.
    pub(super) fn evict(&self) {
        let bytes = self.bytes;
        self.pool.broadcast(|_| {
            BUFFER.with_borrow_mut(|buffer| {
                if buffer.len() < bytes {
                    buffer.resize(bytes, 0);
                }
                for line in buffer.chunks_mut(LINE) {
                    line[0] = line[0].wrapping_add(1);
                }
                std::hint::black_box(&buffer);
            });
        });
    }
}

/// The size of the largest cache of the first core, from Linux's sysfs (`None` elsewhere).
fn last_level_cache_bytes() -> Option<usize> {
    let dir = std::fs::read_dir("/sys/devices/system/cpu/cpu0/cache").ok()?;
    dir.filter_map(|entry| {
        let size = std::fs::read_to_string(entry.ok()?.path().join("size")).ok()?;
        parse_size(size.trim())
    })
    .max()
}

/// A sysfs cache size: `32768K`, `1M` or plain bytes.
fn parse_size(size: &str) -> Option<usize> {
    let (digits, unit) = match size.char_indices().find(|(_, c)| !c.is_ascii_digit()) {
        Some((i, _)) => size.split_at(i),
        None => (size, ""),
    };
    let n: usize = digits.parse().ok()?;
    let shift = match unit {
        "" => 0,
        "K" => 10,
        "M" => 20,
        "G" => 30,
        _ => return None,
    };
    n.checked_mul(1 << shift)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("32768K"), Some(32 << 20));
        assert_eq!(parse_size("1M"), Some(1 << 20));
        assert_eq!(parse_size("512"), Some(512));
        assert_eq!(parse_size("1T"), None);
        assert_eq!(parse_size("K"), None);
        assert_eq!(parse_size(""), None);
    }

    #[test]
    fn eviction_writes_every_core_buffer() {
        let evictor = Evictor::new(false).unwrap();
        assert!((LINE..=MAX_BYTES).contains(&evictor.bytes()));
        evictor.evict();
        evictor.evict();
        // Each thread's buffer was written twice: its first byte counts the evictions.
        let counts = evictor
            .pool
            .broadcast(|_| BUFFER.with_borrow(|b| (b.len(), b.first().copied())));
        for (len, first) in counts {
            assert_eq!((len, first), (evictor.bytes(), Some(2)));
        }
    }
}
