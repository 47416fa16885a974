#!/bin/sh
# Rebuilds every built-in policy (policies/<kind>/) to a component and writes policies/dist/<kind>.wasm,
# the files crates/policy/src/builtin.rs embeds, with `jitship policy build` (wasm32-unknown-unknown,
# reproducible `policy` profile, paths remapped), so the bytes do not depend on the checkout path;
# and policies/dist/TOOLCHAIN, the rustc that built them. Needs: rustup target add wasm32-unknown-unknown
set -eu
cd "$(dirname "$0")/.."
mkdir -p policies/dist
kinds=""
for d in policies/*/; do
    k=$(basename "$d")
    [ "$k" = common ] || [ "$k" = dist ] || kinds="$kinds $k"
done
# jitship embeds these files, so they must exist before it can compile (a new kind starts empty).
for k in $kinds; do
    [ -e "policies/dist/$k.wasm" ] || : > "policies/dist/$k.wasm"
done
cargo build -p jitship --bin jitship
for k in $kinds; do
    target/debug/jitship policy build "policies/$k" --out "policies/dist/$k.wasm" \
        --target-dir target/policy-dist --locked
done
rustc -V > policies/dist/TOOLCHAIN
# A second pass proves the written files are what the sources build (and that jitship embeds them).
exec "$(dirname "$0")/check-dist.sh"
