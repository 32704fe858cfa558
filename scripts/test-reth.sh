#!/usr/bin/env bash
# Builds and tests `integrations/reth` (overdrive inside reth v2.5.1) when a reth source tree can
# be had (scripts/setup-reth.sh); otherwise prints one line saying why it skipped and succeeds.
set -euo pipefail
cd "$(dirname "$0")/.."
status=0
reason=$(bash scripts/setup-reth.sh 2>&1 >/dev/null) || status=$?
if [ "$status" -eq 3 ]; then
  echo "integrations/reth: skipped, ${reason##*$'\n'}"
  exit 0
elif [ "$status" -ne 0 ]; then
  echo "$reason" >&2
  exit "$status"
fi
source scripts/reth-env.sh
python3 scripts/check-locks.py
# Our packages only: `--all` would also format the path dependencies, reth's tree among them.
reth_cargo fmt -p overdrive-reth-components -p overdrive-reth --check
# One profile for everything (release): reth in a debug build is too slow to import chains,
# and a second profile would build reth twice.
reth_cargo clippy --release --workspace --all-targets --locked -- -D warnings
reth_cargo test --release --workspace --locked
# Clients nobody here wrote (web3.py, viem, anvil) against the node the tests just built.
bash scripts/client-checks.sh
