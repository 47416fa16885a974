#!/usr/bin/env bash
# The release binary against an older glibc: the Kubernetes examples copy jitship into the server's
# image (examples/kubernetes/README.md), so it must run on that image's glibc, not on the build
# machine's. Builds `jitship` in the release profile with cargo-zigbuild (zig's linker and its glibc
# stubs for the baseline), strips a copy, and fails if that copy needs a glibc symbol version above
# the baseline, links a shared library beyond glibc's own and libgcc_s (libmooncake_store.so and
# NVML are loaded at run time with dlopen, never linked), or does not run.
#
#   tests/release/glibc-baseline.sh                 # build and check; prints the stripped binary's path
#   tests/release/glibc-baseline.sh --check FILE    # check a binary built elsewhere, no build
#
# Tools: cargo-zigbuild and zig (its dependency `ziglang`) from PyPI, pinned, in a venv cached
# outside the checkout like tests/engines/venv.sh (~/.cache/jitship/zig-venv, 440 MB;
# JITSHIP_ZIG_VENV moves it). JITSHIP_GLIBC_BASELINE sets the baseline (default 2.28: RHEL 8 and
# its rebuilds, Debian 10; Ubuntu 20.04 has 2.31). The build goes to $CARGO_TARGET_DIR (default
# target/) under <triple>/release, beside the unstripped binary and its jitship.dwp; it shares no
# artifacts with a plain `cargo build --release`.
set -euo pipefail
cd "$(dirname "$0")/../.."

BASELINE=${JITSHIP_GLIBC_BASELINE:-2.28}
VENV=${JITSHIP_ZIG_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/jitship/zig-venv}
PINS="cargo-zigbuild==0.24.1 ziglang==0.17.1"
TARGET_DIR=${CARGO_TARGET_DIR:-$PWD/target}

say() { echo "glibc-baseline: $*" >&2; }

binutils() {
    if ! command -v readelf >/dev/null || ! command -v strip >/dev/null || ! command -v objdump >/dev/null; then
        apt-get update -q >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q binutils >&2
    fi
}

check() {
    local bin=$1 versions highest needed lib size
    # Every version the binary needs from glibc's libraries (.gnu.version_r, which strip keeps).
    versions=$(readelf --version-info --wide "$bin" | grep -o 'Name: GLIBC_[A-Z0-9_.]*' | sed 's/^Name: GLIBC_//' | sort -u)
    if printf '%s\n' "$versions" | grep -qv '^[0-9][0-9.]*$'; then
        say "FAIL: $bin needs glibc versions without a number: $(printf '%s\n' "$versions" | grep -v '^[0-9][0-9.]*$' | tr '\n' ' ')"
        return 1
    fi
    highest=$(printf '%s\n' "$versions" | sort -V | tail -1)
    needed=$(readelf --dynamic --wide "$bin" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' | tr '\n' ' ')
    size=$(stat -c %s "$bin")
    say "$bin: highest glibc symbol version GLIBC_$highest (baseline $BASELINE), $size bytes ($((size / 1024 / 1024)) MiB)"
    say "shared libraries needed: $needed"
    if [ "$(printf '%s\n%s\n' "$highest" "$BASELINE" | sort -V | tail -1)" != "$BASELINE" ]; then
        say "FAIL: $bin needs GLIBC_$highest, above the baseline $BASELINE; the symbols that need it:"
        objdump -T "$bin" | grep -F "(GLIBC_$highest)" >&2 || true
        return 1
    fi
    for lib in $needed; do
        case "$lib" in
            libc.so.6 | libm.so.6 | libdl.so.2 | libpthread.so.0 | librt.so.1 | libgcc_s.so.1 | ld-linux-x86-64.so.2 | ld-linux-aarch64.so.1) ;;
            *) say "FAIL: $bin links $lib (only glibc's libraries and libgcc_s may be linked; Mooncake and NVML are loaded at run time)"; return 1 ;;
        esac
    done
    say "runs: $("$bin" --version)"
}

if [ "${1:-}" = --check ]; then
    [ $# -eq 2 ] || { echo "usage: $0 [--check FILE]" >&2; exit 2; }
    binutils
    check "$2"
    exit
fi
[ $# -eq 0 ] || { echo "usage: $0 [--check FILE]" >&2; exit 2; }

case "$(uname -m)" in
    x86_64) triple=x86_64-unknown-linux-gnu ;;
    aarch64) triple=aarch64-unknown-linux-gnu ;;
    *) say "unsupported host architecture $(uname -m) (x86_64 and aarch64 only: the binary is run to check it)"; exit 2 ;;
esac

# The tools, once per machine (a stamp names the pins; a lock lets parallel callers wait).
ready() { [ -x "$VENV/bin/cargo-zigbuild" ] && [ "$(cat "$VENV/.jitship-pins" 2>/dev/null)" = "$PINS" ]; }
if ! ready; then
    mkdir -p "$(dirname "$VENV")"
    exec 9>"$VENV.lock"
    flock 9
    if ! ready; then
        say "installing $PINS into $VENV"
        rm -rf "$VENV"
        python3.11 -m venv "$VENV" 2>/dev/null || python3 -m venv "$VENV"
        # shellcheck disable=SC2086 # PINS is a list of requirements
        "$VENV/bin/pip" install -q --disable-pip-version-check --no-cache-dir $PINS >&2
        echo "$PINS" > "$VENV/.jitship-pins"
    fi
    exec 9>&-
fi
binutils
rustup target add "$triple" >&2

# cargo-zigbuild runs zig as `python3 -m ziglang` when no `zig` is on PATH: the venv first makes
# that the pinned one, and keeps another zig on the machine out of it.
export PATH="$VENV/bin:$PATH"
start=$SECONDS
# `-p jitship` resolves features as `cargo build --release -p jitship` (examples/quickstart.sh).
cargo zigbuild --release --locked -p jitship --bin jitship --target "$triple.$BASELINE" >&2
say "build: $((SECONDS - start)) s"

bin="$TARGET_DIR/$triple/release/jitship"
stripped="$TARGET_DIR/$triple/release/jitship-glibc$BASELINE"
strip -o "$stripped" "$bin"
say "unstripped: $(($(stat -c %s "$bin") / 1024 / 1024)) MiB (symbolize its backtraces with jitship.dwp beside it)"
check "$stripped"
echo "$stripped"
