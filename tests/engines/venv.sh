#!/usr/bin/env bash
# A Python venv with the real engines from PyPI (torch, which brings triton), for the tests that
# prove an installed cache is taken by the engine's own loader. Idempotent: a stamp file names
# the pinned versions, so a second call returns at once. Prints the venv's python on stdout.
#
#   PY=$(tests/engines/venv.sh)        # default: ~/.cache/jitship/engines-venv
#
# The default lives outside the checkout (like pip's own cache) so that a fresh clone on a machine
# that already has it does not download ~3 GB again. JITSHIP_ENGINES_VENV overrides the directory.
set -euo pipefail
VENV=${JITSHIP_ENGINES_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/jitship/engines-venv}
# torch's own wheel pins the triton it was built with; both are named so the stamp says what is here.
PINS=(torch==2.15.0 triton==3.9.0)
STAMP="$VENV/.jitship-pins"
ready() { [ -x "$VENV/bin/python" ] && [ "$(cat "$STAMP" 2>/dev/null)" = "${PINS[*]}" ]; }
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
    echo "engines venv: installing ${PINS[*]} into $VENV (about 3 GB from PyPI, a few minutes)"
    rm -rf "$VENV"
    python3.11 -m venv "$VENV" 2>/dev/null || python3 -m venv "$VENV"
    "$VENV/bin/pip" install -q --disable-pip-version-check --no-cache-dir "${PINS[@]}"
    "$VENV/bin/python" -c 'import torch, triton; print("engines venv: torch", torch.__version__, "triton", triton.__version__)'
} >&2
echo "${PINS[*]}" > "$STAMP"
echo "$VENV/bin/python"
