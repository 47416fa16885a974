"""jitship for Python environments: the release binary, a `jitship` command, and a vLLM plugin.

The wheel carries the glibc-2.28 release binary (`jitship/bin/jitship`). `jitship ...` on PATH and
`python -m jitship ...` both run it through `main`, which adds one thing to its environment: the
Mooncake Store C library (`libmooncake_store.so`) when a Python package that provides it is
installed beside jitship (`pip install 'jitship[mooncake]'` brings one) and neither
MOONCAKE_STORE_LIBRARY nor the config's `store.mooncake.library` names another. See
docs/guide/install.md.
"""

import os
import sys

__all__ = ["binary", "environ", "main", "mooncake_library"]

# The C library's path inside the `mooncake` import package of the PyPI wheel that builds it with
# the C ABI (tokenspeed-mooncake; docs/guide/install.md, "Mooncake").
_MOONCAKE_LIBRARY = os.path.join("mooncake", "libmooncake_store.so")


def binary():
    """The jitship binary this package ships."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "bin", "jitship")


def mooncake_library(path=None):
    """The first `mooncake/libmooncake_store.so` on the import path, or None."""
    for entry in sys.path if path is None else path:
        candidate = os.path.join(entry or os.getcwd(), _MOONCAKE_LIBRARY)
        if os.path.isfile(candidate):
            return candidate
    return None


def environ(env=None):
    """The environment jitship runs with: `env` (default os.environ) plus MOONCAKE_STORE_LIBRARY
    when it is unset and an installed package provides the library."""
    env = dict(os.environ if env is None else env)
    if not env.get("MOONCAKE_STORE_LIBRARY"):
        lib = mooncake_library()
        if lib is not None:
            env["MOONCAKE_STORE_LIBRARY"] = lib
    return env


def main(argv=None):
    """Runs the binary in place of this process (the `jitship` command)."""
    args = sys.argv[1:] if argv is None else list(argv)
    exe = binary()
    os.execve(exe, [exe, *args], environ())
