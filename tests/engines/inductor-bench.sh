#!/usr/bin/env bash
# Benchmark (not a test): does a worker start as warm from `jitship install` as from its own warm
# cache? TorchInductor on CPU, the model of tests/engines/inductor_model.py, every run a fresh
# process. In one run: one cold compile, then the first compiled call with the producer's own warm
# cache (same path, same TMPDIR) x3, and after `jitship install` into a new absolute path with a
# fresh TMPDIR x3. Prints medians and the ratio installed / local warm (goal <= 1.2), with the
# publish and install times.
#
#   JITSHIP_PROFILE=release tests/engines/inductor-bench.sh
source "$(dirname "$0")/inductor-lib.sh"
trap '[ -n "${JITSHIP_KEEP_WORK:-}" ] && echo "kept $WORK" || rm -rf "$WORK"' EXIT
calc() { python3 -c "print(round($1, 2))"; }
median() { printf '%s\n' "$@" | sort -g | sed -n "$(( ($# + 1) / 2 ))p"; }
P=$WORK/producer
mkdir -p "$P"
echo "machine: $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg); torch $("$PY" -c 'import torch; print(torch.__version__)' 2>/dev/null)"

run_as "$P" -- "$PY" "$MODEL" > "$P/cold.log" 2>&1 || { cat "$P/cold.log"; exit 1; }
COLD=$(result "$P/cold.log" first_call_s)

t0=$(now)
# shellcheck disable=SC2046
run_as "$P" -- "$JITSHIP" publish --config "$CONFIG" --store "$STORE" $(caches_of "$P") > "$WORK/publish.log"
PUBLISH=$(calc "$(now) - $t0")

WARM=()
for i in 1 2 3; do
    run_as "$P" -- "$PY" "$MODEL" > "$P/warm$i.log" 2>&1 || { cat "$P/warm$i.log"; exit 1; }
    WARM+=("$(result "$P/warm$i.log" first_call_s)")
done

INSTALLED=() INSTALL=() HITS=() COMPILES=()
for i in 1 2 3; do
    C=$WORK/consumer$i/some/other/place
    mkdir -p "$C"
    t0=$(now)
    # shellcheck disable=SC2046
    run_as "$C" -- "$JITSHIP" install --config "$CONFIG" --store "$STORE" $(caches_of "$C") > "$C.install.log"
    INSTALL+=("$(calc "$(now) - $t0")")
    run_as "$C" -- "$PY" "$MODEL" > "$C/run.log" 2>&1 || { cat "$C/run.log"; exit 1; }
    INSTALLED+=("$(result "$C/run.log" first_call_s)")
    HITS+=("$(result "$C/run.log" inductor.fxgraph_cache_hit)/$(result "$C/run.log" aot_autograd.autograd_cache_hit)")
    COMPILES+=("$(compiles_in "$C/gxx.log")")
done

W=$(median "${WARM[@]}")
I=$(median "${INSTALLED[@]}")
printf '\n%-44s %s\n' "run" "first compiled call, s"
printf '%-44s %s\n' "cold (empty cache, empty TMPDIR)" "$COLD"
printf '%-44s %s (median of %s)\n' "local warm (same path, same TMPDIR)" "$W" "${WARM[*]}"
printf '%-44s %s (median of %s)\n' "after jitship install (new path, new TMPDIR)" "$I" "${INSTALLED[*]}"
printf '%-44s %s   (fx/aot hits per run: %s; g++ compiles: %s)\n' "ratio installed / local warm" \
    "$(calc "$I / $W")" "${HITS[*]}" "${COMPILES[*]}"
printf '%-44s %.2f s (%s)\n' "jitship publish (both roots)" "$PUBLISH" "$(du -sh "$WORK/store" | cut -f1) stored"
printf '%-44s %s s (median of %s)\n' "jitship install (both roots)" "$(median "${INSTALL[@]}")" "${INSTALL[*]}"
