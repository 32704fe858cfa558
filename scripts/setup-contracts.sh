#!/usr/bin/env bash
# Builds the contract artifacts the workload generators (crates/workload) load:
#   build-artifacts/Token.json            OpenZeppelin v5 ERC20 (contracts/Token.sol), compiled
#                                         with the solc-js version pinned in contracts/package.json
#   build-artifacts/uniswap/*.json        UniswapV2Factory, UniswapV2Pair, UniswapV2Router02 and
#                                         WETH9, copied from the published @uniswap npm packages
#
# Usage: scripts/setup-contracts.sh [--force]
#   OVERDRIVE_ARTIFACTS=DIR  write to DIR instead of <repo>/build-artifacts (the crate reads the
#                            same variable)
#
# Needs node, npm (and the npm registry the first time) and sha256sum. Idempotent: when the inputs
# (package.json, package-lock.json, Token.sol, build.js) have not changed since the last build,
# it only checks a stamp and exits.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
contracts="$root/contracts"
out="${OVERDRIVE_ARTIFACTS:-$root/build-artifacts}"
force=0
for arg in "$@"; do
    case "$arg" in
        --force) force=1 ;;
        -h | --help)
            sed -n '2,14p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
            exit 0
            ;;
        *)
            echo "unknown argument: $arg (expected --force)" >&2
            exit 2
            ;;
    esac
done

for tool in node npm sha256sum; do
    if ! command -v "$tool" >/dev/null 2>&1; then
        echo "setup-contracts: '$tool' is required but not installed" >&2
        exit 1
    fi
done

inputs_hash() {
    (cd "$contracts" && cat package.json package-lock.json Token.sol build.js) | sha256sum | cut -d' ' -f1
}
lock_hash() {
    sha256sum "$contracts/package-lock.json" | cut -d' ' -f1
}

stamp="$out/.stamp"
want="$(inputs_hash)"
expected_files=(Token.json uniswap/UniswapV2Factory.json uniswap/UniswapV2Pair.json
    uniswap/UniswapV2Router02.json uniswap/WETH9.json)
if [[ $force == 0 && -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
    complete=1
    for f in "${expected_files[@]}"; do
        [[ -s "$out/$f" ]] || complete=0
    done
    if [[ $complete == 1 ]]; then
        echo "contract artifacts in $out are up to date"
        exit 0
    fi
fi

# `npm ci` wipes and reinstalls node_modules, so it only runs when the lock file changed since
# the last install.
modules_stamp="$contracts/node_modules/.overdrive-lock-hash"
if [[ $force == 1 || ! -f "$modules_stamp" || "$(cat "$modules_stamp")" != "$(lock_hash)" ]]; then
    echo "installing pinned npm packages into contracts/node_modules"
    (cd "$contracts" && npm ci --no-audit --no-fund --loglevel=error)
    lock_hash >"$modules_stamp"
fi

mkdir -p "$out"
rm -f "$stamp"
node "$contracts/build.js" "$out"
echo "$want" >"$stamp"
