"""Baseline for jitship's Mooncake benchmarks: the ModelExpress PR 676 (v1) way of caching a
directory tree in Mooncake Store, done with the official Python client
`mooncake.store.MooncakeDistributedStore`.

usage: pr676_baseline.py publish MASTER METADATA KEY_PREFIX SRC_DIR
       pr676_baseline.py install MASTER METADATA KEY_PREFIX DST_DIR

  e.g. PYTHONPATH=$JITSHIP_TEST_MOONCAKE_PYTHONPATH python3 tests/benches/pr676_baseline.py \
           publish "$JITSHIP_TEST_MOONCAKE_MASTER" "$JITSHIP_TEST_MOONCAKE_METADATA" bench/pr676 /some/tree

On success the last line on stdout is one JSON object, e.g.
  {"op": "publish", "bytes": 61450240, "chunks": 1, "files": 22001, "seconds": 1.23, "phases": {...}}
where "bytes" is the size of the tar, "chunks" the number of chunk objects, "files" the number of
tar members, and "seconds" the wall time of the whole operation (store setup through store close),
measured inside Python, so it excludes interpreter start and the import of mooncake.store.
"phases" splits "seconds" up (setup, tar or untar, transfer, close).

Exit status: 0 success; 1 a store call failed (rc != 0) or the data did not check out;
2 usage error or store setup failed; 3 install found no published artifact (a miss: the manifest
or a chunk is absent).

What it reproduces of PR 676 v1 (metadata/mooncake_artifact_cache.py):
  * The artifact is one uncompressed tar of the tree, cut into 64 MiB chunks (the PR's default
    chunk_size). Each chunk is its own object, `{KEY_PREFIX}/{generation}/chunk/{i}`, where
    generation is a fresh uuid4().hex per publication, as in the PR (Mooncake objects are
    immutable, so a republication writes a whole new chunk set and only replaces the manifest).
  * Every put allocates a fresh buffer, copies the chunk into it, `register_buffer`s it, puts it
    with one `batch_put_from_multi_buffers([key], [[ptr]], [[size]], config)` call (the PR's call)
    and `unregister_buffer`s it. The ReplicateConfig has soft pin on (the PR's default) and the
    default single replica.
  * The manifest `{KEY_PREFIX}/manifest` is the commit point: it is removed first (0 or -704
    OBJECT_NOT_FOUND is fine; -706 OBJECT_HAS_LEASE is retried 10 times, 0.7 s apart, as in the
    PR), then put after all chunks. Like the PR's envelope it is zero-padded to a fixed size
    (64 KiB, what the PR's tests use) so that a reader can get it without asking its size first.
  * Install gets the manifest, then each chunk sequentially into a freshly allocated and
    registered buffer of the chunk's length, checks the returned size and the checksum,
    unregisters, and finally extracts the tar into DST_DIR. An absent manifest or chunk (-704)
    is a miss; any other negative code is an error.
  * Setup as a pure client: global_segment_size 0, local_buffer_size 64 MiB, TCP.

What it simplifies:
  * The tar is built and extracted in memory with Python's tarfile (the PR runs `tar -cf` into a
    bundle dir on disk, stages the fetched chunks in a file on disk, then runs `tar -xf`). This
    saves the baseline the disk round trips.
  * The chunk checksum is zlib.crc32 (CRC-32), not CRC32C as in the PR: the stdlib has no
    CRC32C, and both are a table-driven 32-bit CRC of about the same cost.
  * The manifest is JSON (chunk count, each chunk's length and CRC), not the PR's protobuf
    ArtifactManifest with a SHA-256 artifact id; there is no identity or cache-key derivation,
    no pod markers, flock leases, P2P fallback or env promotion.
  * Extraction uses tarfile's filter="data" (Python >= 3.11.4) where the PR validates members
    itself (no absolute paths, no "..", only files and directories).
"""

import ctypes
import io
import json
import os
import struct
import sys
import tarfile
import time
import uuid
import zlib

from mooncake.store import MooncakeDistributedStore, ReplicateConfig, SoftPinAction

