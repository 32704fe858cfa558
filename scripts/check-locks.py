#!/usr/bin/env python3
"""Fails when the two workspaces' lock files, or the reth workspace's and reth v2.5.1's own, pin
different versions of a crate they share.

The core crates are built in both workspaces; a type that crosses into reth (a revm `State`, an
alloy header) is the same type only when both graphs resolve it to the same version, and a
newer semver-compatible alloy release breaks reth v2.5.1. So the root lock, the
`integrations/reth` lock and reth's own lock must agree wherever they overlap.

    python3 scripts/check-locks.py [RETH_SRC]

RETH_SRC (default integrations/reth/reth-src) is compared only when it holds a Cargo.lock.
"""
import os
import sys
import tomllib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def versions(path):
    with open(path, "rb") as f:
        packages = tomllib.load(f)["package"]
    out = {}
    for p in packages:
        # Path packages (no source) are workspace members or reth's own crates: not pinned.
        if "source" in p:
            out.setdefault(p["name"], set()).add(p["version"])
    return out


def not_in(a_name, a, b_name, b):
    """The versions `a` resolves a crate to that `b`, which also has the crate, does not."""
    errors = []
    for name in sorted(a.keys() & b.keys()):
        extra = a[name] - b[name]
        if extra:
            errors.append(f"  {name}: {a_name} {sorted(extra)}, {b_name} {sorted(b[name])}")
    return errors


def main():
    reth_src = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "integrations/reth/reth-src")
    root = versions(os.path.join(ROOT, "Cargo.lock"))
    integration = versions(os.path.join(ROOT, "integrations/reth/Cargo.lock"))
    errors = []
    # The core's graph is part of the reth graph: each of its versions must be one there too
    # (reth's graph adds older majors of some crates beside them).
    errors += not_in("Cargo.lock", root, "integrations/reth/Cargo.lock", integration)
    reth_lock = os.path.join(reth_src, "Cargo.lock")
    if os.path.exists(reth_lock):
        reth = versions(reth_lock)
        # A crate the reth graph adds beyond reth's own (ours) may be anything; a crate reth
        # pins must be at reth's versions, or one of them where reth has several.
        errors += not_in("integrations/reth/Cargo.lock", integration, "reth v2.5.1's Cargo.lock", reth)
    if errors:
        print("lock files disagree on shared crates:\n" + "\n".join(errors))
        return 1
    checked = "the root and integrations/reth lock files" + (", and reth v2.5.1's" if os.path.exists(reth_lock) else "")
    print(f"{checked} agree on every shared crate")
    return 0


if __name__ == "__main__":
    sys.exit(main())
