# Shared by the benchmark scripts (sourced, not run): the binary, the output folder, the
# failure message, and reading a field of the benchmarks' JSON lines.
#   BIN: the script's first argument, or a release `overdrive` built here.
#   OUT: the environment's, or a new temporary folder; the benchmarks' logs go to
#        $OUT/bench.log so that tables stay readable and a failed run says where to look.
BIN="${1:-}"
if [[ -z "$BIN" ]]; then
  cargo build --release --locked -q -p overdrive
  BIN=./target/release/overdrive
fi
OUT="${OUT:-$(mktemp -d)}"
mkdir -p "$OUT"
trap 'echo "a benchmark failed; its log: $OUT/bench.log" >&2' ERR

# The value of a numeric or boolean field of a one-line JSON object.
field() { grep -oE "\"$1\":[^,}]*" <<<"$2" | head -1 | cut -d: -f2; }
