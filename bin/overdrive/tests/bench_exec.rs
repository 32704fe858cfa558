//! `overdrive bench exec --json`: the report's fields as BENCHMARKS.md and the scripts read
//! them — `speedup` against reth's executor, `scaling` against the same executor on one
//! thread, and blocks the committer ran alone told apart from blocks that ran in parallel.

use std::process::Command;

fn bench_exec(args: &[&str]) -> serde_json::Value {
    let out = Command::new(env!("CARGO_BIN_EXE_overdrive"))
        .args([
            "bench",
            "exec",
            "--accounts",
            "500",
            "--txs",
            "300",
            "--blocks",
            "2",
        ])
        .args(["--repeat", "2", "--prefault-heap", "0", "--json"])
        .args(args)
        .output()
        .expect("run overdrive");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{args:?}: {}\n{stdout}",
        String::from_utf8_lossy(&out.stderr)
    );
    let last = stdout.lines().last().expect("a JSON line");
    serde_json::from_str(last).unwrap_or_else(|e| panic!("{e}: {last}"))
}

fn number(report: &serde_json::Value, field: &str) -> f64 {
    report[field]
        .as_f64()
        .unwrap_or_else(|| panic!("{field}: {report}"))
}

#[test]
fn speedup_and_scaling_are_reported_with_the_blocks_that_ran_in_parallel() {
    let report = bench_exec(&["--workload", "erc20", "--threads", "2"]);
    assert_eq!(report["equal"], true, "{report}");
    for field in ["speedup", "scaling", "cpu_ratio"] {
        let x = number(&report, field);
        assert!(x > 0.0 && x.is_finite(), "{field}: {report}");
        // Rounded for reading: at most three decimals.
        assert_eq!((x * 1e3).round() / 1e3, x, "{field}: {report}");
    }
    // Both blocks took the parallel path. Whether a pool thread's result was committed in a
    // block of 300 transfers depends on timing (on a busy machine the committer can run the
    // whole block before the worker gets ahead), so only the sum is fixed here; the executor's
    // own tests pin `multi_threaded` down.
    let counted = |field: &str| report[field].as_u64().unwrap_or_else(|| panic!("{field}"));
    assert_eq!(
        counted("parallel_blocks") + counted("committer_alone_blocks"),
        2,
        "{report}"
    );

    // One chain of transactions: the parallel path leaves it to the committer, and the
    // report says so instead of counting the blocks as parallel.
    let chained = bench_exec(&["--workload", "chained", "--threads", "2"]);
    assert_eq!(chained["equal"], true, "{chained}");
    assert_eq!(chained["parallel_blocks"], 0, "{chained}");
    assert_eq!(chained["committer_alone_blocks"], 2, "{chained}");

    // One thread: nothing to scale against.
    let one = bench_exec(&["--workload", "erc20", "--threads", "1"]);
    assert!(one.get("scaling").is_none(), "{one}");
    assert_eq!(one["parallel_blocks"], 0, "{one}");
}
