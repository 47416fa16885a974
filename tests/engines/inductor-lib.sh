# Shared by inductor-e2e.sh and inductor-bench.sh (sourced, not run): the real engine (torch from
# PyPI, tests/engines/venv.sh), the jitship binary, a g++ shim that logs every call, and runners
# that start each role as a fresh process with a clean environment, its own TMPDIR and cache dir.
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
PY=$("$REPO/tests/engines/venv.sh")
VENV=$(dirname "$(dirname "$PY")")
if [ -z "${JITSHIP_BIN:-}" ]; then
    (cd "$REPO" && cargo build -q -p jitship ${JITSHIP_PROFILE:+--profile "$JITSHIP_PROFILE"})
    JITSHIP_BIN=$REPO/target/${JITSHIP_PROFILE:-debug}/jitship
    [ "${JITSHIP_PROFILE:-}" = dev ] && JITSHIP_BIN=$REPO/target/debug/jitship
fi
JITSHIP=$JITSHIP_BIN
MODEL=$REPO/tests/engines/inductor_model.py
RUN_USER=${USER:-$(id -un)}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/jitship-inductor.XXXXXX")
STORE=local:$WORK/store
BASE_PATH=${PATH}

# A g++ that logs its arguments to $GXX_LOG and runs the real one with argv[0] = g++, itself
# dropped from PATH (gcc finds its own programs through argv[0] and PATH;
# docs/inductor-cpu.md#detecting-a-hit).
REAL_GXX=$(command -v g++)
mkdir -p "$WORK/shim"
cat > "$WORK/shim/g++" <<SHIM
#!/usr/bin/env bash
printf '%s\n' "\$*" >> "\${GXX_LOG:-/dev/null}"
PATH=$BASE_PATH exec -a g++ $REAL_GXX "\$@"
SHIM
chmod +x "$WORK/shim/g++"

# jitship's config: the engine's interpreter (the facts come from it).
config_for() { # PYTHON -> prints a config path
    local cfg="$WORK/jitship-$(echo "$1" | cksum | cut -d' ' -f1).toml"
    printf '[gather]\npython = "%s"\n' "$1" > "$cfg"
    echo "$cfg"
}
CONFIG=$(config_for "$PY")

# run_as DIR [VAR=VALUE...] -- CMD...: CMD in a clean environment whose TMPDIR is DIR/tmp, whose
# Inductor cache is DIR/cache and whose g++ calls are logged to DIR/gxx.log. A subshell that
# execs CMD; `run_as ... &` may still give the pid of a shell around it (see exec_pid).
run_as() (
    local dir=$1; shift
    local extra=()
    while [ "$1" != -- ]; do extra+=("$1"); shift; done
    shift
    mkdir -p "$dir/tmp"
    exec env -i PATH="$WORK/shim:$BASE_PATH" HOME="$HOME" USER="$RUN_USER" LOGNAME="$RUN_USER" \
        TMPDIR="$dir/tmp" TORCHINDUCTOR_CACHE_DIR="$dir/cache" GXX_LOG="$dir/gxx.log" \
        RUST_LOG="${RUST_LOG:-warn}" "${extra[@]}" "$@"
)

# The two roots of a role: the Inductor cache and the precompiled headers in its own TMPDIR.
caches_of() { # DIR
    echo "--cache inductor=$1/cache --cache inductor-pch=$1/tmp/torchinductor_$RUN_USER/precompiled_headers"
}

# result FILE KEY: a value from the RESULT line the model printed (dotted keys for counters).
result() {
    python3 - "$1" "$2" <<'PYEOF'
import json, sys
line = next(l for l in open(sys.argv[1]) if l.startswith("RESULT "))
v = json.loads(line[7:])
for k in sys.argv[2].split("."):
    v = v.get(k, 0) if isinstance(v, dict) else 0
print(v)
PYEOF
}

so_count() { find "$1" -name '*.so' 2>/dev/null | wc -l; }
# g++ calls that compiled something (a .cpp source or a header into a .gch), not -v/--version/-E.
compiles_in() { grep -cE '\.cpp( |$)|c\+\+-header' "$1" 2>/dev/null || true; }

now() { date +%s.%N; }

# exec_pid PID NAME: the process running NAME for a `run_as ... &` started as PID. Bash may fork
# once more for the subshell body, so NAME is PID itself or its child; waits (up to 10 s) for the
# exec to happen, so a signal reaches the program, not a shell that would die of it.
exec_pid() {
    local pid=$1 name=$2 child i
    for i in $(seq 100); do
        [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$name" ] && { echo "$pid"; return; }
        for child in $(pgrep -P "$pid"); do
            [ "$(cat "/proc/$child/comm" 2>/dev/null)" = "$name" ] && { echo "$child"; return; }
        done
        sleep 0.1
    done
    echo "exec_pid: no $name under $pid" >&2
    return 1
}
