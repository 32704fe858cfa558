//! overdrive-tasks: the worker pools the components run on.
//!
//! Each component that works in parallel (the executor, the state root) owns one persistent
//! rayon pool, started once and reused for every block. [`worker_pool`] builds it: named
//! threads, and optionally each worker pinned to its own core ([`Pinning::Cores`]).
//!
//! Why pin: a pool's caller blocks while the pool works, so each block starts by waking
//! sleeping workers, and a woken worker runs where the kernel places it. On a two-core
//! machine the kernel was measured queueing the second worker behind the first on one core
//! while the other core sat idle, for milliseconds (6–11 ms of run-queue wait in blocks that
//! take 5.5 ms when both cores work; `BENCHMARKS.md`, "Eighth round"). A worker allowed on one
//! core only is woken on that core.
//!
//! [`core_round_trip`] measures what every hand-off between two such workers costs on this
//! machine: the benchmarks print it, since on a shared host it changes from minute to minute.

use rayon::{ThreadPool, ThreadPoolBuildError, ThreadPoolBuilder};
use std::{
    sync::{
        Barrier,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

/// Whether a pool's workers are bound to cores.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Pinning {
    /// The kernel places the workers.
    #[default]
    Off,
    /// Worker `i` runs only on the `i`-th core the calling thread may run on. Left off when
    /// there are more workers than such cores, since two workers sharing a core would then
    /// wait on each other.
    Cores,
}

/// Starts a pool of `threads` workers (at least one) named `{name}-{i}`.
///
/// Pinning is best effort: a worker that cannot be bound (an unsupported platform, a
/// sandbox that forbids it) runs unbound, and the pool works the same.
pub fn worker_pool(
    name: &str,
    threads: usize,
    pinning: Pinning,
) -> Result<ThreadPool, ThreadPoolBuildError> {
    let threads = threads.max(1);
    let cores = match pinning {
        Pinning::Off => None,
        Pinning::Cores => pin_cores(threads),
    };
    let name = name.to_string();
    ThreadPoolBuilder::new()
        .num_threads(threads)
        .thread_name(move |i| format!("{name}-{i}"))
        .start_handler(move |i| {
            if let Some(core) = cores.as_ref().and_then(|cores| cores.get(i))
                && !core_affinity::set_for_current(*core)
            {
                tracing::debug!(worker = i, core = core.id, "could not pin worker");
            }
        })
        .build()
}

/// The cores `threads` pinned workers take, in order, or `None` when they cannot each have
/// their own.
fn pin_cores(threads: usize) -> Option<Vec<core_affinity::CoreId>> {
    let cores = core_affinity::get_core_ids()?;
    (threads <= cores.len()).then(|| cores.into_iter().take(threads).collect())
}

/// Gives up a [`core_round_trip`] measurement that takes longer than this (a thread
/// descheduled for long, or two threads that ended up on one core after all).
const ROUND_TRIP_DEADLINE: Duration = Duration::from_secs(1);

/// The mean time a cache line takes to go from one core to another and back: two threads,
/// pinned to the first two cores the caller may run on, pass a counter back and forth
/// `round_trips` times. `None` when there are not two such cores, a thread cannot be pinned,
/// or the measurement exceeds a second.
///
/// Every transaction the parallel executor hands from a worker to the committer, and every
/// subtree result the trie's workers join, moves a few cache lines between cores, so this is
/// the unit cost of its coordination. On a virtual machine it depends on where the host
/// places the two virtual cores: on this project's machine it moved between ≈ 100 and ≈ 500 ns
/// from one second to the next (`BENCHMARKS.md`, thirteenth round). The caller's own affinity
/// is left as it was: the two threads are new ones.
pub fn core_round_trip(round_trips: u32) -> Option<Duration> {
    let cores = core_affinity::get_core_ids()?;
    let [first, second, ..] = cores[..] else {
        return None;
    };
    // Odd values are the ping, even ones the pong; `abort` ends both loops.
    let counter = AtomicU64::new(0);
    let abort = AtomicBool::new(false);
    let pinned = Barrier::new(2);
    let deadline = Instant::now() + ROUND_TRIP_DEADLINE;
    // Waits until the counter reaches `value`; false on abort or past the deadline (checked
    // every 1024 spins: reading the clock is slower than a round trip).
    let wait_for = |value: u64| {
        let mut spins = 0u32;
        while counter.load(Ordering::Acquire) != value {
            spins = spins.wrapping_add(1);
            if spins.is_multiple_of(1024)
                && (abort.load(Ordering::Relaxed) || Instant::now() > deadline)
            {
                abort.store(true, Ordering::Relaxed);
                return false;
            }
            std::hint::spin_loop();
        }
        true
    };
    std::thread::scope(|scope| {
        let pong = scope.spawn(|| {
            let ok = core_affinity::set_for_current(second);
            pinned.wait();
            if !ok {
                abort.store(true, Ordering::Relaxed);
                return;
            }
            for i in 0..u64::from(round_trips) {
                if !wait_for(2 * i + 1) {
                    return;
                }
                counter.store(2 * i + 2, Ordering::Release);
            }
        });
        let ping = scope.spawn(|| {
            let ok = core_affinity::set_for_current(first);
            pinned.wait();
            if !ok {
                abort.store(true, Ordering::Relaxed);
                return None;
            }
            let start = Instant::now();
            for i in 0..u64::from(round_trips) {
                counter.store(2 * i + 1, Ordering::Release);
                if !wait_for(2 * i + 2) {
                    return None;
                }
            }
            Some(start.elapsed() / round_trips.max(1))
        });
        // `Some` only when every round trip completed.
        let measured = ping.join().ok().flatten();
        // Stops the pong thread if the ping thread gave up.
        abort.store(true, Ordering::Relaxed);
        let _ = pong.join();
        measured
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn core_round_trip_is_measured_on_two_cores() {
        let cores = core_affinity::get_core_ids().map_or(0, |c| c.len());
        let measured = core_round_trip(10_000);
        if cores < 2 {
            assert_eq!(measured, None);
            return;
        }
        // A core-to-core round trip is tens to hundreds of nanoseconds; a measurement that
        // ran the two threads on one core would take milliseconds per round trip (or give up).
        let trip = measured.expect("two cores: measured");
        assert!(
            trip > Duration::ZERO && trip < Duration::from_micros(50),
            "{trip:?}"
        );
    }

    #[test]
    fn pools_run_work_with_and_without_pinning() {
        for pinning in [Pinning::Off, Pinning::Cores] {
            let pool = worker_pool("test-pool", 2, pinning).unwrap();
            assert_eq!(pool.current_num_threads(), 2);
            let sum: u64 = pool.install(|| {
                use rayon::prelude::*;
                (0..10_000u64).into_par_iter().sum()
            });
            assert_eq!(sum, 49_995_000);
            let name = pool.install(|| std::thread::current().name().map(str::to_string));
            assert!(name.is_some_and(|n| n.starts_with("test-pool-")));
        }
    }

    #[test]
    fn pinned_workers_each_get_their_own_allowed_core() {
        let Some(allowed) = core_affinity::get_core_ids() else {
            return; // No affinity support here: nothing to check.
        };
        let threads = allowed.len().min(2);
        let cores = pin_cores(threads).expect("as many workers as cores");
        let mut ids: Vec<usize> = cores.iter().map(|c| c.id).collect();
        ids.dedup();
        assert_eq!(ids.len(), threads);
        assert!(ids.iter().all(|id| allowed.iter().any(|a| a.id == *id)));
        assert!(pin_cores(allowed.len() + 1).is_none());
        // Each worker of a pinned pool may run on its own core only.
        let pool = worker_pool("pinned", threads, Pinning::Cores).unwrap();
        let masks = pool.broadcast(|_| core_affinity::get_core_ids().unwrap_or_default());
        for (i, mask) in masks.iter().enumerate() {
            let mask: Vec<usize> = mask.iter().map(|c| c.id).collect();
            assert_eq!(mask, vec![ids[i]], "worker {i}");
        }
        // A pool that cannot pin still starts.
        let pool = worker_pool("oversubscribed", allowed.len() + 1, Pinning::Cores).unwrap();
        assert_eq!(pool.current_num_threads(), allowed.len() + 1);
    }
}
