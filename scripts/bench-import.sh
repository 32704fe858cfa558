#!/usr/bin/env bash
# `overdrive-reth import` of one exported chain with reth's executor and with overdrive's, the
# same binary, one after the other, each into a fresh datadir: the execution stage's time
# (reth's own "Execution time" log lines, summed), the whole import's wall time and CPU time.
#
#   bash scripts/bench-import.sh [MODE...]
#
# MODEs (default: reth parallel): `reth` (reth's executor), `parallel` (overdrive's on
# THREADS threads, default: all cores), `one-thread` (overdrive's executor on one thread: what
# reading through per-thread providers and handing the bundle over cost, without parallelism).
# WORKLOAD (erc20), ACCOUNTS (100000), BLOCKS (200), TXS (6000) shape the chain; it is exported
# once into OUT (default /tmp/overdrive-bench-import) and reused. The last line is JSON.
set -euo pipefail
cd "$(dirname "$0")/.."
WORKLOAD=${WORKLOAD:-erc20}
ACCOUNTS=${ACCOUNTS:-100000}
BLOCKS=${BLOCKS:-200}
TXS=${TXS:-6000}
THREADS=${THREADS:-$(nproc)}
OUT=${OUT:-/tmp/overdrive-bench-import}
MODES=("$@")
[ ${#MODES[@]} -gt 0 ] || MODES=(reth parallel)

bash scripts/setup.sh >/dev/null
BIN=$(bash scripts/build-reth.sh)
CHAIN=$OUT/chain-$WORKLOAD-$ACCOUNTS-$BLOCKS-$TXS
if [ ! -f "$CHAIN/chain.rlp" ]; then
  echo "exporting $WORKLOAD: $ACCOUNTS accounts, $BLOCKS blocks of $TXS transactions" >&2
  cargo run --release --locked -q -p overdrive -- chain export --workload "$WORKLOAD" \
    --accounts "$ACCOUNTS" --blocks "$BLOCKS" --txs "$TXS" --out "$CHAIN.tmp" >&2
  rm -rf "$CHAIN" && mv "$CHAIN.tmp" "$CHAIN"
fi

results=()
for mode in "${MODES[@]}"; do
  case $mode in
    reth) flags=() ;;
    parallel) flags=(--overdrive.exec parallel --overdrive.exec.threads "$THREADS") ;;
    one-thread) flags=(--overdrive.exec parallel --overdrive.exec.threads 1) ;;
    *) echo "unknown mode $mode (reth, parallel, one-thread)" >&2; exit 2 ;;
  esac
  datadir=$OUT/datadir-$mode
  rm -rf "$datadir"
  "$BIN" init --chain "$CHAIN/genesis.json" --datadir "$datadir" >/dev/null 2>&1
  log=$OUT/import-$mode.log
  echo "importing with $mode" >&2
  /usr/bin/time -f "time %e %U %S" -o "$OUT/time-$mode" "$BIN" import --color never \
    --log.stdout.filter "info,sync::stages::execution=debug" "${flags[@]}" \
    --chain "$CHAIN/genesis.json" --datadir "$datadir" "$CHAIN/chain.rlp" >"$log" 2>&1
  grep -q "Successfully imported" "$log" || { echo "import with $mode failed, see $log" >&2; exit 1; }
  results+=("$mode $log $OUT/time-$mode")
  rm -rf "$datadir"
done

python3 - "$WORKLOAD" "$ACCOUNTS" "$BLOCKS" "$TXS" "$THREADS" "${results[@]}" <<'PY'
import json, re, sys
workload, accounts, blocks, txs, threads = sys.argv[1:6]
units = {"ns": 1e-9, "µs": 1e-6, "us": 1e-6, "ms": 1e-3, "s": 1.0}
def seconds(text):
    m = re.fullmatch(r"([0-9.]+)(ns|µs|us|ms|s)", text)
    return float(m.group(1)) * units[m.group(2)]
rows = {}
for entry in sys.argv[6:]:
    mode, log, timing = entry.split(" ")
    execution = 0.0
    gas = 0
    for line in open(log, encoding="utf-8", errors="replace"):
        if "Execution time" in line:
            m = re.search(r"execution=(\S+)", line)
            execution += seconds(m.group(1))
    wall, user, sys_ = map(float, open(timing).read().split()[1:4])
    rows[mode] = {"execution_s": round(execution, 3), "import_s": wall, "cpu_s": round(user + sys_, 2)}
print(f"import of {workload}: {accounts} accounts, {blocks} blocks of {txs} transactions, {threads} threads")
print(f"{'mode':12} {'execution stage s':>18} {'whole import s':>15} {'CPU s':>8}")
for mode, r in rows.items():
    print(f"{mode:12} {r['execution_s']:18.2f} {r['import_s']:15.2f} {r['cpu_s']:8.2f}")
report = {"bench": "import", "workload": workload, "accounts": int(accounts), "blocks": int(blocks), "txs": int(txs), "threads": int(threads), **{m: r for m, r in rows.items()}}
if "reth" in rows:
    for mode in rows:
        if mode != "reth":
            report[f"{mode}_execution_speedup"] = round(rows["reth"]["execution_s"] / rows[mode]["execution_s"], 3)
            report[f"{mode}_import_speedup"] = round(rows["reth"]["import_s"] / rows[mode]["import_s"], 3)
print(json.dumps(report))
PY
