//! The ethereum/tests runner must be able to fail: tampered fixtures fail, malformed files fail
//! without crashing the run, and the untampered fixture passes.

use overdrive_ef_tests::{Outcome, RunOptions, run_file};
use overdrive_tests::fixtures_dir;
use serde_json::Value;
use std::path::{Path, PathBuf};

fn fixture(rel: &str) -> PathBuf {
    fixtures_dir().join("BlockchainTests").join(rel)
}

/// Writes `value` to a temp file and runs it.
fn run_value(name: &str, value: &Value) -> Vec<Outcome> {
    let dir = std::env::temp_dir().join(format!("overdrive-ef-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(format!("{name}.json"));
    std::fs::write(&path, serde_json::to_vec(value).unwrap()).unwrap();
    let out = run(&path);
    std::fs::remove_dir_all(&dir).ok();
    out
}

fn run(path: &Path) -> Vec<Outcome> {
    run_file(path, RunOptions::default())
        .into_iter()
        .map(|r| r.outcome)
        .collect()
}

fn load(rel: &str) -> Value {
    serde_json::from_slice(&std::fs::read(fixture(rel)).unwrap()).unwrap()
}

const VALID: &str = "ValidBlocks/bcStateTests/simpleSuicide.json";
const INVALID: &str = "InvalidBlocks/bcInvalidHeaderTest/wrongStateRoot.json";

#[test]
fn untampered_fixtures_pass() {
    for rel in [VALID, INVALID] {
        let outcomes = run(&fixture(rel));
        assert!(!outcomes.is_empty());
        assert!(
            outcomes.iter().all(|o| *o == Outcome::Passed),
            "{rel}: {outcomes:?}"
        );
    }
}

#[test]
fn tampered_post_state_fails() {
    let mut value = load(VALID);
    for test in value.as_object_mut().unwrap().values_mut() {
        let post = test["postState"].as_object_mut().unwrap();
        let account = post.values_mut().next().unwrap();
        account["balance"] = Value::String("0x1234567".into());
    }
    let outcomes = run_value("tampered-post", &value);
    assert!(
        outcomes
            .iter()
            .all(|o| matches!(o, Outcome::Failed(why) if why.contains("post-state"))),
        "{outcomes:?}"
    );
}

#[test]
fn tampered_last_block_hash_fails() {
    let mut value = load(VALID);
    for test in value.as_object_mut().unwrap().values_mut() {
        test["lastblockhash"] = Value::String(format!("0x{}", "11".repeat(32)));
    }
    let outcomes = run_value("tampered-head", &value);
    assert!(
        outcomes
            .iter()
            .all(|o| matches!(o, Outcome::Failed(why) if why.contains("head"))),
        "{outcomes:?}"
    );
}

#[test]
fn invalid_block_without_expect_exception_fails() {
    let mut value = load(INVALID);
    for test in value.as_object_mut().unwrap().values_mut() {
        for block in test["blocks"].as_array_mut().unwrap() {
            block.as_object_mut().unwrap().remove("expectException");
        }
    }
    let outcomes = run_value("no-expect", &value);
    assert!(
        outcomes
            .iter()
            .all(|o| matches!(o, Outcome::Failed(why) if why.contains("state root"))),
        "{outcomes:?}"
    );
}

#[test]
fn valid_block_with_expect_exception_fails() {
    let mut value = load(VALID);
    for test in value.as_object_mut().unwrap().values_mut() {
        for block in test["blocks"].as_array_mut().unwrap() {
            block["expectException"] = Value::String("invented".into());
        }
    }
    let outcomes = run_value("expect-on-valid", &value);
    assert!(
        outcomes
            .iter()
            .all(|o| matches!(o, Outcome::Failed(why) if why.contains("must be rejected"))),
        "{outcomes:?}"
    );
}

#[test]
fn malformed_fixtures_fail_without_crashing() {
    let outcomes = run_value("not-json", &Value::String("not a fixture file".into()));
    assert!(
        matches!(&outcomes[..], [Outcome::Failed(_)]),
        "{outcomes:?}"
    );

    let mut value = load(VALID);
    for test in value.as_object_mut().unwrap().values_mut() {
        test["genesisRLP"] = Value::String("0xdeadbeef".into());
        test["blocks"][0]["rlp"] = Value::String("0xc0".into());
    }
    let outcomes = run_value("bad-rlp", &value);
    assert!(
        outcomes.iter().all(|o| matches!(o, Outcome::Failed(_))),
        "{outcomes:?}"
    );

    let mut value = load(VALID);
    for test in value.as_object_mut().unwrap().values_mut() {
        test.as_object_mut().unwrap().remove("pre");
    }
    let outcomes = run_value("no-pre", &value);
    assert!(
        outcomes
            .iter()
            .all(|o| matches!(o, Outcome::Failed(why) if why.contains("malformed"))),
        "{outcomes:?}"
    );
}

/// `--executor parallel` must test the parallel executor's speculation, not its sequential
/// fallback or its committer running ahead: before the runner asked for `speculate_all`, the
/// whole fixture set committed no transaction from speculation.
#[test]
fn parallel_runs_speculate_every_transaction() {
    use overdrive_ef_tests::{ExecCounts, ExecutorChoice};
    // One transaction in one block; and 35 transactions of one sender over 17 blocks.
    for rel in [VALID, "ValidBlocks/bcEIP1559/tips.json"] {
        let parallel = RunOptions {
            executor: ExecutorChoice::Parallel { threads: 2 },
            ..RunOptions::default()
        };
        let results = run_file(&fixture(rel), parallel);
        assert!(!results.is_empty());
        for r in &results {
            assert_eq!(r.outcome, Outcome::Passed, "{rel} {}", r.name);
            let e = r.executed;
            assert!(e.parallel_blocks > 0, "{rel} {}: {e:?}", r.name);
            // Every transaction of a parallel block is speculated; a failed validation
            // re-executes one exactly, which timing may cause now and then, never always.
            assert!(e.speculated >= e.parallel_blocks, "{rel} {}: {e:?}", r.name);
            // Nothing sends these blocks to the sequential path (the runner turns the chain
            // fallback off), so the pool folds every one's transitions, as asked.
            assert_eq!(e.pool_folded, e.parallel_blocks, "{rel} {}: {e:?}", r.name);
        }
        for r in run_file(&fixture(rel), RunOptions::default()) {
            assert_eq!(
                r.executed,
                ExecCounts::default(),
                "sequential {rel} {}",
                r.name
            );
        }
    }
}
