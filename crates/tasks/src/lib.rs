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
//! [`core_round_trip`] measures what a hand-off of data between two cores costs on this
//! machine; the benchmarks print it ([`RoundTrips`]), since on a shared host it changes from
//! second to second. [`process_cpu_time`] is the CPU time behind the benchmarks' `cpu_ratio`.

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
    /// Worker `i` runs only on the `(first + i)`-th core the calling thread may run on (left
    /// off as for [`Pinning::Cores`]): pools that should not share cores, such as the
    /// one-thread tries a benchmark runs side by side.
    From(usize),
}

/// A rayon pool whose threads have ended when it is dropped.
///
/// A dropped rayon pool lets its threads end on their own, later. A thread that ends runs its
/// thread-local destructors, and some libraries' (RocksDB's, through reth's database) lock
/// process-wide state there: a worker still ending while the process exits, after that state
/// was destroyed, aborts the process. Dropping this joins the workers first.
#[derive(Debug)]
pub struct WorkerPool {
    pool: Option<ThreadPool>,
    threads: std::sync::Arc<std::sync::Mutex<Vec<std::thread::JoinHandle<()>>>>,
}

impl std::ops::Deref for WorkerPool {
    type Target = ThreadPool;

    fn deref(&self) -> &ThreadPool {
        self.pool.as_ref().expect("the pool lives until dropped")
    }
}

impl Drop for WorkerPool {
    fn drop(&mut self) {
        // A worker dropping its own pool cannot wait for itself to end.
        let inside = self
            .pool
            .as_ref()
            .is_some_and(|pool| pool.current_thread_index().is_some());
        drop(self.pool.take());
        if inside {
            return;
        }
        let threads = std::mem::take(&mut *self.threads.lock().unwrap_or_else(|e| e.into_inner()));
        for thread in threads {
            let _ = thread.join();
        }
    }
}

/// Starts a pool of `threads` workers (at least one) named `{name}-{i}`.
///
/// Pinning is best effort: a worker that cannot be bound (an unsupported platform, a
/// sandbox that forbids it) runs unbound, and the pool works the same.
pub fn worker_pool(
    name: &str,
    threads: usize,
    pinning: Pinning,
) -> Result<WorkerPool, ThreadPoolBuildError> {
    let threads = threads.max(1);
    let cores = match pinning {
        Pinning::Off => None,
        Pinning::Cores => pin_cores(0, threads),
        Pinning::From(first) => pin_cores(first, threads),
    };
    let name = name.to_string();
    let handles = std::sync::Arc::new(std::sync::Mutex::new(Vec::with_capacity(threads)));
    let spawned = handles.clone();
    let pool = ThreadPoolBuilder::new()
        .num_threads(threads)
        .thread_name(move |i| format!("{name}-{i}"))
        .start_handler(move |i| {
            if let Some(core) = cores.as_ref().and_then(|cores| cores.get(i))
                && !core_affinity::set_for_current(*core)
            {
                tracing::debug!(worker = i, core = core.id, "could not pin worker");
            }
        })
        .spawn_handler(move |thread| {
            let mut builder = std::thread::Builder::new();
            if let Some(name) = thread.name() {
                builder = builder.name(name.to_string());
            }
            if let Some(size) = thread.stack_size() {
                builder = builder.stack_size(size);
            }
            let handle = builder.spawn(|| thread.run())?;
            spawned
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(handle);
            Ok(())
        })
        .build()?;
    Ok(WorkerPool {
        pool: Some(pool),
        threads: handles,
    })
}

/// The cores `threads` pinned workers take, in order from the `first`-th allowed core, or
/// `None` when they cannot each have their own.
fn pin_cores(first: usize, threads: usize) -> Option<Vec<core_affinity::CoreId>> {
    let cores = core_affinity::get_core_ids()?;
    (first + threads <= cores.len()).then(|| cores.into_iter().skip(first).take(threads).collect())
}

/// Gives up a [`core_round_trip`] measurement that takes longer than this (a thread
/// descheduled for long, or two threads that ended up on one core after all).
const ROUND_TRIP_DEADLINE: Duration = Duration::from_secs(1);

/// Round trips per [`RoundTrips::measure`]: a few milliseconds.
pub const ROUND_TRIPS: u32 = 20_000;

