#!/usr/bin/env python3
"""Checks that dependencies point one way (ARCHITECTURE.md, "Layers"): what the compiler cannot.

Between crates, the compiler already refuses cycles; this also refuses an arrow the codemap does
not allow (say, the store crate depending on the generation crate). Inside the engine crate,
where the compiler allows any module to use any other, every non-comment path to a module of
the crate (`crate::m`, each name of `crate::{a, b::c}`, and `super::super::m` from a submodule)
must name a module of a lower layer. Run from anywhere; exits 1 listing each upward arrow.
"""
import json
import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]

# Workspace crates and the workspace crates each may depend on (normal dependencies).
CRATES = {
    "jitship-generation": set(),
    "mooncake-sys": set(),
    "jitship-store": {"mooncake-sys", "jitship-confined"},
    "jitship-catalog": {"jitship-generation", "jitship-store"},
    "jitship-policy-contract": set(),
    "jitship-policy-sdk": {"jitship-policy-contract"},
    "jitship-confined": set(),
    "jitship-facts": {"jitship-generation", "jitship-policy-contract"},
    "jitship-trust": {"jitship-generation"},
    "jitship-scan": {"jitship-generation", "jitship-policy"},
    "jitship-author": {
        "jitship-generation", "jitship-facts", "jitship-policy", "jitship-scan",
    },
    "jitship-oci": {
        "jitship-generation", "jitship-store", "jitship-catalog", "jitship-confined",
        "jitship-trust",
    },
    "jitship-policy": {
        "jitship-generation", "jitship-confined", "jitship-facts", "jitship-policy-contract",
    },
    "jitship": {
        "jitship-generation", "jitship-store", "jitship-catalog", "jitship-confined",
        "jitship-facts", "jitship-policy", "jitship-policy-contract", "jitship-trust",
        "jitship-oci", "jitship-scan", "jitship-author",
    },
}

# Engine modules by layer: a module may use modules of lower layers only. `generation`,
# `store`, `catalog`, `confined`, `facts`, `policy`, `trust`, `oci`, `scan` and `author` are
# crates, re-exported under those names (kept here so an engine module's use of them is still checked against its
# layer).
LAYERS = [
    {"generation", "store", "catalog", "confined", "facts", "interrupt", "ready", "owner", "server"},
    {"policy", "trust"},
    {"config", "inspect"},
    {"scan", "policies", "oci", "scrub"},
    {"publish", "install", "author", "roots"},
    {"gc", "audit", "watch", "engines"},
    {"cli"},
]
LAYER_OF = {m: i for i, layer in enumerate(LAYERS) for m in layer}


def crate_problems():
    meta = json.loads(
        subprocess.run(
            ["cargo", "metadata", "--format-version", "1", "--no-deps", "--offline"],
            cwd=ROOT, check=True, capture_output=True, text=True,
        ).stdout
    )
    members = {p["name"] for p in meta["packages"]}
    problems = []
    for p in meta["packages"]:
        if p["name"] not in CRATES:
            continue
        deps = {d["name"] for d in p["dependencies"] if d["kind"] is None and d["name"] in members}
        for d in sorted(deps - CRATES[p["name"]]):
            problems.append(f"crate {p['name']} depends on {d}, which the codemap does not allow")
    return problems


def module_of(path):
    rel = path.relative_to(ROOT / "engine" / "src")
    return rel.parts[0].removesuffix(".rs")


def module_problems():
    problems = []
    for path in sorted((ROOT / "engine" / "src").rglob("*.rs")):
        own = module_of(path)
        if own in ("lib", "main"):
            continue
        if own not in LAYER_OF:
            problems.append(f"{path.relative_to(ROOT)}: module {own} has no layer in {__file__}")
            continue
        code = "\n".join(line.split("//", 1)[0] for line in path.read_text().splitlines())
        depth = len(path.relative_to(ROOT / "engine" / "src").parts) - 1
        for offset, used in used_modules(code, depth):
            if used == own or used not in LAYER_OF:
                continue
            if LAYER_OF[used] >= LAYER_OF[own]:
                n = code.count("\n", 0, offset) + 1
                problems.append(
                    f"{path.relative_to(ROOT)}:{n}: {own} (layer {LAYER_OF[own]}) uses "
                    f"{used} (layer {LAYER_OF[used]})"
                )
    return problems


def used_modules(code, depth):
    """(offset, module) of every top-level engine module `code` names: `crate::m`, the first name
    of each item of `crate::{...}` (nested braces and lines included), and `super::...::m` that
    climbs to the crate root from a file `depth` directories below engine/src."""
    for m in re.finditer(r"\bcrate::([a-z_]+)", code):
        yield m.start(), m.group(1)
    for m in re.finditer(r"\bcrate::\{", code):
        level, start, i = 1, m.end(), m.end()
        while i < len(code) and level:
            level += {"{": 1, "}": -1}.get(code[i], 0)
            i += 1
        items, level, item = [], 0, ""
        for ch in code[start : i - 1]:
            if ch == "," and level == 0:
                items.append(item)
                item = ""
                continue
            level += {"{": 1, "}": -1}.get(ch, 0)
            item += ch
        items.append(item)
        for item in items:
            name = re.match(r"\s*([a-z_]+)", item)
            if name:
                yield m.start(), name.group(1)
    # A file a/b.rs below engine/src is module a::b: `super::super::m` names the crate's module m.
    # (mod.rs-less layout: a.rs is at depth 0, a/b.rs at depth 1.)
    climb = r"\bsuper::" * (depth + 1)
    for m in re.finditer(climb + r"([a-z_]+)", code):
        yield m.start(), m.group(1)


def main():
    problems = crate_problems() + module_problems()
    for p in problems:
        print(p, file=sys.stderr)
    if problems:
        print(f"{len(problems)} upward dependencies (see ARCHITECTURE.md, Layers)", file=sys.stderr)
        return 1
    print(f"layers: {len(CRATES)} crates and {len(LAYER_OF)} engine modules point one way")
    return 0


if __name__ == "__main__":
    sys.exit(main())
