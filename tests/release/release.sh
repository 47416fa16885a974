#!/usr/bin/env bash
# The release command (release/build.sh) and what it makes, checked: the suite's release step.
#
#   tests/release/release.sh
#
# 1. release/build.sh: one release build, glibc 2.28 baseline checked (glibc-baseline.sh), the
#    wheel and the OCI image packaged from it.
# 2. The wheel: its file name and WHEEL tag are py3-none-manylinux_2_28_<arch>, pip on this machine
#    accepts the tag, it holds the very binary the baseline check passed, and installed into a
#    throwaway venv `jitship --version` and `python -m jitship --version` run it, the vLLM plugin
#    entry point is registered, and with the pinned tokenspeed-mooncake wheel beside it (what
#    `jitship[mooncake]` installs) jitship loads libmooncake_store.so with nothing configured.
# 3. The image: pushed with skopeo to Debian's docker-registry on 127.0.0.1, pulled back, unpacked
#    with umoci and run under chroot in a new mount and PID namespace (unshare --kill-child:
#    nothing outlives it): `jitship --version`, a `jitship install` from a local store mounted
#    into it (the files match the producer's), and the Mooncake library it carries loads; then the
#    Kubernetes examples' jitship-setup init container script, run in it as a pod runs it.
# Nothing keeps running afterwards: the registry is stopped and its directory removed.
set -euo pipefail
cd "$(dirname "$0")/../.."
REPO=$PWD
say() { echo "release check: $*" >&2; }
fail() { echo "release check: FAIL: $*" >&2; exit 1; }

for p in docker-registry skopeo umoci; do
    command -v "$p" >/dev/null || missing="${missing:-} $p"
done
if [ -n "${missing:-}" ]; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $missing
fi

WORK=$(mktemp -d "${TMPDIR:-/tmp}/jitship-release.XXXXXX")
REG_PID=
cleanup() {
    if [ -n "$REG_PID" ]; then kill "$REG_PID" 2>/dev/null; wait "$REG_PID" 2>/dev/null || true; fi
    rm -rf "$WORK"
}
trap cleanup EXIT

t0=$SECONDS
OUT=$(./release/build.sh "$REPO/target/release-artifacts")
t_build=$((SECONDS - t0))
version=$(ls "$OUT" | sed -n 's/^jitship-\(.*\)-linux-.*/\1/p')
arch=$(uname -m)
bin=$OUT/jitship-$version-linux-$arch
say "version $version; binary $(stat -c %s "$bin") bytes"

# --- the wheel ---------------------------------------------------------------------------------
t1=$SECONDS
tag=py3-none-manylinux_2_28_$arch
wheel=$OUT/jitship-$version-$tag.whl
[ -f "$wheel" ] || fail "no wheel named $(basename "$wheel") in $OUT: $(ls "$OUT")"
python3 - "$wheel" "$tag" "$bin" <<'PY' || fail "the wheel's contents"
import hashlib, sys, zipfile
from pip._vendor.packaging.tags import sys_tags
from pip._vendor.packaging.utils import parse_wheel_filename
wheel, tag, binary = sys.argv[1:4]
_, _, _, tags = parse_wheel_filename(wheel.rsplit("/", 1)[-1])
assert {str(t) for t in tags} == {tag}, tags
assert any(t in tags for t in sys_tags()), f"pip here does not accept {tag}"
z = zipfile.ZipFile(wheel)
info = next(n for n in z.namelist() if n.endswith(".dist-info/WHEEL"))
lines = z.read(info).decode().splitlines()
assert f"Tag: {tag}" in lines and "Root-Is-Purelib: false" in lines, lines
inside = z.read("jitship/bin/jitship")
assert hashlib.sha256(inside).digest() == hashlib.sha256(open(binary, "rb").read()).digest(), \
    "the wheel's binary is not the checked release binary"
assert (z.getinfo("jitship/bin/jitship").external_attr >> 16) & 0o111, "the binary is not executable"
print(f"wheel: tag {tag}, binary identical to the checked one")
PY
python3.11 -m venv "$WORK/venv" 2>/dev/null || python3 -m venv "$WORK/venv"
"$WORK/venv/bin/pip" install -q --no-index --no-deps "$wheel"
[ "$("$WORK/venv/bin/jitship" --version)" = "jitship $version" ] || fail "jitship --version from the wheel"
[ "$("$WORK/venv/bin/python" -m jitship --version)" = "jitship $version" ] || fail "python -m jitship --version"
"$WORK/venv/bin/python" -c '
from importlib.metadata import entry_points
eps = [e.value for e in entry_points(group="vllm.general_plugins") if e.name == "jitship"]
assert eps == ["jitship.vllm_plugin:register"], eps
import jitship.vllm_plugin' || fail "the vLLM plugin entry point"
say "wheel: jitship and python -m jitship run the release binary; vllm.general_plugins names jitship"

