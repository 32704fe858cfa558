//! Runner for the Ethereum Foundation's `BlockchainTests` fixtures, in ethereum/tests' format and
//! execution-spec-tests' (which adds each test's chain id and blob schedule), from Paris to Osaka
//! and the blob-parameter-only forks.
//!
//! Each test imports its blocks one by one on top of the fixture's genesis (following side
//! chains by parent hash), validates every post-merge consensus rule, executes with the chosen
//! executor, computes the state root with the chosen trie, and compares the resulting head and
//! post-state with the fixture. A block marked `expectException` must be rejected and leave the
//! chain at its parent. Malformed fixtures and panics become failed tests, never a crashed run.

mod fixture;
mod runner;

pub use fixture::{Fixture, FixtureAccount, FixtureBlobParams, FixtureBlock, FixtureConfig};
pub use runner::{
    ExecCounts, ExecutorChoice, KNOWN_SKIPS, KnownSkip, Outcome, RunOptions, Runner,
    StateRootChoice, Summary, TestResult, collect_files, run_file, run_paths,
};
