//! Sequential vs parallel execution on generated blocks.
//!
//! `cargo run --release -p overdrive-executor --example exec_bench -- [kind] [accounts] [txs]
//! [threads] [repeat]` (defaults: erc20 100000 6000 2 7). Prints median wall time, speedup,
//! CPU ratio (process CPU time of parallel / sequential) and the committer's statistics.
//! `BENCH_ONLY=par` or `BENCH_ONLY=seq` times one executor only (for profiling).
//! `BENCH_FOLDING=pool` or `BENCH_FOLDING=committer` fixes which thread folds the state
//! transitions (`TransitionFolding`; default `auto`).
//! `BENCH_RESPECULATE=0` turns off `ParallelConfig::respeculate`.
//! `BENCH_TRACE=1` prints one line per parallel run, the warm-up's included: the core-to-core
//! round trip just before it, its wall time and the committer's time per validated
//! transaction, so that runs can be compared within one regime of the host (see
//! `overdrive_tasks::core_round_trip`). The measurement runs inside the timed closure, so with
//! it the summary's parallel wall and CPU times include it (about a millisecond); the per-run
//! lines do not.

use overdrive_executor::{
    BlockExecutor, ParallelConfig, ParallelExecutor, SequentialExecutor, TransitionFolding,
};
use overdrive_tasks::process_cpu_time;
use overdrive_workload::{WorkloadConfig, WorkloadKind, generate};
use std::time::{Duration, Instant};

// reth runs on jemalloc; glibc malloc's cross-thread frees (a worker allocates a state diff,
// the committer frees it) cost more than the executions themselves.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let kind: WorkloadKind = args
        .first()
        .map_or("erc20", |s| s)
        .parse()
        .expect("workload kind");
    let accounts: usize = args
        .get(1)
        .map_or(100_000, |s| s.parse().expect("accounts"));
    let txs: usize = args.get(2).map_or(6_000, |s| s.parse().expect("txs"));
    let threads: usize = args.get(3).map_or(2, |s| s.parse().expect("threads"));
    let repeat: usize = args.get(4).map_or(7, |s| s.parse().expect("repeat"));
    let config = WorkloadConfig {
        kind,
        accounts,
        txs_per_block: txs,
        blocks: 1,
        seed: 1,
        hot_share: 0.3,
        sender_skew: 0.0,
        pairs: 300,
    };
    let workload = generate(&config).expect("workload");
    let block = &workload.blocks[0];
    let spec = &workload.chain_spec;
    let state = &workload.genesis;
    let transition_folding = match std::env::var("BENCH_FOLDING").as_deref() {
        Ok("pool") => TransitionFolding::Pool,
        Ok("committer") => TransitionFolding::Committer,
        _ => TransitionFolding::Auto,
    };
    let parallel = ParallelExecutor::new(ParallelConfig {
        threads,
        transition_folding,
        respeculate: std::env::var("BENCH_RESPECULATE").map_or(true, |v| v != "0"),
        ..Default::default()
    });

    let run = |name: &str, f: &dyn Fn() -> overdrive_executor::BlockOutput| {
        let _ = f(); // warm-up
        let mut samples: Vec<(Duration, Duration)> = (0..repeat)
            .map(|_| {
                let (c, w) = (process_cpu_time(), Instant::now());
                let out = f();
                let sample = (w.elapsed(), process_cpu_time() - c);
                drop(out);
                sample
            })
            .collect();
        samples.sort();
        let (wall, cpu) = samples[samples.len() / 2];
        println!(
            "{name:>10}: {:8.2} ms  {:9.0} tx/s  cpu {:8.2} ms",
            wall.as_secs_f64() * 1e3,
            txs as f64 / wall.as_secs_f64(),
            cpu.as_secs_f64() * 1e3
        );
        (wall, cpu)
    };
    let seq_out = SequentialExecutor
        .execute(spec, block, state)
        .expect("sequential");
    let par_out = parallel.execute(spec, block, state).expect("parallel");
    assert!(
        seq_out == par_out,
        "parallel output differs from sequential"
    );
    println!("{kind} accounts {accounts} txs {txs} threads {threads} (equal: true)");
    // The end-of-block phase (post-execution changes, bundle merge) of every parallel run, and
    // the committer's commit phase (validations, commits, and the exact re-runs of results
    // that failed validation) per validated transaction: its critical path in cheap blocks.
    let finishes = std::cell::RefCell::new(Vec::new());
    let commits = std::cell::RefCell::new(Vec::new());
    // Every run starts from what the executor knew after the first (checked) run, not from
    // what the previous timed run of this same block taught it.
    let learned = parallel.learned();
    let trace = std::env::var("BENCH_TRACE").is_ok_and(|v| v == "1");
    let par = || {
        parallel.restore_learned(learned.clone());
        let round_trip = trace
            .then(|| overdrive_tasks::core_round_trip(2_000))
            .flatten();
        let wall = Instant::now();
        let out = parallel.execute(spec, block, state).expect("par");
        let wall = wall.elapsed();
        // Its data is freed on a pool thread after the return: counted here, not in the
        // next run (this includes the wait in the wall time too).
        parallel.wait_for_freeing();
        if let Some(s) = parallel.last_stats() {
            let commit_per_tx = s.commit_ns.checked_div(s.validated as u64);
            if trace {
                println!(
                    "run: round_trip_ns {} wall_ms {:.3} commit_per_tx_ns {} validated {} helped {}",
                    round_trip.map_or(0, |d| d.as_nanos()),
                    wall.as_secs_f64() * 1e3,
                    commit_per_tx.unwrap_or(0),
                    s.validated,
                    s.helped
                );
            }
            finishes.borrow_mut().push(s.finish_ns);
            commits.borrow_mut().extend(commit_per_tx);
        }
        out
    };
    // Median and minimum of nanosecond samples.
    let median_min = |samples: &std::cell::RefCell<Vec<u64>>| {
        let mut v = samples.borrow().clone();
        v.sort_unstable();
        Some((*v.get(v.len() / 2)?, *v.first()?))
    };
    let print_finish = || {
        if let Some((median, min)) = median_min(&finishes) {
            println!(
                "finish phase: median {:.2} ms, min {:.2} ms",
                median as f64 / 1e6,
                min as f64 / 1e6
            );
        }
        if let Some((median, min)) = median_min(&commits) {
            println!("commit phase per validated transaction: median {median} ns, min {min} ns");
        }
    };
    if std::env::var("BENCH_ONLY").is_ok_and(|v| v == "par") {
        run("parallel", &par);
        print_finish();
        return;
    }
    if std::env::var("BENCH_ONLY").is_ok_and(|v| v == "seq") {
        run("sequential", &|| {
            SequentialExecutor.execute(spec, block, state).expect("seq")
        });
        return;
    }
    let (sw, sc) = run("sequential", &|| {
        SequentialExecutor.execute(spec, block, state).expect("seq")
    });
    let (pw, pc) = run("parallel", &par);
    print_finish();
    println!(
        "speedup {:.2}x  cpu_ratio {:.2}  stats {:?}",
        sw.as_secs_f64() / pw.as_secs_f64(),
        pc.as_secs_f64() / sc.as_secs_f64(),
        parallel.last_stats()
    );
}
