//! Receipt blooms with the hashes of repeated inputs cached.
//!
//! A receipt's bloom hashes every log's emitter address and every topic: four keccaks for an ERC20
//! `Transfer`, a sizeable share of a speculative execution's time. The emitter and the first topic
//! (the event signature) repeat across a block (one token, one event), the other topics (indexed
//! senders, recipients, amounts) rarely do, so only the first two are cached.

use alloy_primitives::{Address, B256, Bloom, BloomInput, Log, keccak256, map::HashMap};

/// Entries kept per map before it is cleared: a block has few distinct emitters and events,
/// and a bound keeps a block with many of them from growing the cache without limit.
const MAX_ENTRIES: usize = 4096;

/// A thread's cache of emitter and event-signature hashes.
#[derive(Debug, Default)]
pub(crate) struct BloomCache {
    emitters: HashMap<Address, B256>,
    signatures: HashMap<B256, B256>,
}

impl BloomCache {
    /// The bloom of `logs`, equal to `logs.iter().collect::<Bloom>()`.
    pub(crate) fn bloom(&mut self, logs: &[Log]) -> Bloom {
        let mut bloom = Bloom::ZERO;
        for log in logs {
            bloom.accrue(BloomInput::Hash(cached(&mut self.emitters, log.address)));
            let mut topics = log.topics().iter();
            if let Some(signature) = topics.next() {
                bloom.accrue(BloomInput::Hash(cached(&mut self.signatures, *signature)));
            }
            for topic in topics {
                bloom.accrue(BloomInput::Raw(topic.as_slice()));
            }
        }
        bloom
    }
}

fn cached<K: AsRef<[u8]> + Eq + std::hash::Hash + Copy>(
    map: &mut HashMap<K, B256>,
    key: K,
) -> B256 {
    if let Some(hash) = map.get(&key) {
        return *hash;
    }
    if map.len() >= MAX_ENTRIES {
        map.clear();
    }
    let hash = keccak256(key.as_ref());
    map.insert(key, hash);
    hash
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloy_primitives::{Bytes, LogData};
    use rand::{Rng, SeedableRng, rngs::StdRng};

    #[test]
    fn equals_the_uncached_bloom() {
        let mut rng = StdRng::seed_from_u64(7);
        let mut cache = BloomCache::default();
        // Few emitters and signatures (cache hits), random other topics, 0–4 topics per log,
        // and enough distinct ones to clear the cache on the way.
        for round in 0..3_000 {
            let logs: Vec<Log> = (0..rng.random_range(0..4))
                .map(|_| {
                    let pick = |rng: &mut StdRng, spread: u64| {
                        B256::from(alloy_primitives::U256::from(rng.random_range(0..spread)))
                    };
                    let spread = if round % 2 == 0 { 3 } else { 10_000 };
                    let address = Address::from_word(pick(&mut rng, spread));
                    let topics = (0..rng.random_range(0..=4))
                        .map(|i| {
                            if i == 0 {
                                pick(&mut rng, spread)
                            } else {
                                B256::from(rng.random::<[u8; 32]>())
                            }
                        })
                        .collect();
                    Log {
                        address,
                        data: LogData::new_unchecked(topics, Bytes::new()),
                    }
                })
                .collect();
            assert_eq!(cache.bloom(&logs), logs.iter().collect::<Bloom>());
        }
    }
}
