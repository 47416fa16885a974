"""Real Triton, as the relocation tests' engine: compiles kernels into a cache root with Triton's
own compiler (a CUDA target needs no GPU: Triton bundles ptxas), and checks a root the way Triton
itself loads it.

    python triton_cache.py compile ROOT VARIANT...  # TRITON_CACHE_DIR=ROOT, one kernel per VARIANT
    python triton_cache.py check ROOT [VARIANT...]

`check` asks `triton.runtime.cache.FileCacheManager(key).get_group(name)` (TRITON_CACHE_DIR=ROOT)
for every `<key>/__grp__<name>` under ROOT and requires every child to resolve inside ROOT; with
VARIANTs it also compiles each again and requires Triton to report a cache hit (no recompile).
Prints one JSON object: {"groups": n, "hits": n, "problems": [...]}. Run by tests/e2e/relocation.rs
with the python of tests/engines/venv.sh.
"""

import json
import os
import sys


def setup(root):
    os.environ["TRITON_CACHE_DIR"] = root
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")


def compile_variant(variant):
    """Compiles one kernel; each VARIANT (a power of two) is a distinct kernel for Triton."""
    import triton
    import triton.language as tl
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    @triton.jit
    def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
        pid = tl.program_id(0)
        offs = pid * BLOCK + tl.arange(0, BLOCK)
        m = offs < n
        x = tl.load(x_ptr + offs, mask=m)
        y = tl.load(y_ptr + offs, mask=m)
        tl.store(out_ptr + offs, x + y, mask=m)

    sig = {"x_ptr": "*fp32", "y_ptr": "*fp32", "out_ptr": "*fp32", "n": "i32", "BLOCK": "constexpr"}
    src = ASTSource(fn=add_kernel, signature=sig, constexprs={"BLOCK": int(variant)})
    return triton.compile(src, target=GPUTarget("cuda", 90, 32))


def check(root, variants):
    from triton import knobs
    from triton.runtime.cache import FileCacheManager

    problems = []
    groups = 0
    prefix = root.rstrip("/") + "/"
    for key in sorted(os.listdir(root)):
        kdir = os.path.join(root, key)
        if not os.path.isdir(kdir):
            continue
        for name in sorted(os.listdir(kdir)):
            if not name.startswith("__grp__"):
                continue
            groups += 1
            group = FileCacheManager(key).get_group(name[len("__grp__"):])
            if not group:
                problems.append(f"{key}/{name}: Triton's get_group found no usable group")
                continue
            for child, path in group.items():
                if not path.startswith(prefix) or not os.path.isfile(path):
                    problems.append(f"{key}/{name}: child {child} resolves to {path}, not inside {root}")
    hits = 0
    seen = []
    knobs.compilation.listener = lambda **kw: seen.append(kw["cache_hit"])
    for v in variants:
        seen.clear()
        k = compile_variant(v)
        if seen != [True]:
            problems.append(f"variant {v}: Triton recompiled instead of loading the installed kernel")
        elif any(not p.startswith(prefix) for p in k.metadata_group.values()):
            problems.append(f"variant {v}: loaded from outside {root}: {k.metadata_group}")
        else:
            hits += 1
    return {"groups": groups, "hits": hits, "problems": problems}


def main():
    cmd, root, variants = sys.argv[1], sys.argv[2], sys.argv[3:]
    setup(root)
    if cmd == "compile":
        for v in variants:
            compile_variant(v)
        print(json.dumps({"compiled": len(variants)}))
    elif cmd == "check":
        print(json.dumps(check(root, variants)))
    else:
        sys.exit(f"unknown command {cmd!r} (compile or check)")


if __name__ == "__main__":
    main()
