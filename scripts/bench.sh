#!/usr/bin/env bash
# The main job until the node exists: the executor benchmark on generated ERC20 blocks
# (100k accounts, 6,000 transfers per block, 5 blocks). Extra arguments go to `bench exec`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cargo run --release --locked -q -p overdrive -- bench exec \
  --workload erc20 --accounts 100000 --txs 6000 --blocks 5 "$@"
