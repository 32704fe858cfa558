//! What the benchmarks report beside their timings: the CPU time a run used, and what a
//! hand-off of data between two cores costs on this machine at the time of the run.

use std::{
    sync::{
        Barrier,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

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
}
