//! Independent jobs of very different sizes on a few threads, heaviest first.
//!
//! Started per call rather than on a pool: the callers (a pipeline stage) run a handful of
//! batches, each long enough that starting threads costs nothing next to the work, and idle
//! pool workers would spin between them.

use std::sync::{
    Mutex,
    atomic::{AtomicBool, Ordering},
};

/// Runs every job of `jobs` (each with its weight) on up to `threads` threads, the calling
/// thread included, and returns the results in the order the jobs were given.
///
/// Jobs start heaviest first, so the longest one does not start last and hold the batch up
/// alone, and at most `threads` are in flight. Each thread builds its own state with `init`
/// (a read transaction, say) before its first job and reuses it for its next ones. The first
/// error stops every thread before its next job and is returned.
pub fn largest_first<J, S, R, E>(
    jobs: Vec<(u64, J)>,
    threads: usize,
    init: impl Fn() -> Result<S, E> + Sync,
    work: impl Fn(&mut S, J) -> Result<R, E> + Sync,
) -> Result<Vec<R>, E>
where
    J: Send,
    R: Send,
    E: Send,
{
    let count = jobs.len();
    let mut queue: Vec<(u64, usize, J)> = jobs
        .into_iter()
        .enumerate()
        .map(|(index, (weight, job))| (weight, index, job))
        .collect();
    // Popped from the back: lightest first in the vector, ties in the given order.
    queue.sort_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)));
    let queue = Mutex::new(queue);
    let results: Mutex<Vec<Option<R>>> = Mutex::new((0..count).map(|_| None).collect());
    let failure: Mutex<Option<E>> = Mutex::new(None);
    let stop = AtomicBool::new(false);

    let run = || {
        let mut state = None;
        while !stop.load(Ordering::Relaxed) {
            let Some((_, index, job)) = queue.lock().expect("queue lock").pop() else {
                break;
            };
            let outcome = match &mut state {
                Some(state) => work(state, job),
                None => init().and_then(|fresh| work(state.insert(fresh), job)),
            };
            match outcome {
                Ok(result) => results.lock().expect("results lock")[index] = Some(result),
                Err(error) => {
                    stop.store(true, Ordering::Relaxed);
                    failure.lock().expect("failure lock").get_or_insert(error);
                }
            }
        }
    };
    let helpers = threads.max(1).min(count).saturating_sub(1);
    std::thread::scope(|scope| {
        for _ in 0..helpers {
            scope.spawn(run);
        }
        run();
    });

    if let Some(error) = failure.into_inner().expect("failure lock") {
        return Err(error);
    }
    Ok(results
        .into_inner()
        .expect("results lock")
        .into_iter()
        .map(|result| result.expect("every job ran: none failed"))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::{
        sync::atomic::AtomicUsize,
        thread::{self, ThreadId},
        time::Duration,
    };

    #[test]
    fn results_come_back_in_the_given_order() {
        let jobs: Vec<(u64, u64)> = (0..100).map(|i| ((i * 37) % 11, i)).collect();
        let out = largest_first(jobs, 4, || Ok::<_, ()>(()), |_, job| Ok(job * 2)).unwrap();
        assert_eq!(out, (0..100).map(|i| i * 2).collect::<Vec<_>>());
    }

    #[test]
    fn one_thread_runs_heaviest_first() {
        let order = Mutex::new(Vec::new());
        let jobs = vec![(1, 'a'), (5, 'b'), (3, 'c'), (5, 'd'), (0, 'e')];
        largest_first(
            jobs,
            1,
            || Ok::<_, ()>(()),
            |_, job| {
                order.lock().unwrap().push(job);
                Ok(())
            },
        )
        .unwrap();
        assert_eq!(order.into_inner().unwrap(), vec!['b', 'd', 'c', 'a', 'e']);
    }

    #[test]
    fn at_most_threads_in_flight_each_with_one_state() {
        let inits = AtomicUsize::new(0);
        let running = AtomicUsize::new(0);
        let peak = AtomicUsize::new(0);
        let jobs: Vec<(u64, u64)> = (0..24).map(|i| (i, i)).collect();
        let states: Vec<(ThreadId, usize)> = largest_first(
            jobs,
            3,
            || Ok::<_, ()>(inits.fetch_add(1, Ordering::SeqCst)),
            |state, _| {
                let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                peak.fetch_max(now, Ordering::SeqCst);
                thread::sleep(Duration::from_millis(2));
                running.fetch_sub(1, Ordering::SeqCst);
                Ok((thread::current().id(), *state))
            },
        )
        .unwrap();
        assert!(peak.load(Ordering::SeqCst) <= 3);
        assert!(inits.load(Ordering::SeqCst) <= 3);
        // A thread keeps the state it built.
        for (thread, state) in &states {
            assert!(
                states
                    .iter()
                    .filter(|(t, _)| t == thread)
                    .all(|(_, s)| s == state)
            );
        }
    }

    #[test]
    fn the_first_error_stops_the_rest() {
        let ran = AtomicUsize::new(0);
        let jobs: Vec<(u64, u64)> = (0..1000).map(|i| (1000 - i, i)).collect();
        let out = largest_first(
            jobs,
            2,
            || Ok(()),
            |_, job| {
                ran.fetch_add(1, Ordering::SeqCst);
                if job == 3 { Err(job) } else { Ok(job) }
            },
        );
        assert_eq!(out, Err(3));
        assert!(ran.load(Ordering::SeqCst) < 100);
    }

    #[test]
    fn a_failed_init_is_the_error() {
        let out = largest_first(
            vec![(1, 1)],
            2,
            || Err::<(), _>("no tx"),
            |_, job: i32| Ok(job),
        );
        assert_eq!(out, Err("no tx"));
        let none: Vec<i32> = largest_first(
            Vec::<(u64, i32)>::new(),
            2,
            || Err("unused"),
            |_: &mut (), j| Ok(j),
        )
        .unwrap();
        assert!(none.is_empty());
    }
}
