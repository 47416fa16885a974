#!/usr/bin/env bash
# jitship's main job on the embedded local store, end to end on one machine:
# a worker's Triton-like cache is published as a generation, republished (nothing new to upload),
# then installed into a fresh cache root the way a new pod would at start, and compared (group
# files, which name the root, are relocated to the new one).
#
#   ./examples/quickstart.sh            # uses ./target/quickstart as scratch space
set -euo pipefail
cd "$(dirname "$0")/.."
work=${1:-target/quickstart}
rm -rf "$work" && mkdir -p "$work"

# The test suite runs this with JITSHIP_QUICKSTART_PROFILE=dev to reuse its debug build.
profile=${JITSHIP_QUICKSTART_PROFILE:-release}
cargo build --profile "$profile" -q -p jitship
jitship=target/$([ "$profile" = dev ] && echo debug || echo "$profile")/jitship
store="local:$work/store"

echo "== a worker compiles kernels: 300 Triton-like kernel directories"
for k in $(seq 1 300); do
  d="$work/worker-a/triton/$(printf '%052x' "$k")"
  mkdir -p "$d"
  children=""
  for ext in source ttir ttgir llir ptx cubin json; do
    head -c $(( (k * 131 % 20000) + 500 )) /dev/urandom > "$d/kernel_$k.$ext"
    children="$children${children:+, }\"kernel_$k.$ext\": \"$(cd "$d" && pwd)/kernel_$k.$ext\""
  done
  # Written last, naming every child by absolute path, as Triton does: the triton policy
  # publishes a kernel directory only when its group file parses and every child exists.
  echo "{\"child_paths\": {$children}}" > "$d/__grp__kernel_$k.json"
done
mkdir -p "$work/worker-a/triton/tmp.pid_42_abc" && echo partial > "$work/worker-a/triton/tmp.pid_42_abc/kernel.cubin"

# What the built-in triton policy keys on (jitship gathers them on a GPU machine; given here).
facts=(--fact gpu.name="NVIDIA H100 80GB HBM3" --fact gpu.cc=9.0 --fact gpu.arch=sm_90 --fact driver.major=550
       --fact os.arch=x86_64 --fact python.version=3.12.3 --fact pkg.triton=3.9.0)

echo "== jitship publish (the sidecar does this continuously; in-flight temp dirs are skipped)"
"$jitship" publish --store "$store" --cache triton="$work/worker-a/triton" "${facts[@]}"
echo "== jitship publish again: nothing new, nothing uploaded"
"$jitship" publish --store "$store" --cache triton="$work/worker-a/triton" "${facts[@]}"

echo "== a new pod starts: jitship install"
"$jitship" install --store "$store" --cache triton="$work/worker-b/triton" "${facts[@]}" --report "$work/install-report.json"
echo "== a pod on another GPU gets a miss (exit code 11), never a wrong cache"
"$jitship" install --store "$store" --cache triton="$work/worker-c/triton" --fact gpu.name="NVIDIA A100-SXM4-80GB" --fact gpu.cc=8.0 --fact gpu.arch=sm_80 --fact driver.major=550 --fact os.arch=x86_64 --fact python.version=3.12.3 --fact pkg.triton=3.9.0 || echo "exit code $?"

echo "== the installed cache is the worker's, relocated: kernels byte for byte, group files naming worker-b's root"
diff -r --exclude='tmp.pid_*' --exclude='__grp__*' "$work/worker-a/triton" "$work/worker-b/triton"
# A group file names its children by absolute path (Triton's get_group reads them): installed at
# another root it must name that root's files, every one of which exists.
python3 - "$(cd "$work/worker-a/triton" && pwd)" "$(cd "$work/worker-b/triton" && pwd)" <<'PY'
import json, os, pathlib, sys
a, b = sys.argv[1], sys.argv[2]
groups = sorted(pathlib.Path(a).glob("*/__grp__*.json"))
for ga in groups:
    gb = pathlib.Path(b) / ga.relative_to(a)
    want = {k: b + v[len(a):] for k, v in json.loads(ga.read_text())["child_paths"].items()}
    got = json.loads(gb.read_text())["child_paths"]
    assert got == want, f"{gb}: {got} != {want}"
    assert all(os.path.isfile(p) for p in got.values()), f"{gb} names a missing child"
print(f"   {len(groups)} group files name worker-b's own kernels")
PY
echo "== installed cache matches the worker's (report: $work/install-report.json)"