/// The mean time a cache line takes to go from one core to another and back: two threads,
/// pinned to the first two cores the caller may run on, pass a counter back and forth
/// `round_trips` times (after one untimed round trip that lets both leave their start-up).
/// `None` when `round_trips` is zero, there are not two such cores, a thread cannot be
/// started or pinned, or the measurement takes more than a second.
///
/// Every transaction the parallel executor hands from a worker to the committer, and every
/// subtree result the trie's workers join, moves a few cache lines between cores, so this is
/// the unit cost of their coordination. On a virtual machine it depends on where the host
/// places the virtual cores: on this project's two-core machine it moved between ≈ 60 ns and
/// ≈ 415 ns from one second to the next (`BENCHMARKS.md`, thirteenth round). On a machine
/// with more cores, the executor's threads (unpinned, and the caller's own) may run on
/// another pair than the one measured here, and the first two cores may be hyper-thread
/// siblings. The caller's own affinity is left as it was: the two threads are new ones.
pub fn core_round_trip(round_trips: u32) -> Option<Duration> {
    if round_trips == 0 {
        return None;
    }
    let cores = core_affinity::get_core_ids()?;
    let [first, second, ..] = cores[..] else {
        return None;
    };
    // Round trip `i` (0 untimed) is the ping storing 2i + 1 and the pong 2i + 2; `abort` ends
    // both loops.
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
    let pong = || {
        let ok = core_affinity::set_for_current(second);
        pinned.wait();
        if !ok {
            abort.store(true, Ordering::Relaxed);
            return;
        }
        for i in 0..=u64::from(round_trips) {
            if !wait_for(2 * i + 1) {
                return;
            }
            counter.store(2 * i + 2, Ordering::Release);
        }
    };
    let ping = || {
        let ok = core_affinity::set_for_current(first);
        pinned.wait();
        if !ok {
            abort.store(true, Ordering::Relaxed);
            return None;
        }
        let mut start = Instant::now();
        for i in 0..=u64::from(round_trips) {
            counter.store(2 * i + 1, Ordering::Release);
            if !wait_for(2 * i + 2) {
                return None;
            }
            if i == 0 {
                start = Instant::now();
            }
        }
        let elapsed = start.elapsed();
        (Instant::now() <= deadline).then(|| elapsed / round_trips)
    };
    let thread = |name: &str| std::thread::Builder::new().name(name.to_string());
    std::thread::scope(|scope| {
        let Ok(pong) = thread("round-trip-pong").spawn_scoped(scope, pong) else {
            return None;
        };
        let measured = match thread("round-trip-ping").spawn_scoped(scope, ping) {
            // `Some` only when every round trip completed in time.
            Ok(ping) => ping.join().ok().flatten(),
            Err(_) => {
                // The pong thread waits at the barrier for a ping thread that never came.
                abort.store(true, Ordering::Relaxed);
                pinned.wait();
                None
            }
        };
        // Stops the pong thread if the ping thread gave up.
        abort.store(true, Ordering::Relaxed);
        let _ = pong.join();
        measured
    })
}

/// The CPU time this process has used so far, user and system, all threads together.
///
/// The benchmarks report `cpu_ratio` (parallel CPU time over sequential) from it: a parallel
/// run that is faster only because it burns both cores shows there.
pub fn process_cpu_time() -> Duration {
    // SAFETY: getrusage only writes into the zeroed struct passed to it.
    let usage = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut usage);
        usage
    };
    let tv = |t: libc::timeval| {
        Duration::new(
            u64::try_from(t.tv_sec).unwrap_or(0),
            u32::try_from(t.tv_usec).unwrap_or(0) * 1000,
        )
    };
    tv(usage.ru_utime) + tv(usage.ru_stime)
}

/// The core-to-core round trips measured over a benchmark run (one per block), for its
/// report: the state of the machine its parallel figures were taken in.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RoundTrips {
    /// The measured ones, in nanoseconds.
    ns: Vec<u64>,
    /// Attempts that gave no measurement.
    missed: usize,
}

impl RoundTrips {
    /// Measures one ([`core_round_trip`] of [`ROUND_TRIPS`]) and keeps it.
    pub fn measure(&mut self) -> Option<Duration> {
        let measured = core_round_trip(ROUND_TRIPS);
        match measured {
            Some(t) => self
                .ns
                .push(u64::try_from(t.as_nanos()).unwrap_or(u64::MAX)),
            None => self.missed += 1,
        }
        measured
    }

    /// How many were measured.
    pub fn len(&self) -> usize {
        self.ns.len()
    }

    /// Whether none was measured.
    pub fn is_empty(&self) -> bool {
        self.ns.is_empty()
    }