# jitship[mooncake]: the pinned tokenspeed-mooncake wheel (and the CUDA runtime it requires),
# installed from the files release/image.sh downloaded, is found with nothing configured. On a
# machine without an NVIDIA driver the library needs the driver stub to load (docs/mooncake.md).
wheels=${JITSHIP_CLUSTER_CACHE:-$REPO/target/jitship-cluster}/wheels
"$WORK/venv/bin/pip" install -q --no-index --no-deps "$wheels"/tokenspeed_mooncake-0.3.13.post20261027-cp311-*.whl \
    "$wheels"/nvidia_cuda_runtime-13.0.96-*.whl
mkdir -p "$WORK/stub"
gcc -shared -fPIC -O2 -Wl,-soname,libcuda.so.1 -o "$WORK/stub/libcuda.so.1" tests/cluster/cuda_stub.c
ld=$WORK/stub
ldconfig -p | grep -q 'libcuda\.so\.1 ' && ld=
code=0
env -u MOONCAKE_STORE_LIBRARY LD_LIBRARY_PATH="$ld" "$WORK/venv/bin/jitship" ls --store mooncake:127.0.0.1:1 \
    > "$WORK/mc.out" 2>&1 || code=$?
cat "$WORK/mc.out"
[ "$code" -ne 0 ] && grep -q "127.0.0.1:1 unreachable" "$WORK/mc.out" \
    || fail "with jitship[mooncake] installed, jitship did not load libmooncake_store.so by itself"
say "wheel: with tokenspeed-mooncake installed the library loads unconfigured (the probe of a closed port fails after it)"
t_wheel=$((SECONDS - t1))

# --- the image ---------------------------------------------------------------------------------
t2=$SECONDS
# Debian's docker-registry on 127.0.0.1, a port the kernel picks; its log line says which.
mkdir -p "$WORK/registry"
printf 'version: 0.1\nlog:\n  level: info\nstorage:\n  filesystem:\n    rootdirectory: %s\nhttp:\n  addr: 127.0.0.1:0\n' \
    "$WORK/registry/data" > "$WORK/registry/config.yml"
mkfifo "$WORK/registry/log"
docker-registry serve "$WORK/registry/config.yml" 2> "$WORK/registry/log" > /dev/null &
REG_PID=$!
exec 3< "$WORK/registry/log"
addr=
while IFS= read -r line <&3; do
    case "$line" in *"listening on "*) addr=$(sed -E 's/.*listening on ([0-9.:]+).*/\1/' <<<"$line"); break ;; esac
done
[ -n "$addr" ] || fail "docker-registry did not say where it listens"
cat <&3 > "$WORK/registry/rest.log" &   # keep draining its log
ref=$addr/jitship:$version
skopeo copy -q --dest-tls-verify=false "oci:$OUT/image:$version" "docker://$ref"
skopeo copy -q --src-tls-verify=false "docker://$ref" "oci:$WORK/pulled:$version"
umoci unpack --image "$WORK/pulled:$version" "$WORK/bundle" > /dev/null
ROOTFS=$WORK/bundle/rootfs
unpacked=$(du -sb "$ROOTFS" | cut -f1)
# The image's own environment and entrypoint (umoci writes them into the bundle's config.json
# from the image config), inside a new mount and PID namespace.
mapfile -t IMAGE_ENV < <(python3 -c 'import json, sys; print("\n".join(json.load(open(sys.argv[1]))["process"]["env"]))' "$WORK/bundle/config.json")
ENTRYPOINT=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["process"]["args"][0])' "$WORK/bundle/config.json")
run_image() {
    env -i "${IMAGE_ENV[@]}" unshare --mount --pid --fork --kill-child -- /usr/sbin/chroot "$ROOTFS" "$ENTRYPOINT" "$@"
}
[ "$(run_image --version)" = "jitship $version" ] || fail "jitship --version in the image"
say "image $ref: pushed, pulled, unpacked; jitship --version runs in it"

# A producer on this machine publishes a Triton cache into a store inside the image's root; the
# image installs it (the same facts; the image has no Python, so they are given).
facts=(--fact gpu.name="NVIDIA H100 80GB HBM3" --fact gpu.cc=9.0 --fact gpu.arch=sm_90 --fact driver.major=570
       --fact os.arch="$arch" --fact python.version=3.12.3 --fact pkg.triton=3.9.0)
src=$WORK/producer/triton
for k in 1 2 3; do
    d=$src/$(printf '%052x' "$k")
    mkdir -p "$d"
    head -c $((k * 1000)) /dev/urandom > "$d/kernel_$k.cubin"
    printf '{"child_paths": {"kernel_%d.cubin": "%s/kernel_%d.cubin"}}\n' "$k" "$d" "$k" > "$d/__grp__kernel_$k.json"
done
"$bin" publish --store "local:$ROOTFS/store" --cache triton="$src" "${facts[@]}" > /dev/null
run_image install --store local:/store --cache triton=/cache/triton "${facts[@]}" > "$WORK/install.out" \
    || { cat "$WORK/install.out"; fail "jitship install in the image exited $?"; }