CHUNK_BYTES = 64 * 1024 * 1024  # PR 676's default chunk_size (MX_ARTIFACT_TRANSFER_CHUNK_SIZE)
MANIFEST_BYTES = 64 * 1024  # fixed manifest object size (MX_ARTIFACT_MOONCAKE_MANIFEST_BYTES)
MANIFEST_MAGIC = b"PR676BL1"
MANIFEST_HEADER = struct.Struct("!8sQ")  # magic, length of the JSON that follows; then zeros
LOCAL_BUFFER_BYTES = 64 * 1024 * 1024
DELETE_RETRIES = 10  # MX_ARTIFACT_MOONCAKE_DELETE_RETRIES
DELETE_RETRY_DELAY_SECS = 0.7  # MX_ARTIFACT_MOONCAKE_DELETE_RETRY_DELAY_SECS

OBJECT_NOT_FOUND = -704
OBJECT_HAS_LEASE = -706


class StoreError(Exception):
    """A store call returned an error code, or fetched data did not check out (exit 1)."""


class Miss(Exception):
    """The artifact, or one of its chunks, is not in the store (exit 3)."""


def replicate_config() -> ReplicateConfig:
    config = ReplicateConfig()  # replica_num 1, as in the PR (it never sets it)
    config.soft_pin_action = SoftPinAction.ENABLE  # the PR's with_soft_pin=True
    return config


def put_bytes(store: MooncakeDistributedStore, key: str, data, config: ReplicateConfig) -> None:
    """The PR's put_bytes: a fresh buffer with a copy of data, registered for this one put."""
    size = len(data)
    buf = (ctypes.c_char * size).from_buffer_copy(data)
    ptr = ctypes.addressof(buf)
    rc = store.register_buffer(ptr, size)
    if rc != 0:
        raise StoreError(f"register_buffer({size} bytes) for {key}: {rc}")
    try:
        rcs = store.batch_put_from_multi_buffers([key], [[ptr]], [[size]], config)
        if len(rcs) != 1 or rcs[0] != 0:
            raise StoreError(f"put {key} ({size} bytes): {rcs}")
    finally:
        rc = store.unregister_buffer(ptr)
        if rc != 0:
            raise StoreError(f"unregister_buffer for {key}: {rc}")


def get_bytes(store: MooncakeDistributedStore, key: str, size: int):
    """The PR's get_bytes: a fresh registered buffer of the expected size, filled by get_into."""
    buf = (ctypes.c_char * size)()
    ptr = ctypes.addressof(buf)
    rc = store.register_buffer(ptr, size)
    if rc != 0:
        raise StoreError(f"register_buffer({size} bytes) for {key}: {rc}")
    try:
        got = store.get_into(key, ptr, size)
    finally:
        rc = store.unregister_buffer(ptr)
        if rc != 0:
            raise StoreError(f"unregister_buffer for {key}: {rc}")
    if got == OBJECT_NOT_FOUND:
        raise Miss(f"{key}: not found")
    if got < 0:
        raise StoreError(f"get_into {key}: {got}")
    if got != size:
        raise StoreError(f"get_into {key}: got {got} bytes, expected {size}")
    return buf


def remove_with_retry(store: MooncakeDistributedStore, key: str) -> None:
    for attempt in range(DELETE_RETRIES + 1):
        rc = store.remove(key)
        if rc in (0, OBJECT_NOT_FOUND):
            return
        if rc != OBJECT_HAS_LEASE or attempt == DELETE_RETRIES:
            raise StoreError(f"remove {key}: {rc}")
        time.sleep(DELETE_RETRY_DELAY_SECS)


def encode_manifest(manifest: dict) -> bytes:
    body = json.dumps(manifest, separators=(",", ":"), sort_keys=True).encode()
    frame = MANIFEST_HEADER.pack(MANIFEST_MAGIC, len(body)) + body
    if len(frame) > MANIFEST_BYTES:
        raise StoreError(f"manifest of {len(frame)} bytes exceeds {MANIFEST_BYTES}")
    return frame + bytes(MANIFEST_BYTES - len(frame))


def decode_manifest(frame) -> dict:
    magic, length = MANIFEST_HEADER.unpack_from(frame)
    if magic != MANIFEST_MAGIC or MANIFEST_HEADER.size + length > len(frame):
        raise StoreError("manifest: bad magic or length")
    start = MANIFEST_HEADER.size
    return json.loads(bytes(frame[start : start + length]))


