#!/bin/sh
# Fails with "policies/dist/<kind>.wasm is stale: run `policies/build-dist.sh`" when a committed
# built-in policy module is not byte-for-byte what its sources build. Run by the README test command
# (it is the test module `policy_dist` of the jitship-tests crate's e2e binary).
set -eu
cd "$(dirname "$0")/.."
exec cargo test -p jitship-tests --test e2e -- policy_dist::
