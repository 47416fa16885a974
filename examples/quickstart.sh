#!/usr/bin/env bash
# jitship's main job on the embedded local store, end to end on one machine:
# a worker's Triton-like cache is published as a generation, republished (nothing new to upload),
# then installed into a fresh cache root the way a new pod would at start, and compared.
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

diff -r --exclude='tmp.pid_*' "$work/worker-a/triton" "$work/worker-b/triton" && echo "== installed cache is identical to the worker's (report: $work/install-report.json)"
