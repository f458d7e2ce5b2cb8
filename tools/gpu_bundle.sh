#!/usr/bin/env bash
# Builds the tests and benchmarks that need a GPU and gathers them into one
# folder that runs on a GPU machine without Bazel or an Ember checkout: each
# binary, the shared libraries Bazel linked it against (its _solib files),
# and run.sh, which runs every test, then every benchmark, and exits non-zero
# when a test fails. The CUDA runtime, cuBLAS, cuDNN and NCCL come from the
# GPU machine's /usr/local/cuda.
#
#   tools/gpu_bundle.sh [folder]        # default: .device/bundle (git-ignored)
#   # on the GPU machine, from the folder's parent:
#   bundle/run.sh [gtest/benchmark flags...]
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-.device/bundle}"

tests=(
  //third_party/cuda:cuda_test
  //tools:cuda_library_test
  //cuda:status_test
  //cuda:device_test
  //cuda:stream_test
  //cuda:block_pool_test
  //cuda:caching_allocator_test
  //cuda:kernels_test
)
benchmarks=(
  //cuda:allocator_benchmark
  //cuda:kernels_benchmark
)
bazel build "${tests[@]}" "${benchmarks[@]}"

rm -rf "$out"
mkdir -p "$out/bin" "$out/lib"
binary() { local t="${1#//}"; echo "bazel-bin/${t%%:*}/${t##*:}"; }
for target in "${tests[@]}" "${benchmarks[@]}"; do
  bin="$(binary "$target")"
  cp "$bin" "$out/bin/"
  # Bazel links tests against one shared library per cc_library; ldd names
  # the ones under bazel-out.
  ldd "$bin" | awk '$3 ~ /bazel-out|_solib/ { print $3 }' | while read -r lib; do
    cp -n "$lib" "$out/lib/" 2>/dev/null || true
  done
done

{
  echo '#!/usr/bin/env bash'
  echo '# Written by tools/gpu_bundle.sh: every GPU test, then every benchmark.'
  echo 'here="$(cd "$(dirname "$0")" && pwd)"'
  echo 'export LD_LIBRARY_PATH="$here/lib:/usr/local/cuda/lib64:/usr/local/cuda/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"'
  echo 'failed=0'
  for target in "${tests[@]}"; do
    name="${target##*:}"
    echo "echo \"=== $name\"; \"\$here/bin/$name\" \"\$@\" || failed=1"
  done
  for target in "${benchmarks[@]}"; do
    name="${target##*:}"
    echo "echo \"=== $name\"; \"\$here/bin/$name\" || failed=1"
  done
  echo 'exit $failed'
} >"$out/run.sh"
chmod +x "$out/run.sh"
du -sh "$out" | awk -v out="$out" '{ print "bundle: " out " (" $1 ")" }'
