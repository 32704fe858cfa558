//! overdrive-tasks: the worker pools the components run on, and [`largest_first`] for
//! batches of independent jobs of very different sizes.
//!
//! Each component that works in parallel (the executor, the state root) owns one persistent
//! rayon pool, started once and reused for every block. [`worker_pool`] builds it: named
//! threads, and optionally each worker pinned to its own core ([`Pinning::Cores`]).
//!
//! Why pinning exists: a pool's caller blocks while the pool works, so each block starts by
//! waking sleeping workers, and a woken worker runs where the kernel places it. On a machine
//! with few cores the kernel can queue a second worker behind the first on one core while
//! another core sits idle, for longer than the block takes. A worker allowed on one core only
//! is woken on that core. Inside a node, pinned workers would fight the node's own threads
//! for those cores, so the components leave it off unless asked.

mod jobs;

pub use jobs::largest_first;
use rayon::{ThreadPool, ThreadPoolBuildError, ThreadPoolBuilder};

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

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};

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
