#!/usr/bin/env bash
# Builds `overdrive-reth` (reth v2.5.1 with overdrive's components) in release mode and prints
# the binary's path on its last line. Gets the reth source first (scripts/setup-reth.sh). The
# first build takes about 30 minutes on 2 cores; later ones rebuild what changed.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-reth.sh
source scripts/reth-env.sh
reth_cargo build --release --locked -p overdrive-reth >&2
echo "$RETH_BIN"
