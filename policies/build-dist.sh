#!/bin/sh
# Rebuilds every built-in policy (policies/<kind>/) to a component and writes policies/dist/<kind>.wasm,
# the files crates/policy/src/builtin.rs embeds. Same build as `jitship policy build`
# (wasm32-unknown-unknown, reproducible `policy` profile, paths remapped), so the bytes do not depend
# on the checkout path. Needs: rustup target add wasm32-unknown-unknown
set -eu
cd "$(dirname "$0")/.."
mkdir -p policies/dist
# jitship embeds these files, so they must exist before it can compile (a new kind starts empty).
for d in policies/*/; do
    k=$(basename "$d")
    [ "$k" = common ] || [ "$k" = dist ] || [ -e "policies/dist/$k.wasm" ] || : > "policies/dist/$k.wasm"
done
JITSHIP_WRITE_DIST=1 cargo test -p jitship-tests --test policy_dist -- --nocapture
# A second pass proves the written files are what the sources build (and that jitship embeds them).
exec "$(dirname "$0")/check-dist.sh"
