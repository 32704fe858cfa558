#!/usr/bin/env bash
# The state root in the engine at several core counts, for a machine with more cores than this
# project's 2-core hosts: stock reth v2.5.1 against overdrive's state root, each node held to
# the same first N cores (taskset), overdrive's trie on N threads. reth runs its sparse-trie
# task only with at least 5 cores (`has_enough_parallelism`, which reads the affinity mask), so
# at 5 and more this compares overdrive's strategy with reth's task at the same core count.
#
#   scripts/state-root-cores.sh OVERDRIVE_BIN RETH_BIN CHAIN_DIR...
#
# Each cell is one `overdrive bench replay --component state-root` (both nodes, same blocks,
# minutes apart; the roots must agree block for block). Environment: CORES (default "5 8 16";
# counts above this machine's are left out, saying so), OUT (a folder for the JSON lines and
# the nodes' logs), REPLAY_FLAGS (more flags for each replay, such as --trie-hash-ahead). Prints one Markdown row per chain and core count: reth's strategy, both
# totals over the chain, the ratio, the per-block median ratio, overdrive's hashing and rows
# (median per block, from its debug lines; hashing ahead, the time after execution and the
# nodes hashed after it), the dirty nodes, and each node's reads of the trie
# and hashed-state tables per block (seeks and nexts through reth's overlay, as reth's metrics
# count them: `table_reads_per_block`), and each node's peak resident memory.
set -euo pipefail
BIN=${1:?usage: state-root-cores.sh OVERDRIVE_BIN RETH_BIN CHAIN_DIR...}
RETH=${2:?usage: state-root-cores.sh OVERDRIVE_BIN RETH_BIN CHAIN_DIR...}
shift 2
CORES="${CORES:-5 8 16}"
OUT="${OUT:-$(mktemp -d)}"
mkdir -p "$OUT"
trap 'echo "a replay failed; its log: $OUT/bench.log" >&2' ERR
have=$(nproc --all)

echo "| chain | cores | reth's strategy | stock reth, all blocks | overdrive-reth, all blocks | ratio | per-block median | overdrive hashing / rows, median | dirty nodes | table reads per block, stock / overdrive (trie + hashed) | peak memory, stock / overdrive |"
echo "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
for chain in "$@"; do
  name=$(basename "$chain")
  for n in $CORES; do
    if (( n > have )); then
      echo "$name: $n cores left out, this machine has $have" >&2
      continue
    fi
    report="$OUT/$name-$n"
    json=$(taskset -c "0-$((n - 1))" "$BIN" bench replay --chain "$chain" --reth-bin "$RETH" \
      --component state-root --threads "$n" --out "$report" ${REPLAY_FLAGS:-} --json 2>>"$OUT/bench.log" |
      tee -a "$OUT/bench.log" | tail -1)
    echo "$json" >>"$OUT/replay.jsonl"
    python3 - "$name" "$n" "$json" "$report/overdrive.log" <<'EOF'
import json, re, statistics, sys

name, cores, line, log = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), sys.argv[4]
roots = line["state_root"]
units = {"ns": 1e-6, "µs": 1e-3, "us": 1e-3, "ms": 1.0, "s": 1e3}


def ms(text):
    number, unit = re.fullmatch(r"([0-9.]+)(ns|µs|us|ms|s)", text).groups()
    return float(number) * units[unit]


compute, rows, dirty, rest, rest_nodes = [], [], [], [], []
for entry in open(log, encoding="utf-8", errors="replace"):
    fields = dict(re.findall(r"(\w+)=(\S+)", entry))
    if "overdrive's state root, hashed ahead" in entry:
        rest.append(ms(fields["prepare"]) + ms(fields["rest"]))
        rest_nodes.append(int(fields["rest_nodes"]))
        dirty.append(int(fields["ahead_nodes"]) + int(fields["rest_nodes"]))
    elif "overdrive's state root" in entry:
        compute.append(ms(fields["compute"]))
        rows.append(ms(fields["rows"]))
        dirty.append(int(fields["dirty_nodes"]))
median = lambda xs: statistics.median(xs) if xs else float("nan")
work = f"{median(compute):.1f} / {median(rows):.1f} ms"
if rest:
    work += f"; hashed ahead, {median(rest):.1f} ms after execution for {median(rest_nodes):,.0f} nodes"
reads = roots["table_reads_per_block"]
both = lambda node: f"{reads[node]['trie tables']:,.0f} + {reads[node]['hashed tables']:,.0f}"
print(
    f"| {name} | {cores} | {roots['stock_strategy']} | {roots['stock_ms']:,.1f} ms"
    f" | {roots['overdrive_ms']:,.1f} ms | **{roots['speedup']:.2f}x** | {roots['median_block_speedup']:.2f}x"
    f" | {work} | {median(dirty):,.0f}"
    f" | {both('stock')} / {both('overdrive')}"
    f" | {line['stock_peak_mib'] or 0:,.0f} / {line['overdrive_peak_mib'] or 0:,.0f} MiB |"
)
EOF
  done
done
