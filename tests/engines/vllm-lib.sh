# Shared by vllm-e2e.sh and vllm-bench.sh (sourced, not run): the engines venv (vLLM for CPU from
# PyPI, tests/engines/venv.sh), the jitship binary, the g++ shim and helpers of inductor-lib.sh,
# a tiny local model, and a runner that starts each vLLM worker as a fresh process with a clean
# environment, its own TMPDIR and VLLM_CACHE_ROOT. Facts on vLLM: docs/vllm.md.
source "$(dirname "${BASH_SOURCE[0]}")/inductor-lib.sh"
fail() { echo "FAIL: $*" >&2; exit 1; }
say() { printf -- '-- %s\n' "$*"; }
WORKER=$REPO/tests/engines/vllm_worker.py
# No model can be downloaded here: a tiny Llama with random weights, made once per run.
MODEL_DIR=$WORK/model
"$PY" "$WORKER" model "$MODEL_DIR" > "$WORK/model.log" 2>&1 || { cat "$WORK/model.log"; exit 1; }

# vllm_as DIR [VAR=VALUE...] -- CMD...: CMD as a vLLM worker whose TMPDIR is DIR/tmp, whose
# VLLM_CACHE_ROOT is DIR/vllm and whose g++ calls are logged to DIR/gxx.log; AOT compile as
# $AOT (1 or 0). The engine core runs in-process (its torch counters are the script's).
vllm_as() (
    local dir=$1; shift
    local extra=()
    while [ "$1" != -- ]; do extra+=("$1"); shift; done
    shift
    mkdir -p "$dir/tmp"
    exec env -i PATH="$WORK/shim:$BASE_PATH" HOME="$HOME" USER="$RUN_USER" LOGNAME="$RUN_USER" \
        TMPDIR="$dir/tmp" VLLM_CACHE_ROOT="$dir/vllm" VLLM_USE_AOT_COMPILE="$AOT" \
        HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1 VLLM_CPU_KVCACHE_SPACE=1 \
        VLLM_ENABLE_V1_MULTIPROCESSING=0 GXX_LOG="$dir/gxx.log" \
        RUST_LOG="${RUST_LOG:-warn}" "${extra[@]}" "$@"
)

# generate DIR [VAR=VALUE...]: the worker's greedy generate; its log is DIR/run.log.
generate() {
    local dir=$1; shift
    vllm_as "$dir" "$@" -- "$PY" "$WORKER" generate "$MODEL_DIR" > "$dir/run.log" 2>&1 \
        || { tail -50 "$dir/run.log"; fail "vLLM worker in $dir failed"; }
}

# vLLM's own "init engine (profile, create kv cache, warmup model) took N s" from a run's log.
init_engine_s() { sed -nE 's/.*init engine .* took ([0-9.]+) s.*/\1/p' "$1" | tail -1; }
