#!/usr/bin/env bash
# Clients nobody here wrote against `overdrive-reth node --dev` with every component on:
# web3.py (PyPI) and viem (npm) deploy the project's ERC20, send ether and tokens, and read
# receipts, logs, balances, storage, calls and gas estimates; then the same signed transactions
# go to the node and to anvil (npm @foundry-rs/anvil), which must agree on every receipt and
# balance. Installs the pinned clients under the cache folder; needs a built overdrive-reth
# (scripts/build-reth.sh, or RETH_BIN).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$(pwd)"
source scripts/reth-env.sh
BIN="${RETH_BIN:?}"
[ -x "$BIN" ] || { echo "client checks: $BIN is not built (bash scripts/build-reth.sh)" >&2; exit 1; }
CLIENTS="${XDG_CACHE_HOME:-$HOME/.cache}/overdrive/clients"
mkdir -p "$CLIENTS/node"
if [ ! -x "$CLIENTS/venv/bin/python" ] || ! "$CLIENTS/venv/bin/python" -c 'import web3' 2>/dev/null; then
  python3 -m venv "$CLIENTS/venv"
  "$CLIENTS/venv/bin/pip" install -q web3==7.16.0
fi
if [ ! -x "$CLIENTS/node/node_modules/.bin/anvil" ] || [ ! -d "$CLIENTS/node/node_modules/viem" ]; then
  (cd "$CLIENTS/node" && { [ -f package.json ] || npm init -y >/dev/null; } \
    && npm install --silent viem@2.57.20 @foundry-rs/anvil@1.7.1)
fi
TOKEN="$ROOT/build-artifacts/Token.json"
[ -f "$TOKEN" ] || bash scripts/setup-contracts.sh

WORK="$(mktemp -d)"
PIDS=()
cleanup() {
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_rpc() {
  for _ in $(seq 1 240); do
    if curl -sf -H 'Content-Type: application/json' \
      -d '{"jsonrpc":"2.0","id":1,"method":"eth_blockNumber","params":[]}' "$1" >/dev/null; then
      return 0
    fi
    sleep 0.5
  done
  echo "client checks: $1 never answered; log:" >&2
  tail -30 "$2" >&2
  exit 1
}

start_node() {
  local http; http=$(port)
  METRICS=$(port)
  "$BIN" node --dev --dev.block-time 1s --datadir "$WORK/$1" \
    --http --http.port "$http" --http.api eth,net,web3 --metrics "127.0.0.1:$METRICS" \
    --port "$(port)" --disable-discovery --authrpc.port "$(port)" --ipcdisable \
    --overdrive.exec parallel --overdrive.exec.threads 2 >"$WORK/$1.log" 2>&1 &
  PIDS+=($!)
  NODE="http://127.0.0.1:$http"
  wait_rpc "$NODE" "$WORK/$1.log"
}

start_node clients
"$CLIENTS/venv/bin/python" tests/clients/web3_check.py "$NODE" "$TOKEN"
# ES modules resolve `viem` beside the importing file: run the check from the clients folder.
cp tests/clients/viem_check.mjs "$CLIENTS/node/viem_check.mjs"
(cd "$CLIENTS/node" && node viem_check.mjs "$NODE" "$TOKEN")
# The clients' blocks were validated by overdrive's executor, on its parallel path or (for
# blocks too small to split) its own sequential one, not handed back to reth's.
sleep 2
validated=$(curl -s "http://127.0.0.1:$METRICS/" \
  | awk '/^reth_overdrive_block_executed_total/ && !/executor="reth"/ {n += $NF} END {print n + 0}')
echo "client checks: $validated blocks validated by overdrive's executor"
[ "${validated%.*}" -ge 1 ] || { echo "client checks: no block went through overdrive's executor" >&2; exit 1; }

# A fresh node and a fresh anvil for the differential run.
start_node diff
ANVIL_PORT=$(port)
"$CLIENTS/node/node_modules/.bin/anvil" --port "$ANVIL_PORT" --chain-id 1337 --silent \
  >"$WORK/anvil.log" 2>&1 &
PIDS+=($!)
wait_rpc "http://127.0.0.1:$ANVIL_PORT" "$WORK/anvil.log"
"$CLIENTS/venv/bin/python" tests/clients/anvil_diff.py "$NODE" "http://127.0.0.1:$ANVIL_PORT" "$TOKEN"
echo "client checks: passed"
