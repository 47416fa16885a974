#!/usr/bin/env bash
# Benchmark (not a test): does a vLLM worker start as warm from `jitship install` as from its own
# warm cache? vLLM's own "init engine (profile, create kv cache, warmup model) took N s" line and
# the whole start's wall time (the process, model load and generate included), a tiny local
# Llama, every run a fresh process. Per compile mode (VLLM_BENCH_AOT, default "0 1"):
# one cold run, `jitship publish --engine vllm`, then local warm (same VLLM_CACHE_ROOT, same
# TMPDIR) x3 and after `jitship install --engine vllm` into a new absolute VLLM_CACHE_ROOT with a
# fresh TMPDIR x3. Prints medians and the ratio installed / local warm (goal <= 1.1).
#
#   JITSHIP_PROFILE=release tests/engines/vllm-bench.sh
source "$(dirname "$0")/vllm-lib.sh"
trap '[ -n "${JITSHIP_KEEP_WORK:-}" ] && echo "kept $WORK" || rm -rf "$WORK"' EXIT
calc() { python3 -c "print(round($1, 2))"; }
median() { printf '%s\n' "$@" | sort -g | sed -n "$(( ($# + 1) / 2 ))p"; }
echo "machine: $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg); $("$PY" -c 'import vllm, torch; print("vllm", vllm.__version__, "torch", torch.__version__)' 2>/dev/null)"

for AOT in ${VLLM_BENCH_AOT:-0 1}; do
    M=$WORK/aot$AOT
    STORE=local:$M/store
    P=$M/producer
    mkdir -p "$P"
    t0=$(now)
    generate "$P"
    COLD_WALL=$(calc "$(now) - $t0")
    COLD=$(init_engine_s "$P/run.log")
    vllm_as "$P" -- "$JITSHIP" publish --config "$CONFIG" --store "$STORE" --engine vllm > "$M/publish.log" \
        || { cat "$M/publish.log"; fail "publish"; }
    WARM=() WARM_WALL=()
    for i in 1 2 3; do
        t0=$(now)
        generate "$P"
        WARM_WALL+=("$(calc "$(now) - $t0")")
        WARM+=("$(init_engine_s "$P/run.log")")
    done
    INSTALLED=() INSTALLED_WALL=() INSTALL=() NEW_SO=()
    for i in 1 2 3; do
        C=$M/consumer$i/some/other/place
        mkdir -p "$C"
        t0=$(now)
        vllm_as "$C" -- "$JITSHIP" install --config "$CONFIG" --store "$STORE" --engine vllm > "$C.install.log" \
            || { cat "$C.install.log"; fail "install"; }
        INSTALL+=("$(calc "$(now) - $t0")")
        before=$(so_count "$C")
        t0=$(now)
        generate "$C"
        INSTALLED_WALL+=("$(calc "$(now) - $t0")")
        INSTALLED+=("$(init_engine_s "$C/run.log")")
        NEW_SO+=("$(( $(so_count "$C") - before ))")
    done
    W=$(median "${WARM[@]}") WW=$(median "${WARM_WALL[@]}")
    I=$(median "${INSTALLED[@]}") IW=$(median "${INSTALLED_WALL[@]}")
    printf '\nVLLM_USE_AOT_COMPILE=%s\n' "$AOT"
    printf '%-48s %-34s %s\n' "run" "vLLM init engine, s" "whole start (wall), s"
    printf '%-48s %-34s %s\n' "cold (empty caches, empty TMPDIR)" "$COLD" "$COLD_WALL"
    printf '%-48s %-34s %s\n' "local warm (same root, same TMPDIR)" "$W (median of ${WARM[*]})" "$WW (median of ${WARM_WALL[*]})"
    printf '%-48s %-34s %s\n' "after jitship install (new root, new TMPDIR)" "$I (median of ${INSTALLED[*]})" "$IW (median of ${INSTALLED_WALL[*]})"
    printf '%-48s %-34s %s   (new .so per run: %s)\n' "ratio installed / local warm" "$(calc "$I / $W")" "$(calc "$IW / $WW")" "${NEW_SO[*]}"
    printf '%-48s %s s (median of %s; %s stored)\n' "jitship install --engine vllm" \
        "$(median "${INSTALL[@]}")" "${INSTALL[*]}" "$(du -sh "$M/store" | cut -f1)"
done
