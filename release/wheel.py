"""Writes jitship's wheel from an already-built binary: no compiler, no build backend.

    python3 release/wheel.py BINARY VERSION OUT_DIR     # prints the wheel's path

A wheel is a zip with a fixed layout (PyPA's binary distribution format): the package
(python/jitship/*.py and the binary as jitship/bin/jitship, mode 0755), and a
jitship-VERSION.dist-info/ with METADATA, WHEEL (the tag), entry_points.txt and RECORD (every
file's sha256). Tag py3-none-manylinux_2_28_x86_64 (or _aarch64): the binary runs on any Python 3
and on glibc 2.28 or newer, which tests/release/glibc-baseline.sh checks before this runs; it
links only glibc's libraries and libgcc_s, all on the manylinux allow-list. The `jitship` command is
a console script (jitship:main) rather than the bare binary, so it can hand the binary the Mooncake
library of an installed `jitship[mooncake]` (docs/guide/install.md).
"""

import base64
import hashlib
import os
import platform
import sys
import zipfile

MOONCAKE = "tokenspeed-mooncake==0.3.13.post20261027"
# A fixed date for every entry, so the same inputs give the same wheel bytes.
DATE = (2020, 1, 1, 0, 0, 0)


def record_hash(data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"sha256={digest}"


def main():
    binary, version, out = sys.argv[1:4]
    arch = {"x86_64": "x86_64", "aarch64": "aarch64"}[platform.machine()]
    tag = f"py3-none-manylinux_2_28_{arch}"
    src = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python", "jitship")
    readme = os.path.join(os.path.dirname(src), "README.md")
    dist_info = f"jitship-{version}.dist-info"
    files = []  # (name in the wheel, bytes, mode)
    for name in sorted(os.listdir(src)):
        if name.endswith(".py"):
            with open(os.path.join(src, name), "rb") as f:
                files.append((f"jitship/{name}", f.read(), 0o644))
    with open(binary, "rb") as f:
        files.append(("jitship/bin/jitship", f.read(), 0o755))
    with open(readme, encoding="utf-8") as f:
        description = f.read()
    metadata = "\n".join(
        [
            "Metadata-Version: 2.1",
            "Name: jitship",
            f"Version: {version}",
            "Summary: Publish and install the JIT and kernel caches of vLLM and SGLang workers",
            "License: Apache-2.0",
            "Requires-Python: >=3.8",
            "Provides-Extra: mooncake",
            f'Requires-Dist: {MOONCAKE}; extra == "mooncake"',
            "Description-Content-Type: text/markdown",
            "",
            description,
        ]
    )
    wheel = "\n".join(
        [
            "Wheel-Version: 1.0",
            "Generator: jitship release/wheel.py",
            "Root-Is-Purelib: false",
            f"Tag: {tag}",
            "",
        ]
    )
    entry_points = "\n".join(
        [
            "[console_scripts]",
            "jitship = jitship:main",
            "",
            "[vllm.general_plugins]",
            "jitship = jitship.vllm_plugin:register",
            "",
        ]
    )
    files += [
        (f"{dist_info}/METADATA", metadata.encode(), 0o644),
        (f"{dist_info}/WHEEL", wheel.encode(), 0o644),
        (f"{dist_info}/entry_points.txt", entry_points.encode(), 0o644),
    ]
    record = "".join(f"{n},{record_hash(d)},{len(d)}\n" for n, d, _ in files)
    record += f"{dist_info}/RECORD,,\n"
    files.append((f"{dist_info}/RECORD", record.encode(), 0o644))

    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, f"jitship-{version}-{tag}.whl")
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as zf:
        for name, data, mode in files:
            info = zipfile.ZipInfo(name, DATE)
            info.external_attr = (0o100000 | mode) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, data)
    print(path)


if __name__ == "__main__":
    main()
