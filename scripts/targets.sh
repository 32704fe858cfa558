#!/usr/bin/env bash
# The executor's and the trie's speed targets (issues 3 and 4), measured ROUNDS times each and
# summed up per target: the range over the rounds, the median, and in how many rounds it was met
# (each round's figure stays in the files under OUT).
#
# On this project's 2-core VM one run of a command cannot settle a target near 1.8x: the same
# binary's speedup moves by ±15 % from minute to minute (BENCHMARKS.md). This script runs the
# issues' exact commands in interleaved rounds (every command once per round), so a slow stretch
# of the host lands on all of them alike, and reports what the rounds support. Every figure is
# still a ratio measured inside one run of the benchmark (new against reference, same blocks,
# same process); the script only repeats the runs and reads their JSON lines.
#
#   scripts/targets.sh [BIN]            # BIN: a release `overdrive` (default: built here)
#
# Environment: ROUNDS (default 5), THREADS (default 2, the issues' table), OUT (a directory for
# the raw JSON lines and the benchmarks' logs), SPLIT=1 (the multi-thread exec runs also measure
# `--split-reference`, an ideal partitioned executor on the same blocks, and the trie runs
# `--co-run-reference`, one-thread tries side by side; the table gets rows for them; the
# targets' figures are measured as without them). Stops at the first run whose outputs or roots
# differ.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/bench-common.sh "$@"
ROUNDS="${ROUNDS:-5}"
THREADS="${THREADS:-2}"

# One figure per line of FILE, summed up as "MIN–MAX | MEDIAN | HITS/N" for a target of `>= GOAL`
# (or `<= GOAL` when OP is "le").
summary() {
  local file="$1" goal="$2" op="${3:-ge}"
  sort -g "$file" | awk -v goal="$goal" -v op="$op" '
    { v[NR] = $1 }
    END {
      n = NR; hits = 0
      for (i = 1; i <= n; i++) if ((op == "ge" && v[i] >= goal) || (op == "le" && v[i] <= goal)) hits++
      med = (n % 2) ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2
      printf "%.2f–%.2f | %.2f | %d/%d", v[1], v[n], med, hits, n
    }'
}

SPLIT="${SPLIT:-0}"

exec_run() { # workload threads
  EXEC_EXTRA=""
  if [[ "$SPLIT" == 1 ]] && (( $2 > 1 )); then EXEC_EXTRA="--split-reference"; fi
  bench_exec "$1" "$2"
  field speedup "$JSON" >>"$OUT/exec-$1-t$2"
  field cpu_ratio "$JSON" >>"$OUT/exec-$1-t$2-cpu"
  if [[ -n "$EXEC_EXTRA" ]]; then field split_speedup "$JSON" >>"$OUT/exec-$1-t$2-split"; fi
}

trie_run() { # accounts blocks
  TRIE_EXTRA=""
  if [[ "$SPLIT" == 1 ]] && (( THREADS > 1 )); then TRIE_EXTRA="--co-run-reference"; fi
  bench_trie "$1" "$2" "$THREADS"
  local b c d k dirty
  b=$(field reth_style_ms "$JSON")
  c=$(field overdrive_1t_ms "$JSON")
  d=$(field overdrive_ms "$JSON")
  k=$(field keccak_calls "$JSON")
  dirty=$(field dirty_nodes "$JSON")
  awk -v c="$c" -v d="$d" 'BEGIN { print c / d }' >>"$OUT/trie-$1-cd"
  awk -v b="$b" -v c="$c" 'BEGIN { print b / c }' >>"$OUT/trie-$1-bc"
  echo "$d" >>"$OUT/trie-$1-d"
  awk -v k="$k" -v n="$dirty" 'BEGIN { print k / n }' >>"$OUT/trie-$1-keccak"
  if [[ -n "$TRIE_EXTRA" ]]; then
    local co
    co=$(field co_run_speedup "$JSON")
    echo "$co" >>"$OUT/trie-$1-corun"
    awk -v c="$c" -v d="$d" -v co="$co" 'BEGIN { print c / d / co }' >>"$OUT/trie-$1-corun-share"
  fi
}

WORKLOADS="erc20 uniswap transfer hybrid chained"
for r in $(seq "$ROUNDS"); do
  echo "round $r of $ROUNDS ($(date +%T))" >&2
  for w in $WORKLOADS; do exec_run "$w" "$THREADS"; done
  exec_run erc20 1
  trie_run 10000 10
  trie_run 100000 10
  trie_run 1000000 5
done

echo "## Targets: $ROUNDS interleaved rounds ($(nproc) cores, $(date -u +%F))"
echo
echo "| target | figure | rounds (min–max) | median | met in |"
echo "| --- | --- | --- | --- | --- |"
echo "| erc20 ≥ 1.8 | speedup | $(summary "$OUT/exec-erc20-t$THREADS" 1.8) |"
echo "| uniswap ≥ 1.8 | speedup | $(summary "$OUT/exec-uniswap-t$THREADS" 1.8) |"
echo "| transfer ≥ 1.6 | speedup | $(summary "$OUT/exec-transfer-t$THREADS" 1.6) |"
echo "| hybrid ≥ 1.4 | speedup | $(summary "$OUT/exec-hybrid-t$THREADS" 1.4) |"
echo "| chained ≥ 0.95 | speedup | $(summary "$OUT/exec-chained-t$THREADS" 0.95) |"
echo "| chained cpu ≤ 1.15 | cpu_ratio | $(summary "$OUT/exec-chained-t$THREADS-cpu" 1.15 le) |"
echo "| erc20 \`--threads 1\` ≥ 0.9 | speedup | $(summary "$OUT/exec-erc20-t1" 0.9) |"
if [[ "$SPLIT" == 1 ]]; then
  for wg in erc20:1.8 uniswap:1.8 transfer:1.6 hybrid:1.4 chained:0.95; do
    echo "| ${wg%%:*}: split reference vs ≥ ${wg#*:} | split_speedup | $(summary "$OUT/exec-${wg%%:*}-t$THREADS-split" "${wg#*:}") |"
  done
fi
for n in 100000 1000000; do
  echo "| trie $n: (d) ≥ 1.8x (c) | (c)/(d) | $(summary "$OUT/trie-$n-cd" 1.8) |"
  echo "| trie $n: (c) ≥ 2x (b) | (b)/(c) | $(summary "$OUT/trie-$n-bc" 2) |"
  echo "| trie $n: keccak ≤ dirty | calls/nodes | $(summary "$OUT/trie-$n-keccak" 1 le) |"
  if [[ "$SPLIT" == 1 ]] && (( THREADS > 1 )); then
    echo "| trie $n: co-run reference vs ≥ 1.8 | co_run_speedup | $(summary "$OUT/trie-$n-corun" 1.8) |"
    echo "| trie $n: (c)/(d) over co-run (≥ 1: the split loses nothing) | share | $(summary "$OUT/trie-$n-corun-share" 1) |"
  fi
done
echo "| trie 100000: (d) ≤ 21 ms | ms | $(summary "$OUT/trie-100000-d" 21 le) |"
echo "| trie 1000000: (d) ≤ 46 ms | ms | $(summary "$OUT/trie-1000000-d" 46 le) |"
# 1M against 10k, round by round (both from the same round).
paste "$OUT/trie-1000000-d" "$OUT/trie-10000-d" | awk '{ print $1 / $2 }' >"$OUT/trie-scale"
echo "| trie (d) 1M ≤ 2.5x 10k | 1M/10k | $(summary "$OUT/trie-scale" 2.5 le) |"
echo
echo "raw JSON lines and logs: $OUT" >&2
