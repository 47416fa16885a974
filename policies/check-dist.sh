#!/bin/sh
# Fails with "policies/dist/<kind>.wasm is stale: run `policies/build-dist.sh`" when a committed
# built-in policy module is not byte-for-byte what its sources build. Run by the README test command
# (it is the test `policy_dist` of the jitship-tests crate).
set -eu
cd "$(dirname "$0")/.."
exec cargo test -p jitship-tests --test policy_dist
