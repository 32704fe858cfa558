#!/usr/bin/env bash
# Thread scaling of both benchmarks, for a machine with more cores than this project's 2-core
# hosts (the issues' 1/2/4/8/16-thread tables). Every figure is a ratio measured in one run of
# the benchmark (new against reference, same blocks, same process); this script only varies the
# thread count and collects the JSON lines into Markdown tables.
#
#   scripts/scaling.sh [BIN]            # BIN: a release `overdrive` (default: built here)
#
# Environment: THREADS (default "1 2 4 8 16"), WORKLOADS (default: every workload kind; empty:
# no exec table), TRIE_ACCOUNTS (default "100000 1000000"; empty: no trie table), COMPUTE_TXS
# (calls per compute block, default 200: each is 0.2–0.9 Mgas, so 6,000 would make 3-gigagas
# blocks), OUT (a directory for the raw JSON lines), SPLIT=1 (multi-thread runs also measure `--split-reference`, an ideal
# partitioned executor on the same blocks, shown in brackets after the cpu ratio, and
# `--co-run-reference`, as many one-thread tries side by side, in brackets after (c)/(d)).
# Multi-thread exec cells add, after ×, the `scaling` (the same executor on one thread, on its
# parallel path, over it on T threads) and end with the committer bound in braces
# (`committer_bound`: sequential time over the committing thread's serial time, the speedup
# no thread count passes).
# FOLDING=auto|committer|pool passes `--transition-folding` to every exec run (default: the
# benchmark's, auto); multi-thread cells then add, after a slash, in how many of the 5 blocks
# the pool folded the state transitions. Running the exec table with FOLDING=committer and
# with FOLDING=auto compares the two on one machine.
# Multi-thread exec cells end with <I R>: per block, the speculative results that failed
# validation (each re-executed by the committer) and those the pool executed again first.
# RESPECULATE=0 passes `--no-respeculate` (R is then 0).
#
# On the lent 16-core machine (BENCHMARKS.md, twenty-eighth round) each core ran these
# workloads at about half this VM's speed: the nine workloads' exec table took over 6 minutes
# and the trie table over 5 (1M accounts: 40–50 s a run). Run the tables as separate calls
# (WORKLOADS= or TRIE_ACCOUNTS= empty) so that each fits one call's limit.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/bench-common.sh "$@"
THREADS="${THREADS:-1 2 4 8 16}"
WORKLOADS="${WORKLOADS-erc20 uniswap transfer hybrid chained allowance router compute exchange}"
COMPUTE_TXS="${COMPUTE_TXS:-200}"
TRIE_ACCOUNTS="${TRIE_ACCOUNTS-100000 1000000}"
SPLIT="${SPLIT:-0}"
FOLDING="${FOLDING:-}"
RESPECULATE="${RESPECULATE:-1}"
# A number with two decimals, and a quotient (awk: bc is not on every machine).
fmt() { awk -v x="$1" 'BEGIN { printf "%.2f", x }'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'; }

header() {
  local line="| $1 |" rule="| --- |"
  for t in $THREADS; do line+=" $t |"; rule+=" --- |"; done
  echo "$line"
  echo "$rule"
}

split_note=""
if [[ "$SPLIT" == 1 ]]; then split_note=" [split reference]"; fi
if [[ -n "${WORKLOADS// }" ]]; then
  echo "## bench exec: speedup (cpu ratio)$split_note {committer bound}, 100k accounts, 6,000 txs x 5 blocks ($(nproc) cores)"
  echo
  echo "(compute: $COMPUTE_TXS calls per block)"
  echo
  header "workload \\ threads"
  for w in $WORKLOADS; do
    row="| $w |"
    for t in $THREADS; do
      EXEC_EXTRA=""
      split=0
      if [[ "$SPLIT" == 1 ]] && (( t > 1 )); then EXEC_EXTRA="--split-reference"; split=1; fi
      if [[ -n "$FOLDING" ]]; then EXEC_EXTRA+=" --transition-folding $FOLDING"; fi
      if [[ "$RESPECULATE" == 0 ]]; then EXEC_EXTRA+=" --no-respeculate"; fi
      if [[ "$w" == compute ]]; then bench_exec "$w" "$t" "$COMPUTE_TXS"; else bench_exec "$w" "$t"; fi
      cell="$(fmt "$(field speedup "$JSON")") ($(fmt "$(field cpu_ratio "$JSON")"))"
      scaling=$(field scaling "$JSON" || true)  # absent on one thread
      if [[ -n "$scaling" ]]; then cell+=" ×$(fmt "$scaling")"; fi
      if [[ "$split" == 1 ]]; then cell+=" [$(fmt "$(field split_speedup "$JSON")")]"; fi
      bound=$(field committer_bound "$JSON" || true)  # absent on one thread
      if [[ -n "$bound" ]]; then cell+=" {$(fmt "$bound")}"; fi
      if [[ -n "$FOLDING" ]] && (( t > 1 )); then cell+=" /$(field pool_folded_blocks "$JSON")"; fi
      if (( t > 1 )); then
        cell+=" <$(field invalid_per_block "$JSON") $(field respeculated_per_block "$JSON")>"
      fi
      row+=" $cell |"
    done
    echo "$row"
  done
  echo
fi

corun_note=""
if [[ "$SPLIT" == 1 ]]; then corun_note=" [co-run reference]"; fi
if [[ -n "${TRIE_ACCOUNTS// }" ]]; then
  echo "## bench trie: (d) ms per block, and (c)/(d)$corun_note ($(nproc) cores)"
  echo
  header "accounts \\ threads"
  for n in $TRIE_ACCOUNTS; do
    row="| $n |"
    for t in $THREADS; do
      TRIE_EXTRA=""
      if [[ "$SPLIT" == 1 ]] && (( t > 1 )); then TRIE_EXTRA="--co-run-reference"; fi
      bench_trie "$n" 10 "$t"
      par=$(field overdrive_ms "$JSON")
      cell="$(fmt "$par") ($(ratio "$(field overdrive_1t_ms "$JSON")" "$par")x)"
      if [[ -n "$TRIE_EXTRA" ]]; then cell+=" [$(fmt "$(field co_run_speedup "$JSON")")x]"; fi
      row+=" $cell |"
    done
    echo "$row"
  done
  echo
fi
echo "raw JSON lines: $OUT" >&2
