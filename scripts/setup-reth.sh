#!/usr/bin/env bash
# Provides the reth v2.5.1 source tree that `integrations/reth` builds against, and links it as
# `integrations/reth/reth-src` (ignored by git; the workspace excludes it, so reth's crates keep
# reth's own workspace).
#
# The tree comes from, in this order:
#   1. OVERDRIVE_RETH_SRC, when set (a reth checkout at v2.5.1, e.g. one you edit for a PR);
#   2. ${XDG_CACHE_HOME:-$HOME/.cache}/overdrive/reth-v2.5.1, when present;
#   3. a shallow clone of the v2.5.1 tag from GitHub into that folder.
# It also installs what reth's build needs (Debian's libclang-dev and m4).
#
# Exit status 3 (and one line on stderr) when no tree can be had: callers that can go on
# without reth (CI, the main job) say so and skip it.
set -euo pipefail
cd "$(dirname "$0")/.."
TAG=v2.5.1
CACHE=${XDG_CACHE_HOME:-$HOME/.cache}/overdrive
SRC=${OVERDRIVE_RETH_SRC:-$CACHE/reth-$TAG}

if [ ! -f "$SRC/Cargo.toml" ]; then
  if [ -n "${OVERDRIVE_RETH_SRC:-}" ]; then
    echo "OVERDRIVE_RETH_SRC=$SRC holds no reth tree (no Cargo.toml)" >&2
    exit 3
  fi
  echo "reth $TAG: cloning into $SRC" >&2
  mkdir -p "$CACHE"
  rm -rf "$SRC.tmp"
  if ! git clone -q --depth 1 --branch "$TAG" https://github.com/paradigmxyz/reth "$SRC.tmp" 2>/dev/null; then
    rm -rf "$SRC.tmp"
    echo "no reth $TAG source: OVERDRIVE_RETH_SRC is unset, $SRC is absent and github.com cannot be reached" >&2
    exit 3
  fi
  mv "$SRC.tmp" "$SRC"
fi

version=$(grep -m1 -E '^version *= *"' "$SRC/Cargo.toml" | sed -E 's/.*"(.*)".*/\1/')
if [ "$version" != "${TAG#v}" ]; then
  echo "the reth tree at $SRC is version $version, not ${TAG#v}" >&2
  exit 3
fi

ln -sfn "$SRC" integrations/reth/reth-src

need=()
command -v m4 >/dev/null || need+=(m4)
ls /usr/lib/llvm-*/lib/libclang.so* >/dev/null 2>&1 || ls /usr/lib/*/libclang*.so* >/dev/null 2>&1 || need+=(libclang-dev)
if [ ${#need[@]} -gt 0 ]; then
  SUDO=$([ "$(id -u)" -eq 0 ] && echo "" || echo sudo)
  $SUDO apt-get install -y -q "${need[@]}" >/dev/null
fi
echo "reth $TAG source: $SRC (linked as integrations/reth/reth-src)" >&2
