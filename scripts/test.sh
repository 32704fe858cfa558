#!/usr/bin/env bash
# The whole test suite: formatting, lints, doc links, unit/integration/differential tests, and the
# ethereum/tests fixtures. Tests build with optimised dependencies (see
# [profile.dev.package."*"] in Cargo.toml), because revm in debug runs 40-75x slower.
set -euo pipefail
cd "$(dirname "$0")/.."
FIXTURES="${OVERDRIVE_FIXTURES:-$(cd .. && pwd)/shared/fixtures/ethereum-tests}"
export OVERDRIVE_FIXTURES="$FIXTURES"

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
"$BIN" ef-tests "$FIXTURES/BlockchainTests" --executor sequential --state-root reference
"$BIN" ef-tests "$FIXTURES/BlockchainTests" --executor parallel --threads 2 --state-root overdrive --trie-threads 2
# overdrive inside reth: built and tested where a reth source tree can be had.
bash scripts/test-reth.sh
