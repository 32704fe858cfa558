//! The co-run reference of `bench trie`: what `threads` cores give for this work on this
//! machine, with nothing split, shared or handed between them.
//!
//! (d) splits one trie's work over `threads` cores, so its speed-up over (c) is bounded by
//! what those cores deliver running the trie's work side by side, which on a shared host is
//! less than `threads` and changes from minute to minute. This measures that bound in the same
//! run: `threads` one-thread tries, each with its own copy of the state
//! ([`MemNodeStore::detached`]) and its own pool pinned to its own core, apply a block one
//! after another and another block all at once. The summed one-after-another time over the
//! summed at-once time is `threads` when the cores do not slow each other down; (c)/(d) can
//! reach it only by losing nothing to the split.

use super::{TrieBenchConfig, World, shortfall};
use crate::BenchError;
use overdrive_tasks::{Pinning, worker_pool};
use overdrive_trie::{HashedStateChanges, StateTrie, TrieConfig};
use rand::{SeedableRng, rngs::SmallRng};
use std::{
    sync::Arc,
    time::{Duration, Instant},
};

/// Mixed into the benchmark's seed for the reference's own blocks, so that the measured
/// blocks' random choices are the same with or without it.
const SEED_MIX: u64 = 0xc0_7a11;

/// The reference's tries and the time summed so far.
pub(super) struct CoRun {
    tries: Vec<StateTrie>,
    rng: SmallRng,
    one_by_one: Duration,
    at_once: Duration,
    rounds: u64,
}

impl CoRun {
    /// `cfg.threads` copies of `source`'s state, each trie on its own core.
    pub(super) fn new(source: &StateTrie, cfg: &TrieBenchConfig) -> Result<Self, BenchError> {
        let bytes_each = source.store().heap_bytes();
        let available_mib = crate::available_mib();
        if let Some((needed_mib, available_mib)) = shortfall(cfg.threads, bytes_each, available_mib)
        {
            return Err(BenchError::InvalidConfig(format!(
                "the co-run reference needs about {needed_mib} MiB for {} copies of the state \
                 and {available_mib} MiB are available: use fewer --threads or --accounts",
                cfg.threads
            )));
        }
        tracing::info!(
            copies = cfg.threads,
            mib_each = bytes_each >> 20,
            available_mib,
            "co-run reference: copying the state"
        );
        let config = TrieConfig {
            threads: 1,
            pin_workers: cfg.pin_workers,
            ..TrieConfig::default()
        };
        let tries = (0..cfg.threads)
            .map(|i| {
                let pinning = if cfg.pin_workers {
                    Pinning::From(i)
                } else {
                    Pinning::Off
                };
                let pool = worker_pool("overdrive-trie-co-run", 1, pinning)?;
                StateTrie::with_pool(source.store().detached(), config, Arc::new(pool))
            })
            .collect::<Result<Vec<_>, overdrive_trie::TrieError>>()?;
        tracing::info!(
            available_mib = crate::available_mib(),
            "co-run reference: state copied"
        );
        Ok(Self {
            tries,
            rng: SmallRng::seed_from_u64(cfg.seed ^ SEED_MIX),
            one_by_one: Duration::ZERO,
            at_once: Duration::ZERO,
            rounds: 0,
        })
    }

    /// One round: two fresh blocks of `world`, the first applied by each trie in turn and the
    /// second by all at once (the order alternates by round). Counted when `measured`.
    pub(super) fn round(
        &mut self,
        world: &mut World,
        transfers: usize,
        measured: bool,
    ) -> Result<(), BenchError> {
        let serial_block = world.block(transfers, &mut self.rng).diff;
        let concurrent_block = world.block(transfers, &mut self.rng).diff;
        let (one_by_one, at_once) = if self.rounds.is_multiple_of(2) {
            let serial = one_by_one(&mut self.tries, &serial_block)?;
            (serial, at_once(&mut self.tries, &concurrent_block)?)
        } else {
            let concurrent = at_once(&mut self.tries, &concurrent_block)?;
            (one_by_one(&mut self.tries, &serial_block)?, concurrent)
        };
        self.rounds += 1;
        // Every copy applied the same blocks from the same state.
        if self.tries.windows(2).any(|w| w[0].root() != w[1].root()) {
            return Err(BenchError::Invariant(
                "co-run reference: the copies' roots differ",
            ));
        }
        tracing::debug!(
            one_by_one_ms = one_by_one.as_secs_f64() * 1e3,
            at_once_ms = at_once.as_secs_f64() * 1e3,
            measured,
            "co-run reference"
        );
        if measured {
            self.one_by_one += one_by_one;
            self.at_once += at_once;
        }
        Ok(())
    }

    /// Summed one-after-another time over summed at-once time (NaN before a measured round).
    pub(super) fn speedup(&self) -> f64 {
        self.one_by_one.as_secs_f64() / self.at_once.as_secs_f64()
    }
}

/// Each trie applies `block`, one after another.
fn one_by_one(tries: &mut [StateTrie], block: &HashedStateChanges) -> Result<Duration, BenchError> {
    let start = Instant::now();
    for trie in tries {
        trie.apply(block)?;
    }
    Ok(start.elapsed())
}

/// Each trie applies `block`, all at once, each from its own thread.
fn at_once(tries: &mut [StateTrie], block: &HashedStateChanges) -> Result<Duration, BenchError> {
    let start = Instant::now();
    std::thread::scope(|scope| {
        // The calling thread takes the first trie: one spawn fewer in the timed span.
        let Some((first, rest)) = tries.split_first_mut() else {
            return Ok(());
        };
        let others: Vec<_> = rest
            .iter_mut()
            .map(|trie| scope.spawn(|| trie.apply(block)))
            .collect();
        first.apply(block)?;
        for other in others {
            other
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic))?;
        }
        Ok::<_, BenchError>(())
    })?;
    Ok(start.elapsed())
}

#[cfg(test)]
mod tests {
    use super::*;
    use overdrive_trie::TrieId;

    #[test]
    fn copies_apply_the_same_blocks_apart_from_their_source() {
        let mut rng = SmallRng::seed_from_u64(5);
        let mut world = World::new(2_000, &mut rng);
        let mut source = StateTrie::new(
            overdrive_trie::MemNodeStore::new(),
            TrieConfig::with_threads(1),
        )
        .unwrap();
        for chunk in world.genesis(usize::MAX) {
            source.apply(&chunk).unwrap();
        }
        let before = source.root();
        let nodes_before = source.store().nodes(TrieId::Account);
        let cfg = TrieBenchConfig {
            threads: 2,
            co_run_reference: true,
            ..TrieBenchConfig::default()
        };
        let mut co_run = CoRun::new(&source, &cfg).unwrap();
        assert_eq!(co_run.tries.len(), 2);
        assert!(co_run.speedup().is_nan(), "nothing measured yet");
        for measured in [false, true, true] {
            co_run.round(&mut world, 200, measured).unwrap();
        }
        assert_eq!(co_run.rounds, 3);
        let roots: Vec<_> = co_run.tries.iter().map(StateTrie::root).collect();
        assert_eq!(roots[0], roots[1]);
        assert_ne!(roots[0], before, "the copies applied their blocks");
        assert_eq!(source.root(), before);
        assert_eq!(
            source.store().nodes(TrieId::Account),
            nodes_before,
            "the source's nodes are untouched"
        );
        let speedup = co_run.speedup();
        assert!(speedup.is_finite() && speedup > 0.0, "{speedup}");
    }
}
