#!/usr/bin/env bash
# Builds the guide (docs/guide/, with the design notes and the performance history beside it in
# docs/) as a static site with mkdocs, `--strict`: a link to a page that does not exist, an anchor
# no heading of its page has, a page of the navigation that is missing, or a docs/ page left out of
# the navigation is a warning, and --strict fails on it. The navigation is mkdocs.yml's.
#
#   tests/docs/build-guide.sh          # writes target/guide/ (open target/guide/guide/index.html)
#
# mkdocs comes from PyPI, pinned with its dependencies, in a venv cached outside the checkout like
# tests/release/glibc-baseline.sh's zig (~/.cache/jitship/docs-venv, about 50 MB; JITSHIP_DOCS_VENV
# moves it). A second run reuses it and takes about a second.
set -euo pipefail
cd "$(dirname "$0")/../.."

VENV=${JITSHIP_DOCS_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/jitship/docs-venv}
PINS="mkdocs==1.6.1 click==8.5.1 ghp-import==2.1.0 Jinja2==3.1.6 Markdown==3.11.3 MarkupSafe==3.0.4 mergedeep==1.3.4 mkdocs-get-deps==0.2.2 packaging==26.4 pathspec==1.1.1 platformdirs==4.14.9 python-dateutil==4.0.0 PyYAML==6.0.4 pyyaml_env_tag==1.1 watchdog==7.1.1"

say() { echo "build-guide: $*" >&2; }

# The tool, once per machine (a stamp names the pins; a lock lets parallel callers wait).
ready() { [ -x "$VENV/bin/mkdocs" ] && [ "$(cat "$VENV/.jitship-pins" 2>/dev/null)" = "$PINS" ]; }
if ! ready; then
    mkdir -p "$(dirname "$VENV")"
    exec 9>"$VENV.lock"
    flock 9
    if ! ready; then
        say "installing $PINS into $VENV"
        rm -rf "$VENV"
        python3.11 -m venv "$VENV" 2>/dev/null || python3 -m venv "$VENV"
        # shellcheck disable=SC2086 # PINS is a list of requirements
        "$VENV/bin/pip" install -q --disable-pip-version-check --no-cache-dir $PINS >&2
        echo "$PINS" > "$VENV/.jitship-pins"
    fi
    exec 9>&-
fi

start=$SECONDS
# Not --quiet: it drops the warnings before --strict counts them. INFO lines are left out.
log=$(mktemp)
trap 'rm -f "$log"' EXIT
if ! "$VENV/bin/mkdocs" build --strict --config-file mkdocs.yml >"$log" 2>&1; then
    grep -v '^INFO' "$log" >&2
    say "FAIL: the guide has a broken link or a missing page (above); the navigation is in mkdocs.yml"
    exit 1
fi
grep -v '^INFO' "$log" >&2 || true
pages=$(find target/guide -name '*.html' | wc -l)
say "built target/guide/: $pages pages, no broken link or missing page ($((SECONDS - start)) s)"
