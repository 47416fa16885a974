"""The official Mooncake Python client's side of jitship's interop test (tests/e2e/mooncake_interop.rs).

usage: mooncake_interop.py MASTER METADATA get KEY OUT_FILE   -> writes the object's bytes to OUT_FILE
       mooncake_interop.py MASTER METADATA put KEY IN_FILE    -> stores IN_FILE's bytes under KEY
Runs `mooncake.store.MooncakeDistributedStore` from the official wheel as a pure client.
"""

import sys

from mooncake.store import MooncakeDistributedStore


def main() -> int:
    master, metadata, op, key, path = sys.argv[1:6]
    store = MooncakeDistributedStore()
    rc = store.setup("127.0.0.1", metadata, 0, 64 * 1024 * 1024, "tcp", "", master)
    if rc != 0:
        print(f"setup failed: {rc}", file=sys.stderr)
        return 2
    try:
        if op == "get":
            value = store.get(key)
            if not value:
                print(f"{key}: missing", file=sys.stderr)
                return 3
            with open(path, "wb") as f:
                f.write(value)
        elif op == "put":
            with open(path, "rb") as f:
                value = f.read()
            rc = store.put(key, value)
            if rc != 0:
                print(f"put {key}: {rc}", file=sys.stderr)
                return 4
        else:
            print(f"unknown op {op}", file=sys.stderr)
            return 1
    finally:
        store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
