#!/usr/bin/env python3
"""Checks that every citation in the tracked files points into the repository (issue 27).

A citation is a repository path written in a comment or a page: `docs/jit-caches.md#triton`,
`tests/layers/check.py`, `ARCHITECTURE.md`, or a relative link in a Markdown page. Each must name
a file or directory of the repository, and a `#anchor` must name a heading of the cited page
(GitHub's slugs: lower case, punctuation dropped, spaces to hyphens). Facts the code relies on
live in the repository's own `docs/`, so any citation of `research/...` or `shared/...` notes
fails too: they are not part of the repository. Scans the files git tracks (and new ones it does
not ignore), not `target/`. Run from anywhere; exits 1 listing `file:line: problem` for each
broken citation, else prints a one-line summary.
"""
import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
SELF = pathlib.Path(__file__).resolve().relative_to(ROOT).as_posix()

EXTENSIONS = "md|rs|py|sh|toml|wit|json|yaml|wasm|h"
# A path starts a token: not after a word character, '.', '/', '-' or '$' (so `$REPO/tests/x.sh`
# and `github.com/org/docs/x.md` are not repository citations of `tests/...` or `docs/...`).
START = r"(?<![\w./$-])"
# Notes kept outside the repository (the research notes, the shared folder), wherever they sit.
OUTSIDE = re.compile(r"\b(?:research|shared)/[\w./-]*\w\.md")
BARE_RESEARCH = re.compile(r"\bresearch §")
ROOT_FILE = re.compile(START + r"([A-Z][A-Z_]*\.md)\b")
MD_LINK = re.compile(r"\]\(([^()\s]*)\)")
HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
FENCE = re.compile(r"^ {0,3}(```|~~~)")


def tracked_files():
    out = subprocess.run(
        # Tracked files, and new ones not yet added (but not ignored ones such as target/).
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT, check=True, capture_output=True,
    ).stdout.decode()
    return [p for p in out.split("\0") if p]


def slug(heading):
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # [text](url) -> text
    text = text.replace("`", "").replace("*", "").strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(text):
    """The anchors GitHub gives the headings of a Markdown page (duplicates get -1, -2, ...)."""
    seen = {}
    result = set()
    in_fence = False
    for line in text.splitlines():
        if FENCE.match(line):
            in_fence = not in_fence
            continue
        m = None if in_fence else HEADING.match(line)
        if not m:
            continue
        base = slug(m.group(2))
        n = seen.get(base, 0)
        seen[base] = n + 1
        result.add(base if n == 0 else f"{base}-{n}")
    return result


def main():
    every = [f for f in tracked_files() if not f.startswith(("target/", ".git/"))]
    tracked = set(every)
    files = [f for f in every if f != SELF]  # its own docstring shows citations, good and bad
    dirs = {p.as_posix() for f in every for p in pathlib.PurePosixPath(f).parents}
    tops = sorted({f.split("/", 1)[0] for f in every if "/" in f})
    repo_path = re.compile(
        START
        + r"((?:%s)/[\w./-]*\w\.(?:%s))\b(#[\w-]+)?" % ("|".join(map(re.escape, tops)), EXTENSIONS)
    )
    anchor_cache = {}

    def page_anchors(path):
        if path not in anchor_cache:
            anchor_cache[path] = anchors((ROOT / path).read_text(encoding="utf-8"))
        return anchor_cache[path]

    def exists(path):
        return path in tracked or path.rstrip("/") in dirs

    problems = []
    checked = 0

    def check(where, path, anchor):
        nonlocal checked
        checked += 1
        if not exists(path):
            problems.append(f"{where}: cites {path}, which is not in the repository")
        elif anchor and path.endswith(".md") and anchor[1:] not in page_anchors(path):
            problems.append(f"{where}: cites {path}{anchor}, but {path} has no such heading")

    for f in files:
        try:
            text = (ROOT / f).read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue  # binary files cite nothing
        base = pathlib.PurePosixPath(f).parent
        for no, line in enumerate(text.splitlines(), 1):
            where = f"{f}:{no}"
            for m in OUTSIDE.finditer(line):
                problems.append(
                    f"{where}: cites {m.group(0)}, which is not in the repository "
                    "(bring the fact into docs/ and cite that)"
                )
            if BARE_RESEARCH.search(line):
                problems.append(f"{where}: cites a research section; cite a docs/ page instead")
            for m in repo_path.finditer(line):
                check(where, m.group(1), m.group(2))
            for m in ROOT_FILE.finditer(line):
                # A bare page name means the repository's, or in a subdirectory a neighbour.
                name = m.group(1)
                neighbour = (base / name).as_posix()
                check(where, neighbour if exists(neighbour) else name, "")
            if f.endswith(".md"):
                for m in MD_LINK.finditer(line):
                    target = m.group(1)
                    if re.match(r"[a-z][a-z0-9+.-]*:", target):
                        continue  # a URL
                    path, _, anchor = target.partition("#")
                    resolved = "/".join(_normalize((base / path).as_posix())) if path else f
                    check(where, resolved, "#" + anchor if anchor else "")

    if problems:
        print("\n".join(problems))
        print(f"{len(problems)} broken citation(s); facts the code relies on belong in docs/")
        return 1
    print(f"citations: {checked} repository paths cited in {len(files)} tracked files, all present")
    return 0


def _normalize(path):
    parts = []
    for part in path.split("/"):
        if part in ("", "."):
            continue
        if part == ".." and parts:
            parts.pop()
        else:
            parts.append(part)
    return parts or ["."]


if __name__ == "__main__":
    sys.exit(main())
