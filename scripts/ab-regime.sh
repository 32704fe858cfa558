#!/usr/bin/env bash
# Two release `overdrive` binaries, A and B, compared on `bench exec` blocks, split by how far
# apart the two cores were when each block ran.
#
# On this project's VM the round trip of a cache line between the two cores is either ≈ 50 ns
# ("near") or ≈ 400 ns ("far"), and it flips by the minute (BENCHMARKS.md, thirteenth round).
# A change meant for the far case (results crossing from a worker's core to the committer's)
# cannot be judged by whole runs: most of them are near. `bench exec` measures the round trip
# before every block and logs it with the block's sequential and parallel times, so this script
# alternates the two binaries for DUR seconds and sums each binary's blocks per regime: the
# speedup of a regime is its blocks' summed sequential time over their summed parallel time,
# both measured in the same process. Every run must give `"equal":true`.
#
#   DUR=720 scripts/ab-regime.sh A_BIN B_BIN        # default workloads: transfer erc20
#
# Environment: DUR (seconds, default 600), WORKLOADS, THREADS (default 2), OUT (a directory for
# the logs), FAR_NS (the round trip above which a block counts as far, default 200).
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ $# -ne 2 ]]; then
  echo "usage: scripts/ab-regime.sh A_BIN B_BIN" >&2
  exit 2
fi
declare -A BIN=([A]="$1" [B]="$2")
DUR="${DUR:-600}"
WORKLOADS="${WORKLOADS:-transfer erc20}"
THREADS="${THREADS:-2}"
FAR_NS="${FAR_NS:-200}"
OUT="${OUT:-$(mktemp -d)}"
mkdir -p "$OUT"

end=$(($(date +%s) + DUR))
while (($(date +%s) < end)); do
  for w in $WORKLOADS; do
    for v in A B; do
      "${BIN[$v]}" bench exec --workload "$w" --accounts 100000 --txs 6000 --blocks 5 \
        --threads "$THREADS" --json 2>&1 | sed 's/\x1b\[[0-9;]*m//g' |
        grep -E "executed block|^\{" >>"$OUT/$v-$w.log"
      if ! tail -1 "$OUT/$v-$w.log" | grep -q '"equal":true'; then
        echo "$v ($w): outputs differ or the run failed; see $OUT/$v-$w.log" >&2
        exit 1
      fi
    done
  done
done

echo "| workload | binary | near blocks | near speedup | far blocks | far speedup | runs' median speedup |"
echo "| --- | --- | --- | --- | --- | --- | --- |"
for w in $WORKLOADS; do
  for v in A B; do
    f="$OUT/$v-$w.log"
    blocks=$(grep "executed block" "$f" | awk -v far="$FAR_NS" '
      function num(name,   v) { match($0, name "=[0-9.]*"); return substr($0, RSTART + length(name) + 1, RLENGTH - length(name) - 1) + 0 }
      { r = (num("core_round_trip_ns") > far) ? "far" : "near"; s[r] += num("sequential_ms"); p[r] += num("parallel_ms"); n[r]++ }
      END {
        for (i = 1; i <= 2; i++) { r = (i == 1) ? "near" : "far"; printf "%d | %s | ", n[r], n[r] ? sprintf("%.3f", s[r] / p[r]) : "—" }
      }')
    median=$(grep -oE '"speedup":[0-9.]+' "$f" | cut -d: -f2 | sort -g |
      awk '{ v[NR] = $1 } END { printf "%.3f (%d runs)", (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2, NR }')
    echo "| $w | $v | $blocks$median |"
  done
done
echo "logs: $OUT" >&2
