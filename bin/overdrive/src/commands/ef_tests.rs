use super::count;
use clap::{Args, ValueEnum};
use eyre::bail;
use overdrive_ef_tests::{ExecutorChoice, Outcome, RunOptions, StateRootChoice, run_paths};
use std::{path::PathBuf, time::Instant};

#[derive(Debug, Clone, Copy, ValueEnum)]
enum ExecutorArg {
    /// alloy-evm's EthBlockExecutor (the reference).
    Sequential,
    /// overdrive's parallel executor, forced on every block with a transaction, speculating
    /// every transaction.
    Parallel,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum StateRootArg {
    /// overdrive's incremental parallel trie.
    Overdrive,
    /// Full alloy-trie HashBuilder build of the whole state.
    Reference,
}

#[derive(Debug, Args)]
pub struct EfTestsArgs {
    /// Fixture files or directories (searched recursively for .json).
    #[arg(required = true)]
    paths: Vec<PathBuf>,
    /// Executor that imports the blocks.
    #[arg(long, value_enum, default_value = "sequential")]
    executor: ExecutorArg,
    /// Trie that computes state roots.
    #[arg(long = "state-root", value_enum, default_value = "overdrive")]
    state_root: StateRootArg,
    /// Threads of the parallel executor.
    #[arg(long, default_value_t = 2, value_parser = super::positive)]
    threads: usize,
    /// Workers of overdrive's trie. With more than one, every subtree with two or more
    /// changes is split into parallel tasks, so that the fixtures' small tries take the
    /// parallel paths.
    #[arg(long = "trie-threads", default_value_t = 1, value_parser = super::positive)]
    trie_threads: usize,
    /// Print every passing test too.
    #[arg(long)]
    verbose: bool,
    /// Fail when more tests than this are skipped. Only the tests of the runner's known-skip
    /// list are ever skipped; this catches a list that grew to cover more than it should.
    #[arg(long = "max-skipped")]
    max_skipped: Option<usize>,
}

pub fn run(args: EfTestsArgs) -> eyre::Result<()> {
    let options = RunOptions {
        executor: match args.executor {
            ExecutorArg::Sequential => ExecutorChoice::Sequential,
            ExecutorArg::Parallel => ExecutorChoice::Parallel {
                threads: args.threads,
            },
        },
        state_root: match args.state_root {
            StateRootArg::Overdrive => StateRootChoice::Overdrive,
            StateRootArg::Reference => StateRootChoice::Reference,
        },
        trie_threads: args.trie_threads,
    };
    // A mistyped path is an error before anything runs, not a failed test.
    for path in &args.paths {
        if !path.exists() {
            bail!("no fixture file or directory at {}", path.display());
        }
    }
    let started = Instant::now();
    let summary = run_paths(&args.paths, options)?;
    for r in &summary.results {
        match &r.outcome {
            Outcome::Failed(why) => println!("FAIL {} :: {}: {why}", r.file.display(), r.name),
            Outcome::Skipped(_) => {}
            Outcome::Passed if args.verbose => {
                let e = r.executed;
                println!(
                    "ok   {} :: {} (parallel blocks {}, speculated {}, exact {})",
                    r.file.display(),
                    r.name,
                    e.parallel_blocks,
                    e.speculated,
                    e.exact
                )
            }
            Outcome::Passed => {}
        }
    }
    for (reason, tests) in summary.skipped_by_reason() {
        println!("skipped {}: {reason}", count(tests.len(), "test"));
        for r in tests {
            println!("  SKIP {} :: {}", r.file.display(), r.name);
        }
    }
    for (network, (p, f, s)) in summary.by_network() {
        println!("{network:>28}: {p} passed, {f} failed, {s} skipped");
    }
    if matches!(args.executor, ExecutorArg::Parallel) {
        let executed = summary.executed();
        println!(
            "parallel executor: {} on the parallel path, {} committed from speculation, {} \
             executed exactly by the committer (after a failed validation), state transitions \
             folded on the pool in {}",
            count(executed.parallel_blocks, "block"),
            count(executed.speculated, "transaction"),
            executed.exact,
            count(executed.pool_folded, "block"),
        );
    }
    let (passed, failed, skipped) = summary.counts();
    eprintln!(
        "ran {} in {:.1}s",
        count(summary.results.len(), "test"),
        started.elapsed().as_secs_f64()
    );
    println!("{passed} passed, {failed} failed, {skipped} skipped");
    if summary.results.is_empty() {
        bail!("no tests found under {:?}", args.paths);
    }
    if failed > 0 {
        std::process::exit(1);
    }
    if let Some(max) = args.max_skipped
        && skipped > max
    {
        bail!(
            "{} skipped, more than the {max} allowed (--max-skipped)",
            count(skipped, "test")
        );
    }
    // A parallel run whose blocks all fell back to sequential (a pool that failed to start)
    // would pass without testing the parallel executor.
    if matches!(args.executor, ExecutorArg::Parallel) && summary.executed().parallel_blocks == 0 {
        bail!(
            "no block took the parallel executor's parallel path (do the fixtures have transactions?)"
        );
    }
    Ok(())
}
