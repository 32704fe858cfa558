# Sourced by the scripts that build `integrations/reth`: sets RETH_CARGO (cargo for that
# workspace) and RETH_TARGET (its target directory), after scripts/setup-reth.sh has linked the
# reth tree.
#
# The workspace is reached through a stable path, ${XDG_CACHE_HOME:-$HOME/.cache}/overdrive/checkout
# (a link to this checkout), and builds into one target directory beside it
# (OVERDRIVE_RETH_TARGET overrides). Cargo keys a path dependency's build by the path it is
# reached at: through the stable path, reth's ~200 crates stay built across checkouts (a CI
# clone, a second worktree), and only the changed crates rebuild. A cold build of reth takes
# about 30 minutes on 2 cores.
OVERDRIVE_CACHE=${XDG_CACHE_HOME:-$HOME/.cache}/overdrive
RETH_TARGET=${OVERDRIVE_RETH_TARGET:-$OVERDRIVE_CACHE/target-reth}
_checkout=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
mkdir -p "$OVERDRIVE_CACHE"
# Cargo takes a path crate as fresh when its sources are older than its last build. After
# another checkout built through the stable path, this one's older files would pass for built:
# touching them makes cargo rebuild overdrive's crates (not reth's) from this checkout.
if [ "$(readlink "$OVERDRIVE_CACHE/checkout" 2>/dev/null)" != "$_checkout" ]; then
  find "$_checkout/crates" "$_checkout/bin" "$_checkout/integrations/reth/components" \
    "$_checkout/integrations/reth/bin" -name '*.rs' -exec touch {} + 2>/dev/null || true
fi
ln -sfn "$_checkout" "$OVERDRIVE_CACHE/checkout"
RETH_MANIFEST=$OVERDRIVE_CACHE/checkout/integrations/reth/Cargo.toml
export CARGO_NET_GIT_FETCH_WITH_CLI=true
reth_cargo() {
  # From outside the checkout: cargo resolves the manifest path as given, not the real path.
  (cd / && CARGO_TARGET_DIR="$RETH_TARGET" cargo "$1" --manifest-path "$RETH_MANIFEST" "${@:2}")
}
RETH_BIN=$RETH_TARGET/release/overdrive-reth
