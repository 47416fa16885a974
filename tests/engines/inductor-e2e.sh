#!/usr/bin/env bash
# TorchInductor on CPU, end to end with the real engine: a worker starts warm from what jitship
# installs, and a worker that torch would miss on or fail on gets a jitship miss instead.
#
#   tests/engines/inductor-e2e.sh        # JITSHIP_ENGINES_VENV (see venv.sh), JITSHIP_BIN optional
#
# 1. `jitship watch` on an empty Inductor root and the producer's precompiled-header directory;
#    a cold producer `torch.compile`; SIGTERM to the watcher (its final publish).
# 2. `jitship install` into a different absolute path with a fresh TMPDIR, as another worker
#    would; the consumer must show FX-graph and AOTAutograd cache hits, no new `.so`, no g++
#    compile (logged by a g++ shim on PATH), output equal to eager; `jitship audit` agrees.
# 3. Consumers that differ (fewer threads, another ISA tier, the venv at another path) get exit 11.
source "$(dirname "$0")/inductor-lib.sh"
WATCH_PID=
cleanup() {
    [ -n "$WATCH_PID" ] && { pkill -P "$WATCH_PID" 2>/dev/null; kill "$WATCH_PID" 2>/dev/null; } || true
    [ -n "${JITSHIP_KEEP_WORK:-}" ] && echo "kept $WORK" || rm -rf "$WORK"
}
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
say() { printf -- '-- %s\n' "$*"; }

P=$WORK/producer
C=$WORK/consumer/at/another/absolute/path
say "facts on this machine (as the producer sees them)"
run_as "$P" -- "$JITSHIP" facts --config "$CONFIG" | grep -E '^(cpu|cxx|inductor|python|pkg.torch|os)\.' || true
ISA=$(run_as "$P" -- "$JITSHIP" facts --config "$CONFIG" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["facts"].get("cpu.isa",""))')
THREADS=$(run_as "$P" -- "$JITSHIP" facts --config "$CONFIG" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["facts"].get("cpu.threads",""))')
[ -n "$ISA" ] && [ -n "$THREADS" ] || fail "cpu.isa / cpu.threads not gathered"

say "producer: jitship watch on empty roots, then a cold torch.compile"
# shellcheck disable=SC2046
run_as "$P" -- "$JITSHIP" watch --config "$CONFIG" --store "$STORE" $(caches_of "$P") \
    --settle 2s --min-interval 1s --grace 300s > "$WORK/watch.log" 2>&1 &
WATCH_PID=$!
run_as "$P" -- "$PY" "$MODEL" > "$P/run.log" 2>&1 || { cat "$P/run.log"; fail "producer run failed"; }
grep RESULT "$P/run.log"
[ "$(result "$P/run.log" inductor.fxgraph_cache_miss)" -ge 1 ] || fail "the producer was not cold"
kill -TERM "$(exec_pid "$WATCH_PID" jitship)"
WATCH_RC=0; wait "$WATCH_PID" || WATCH_RC=$?
[ "$WATCH_RC" = 0 ] || { cat "$WORK/watch.log"; fail "watch did not stop cleanly (exit $WATCH_RC)"; }
WATCH_PID=
"$JITSHIP" ls --store "$STORE"

say "consumer: install into $C with a fresh TMPDIR, then the same torch.compile"
# shellcheck disable=SC2046
run_as "$C" -- "$JITSHIP" install --config "$CONFIG" --store "$STORE" $(caches_of "$C") \
    || fail "install exited $?"
BEFORE=$(so_count "$C/cache")
[ "$BEFORE" -gt 0 ] || fail "no kernel .so installed"
run_as "$C" -- "$PY" "$MODEL" > "$C/run.log" 2>&1 || { cat "$C/run.log"; fail "consumer run failed"; }
grep RESULT "$C/run.log"
[ "$(result "$C/run.log" inductor.fxgraph_cache_hit)" -ge 1 ] || fail "no FX-graph cache hit"
[ "$(result "$C/run.log" inductor.fxgraph_cache_miss)" -eq 0 ] || fail "an FX-graph cache miss"
[ "$(result "$C/run.log" aot_autograd.autograd_cache_hit)" -ge 1 ] || fail "no AOTAutograd cache hit"
[ "$(result "$C/run.log" equal_to_eager)" = True ] || fail "compiled output differs from eager"
AFTER=$(so_count "$C/cache")
[ "$AFTER" -eq "$BEFORE" ] || fail "$((AFTER - BEFORE)) new .so files: kernels were recompiled"
COMPILES=$(compiles_in "$C/gxx.log")
[ "$COMPILES" -eq 0 ] || { cat "$C/gxx.log"; fail "$COMPILES g++ compiles in the consumer"; }
# shellcheck disable=SC2046
run_as "$C" -- "$JITSHIP" audit $(caches_of "$C") || fail "jitship audit says the engine compiled anyway"
say "consumer warm: $BEFORE kernels installed, 0 new, 0 g++ compiles, FX and AOT hits"

expect_miss() { # WHAT DIR CONFIG [VAR=VALUE...]
    local what=$1 dir=$2 cfg=$3; shift 3
    local code=0
    # shellcheck disable=SC2046
    run_as "$dir" "$@" -- "$JITSHIP" install --config "$cfg" --store "$STORE" $(caches_of "$dir") \
        > "$dir.out" 2>&1 || code=$?
    cat "$dir.out"
    [ "$code" -eq 11 ] || fail "$what: install exited $code, want 11 (miss)"
    say "$what: jitship miss (exit 11)"
}
if [ "$THREADS" -gt 1 ]; then
    expect_miss "fewer threads (OMP_NUM_THREADS=1)" "$WORK/neg-threads" "$CONFIG" OMP_NUM_THREADS=1
else
    say "SKIPPED fewer threads: the producer already ran with 1 thread"
fi
if [ "$ISA" != default ]; then
    expect_miss "ISA tier default (ATEN_CPU_CAPABILITY=default)" "$WORK/neg-isa" "$CONFIG" ATEN_CPU_CAPABILITY=default
else
    say "SKIPPED ISA tier: this CPU has no vector tier to drop"
fi
ln -s "$VENV" "$WORK/venv-at-another-path"
expect_miss "venv at another path" "$WORK/neg-venv" "$(config_for "$WORK/venv-at-another-path/bin/python")"
say "PASS"
