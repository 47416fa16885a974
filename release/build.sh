#!/usr/bin/env bash
# The release: one release build of jitship, and from it the three things users install.
#
#   release/build.sh [OUT]        # default OUT: target/release-artifacts
#
#   OUT/jitship-VERSION-linux-ARCH                    the stripped binary (glibc 2.28 or newer)
#   OUT/jitship-VERSION-py3-none-manylinux_2_28_ARCH.whl   `pip install` it: jitship on PATH,
#                                                     `python -m jitship`, the vLLM plugin
#   OUT/image/  (OCI image layout, tag VERSION)       the container image; copy it to a registry:
#       skopeo copy oci:OUT/image:VERSION docker://REGISTRY/jitship:VERSION
#
# The build is tests/release/glibc-baseline.sh's (cargo-zigbuild against glibc 2.28, checked:
# symbol versions, linked libraries, --version); the wheel (release/wheel.py) and the image
# (release/image.sh) only package that binary, nothing is compiled twice. Each step prints its
# wall time. tests/release/release.sh runs this and checks what it made (the suite's step).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-target/release-artifacts}
say() { echo "release: $*" >&2; }

t=$SECONDS
bin=$(./tests/release/glibc-baseline.sh)
say "binary built and checked in $((SECONDS - t)) s: $bin"
version=$("$bin" --version | awk '{ print $2 }')
arch=$(uname -m)
rm -rf "$OUT" && mkdir -p "$OUT"
cp "$bin" "$OUT/jitship-$version-linux-$arch"

t=$SECONDS
wheel=$(python3 release/wheel.py "$bin" "$version" "$OUT")
say "wheel in $((SECONDS - t)) s: $wheel ($(stat -c %s "$wheel") bytes)"

t=$SECONDS
./release/image.sh "$bin" "$version" "$OUT/image"
say "image in $((SECONDS - t)) s: $OUT/image:$version ($(du -sb "$OUT/image" | cut -f1) bytes as an OCI layout)"
echo "$OUT"
