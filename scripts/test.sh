#!/usr/bin/env bash
# The whole test suite: formatting, lints, doc links, unit/integration/differential tests, and the
# ethereum/tests and execution-spec-tests fixtures. Tests build with optimised dependencies (see
# [profile.dev.package."*"] in Cargo.toml), because revm in debug runs 40-75x slower.
set -euo pipefail
cd "$(dirname "$0")/.."
FIXTURES="${OVERDRIVE_FIXTURES:-$(cd .. && pwd)/shared/fixtures/ethereum-tests}"
export OVERDRIVE_FIXTURES="$FIXTURES"
EEST_FIXTURES="${OVERDRIVE_EEST_FIXTURES:-$(cd .. && pwd)/shared/fixtures/eest}"
export OVERDRIVE_EEST_FIXTURES="$EEST_FIXTURES"

bash scripts/setup.sh
cargo fmt --all --check
cargo clippy --workspace --all-targets --locked -- -D warnings
# Broken intra-doc links fail too: the docs are where a newcomer starts.
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --locked
cargo test --workspace --locked
# The fixtures twice: the references alone, then every overdrive component at once.
cargo build --locked -q -p overdrive
# Where cargo put it (CARGO_TARGET_DIR or the workspace's target/).
BIN="$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')/debug/overdrive"
# Both fixture sets, each with its exact number of known skips (EIP-7610, see KNOWN_SKIPS in
# crates/ef-tests): a skip list that grows fails here.
for set in "$FIXTURES/BlockchainTests 5" "$EEST_FIXTURES/blockchain_tests 30"; do
  read -r dir skips <<<"$set"
  "$BIN" ef-tests "$dir" --max-skipped "$skips" --executor sequential --state-root reference
  "$BIN" ef-tests "$dir" --max-skipped "$skips" --executor parallel --threads 2 --state-root overdrive --trie-threads 2
done
# overdrive inside reth: built and tested where a reth source tree can be had.
bash scripts/test-reth.sh
