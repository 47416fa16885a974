#!/bin/sh
# Builds this example policy with `jitship policy build` and dry-runs it with `jitship policy test`
# on a small Triton-shaped tree and four generations (one golden), checking its answers.
# Run from anywhere; uses target/ of the workspace. Needs: rustup target add wasm32-unknown-unknown
set -eu
cd "$(dirname "$0")/../.."
cargo build -q -p jitship
JITSHIP=target/debug/jitship
out=target/example-retention
rm -rf "$out" && mkdir -p "$out/root/ABCD" "$out/root/EFGH/tmp.pid_1_2"
echo cubin > "$out/root/ABCD/k.cubin"
echo '{"child_paths": {}}' > "$out/root/ABCD/__grp__k.json"
echo partial > "$out/root/EFGH/tmp.pid_1_2/k.cubin"
# ids are content hashes: the blake3 of "new", "gold", "a", "b" (any 64-hex strings do)
cat > "$out/generations.json" <<'JSON'
[
 {"id": "1111111111111111111111111111111111111111111111111111111111111111", "compat_key": "k", "created_at": 400, "size_bytes": 4294967296, "file_count": 1, "pinned": false},
 {"id": "2222222222222222222222222222222222222222222222222222222222222222", "compat_key": "k", "created_at": 300, "size_bytes": 12884901888, "file_count": 1, "pinned": true},
 {"id": "3333333333333333333333333333333333333333333333333333333333333333", "compat_key": "k", "created_at": 200, "size_bytes": 3221225472, "file_count": 1, "pinned": false},
 {"id": "4444444444444444444444444444444444444444444444444444444444444444", "compat_key": "k", "created_at": 100, "size_bytes": 3221225472, "file_count": 1, "pinned": false}
]
JSON
$JITSHIP policy build examples/retention-policy -o "$out/golden-retention.wasm" --locked
$JITSHIP policy check "$out/golden-retention.wasm"
$JITSHIP policy test "$out/golden-retention.wasm" --root "$out/root" --generations "$out/generations.json" --now 500 \
    --fact pkg.triton=3.9.0 --fact gpu.arch=sm_90 --fact driver.major=550 --fact os.arch=x86_64 --json > "$out/report.json"
cat "$out/report.json"
# 20 GiB quota: new (4) + golden (12) + 3333 (3) = 19 GiB fit; 4444 does not.
python3 - "$out/report.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
assert r["compat_key"]["value"] == "triton-golden@1;driver.major=550;gpu.arch=sm_90;os.arch=x86_64;pkg.triton=3.9.0", r["compat_key"]
verdicts = {d["path"]: d["verdict"] for d in r["select"]["call"]["value"]}
assert verdicts == {"ABCD/__grp__k.json": "publish", "ABCD/k.cubin": "publish", "EFGH/tmp.pid_1_2/k.cubin": "skip"}, verdicts
categories = {d["path"]: d["category"] for d in r["select"]["call"]["value"]}
assert categories == {"ABCD/__grp__k.json": "complete", "ABCD/k.cubin": "complete", "EFGH/tmp.pid_1_2/k.cubin": "temporary"}, categories
markers = [d["path"] for d in r["select"]["call"]["value"] if d.get("marker")]
assert markers == ["ABCD/__grp__k.json"], markers
assert r["select"]["complete"] is True, r["select"]
assert r["contract"].startswith("3."), r["contract"]
assert r["settings"] == {"keep": "5", "quota": str(20 << 30)}, r["settings"]
drops = r["retain"]["call"]["value"]
assert [d["id"] for d in drops] == ["4" * 64], r["retain"]
assert drops[0]["category"] == "size", drops
PY
# The same module with its settings changed, no rebuild: keep 1 drops the third as well.
$JITSHIP policy test "$out/golden-retention.wasm" --generations "$out/generations.json" --now 500 \
    --setting keep=1 --setting "quota=100 GiB" \
    --fact pkg.triton=3.9.0 --fact gpu.arch=sm_90 --fact driver.major=550 --fact os.arch=x86_64 --json > "$out/report-keep1.json"
python3 - "$out/report-keep1.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
assert r["settings"] == {"keep": "1", "quota": str(100 << 30)}, r["settings"]
drops = r["retain"]["call"]["value"]
assert [(d["id"], d["category"]) for d in drops] == [("3" * 64, "count"), ("4" * 64, "count")], drops
PY
echo "example policy: built, checked and dry-run as expected"
