#!/usr/bin/env bash
# Installs what overdrive needs on a fresh Debian machine (idempotent, quick when done):
# build-essential, pkg-config and Node.js/npm from apt, rustfmt/clippy for the Rust toolchain
# (Rust itself, from rustup, must already be there), the contract artifacts (OpenZeppelin
# ERC20 compiled with solc-js; Uniswap V2 npm builds) and the mainnet genesis allocation.
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
command -v cc >/dev/null 2>&1 || need_apt+=(build-essential)
command -v node >/dev/null 2>&1 || need_apt+=(nodejs)
command -v npm >/dev/null 2>&1 || need_apt+=(npm)
command -v pkg-config >/dev/null 2>&1 || need_apt+=(pkg-config)
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "setup: installing ${need_apt[*]}"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}"
fi
if ! command -v cargo >/dev/null 2>&1; then
  echo "setup: cargo not found; install Rust (rustup) first" >&2
  exit 1
fi
rustup component add rustfmt clippy >/dev/null 2>&1 || true

bash scripts/setup-contracts.sh
bash scripts/setup-genesis.sh