    /// The report line, "core-to-core round trip before each block: min A ns, median B ns,
    /// max C ns (N of M)", or `None` when none was measured.
    pub fn summary(&self) -> Option<String> {
        let mut ns = self.ns.clone();
        ns.sort_unstable();
        let (min, max) = (ns.first()?, ns.last()?);
        // The lower middle one: a measured value, as min and max are.
        let median = ns[(ns.len() - 1) / 2];
        Some(format!(
            "core-to-core round trip before each block: min {min} ns, median {median} ns, max \
             {max} ns ({} of {})",
            ns.len(),
            ns.len() + self.missed
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every worker has ended, its thread-local destructors run, once the pool is dropped.
    #[test]
    fn dropping_a_pool_ends_its_workers() {
        static ENDED: AtomicU64 = AtomicU64::new(0);
        struct CountsItsEnd;
        impl Drop for CountsItsEnd {
            fn drop(&mut self) {
                ENDED.fetch_add(1, Ordering::SeqCst);
            }
        }
        thread_local!(static MARK: std::cell::RefCell<Option<CountsItsEnd>> = const { std::cell::RefCell::new(None) });
        let pool = worker_pool("ending", 3, Pinning::Off).unwrap();
        pool.broadcast(|_| MARK.with(|m| *m.borrow_mut() = Some(CountsItsEnd)));
        drop(pool);
        assert_eq!(ENDED.load(Ordering::SeqCst), 3);
    }

    #[test]
    fn process_cpu_time_counts_work() {
        // Spin until the clock shows 20 ms of CPU. A clock that does not move (a wrong field)
        // or runs 1,000 times too slow leaves the loop only at the wall-clock bound and fails
        // the first check; one 1,000 times too fast fails the second. Other tests' threads may
        // add to the process's time, never take from it.
        let started = Instant::now();
        let before = process_cpu_time();
        let mut x = 0u64;
        let mut used = Duration::ZERO;
        while used < Duration::from_millis(20) && started.elapsed() < Duration::from_secs(10) {
            for _ in 0..10_000 {
                x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
            }
            used = process_cpu_time() - before;
        }
        assert!(used >= Duration::from_millis(20), "{used:?}");
        // No more than every core busy for the whole time.
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as u32;
        let elapsed = started.elapsed();
        assert!(
            used <= elapsed * cores + Duration::from_millis(5),
            "{used:?} of CPU in {elapsed:?}"
        );
    }

    #[test]
    fn core_round_trip_is_measured_on_two_cores() {
        let before = core_affinity::get_core_ids();
        let cores = before.as_ref().map_or(0, Vec::len);
        assert_eq!(core_round_trip(0), None);
        let measured = core_round_trip(10_000);
        // The caller's affinity is untouched.
        assert_eq!(core_affinity::get_core_ids(), before);
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
    fn round_trips_summarise_what_was_measured() {
        let mut trips = RoundTrips::default();
        assert_eq!(trips.summary(), None);
        trips.ns = vec![300, 100, 200, 400];
        trips.missed = 1;
        assert_eq!(
            trips.summary().as_deref(),
            Some(
                "core-to-core round trip before each block: min 100 ns, median 200 ns, max 400 \
                 ns (4 of 5)"
            )
        );
        let measured = trips.measure();
        assert_eq!(trips.len() + trips.missed, 6);
        assert_eq!(trips.len(), 4 + usize::from(measured.is_some()));
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
        let cores = pin_cores(0, threads).expect("as many workers as cores");
        let mut ids: Vec<usize> = cores.iter().map(|c| c.id).collect();
        ids.dedup();
        assert_eq!(ids.len(), threads);
        assert!(ids.iter().all(|id| allowed.iter().any(|a| a.id == *id)));
        assert!(pin_cores(0, allowed.len() + 1).is_none());
        assert!(pin_cores(allowed.len(), 1).is_none());
        // Each worker of a pinned pool may run on its own core only.
        let pool = worker_pool("pinned", threads, Pinning::Cores).unwrap();
        let masks = pool.broadcast(|_| core_affinity::get_core_ids().unwrap_or_default());
        for (i, mask) in masks.iter().enumerate() {
            let mask: Vec<usize> = mask.iter().map(|c| c.id).collect();
            assert_eq!(mask, vec![ids[i]], "worker {i}");
        }
        // A pool that starts at the last allowed core runs there.
        let last = allowed.len() - 1;
        let pool = worker_pool("last", 1, Pinning::From(last)).unwrap();
        let mask = pool.install(|| core_affinity::get_core_ids().unwrap_or_default());
        let mask: Vec<usize> = mask.iter().map(|c| c.id).collect();
        assert_eq!(mask, vec![allowed[last].id]);
        // A pool that cannot pin still starts.
        let pool = worker_pool("oversubscribed", allowed.len() + 1, Pinning::Cores).unwrap();
        assert_eq!(pool.current_num_threads(), allowed.len() + 1);
        let pool = worker_pool("past the end", 1, Pinning::From(allowed.len())).unwrap();
        assert_eq!(pool.current_num_threads(), 1);
    }
}