def publish(store, prefix: str, src_dir: str, phases: dict) -> dict:
    if not os.path.isdir(src_dir):
        raise StoreError(f"{src_dir}: not a directory")
    t = time.perf_counter()
    tar_buf = io.BytesIO()
    with tarfile.open(fileobj=tar_buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        tar.add(src_dir, arcname=".")  # like `tar -cf ... -C SRC_DIR .`
        files = len(tar.getmembers())
    phases["tar"] = time.perf_counter() - t

    t = time.perf_counter()
    config = replicate_config()
    generation = uuid.uuid4().hex
    chunks = []
    with tar_buf.getbuffer() as view:
        total = len(view)
        for i, offset in enumerate(range(0, total, CHUNK_BYTES)):
            with view[offset : offset + CHUNK_BYTES] as data:
                # CRC-32 (zlib) stands in for the PR's per-chunk CRC32C.
                chunks.append({"length": len(data), "crc32": zlib.crc32(data)})
                put_bytes(store, f"{prefix}/{generation}/chunk/{i}", data, config)
    manifest = {"generation": generation, "total": total, "files": files, "chunks": chunks}
    manifest_key = f"{prefix}/manifest"
    remove_with_retry(store, manifest_key)
    put_bytes(store, manifest_key, encode_manifest(manifest), config)  # the commit point
    phases["transfer"] = time.perf_counter() - t
    return {"bytes": total, "chunks": len(chunks), "files": files}


def install(store, prefix: str, dst_dir: str, phases: dict) -> dict:
    t = time.perf_counter()
    manifest = decode_manifest(get_bytes(store, f"{prefix}/manifest", MANIFEST_BYTES))
    generation = manifest["generation"]
    tar_buf = io.BytesIO()
    for i, chunk in enumerate(manifest["chunks"]):
        key = f"{prefix}/{generation}/chunk/{i}"
        buf = get_bytes(store, key, chunk["length"])
        if zlib.crc32(buf) != chunk["crc32"]:
            raise StoreError(f"{key}: checksum mismatch")
        tar_buf.write(buf)
    if tar_buf.tell() != manifest["total"]:
        raise StoreError(f"fetched {tar_buf.tell()} bytes, manifest says {manifest['total']}")
    phases["transfer"] = time.perf_counter() - t

    t = time.perf_counter()
    tar_buf.seek(0)
    os.makedirs(dst_dir, exist_ok=True)
    with tarfile.open(fileobj=tar_buf, mode="r") as tar:
        if hasattr(tarfile, "data_filter"):
            tar.extractall(dst_dir, filter="data")
        else:
            tar.extractall(dst_dir)
        files = len(tar.getmembers())
    phases["untar"] = time.perf_counter() - t
    return {"bytes": manifest["total"], "chunks": len(manifest["chunks"]), "files": files}


def main(argv: list) -> int:
    if len(argv) != 5 or argv[0] not in ("publish", "install"):
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    op, master, metadata, prefix, directory = argv
    prefix = prefix.rstrip("/")
    phases = {}
    start = time.perf_counter()
    store = MooncakeDistributedStore()
    rc = store.setup("127.0.0.1", metadata, 0, LOCAL_BUFFER_BYTES, "tcp", "", master)
    phases["setup"] = time.perf_counter() - start
    if rc != 0:
        print(f"setup failed: {rc}", file=sys.stderr)
        return 2
    try:
        if op == "publish":
            result = publish(store, prefix, directory, phases)
        else:
            result = install(store, prefix, directory, phases)
    except Miss as e:
        print(f"{op} {prefix}: miss: {e}", file=sys.stderr)
        return 3
    except (StoreError, OSError, tarfile.TarError, ValueError, KeyError) as e:
        print(f"{op} {prefix}: {e}", file=sys.stderr)
        return 1
    finally:
        t = time.perf_counter()
        rc = store.close()
        phases["close"] = time.perf_counter() - t
    if rc != 0:
        print(f"close failed: {rc}", file=sys.stderr)
        return 1
    seconds = time.perf_counter() - start
    phases = {k: round(v, 6) for k, v in phases.items()}
    print(json.dumps({"op": op, **result, "seconds": round(seconds, 6), "phases": phases}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