diff -r --exclude='__grp__*' "$src" "$ROOTFS/cache/triton" || fail "the image installed other files"
grep -q '"/cache/triton/' "$ROOTFS/cache/triton/$(printf '%052x' 1)/__grp__kernel_1.json" \
    || fail "group files were not relocated to the image's root"
say "image: jitship install from a local store, files identical to the producer's"

code=0
run_image ls --store mooncake:127.0.0.1:1 > "$WORK/mc-image.out" 2>&1 || code=$?
[ "$code" -ne 0 ] && grep -q "127.0.0.1:1 unreachable" "$WORK/mc-image.out" \
    || { cat "$WORK/mc-image.out"; fail "the image's Mooncake library did not load"; }
say "image: its libmooncake_store.so loads (MOONCAKE_STORE_LIBRARY from the image config: ${IMAGE_ENV[*]})"
# The Kubernetes examples' jitship-setup init container (examples/kubernetes/run.yaml), run in the
# image as the pod runs it: with trust.yaml's placeholder key it stops and names trust.yaml; with a
# key it copies /opt/jitship into /jitship and writes the config with the pod's IP, and jitship runs
# from there with the Mooncake library it copied.
python3 - "$ROOTFS" <<'PY' || fail "reading the Kubernetes examples"
import os, re, sys
root = sys.argv[1]
def block(path, after, start):
    """The block scalar that follows the first line matching `start` after a line matching `after`."""
    lines = open(path).read().splitlines()
    i = next(n for n, l in enumerate(lines) if re.search(after, l))
    i = next(n for n in range(i, len(lines)) if re.search(start, lines[n]))
    body = []
    indent = None
    for l in lines[i + 1:]:
        if l.strip() and indent is None:
            indent = len(l) - len(l.lstrip())
        if l.strip() and len(l) - len(l.lstrip()) < indent:
            break
        body.append(l[indent:])
    return "\n".join(body).rstrip() + "\n"
ex = "examples/kubernetes"
open(f"{root}/setup.sh", "w").write(block(f"{ex}/run.yaml", r"name: jitship-setup", r"^\s+- \|$"))
os.makedirs(f"{root}/etc/jitship-template", exist_ok=True)
open(f"{root}/etc/jitship-template/jitship.toml", "w").write(block(f"{ex}/configmap.yaml", r"^data:", r"jitship.toml: \|"))
os.makedirs(f"{root}/etc/jitship-trust", exist_ok=True)
key = re.search(r'publisher.pub: "(.*)"', open(f"{ex}/trust.yaml").read()).group(1)
open(f"{root}/etc/jitship-trust/publisher.pub", "w").write(key + "\n")
PY
mkdir -p "$ROOTFS/jitship"
in_pod() { env -i POD_IP=10.1.2.3 unshare --mount --pid --fork --kill-child -- /usr/sbin/chroot "$ROOTFS" "$@"; }
code=0
in_pod /bin/busybox sh -ec "$(cat "$ROOTFS/setup.sh")" > "$WORK/setup.out" 2>&1 || code=$?
[ "$code" -ne 0 ] && grep -q "examples/kubernetes/trust.yaml" "$WORK/setup.out" \
    || { cat "$WORK/setup.out"; fail "jitship-setup accepted trust.yaml's placeholder key"; }
"$bin" key generate --out "$WORK/publisher.key" > /dev/null
cp "$WORK/publisher.key.pub" "$ROOTFS/etc/jitship-trust/publisher.pub"
in_pod /bin/busybox sh -ec "$(cat "$ROOTFS/setup.sh")" || fail "jitship-setup failed with a real key"
grep -qx 'local_hostname = "10.1.2.3"' "$ROOTFS/jitship/etc/jitship.toml" || fail "the rendered config does not name the pod IP"
[ "$(in_pod /jitship/bin/jitship --version)" = "jitship $version" ] || fail "/jitship/bin/jitship"
code=0
env -i MOONCAKE_STORE_LIBRARY=/jitship/mooncake/mooncake/libmooncake_store.so \
    unshare --mount --pid --fork --kill-child -- /usr/sbin/chroot "$ROOTFS" /jitship/bin/jitship \
    ls --store mooncake:127.0.0.1:1 > "$WORK/mc-copied.out" 2>&1 || code=$?
[ "$code" -ne 0 ] && grep -q "127.0.0.1:1 unreachable" "$WORK/mc-copied.out" \
    || { cat "$WORK/mc-copied.out"; fail "the copied Mooncake library did not load"; }
say "image: the Kubernetes examples' jitship-setup refuses the placeholder key, copies jitship out, writes the pod IP"
t_image=$((SECONDS - t2))

layer=$(du -sb "$OUT/image/blobs" | cut -f1)
say "PASS: build ${t_build} s, wheel checks ${t_wheel} s, image checks ${t_image} s"
say "sizes: binary $(stat -c %s "$bin") B, wheel $(stat -c %s "$wheel") B, image $layer B compressed (OCI blobs), $unpacked B unpacked"
