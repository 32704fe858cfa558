//! The runner on execution-spec-tests fixtures (Prague, Osaka, the BPO forks): every test passes
//! but the known skips, which are chosen by test identity; a fixture naming a network, a field or
//! a fork the runner does not know fails instead of being skipped.

use overdrive_ef_tests::{KnownSkip, Outcome, RunOptions, run_file, run_paths};
use overdrive_tests::eest_dir;
use serde_json::Value;
use std::path::{Path, PathBuf};

fn fixture(rel: &str) -> PathBuf {
    eest_dir().join("blockchain_tests").join(rel)
}

fn load(rel: &str) -> Value {
    serde_json::from_slice(&std::fs::read(fixture(rel)).unwrap()).unwrap()
}

/// Runs `value` written as `file_name` in a fresh directory: (test name, outcome) pairs.
fn run_as(file_name: &str, value: &Value) -> Vec<(String, Outcome)> {
    let dir = std::env::temp_dir().join(format!(
        "overdrive-eest-{}-{}",
        std::process::id(),
        file_name.replace('.', "-")
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(file_name);
    std::fs::write(&path, serde_json::to_vec(value).unwrap()).unwrap();
    let out = run(&path);
    std::fs::remove_dir_all(&dir).ok();
    out
}

fn run(path: &Path) -> Vec<(String, Outcome)> {
    run_file(path, RunOptions::default())
        .into_iter()
        .map(|r| (r.name, r.outcome))
        .collect()
}

/// Applies `change` to every test of `value`.
fn each_test(mut value: Value, change: impl Fn(&mut Value)) -> Value {
    for test in value.as_object_mut().unwrap().values_mut() {
        change(test);
    }
    value
}

fn all_fail_with(outcomes: &[(String, Outcome)], what: &str) {
    assert!(!outcomes.is_empty());
    for (name, outcome) in outcomes {
        assert!(
            matches!(outcome, Outcome::Failed(why) if why.contains(what)),
            "{name}: {outcome:?}, expected a failure naming {what:?}"
        );
    }
}

const BPO: &str = "osaka/eip7918_blob_reserve_price/test_blob_base_fee_with_bpo_transition.json";
const COLLISION: &str = "paris/eip7610_create_collision/test_init_collision_create_tx.json";

#[test]
fn every_fixture_passes_but_the_known_skips() {
    let summary = run_paths(&[eest_dir()], RunOptions::default()).unwrap();
    let (passed, failed, skipped) = summary.counts();
    let failures: Vec<_> = summary
        .results
        .iter()
        .filter(|r| matches!(r.outcome, Outcome::Failed(_)))
        .take(5)
        .map(|r| format!("{} :: {}: {:?}", r.file.display(), r.name, r.outcome))
        .collect();
    assert_eq!(failed, 0, "{failures:#?}");
    assert!(passed > 2_900, "{passed} passed");
    // Only the EIP-7610 tests, each found by its identity.
    assert_eq!(skipped, 30);
    for (reason, tests) in summary.skipped_by_reason() {
        assert!(reason.starts_with("EIP-7610"), "{reason}");
        for r in tests {
            assert!(KnownSkip::find(&r.file, &r.name).is_some(), "{}", r.name);
        }
    }
    // Every fork and transition of the set ran.
    let networks = summary.by_network();
    for network in [
        "Prague",
        "Osaka",
        "CancunToPragueAtTime15k",
        "PragueToOsakaAtTime15k",
        "OsakaToBPO1AtTime15k",
        "BPO1ToBPO2AtTime15k",
        "BPO2ToBPO3AtTime15k",
        "BPO3ToBPO4AtTime15k",
    ] {
        let (passed, _, _) = networks.get(network).copied().unwrap_or_default();
        assert!(passed > 0, "no {network} test passed: {networks:?}");
    }
}

#[test]
fn the_fixture_blob_schedule_is_the_one_used() {
    let untouched = run_as("schedule.json", &load(BPO));
    assert!(
        untouched.iter().all(|(_, o)| *o == Outcome::Passed),
        "{untouched:?}"
    );
    // BPO1 with Osaka's parameters: the blocks after the transition carry the wrong excess
    // blob gas or blob fee.
    let changed = each_test(load(BPO), |test| {
        let schedule = &mut test["config"]["blobSchedule"];
        schedule["BPO1"] = schedule["Osaka"].clone();
    });
    let outcomes = run_as("schedule.json", &changed);
    assert!(
        outcomes
            .iter()
            .all(|(_, o)| matches!(o, Outcome::Failed(_))),
        "{outcomes:?}"
    );
}

#[test]
fn unknown_networks_fields_and_forks_fail() {
    let renamed = each_test(load(BPO), |test| {
        test["network"] = "OsakaToAmsterdamAtTime15k".into();
        test["config"]["network"] = "OsakaToAmsterdamAtTime15k".into();
    });
    all_fail_with(&run_as("network.json", &renamed), "unknown network");

    let mismatched = each_test(load(BPO), |test| test["config"]["network"] = "Osaka".into());
    all_fail_with(&run_as("config.json", &mismatched), "config.network");

    let extra = each_test(load(BPO), |test| test["newRule"] = 1.into());
    all_fail_with(&run_as("field.json", &extra), "unknown field `newRule`");

    let in_block = each_test(load(BPO), |test| test["blocks"][0]["newRule"] = 1.into());
    all_fail_with(
        &run_as("block-field.json", &in_block),
        "unknown field `newRule`",
    );

    let fork = each_test(load(BPO), |test| {
        test["config"]["blobSchedule"]["Amsterdam"] = test["config"]["blobSchedule"]["BPO1"].clone()
    });
    all_fail_with(&run_as("fork.json", &fork), "unknown fork \"Amsterdam\"");
}

#[test]
fn bad_fixtures_are_failed_tests_with_a_reason() {
    let truncated = each_test(load(BPO), |test| {
        let rlp = test["blocks"][0]["rlp"].as_str().unwrap().to_string();
        test["blocks"][0]["rlp"] = rlp[..rlp.len() / 2].into();
    });
    all_fail_with(&run_as("truncated.json", &truncated), "block 0 rejected");

    let wrong_type = each_test(load(BPO), |test| test["lastblockhash"] = 5.into());
    all_fail_with(&run_as("type.json", &wrong_type), "malformed fixture");

    let wrong_schedule = each_test(load(BPO), |test| {
        test["config"]["blobSchedule"]["BPO1"]["max"] = "fifteen".into()
    });
    all_fail_with(
        &run_as("schedule-type.json", &wrong_schedule),
        "malformed fixture",
    );
}

/// Skips go by test identity: the same tests under another name, or in another file, run and
/// fail (the skip hides a real difference, not a passing test); their neighbours in the file run
/// and pass.
#[test]
fn known_skips_match_by_test_identity() {
    let value = load(COLLISION);
    let name = Path::new(COLLISION).file_name().unwrap().to_str().unwrap();
    let outcomes = run_as(name, &value);
    let skipped: Vec<_> = outcomes
        .iter()
        .filter(|(_, o)| matches!(o, Outcome::Skipped(_)))
        .collect();
    assert_eq!(skipped.len(), 18, "{outcomes:?}");
    for (name, outcome) in &outcomes {
        match outcome {
            Outcome::Skipped(_) => assert!(name.contains("-non-empty-balance-"), "{name}"),
            other => assert_eq!(*other, Outcome::Passed, "{name}"),
        }
    }

    let elsewhere = run_as("collision-copy.json", &value);
    let renamed: serde_json::Map<String, Value> = value
        .as_object()
        .unwrap()
        .iter()
        .map(|(k, v)| {
            (
                k.replace("-non-empty-balance-", "-renamed-balance-"),
                v.clone(),
            )
        })
        .collect();
    let renamed = run_as(name, &Value::Object(renamed));
    for outcomes in [elsewhere, renamed] {
        assert!(
            outcomes
                .iter()
                .all(|(_, o)| !matches!(o, Outcome::Skipped(_)))
        );
        let failed = outcomes
            .iter()
            .filter(|(_, o)| matches!(o, Outcome::Failed(_)))
            .count();
        assert!(failed > 0, "{outcomes:?}");
    }
}
