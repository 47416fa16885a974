#!/usr/bin/env bash
# Builds jitship's OCI image from the release binary, with umoci (Debian's package; no daemon, no
# base image, nothing pulled): the binary, the glibc it runs on, and the Mooncake Store C library
# with what it loads. Facts and the layout: docs/guide/install.md ("The image").
#
#   release/image.sh BINARY VERSION LAYOUT      # writes the OCI image layout LAYOUT, tag VERSION
#
# The root filesystem, one layer:
#   /opt/jitship/bin/jitship        the stripped release binary (glibc 2.28 baseline);
#   /usr/local/bin/jitship          a link to it
#   /opt/jitship/mooncake/          libmooncake_store.so, its store_c.h and its private libraries from the pinned
#                                   tokenspeed-mooncake wheel, libcudart from nvidia-cuda-runtime
#                                   (pip's layout), and system/: the build machine's (Debian 12)
#                                   libraries it needs beyond glibc and libstdc++ (libibverbs,
#                                   libmlx5, libcurl and its own, libnuma), found through the
#                                   library's RPATH, which patchelf extends by $ORIGIN/../system.
#                                   So /opt/jitship copied into another image (an init container
#                                   does: examples/kubernetes) loads there too, given glibc 2.34+,
#                                   libstdc++ and, for a CUDA build, the GPU driver
#   /lib/x86_64-linux-gnu/...       glibc, libgcc_s and libstdc++ (Debian 12's)
#   /usr/lib/x86_64-linux-gnu/libibverbs, /etc/libibverbs.d   the mlx5 RDMA provider
#   /opt/jitship/mooncake/cuda-stub/libcuda.so.1   a stand-in for the NVIDIA driver
#                                   (tests/cluster/cuda_stub.c: every call answers "no device"),
#                                   last in the library's RPATH: jitship's Mooncake client moves
#                                   bytes from host memory and never needs the driver, but the CUDA
#                                   build links it; with the stub it loads in containers that have
#                                   no GPU (the init container and sidecar of examples/kubernetes)
#                                   and means the same in those that do. Only jitship's process
#                                   loads it (through that RPATH); nothing else in the container does
#   /bin/busybox, /bin/cp           busybox-static: an init container copies /opt/jitship out
#   /etc/ssl/certs/ca-certificates.crt, /tmp
# Config: entrypoint jitship, MOONCAKE_STORE_LIBRARY set, PATH=/usr/local/bin:/bin.
#
# Wheels are downloaded once into JITSHIP_CLUSTER_CACHE/wheels (default target/jitship-cluster,
# shared with tests/cluster/cluster.sh); Debian packages are installed when missing (root).
set -euo pipefail
[ $# -eq 3 ] || { echo "usage: $0 BINARY VERSION LAYOUT" >&2; exit 2; }
BINARY=$1 VERSION=$2 LAYOUT=$3
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
CACHE=${JITSHIP_CLUSTER_CACHE:-$REPO/target/jitship-cluster}
# The same pins as tests/cluster/cluster.sh (CLIB_WHEEL, CUDART_WHEEL) and release/wheel.py.
CLIB_WHEEL="tokenspeed-mooncake==0.3.13.post20261027"
CUDART_WHEEL="nvidia-cuda-runtime==13.0.96"
say() { echo "image: $*" >&2; }

case "$(uname -m)" in
    x86_64) arch=amd64 libdir=lib/x86_64-linux-gnu ld=lib64/ld-linux-x86-64.so.2 ;;
    aarch64) arch=arm64 libdir=lib/aarch64-linux-gnu ld=lib/ld-linux-aarch64.so.1 ;;
    *) say "unsupported architecture $(uname -m)"; exit 2 ;;
esac

packages=(umoci patchelf busybox-static libibverbs1 ibverbs-providers libcurl4 libnuma1 ca-certificates gcc)
missing=()
for p in "${packages[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
    say "installing ${missing[*]}"
    apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
fi

