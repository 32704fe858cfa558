# Shared by the benchmark scripts (sourced, not run): the binary, the output folder, the
# failure message, and reading a field of the benchmarks' JSON lines.
#   BIN: the script's first argument, or a release `overdrive` built here.
#   OUT: the environment's, or a new temporary folder; the benchmarks' logs go to
#        $OUT/bench.log so that tables stay readable and a failed run says where to look.
BIN="${1:-}"
if [[ -z "$BIN" ]]; then
  cargo build --release --locked -p overdrive >&2
  # Where cargo put it (CARGO_TARGET_DIR or the workspace's target/).
  BIN="$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')/release/overdrive"
fi
OUT="${OUT:-$(mktemp -d)}"
mkdir -p "$OUT"
trap 'echo "a benchmark failed; its log: $OUT/bench.log" >&2' ERR

# The value of a numeric or boolean field of a one-line JSON object.
field() { grep -oE "\"$1\":[^,}]*" <<<"$2" | head -1 | cut -d: -f2; }

# One `bench exec` run of the issues' block shape (100k accounts, 6,000 txs x 5 blocks):
# bench_exec WORKLOAD THREADS [TXS] (TXS: transactions per block, default 6,000), with the
# flags in EXEC_EXTRA (unquoted) added. Its JSON line goes to $OUT/exec.jsonl and to $JSON; outputs
# that differ from sequential, a block left to the sequential fallback, or a reverted
# transaction stop the script.
bench_exec() {
  JSON=$("$BIN" bench exec --workload "$1" --accounts 100000 --txs "${3:-6000}" --blocks 5 \
    --threads "$2" ${EXEC_EXTRA:-} --json 2>>"$OUT/bench.log" | tail -1)
  echo "$JSON" >>"$OUT/exec.jsonl"
  if [[ "$(field equal "$JSON")" != "true" ]]; then
    echo "outputs differ: $1, $2 threads: $JSON" >&2
    exit 1
  fi
  # With one thread the parallel executor is sequential by design; otherwise every block of
  # this shape must take its parallel path (on several threads, or by the committer alone
  # for a chain), or the figure measures the small-block fallback.
  if (( $2 > 1 )) && (( $(field parallel_blocks "$JSON") + $(field committer_alone_blocks "$JSON") != 5 )); then
    echo "not every block took the parallel path: $1, $2 threads: $JSON" >&2
    exit 1
  fi
  if [[ "$(field reverted "$JSON")" != "0" ]]; then
    echo "transactions reverted: $1, $2 threads: $JSON" >&2
    exit 1
  fi
}

# One `bench trie` run: bench_trie ACCOUNTS BLOCKS THREADS, with the flags in TRIE_EXTRA
# (unquoted) added. Its JSON line goes to $OUT/trie.jsonl and to $JSON; roots that differ stop
# the script.
bench_trie() {
  JSON=$("$BIN" bench trie --accounts "$1" --blocks "$2" --threads "$3" ${TRIE_EXTRA:-} --json \
    2>>"$OUT/bench.log" | tail -1)
  echo "$JSON" >>"$OUT/trie.jsonl"
  if [[ "$(field roots_equal "$JSON")" != "true" ]]; then
    echo "roots differ: $1 accounts, $3 threads: $JSON" >&2
    exit 1
  fi
}
