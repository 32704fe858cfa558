#!/usr/bin/env bash
# Exports the mainnet genesis allocation (from the pinned @ethereumjs/genesis npm package) to
# build-artifacts/mainnet-alloc.json, so `overdrive init --chain mainnet` can build mainnet's
# genesis block. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${OVERDRIVE_ARTIFACTS:-$PWD/build-artifacts}/mainnet-alloc.json"
[ -s "$out" ] && exit 0
mkdir -p "$(dirname "$out")"
(cd scripts/genesis && npm install --silent --no-audit --no-fund >/dev/null)
node scripts/genesis/export.js "$out.tmp" && mv "$out.tmp" "$out"
echo "setup-genesis: wrote $out"