WORK=$(mktemp -d "${TMPDIR:-/tmp}/jitship-image.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
ROOT=$WORK/rootfs
mkdir -p "$ROOT/usr/local/bin" "$ROOT/$libdir" "$ROOT/bin" "$ROOT/usr/lib" "$ROOT/etc/ssl/certs" \
    "$ROOT/opt/jitship/bin" "$ROOT/opt/jitship/mooncake/system" "$ROOT/$(dirname "$ld")"
install -m 0755 "$BINARY" "$ROOT/opt/jitship/bin/jitship"
ln -s /opt/jitship/bin/jitship "$ROOT/usr/local/bin/jitship"

# The Mooncake C library, as pip lays it out (mooncake/, tokenspeed_mooncake.libs/, nvidia/).
mkdir -p "$CACHE/wheels"
python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.11 \
    --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 \
    -d "$CACHE/wheels" "$CLIB_WHEEL" "$CUDART_WHEEL" >&2
MC=$ROOT/opt/jitship/mooncake
python3 - "$MC" "$CACHE"/wheels/tokenspeed_mooncake-0.3.13.post20261027-cp311-*.whl \
    "$CACHE"/wheels/nvidia_cuda_runtime-13.0.96-*.whl <<'PY'
import sys, zipfile
dest, clib, cudart = sys.argv[1:4]
with zipfile.ZipFile(clib) as z:
    for n in z.namelist():
        # The C library, its header (jitship establishes the library's ABI from it) and its
        # private libraries only (not the Python modules nor the transfer-engine library the
        # Python client alone loads).
        if n in ("mooncake/libmooncake_store.so", "mooncake/include/store_c.h") \
                or n.startswith("tokenspeed_mooncake.libs/"):
            z.extract(n, dest)
with zipfile.ZipFile(cudart) as z:
    z.extract("nvidia/cu13/lib/libcudart.so.13", dest)
PY
LIB=$MC/mooncake/libmooncake_store.so

# The CUDA driver stub, private to the Mooncake library (see the header). No libc: it calls nothing.
mkdir -p "$WORK/cuda-stub" "$MC/cuda-stub"
gcc -shared -fPIC -O2 -Wall -nostdlib -Wl,-soname,libcuda.so.1 -o "$WORK/cuda-stub/libcuda.so.1" "$REPO/tests/cluster/cuda_stub.c"
install -m 0755 "$WORK/cuda-stub/libcuda.so.1" "$MC/cuda-stub/libcuda.so.1"

# The RDMA provider for Mellanox/NVIDIA NICs (libibverbs loads it by the .driver file).
mkdir -p "$ROOT/etc/libibverbs.d" "$ROOT/$libdir/libibverbs"
cp /etc/libibverbs.d/mlx5.driver "$ROOT/etc/libibverbs.d/"
provider=$(ls /"$libdir"/libibverbs/libmlx5-rdmav*.so 2>/dev/null || ls /usr/"$libdir"/libibverbs/libmlx5-rdmav*.so)
cp -L "$provider" "$ROOT/$libdir/libibverbs/"

# Every system library the binary, the C library and the provider need (ldd resolves them on this
# machine; the stub stands in for the driver): glibc's own, libgcc_s and libstdc++ into the
# image's library directory, the rest into the Mooncake directory's system/.
libs=$( { ldd "$BINARY"; LD_LIBRARY_PATH=$WORK/cuda-stub ldd "$LIB"; ldd "$provider"; } |
    awk '$2 == "=>" && $3 ~ /^\// { print $3 }' | grep -v -e "$MC/" -e "^$WORK/" | sort -u)
for l in $libs; do
    name=$(basename "$l")
    case "$name" in
        libc.so.* | libm.so.* | libdl.so.* | libpthread.so.* | librt.so.* | libresolv.so.* | ld-linux*.so.* | \
            libgcc_s.so.* | libstdc++.so.*) cp -L "$l" "$ROOT/$libdir/$name" ;;
        libibverbs.so.* | libmlx5.so.* | libnl-3.so.* | libnl-route-3.so.*)
            # Also beside the provider (the loader finds them there for the binary's own use).
            cp -L "$l" "$ROOT/$libdir/$name"; cp -L "$l" "$MC/system/$name" ;;
        *) cp -L "$l" "$MC/system/$name" ;;
    esac
done
patchelf --force-rpath --set-rpath '$ORIGIN/../tokenspeed_mooncake.libs:$ORIGIN/../nvidia/cu13/lib:$ORIGIN/../system:$ORIGIN/../cuda-stub' "$LIB"
# The dynamic loader at the path the binary names (PT_INTERP).
cp -L "/$ld" "$ROOT/$libdir/$(basename "$ld")"
ln -sf "/$libdir/$(basename "$ld")" "$ROOT/$ld"
if env -u LD_LIBRARY_PATH ldd "$LIB" | grep -q "not found"; then
    env -u LD_LIBRARY_PATH ldd "$LIB" | grep "not found" >&2
    say "FAIL: libmooncake_store.so needs libraries this machine lacks"
    exit 1
fi

cp /bin/busybox "$ROOT/bin/busybox"
ln -s busybox "$ROOT/bin/cp"
cp /etc/ssl/certs/ca-certificates.crt "$ROOT/etc/ssl/certs/"
mkdir -p "$ROOT/tmp" && chmod 1777 "$ROOT/tmp"

rm -rf "$LAYOUT"
umoci init --layout "$LAYOUT"
umoci new --image "$LAYOUT:$VERSION"
# One layer: the whole root filesystem at /. Owned by root, as the files here are.
umoci insert --image "$LAYOUT:$VERSION" "$ROOT" /
umoci config --image "$LAYOUT:$VERSION" --architecture "$arch" --os linux \
    --config.entrypoint /usr/local/bin/jitship --config.cmd --help \
    --config.env PATH=/usr/local/bin:/bin \
    --config.env MOONCAKE_STORE_LIBRARY=/opt/jitship/mooncake/mooncake/libmooncake_store.so \
    --config.workingdir / \
    --config.label "org.opencontainers.image.title=jitship" \
    --config.label "org.opencontainers.image.version=$VERSION" \
    --config.label "org.opencontainers.image.licenses=Apache-2.0"
umoci gc --layout "$LAYOUT"
say "$LAYOUT:$VERSION: rootfs $(du -sb "$ROOT" | cut -f1) bytes, layout $(du -sb "$LAYOUT" | cut -f1) bytes"
