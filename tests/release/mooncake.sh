#!/usr/bin/env bash
# The release's wheel and image against a real Mooncake Store, with nothing configured but the
# master: run inside the test cluster, after tests/release/release.sh wrote target/release-artifacts.
#
#   tests/cluster/cluster.sh run -- tests/release/mooncake.sh
#
# A producer installed from the wheel with the pinned tokenspeed-mooncake wheel beside it (what
# `pip install 'jitship[mooncake]'` installs; from the wheel files, no index) publishes a Triton
# cache to Mooncake: jitship finds libmooncake_store.so by itself. The image, unpacked with umoci
# and run under chroot with its own config's environment (MOONCAKE_STORE_LIBRARY names the library
# it carries) in a new mount and PID namespace, installs it from Mooncake: the files are the
# producer's. Keys go under a namespace of this run's own.
set -euo pipefail
cd "$(dirname "$0")/../.."
REPO=$PWD
say() { echo "release mooncake: $*" >&2; }
fail() { echo "release mooncake: FAIL: $*" >&2; exit 1; }
[ -n "${JITSHIP_TEST_MOONCAKE_MASTER:-}" ] || { echo "run inside tests/cluster/cluster.sh run -- $0" >&2; exit 2; }
OUT=${JITSHIP_RELEASE_OUT:-$REPO/target/release-artifacts}
version=$(ls "$OUT" | sed -n 's/^jitship-\(.*\)-linux-.*/\1/p')
[ -n "$version" ] || fail "no release in $OUT: run tests/release/release.sh first"
arch=$(uname -m)
wheel=$OUT/jitship-$version-py3-none-manylinux_2_28_$arch.whl
wheels=${JITSHIP_CLUSTER_CACHE:-$REPO/target/jitship-cluster}/wheels

WORK=$(mktemp -d "${TMPDIR:-/tmp}/jitship-release-mc.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
STORE=mooncake:$JITSHIP_TEST_MOONCAKE_MASTER
NS=release-check-$$-$RANDOM
facts=(--fact gpu.name="NVIDIA H100 80GB HBM3" --fact gpu.cc=9.0 --fact gpu.arch=sm_90 --fact driver.major=570
       --fact os.arch="$arch" --fact python.version=3.12.3 --fact pkg.triton=3.9.0)

python3.11 -m venv "$WORK/venv" 2>/dev/null || python3 -m venv "$WORK/venv"
"$WORK/venv/bin/pip" install -q --disable-pip-version-check --no-index --no-deps "$wheel" \
    "$wheels"/tokenspeed_mooncake-0.3.13.post20261027-cp311-*.whl "$wheels"/nvidia_cuda_runtime-13.0.96-*.whl
src=$WORK/producer/triton
for k in 1 2 3; do
    d=$src/$(printf '%052x' "$k")
    mkdir -p "$d"
    head -c $((k * 300000)) /dev/urandom > "$d/kernel_$k.cubin"
    printf '{"child_paths": {"kernel_%d.cubin": "%s/kernel_%d.cubin"}}\n' "$k" "$d" "$k" > "$d/__grp__kernel_$k.json"
done
env -u MOONCAKE_STORE_LIBRARY "$WORK/venv/bin/jitship" publish --store "$STORE" --namespace "$NS" \
    --cache triton="$src" "${facts[@]}" || fail "publish from the wheel (jitship[mooncake]) exited $?"
say "the wheel's jitship published to Mooncake, the library found by itself"

umoci unpack --image "$OUT/image:$version" "$WORK/bundle" > /dev/null
ROOTFS=$WORK/bundle/rootfs
mapfile -t IMAGE_ENV < <(python3 -c 'import json, sys; print("\n".join(json.load(open(sys.argv[1]))["process"]["env"]))' "$WORK/bundle/config.json")
ENTRYPOINT=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["process"]["args"][0])' "$WORK/bundle/config.json")
env -i "${IMAGE_ENV[@]}" MC_TCP_BIND_ADDRESS=127.0.0.1 MC_LOG_LEVEL=WARNING \
    unshare --mount --pid --fork --kill-child -- /usr/sbin/chroot "$ROOTFS" "$ENTRYPOINT" \
    install --store "$STORE" --namespace "$NS" --cache triton=/cache/triton "${facts[@]}" \
    || fail "jitship install from Mooncake in the image exited $?"
diff -r --exclude='__grp__*' "$src" "$ROOTFS/cache/triton" || fail "the image installed other files"
say "PASS: the image installed from Mooncake with its own library: the producer's files"
