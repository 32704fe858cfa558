//! Evicting the trie from every core's caches before a timed phase of `bench trie`.
//!
//! Which of a block's nodes a timed phase finds in cache depends on what ran before it, and on
//! which core last wrote them: a line another core holds modified is fetched from that core,
//! which can cost more than memory. When (c) and (d) take turns on one store
//! ([`super::TrieBenchConfig::one_store`]), each runs right after its trie's take-back of the
//! block, which touched exactly the block's paths. Writing buffers larger than the caches on
//! every core before each timed phase starts (c) and (d) alike: nothing of the trie cached,
//! everything in memory.

use crate::BenchError;
use overdrive_tasks::{Pinning, worker_pool};
use std::cell::RefCell;

/// Bytes each core writes when the caches' sizes are unknown.
const DEFAULT_BYTES: usize = 64 << 20;

/// The most bytes each core writes.
const MAX_BYTES: usize = 256 << 20;

/// A cache line, or more: every line of the buffer is written once.
const LINE: usize = 64;

thread_local! {
    /// Each eviction thread's own buffer, kept between evictions so that only the first one
    /// pays for page faults.
    static BUFFER: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// A thread on every core, each writing its own buffer on [`Evictor::evict`].
pub(super) struct Evictor {
    pool: overdrive_tasks::WorkerPool,
    bytes: usize,
}

impl Evictor {
    /// One thread per core this process may run on, pinned there when `pin`, each writing
    /// twice its share of every cache it sits behind (see [`bytes_per_core`]).
    pub(super) fn new(pin: bool) -> Result<Self, BenchError> {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let pinning = if pin { Pinning::Cores } else { Pinning::Off };
        let pool = worker_pool("overdrive-evict", cores, pinning)
            .map_err(|e| BenchError::InvalidConfig(format!("cache eviction threads: {e}")))?;
        let bytes = bytes_per_core(&caches()).clamp(LINE, MAX_BYTES);
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
        // rayon's idle workers spin a little before they sleep: not inside the timed phase
        // that follows, on the cores its workers run on.
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

/// One cache of the first core: its size and how many cores share it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Cache {
    bytes: usize,
    shared_by: usize,
}

/// What each core writes to evict every cache of the first core: twice each cache's share per
/// core, summed over the levels (a core writes through its private caches into the shared
/// one, so each level takes its own share). [`DEFAULT_BYTES`] when nothing is known.
fn bytes_per_core(caches: &[Cache]) -> usize {
    if caches.is_empty() {
        return DEFAULT_BYTES;
    }
    caches
        .iter()
        .map(|cache| 2 * cache.bytes / cache.shared_by.max(1))
        .sum()
}

/// The data and unified caches of the first core, from Linux's sysfs (none elsewhere).
fn caches() -> Vec<Cache> {
    let Ok(dir) = std::fs::read_dir("/sys/devices/system/cpu/cpu0/cache") else {
        return Vec::new();
    };
    dir.filter_map(|entry| {
        let path = entry.ok()?.path();
        let read = |name: &str| std::fs::read_to_string(path.join(name)).ok();
        if read("type")?.trim() == "Instruction" {
            return None;
        }
        Some(Cache {
            bytes: parse_size(read("size")?.trim())?,
            shared_by: count_cpus(read("shared_cpu_list")?.trim())?,
        })
    })
    .collect()
}

/// The number of CPUs in a sysfs CPU list such as `0-7,16-23`.
fn count_cpus(list: &str) -> Option<usize> {
    list.split(',').try_fold(0usize, |count, part| {
        let n = match part.split_once('-') {
            Some((first, last)) => {
                let (first, last): (usize, usize) = (first.parse().ok()?, last.parse().ok()?);
                last.checked_sub(first)? + 1
            }
            None => {
                part.parse::<usize>().ok()?;
                1
            }
        };
        count.checked_add(n)
    })
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
    fn cpu_lists_count() {
        assert_eq!(count_cpus("0-1"), Some(2));
        assert_eq!(count_cpus("0-7,16-23"), Some(16));
        assert_eq!(count_cpus("3"), Some(1));
        assert_eq!(count_cpus("7-3"), None);
        assert_eq!(count_cpus("a"), None);
    }

    #[test]
    fn each_core_writes_twice_its_share_of_each_cache() {
        // This VM: 1 MiB of L2 per core, 32 MiB of L3 shared by two cores.
        let vm = [
            Cache {
                bytes: 64 << 10,
                shared_by: 1,
            },
            Cache {
                bytes: 1 << 20,
                shared_by: 1,
            },
            Cache {
                bytes: 32 << 20,
                shared_by: 2,
            },
        ];
        assert_eq!(bytes_per_core(&vm), (128 << 10) + (2 << 20) + (32 << 20));
        assert_eq!(bytes_per_core(&[]), DEFAULT_BYTES);
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
