#!/usr/bin/env bash
# The main job: overdrive-reth with its components on against stock reth, one after the other on
# this machine, same genesis and load (`overdrive bench load --compare`: pre-signed ERC20
# transfers over 100k accounts, sent as fast as the node takes them for a minute; reports and
# charts in ./load-report). Builds reth v2.5.1 first (about 30 minutes the first time on 2
# cores). Where no reth source tree can be had, it says so and runs the executor benchmark
# instead. Extra arguments go to `bench load`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
echo "bench: building overdrive (release; a few minutes the first time)" >&2
cargo build --release --locked -p overdrive
BIN="$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')/release/overdrive"
status=0
reason=$(bash scripts/setup-reth.sh 2>&1 >/dev/null) || status=$?
if [ "$status" -eq 3 ]; then
  echo "bench: no reth source tree (${reason##*$'\n'}); running the executor benchmark instead"
  exec "$BIN" bench exec --workload erc20 --accounts 100000 --txs 6000 --blocks 5
elif [ "$status" -ne 0 ]; then
  echo "$reason" >&2
  exit "$status"
fi
RETH="$(bash scripts/build-reth.sh | tail -1)"
exec "$BIN" bench load --compare --reth-bin "$RETH" --workload erc20 --accounts 100000 \
  --duration 60 "$@"
