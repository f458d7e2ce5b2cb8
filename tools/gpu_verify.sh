#!/usr/bin/env bash
# One command that verifies every GPU test and benchmark on a GPU machine that
# has no Bazel and no Ember checkout. Here (a build with CUDA support), it
# finds the GPU targets of every area, builds them and packs them with every
# shared library they need (stripped, xz-compressed, under 48 MiB) into a
# folder; on the GPU machine that folder's run.sh runs them all and ends with
# one line `N passed, M failed, K skipped`.
#
#   tools/gpu_verify.sh [--out DIR] [--check]
#     --out DIR   the bundle's folder (default .device/bundle, git-ignored)
#     --check     then run the bundle here under `env -i`, as a machine with
#                 nothing set up would (no GPU here: the GPU cases skip)
#   # on the GPU machine, with the folder copied there:
#   bundle/run.sh [--budget SECONDS] [--log FILE] [--no-memcheck] [--filter REGEX]
#                 [--exclude REGEX]
#
# Which targets: a GPU test is a cc_test tagged "gpu" (every cuda_cc_test
# is; a test of another rule with GPU cases says so with tags = ["gpu"]); a
# GPU benchmark is a cc_binary tagged both "benchmark" (what
# ember_cc_benchmark tags) and "gpu". A CPU test that merely links the CUDA
# toolkit (through //distributed's nccl or parallel's cuda_comm) is not one.
#
# What the bundle holds: run.sh, MANIFEST (the targets, their timeouts, the
# CUDA libraries they need) and payload.tar.xz: bin/ (the binaries, stripped),
# lib/ (Ember's own shared libraries and the Debian ones the binaries link,
# stripped), lib/fallback/ (libstdc++ and libgcc_s, used only where the
# machine's own are too old) and lib/cudart/ (the CUDA runtime, used only where
# the machine has none) and data/ (the tests' data files at their workspace
# paths, which run.sh links into each test's working folder). cuBLAS, cuDNN and NCCL are far too large to carry:
# run.sh finds them on the GPU machine (see tools/gpu_verify_run.sh). Beside
# them, the PyTorch peers run.sh runs when the machine's python3 has torch
# with CUDA: torch_train_step.py (nn/cuda/: the training-step and attention benchmarks) and
# torch_cuda_queue.py (multiprocessing/: cuda_queue_benchmark's CUDA tensors
# through a Queue).
set -euo pipefail
cd "$(dirname "$0")/.."
out=.device/bundle
check=0
while (($#)); do
  case "$1" in
    --out) out="$2"; shift 2 ;;
    --check) check=1; shift ;;
    -h | --help) sed -n '2,28p' "$0"; exit 0 ;;
    *) echo "gpu_verify.sh: unknown argument '$1'; see --help" >&2; exit 2 ;;
  esac
done
die() { echo "gpu_verify.sh: $*" >&2; exit 1; }
limit_mib=48

# ---- The build must have CUDA support ----
bazel query --noshow_progress @ember_cuda//:all >/dev/null 2>&1 || true
defs="$(bazel info output_base 2>/dev/null)/external/ember_cuda/defs.bzl"
[[ -f "$defs" ]] || die "cannot read $defs (is this an Ember checkout?)"
if ! grep -q '^CUDA_ENABLED = True' "$defs"; then
  state=$(sed -n 's/^CUDA_STATE = "\(.*\)"$/\1/p' "$defs")
  die "this build is ${state:-without CUDA support}; the GPU bundle needs the CUDA toolkit
(in /usr/local/cuda or EMBER_CUDA_PATH, with EMBER_CUDA unset or 1)."
fi
cuda_root=$(sed -n 's/^CUDA_PATH = "\(.*\)"$/\1/p' "$defs")

# ---- Find the GPU targets (tagged "gpu": see "Which targets" above) ----
gpu="attr(tags, '\\bgpu\\b', //...)"
query() { bazel query --noshow_progress --keep_going "$1" 2>/dev/null | sort -u; }
mapfile -t tests < <(query "kind('cc_test rule', $gpu)")
mapfile -t benchmarks < <(query "attr(tags, '\\bbenchmark\\b', kind('cc_binary rule', $gpu))")
((${#tests[@]} > 0)) || die "no GPU tests found"
mapfile -t medium < <(query "attr(size, 'medium', set(${tests[*]}))")
mapfile -t large < <(query "attr(size, 'large|enormous', set(${tests[*]}))")
# Their data files: the bundle carries the source files (under data/, at
# their workspace paths, which is where a test finds them in its runfiles);
# a target that needs a built file or another rule as data cannot run there.
mapfile -t data_files < <(query "kind('source file', labels(data, set(${tests[*]} ${benchmarks[*]})))")
mapfile -t data_rules < <(query "kind(rule, labels(data, set(${tests[*]} ${benchmarks[*]})))")
((${#data_rules[@]} == 0)) ||
  die "GPU targets take rules as data (${data_rules[*]}); the bundle carries only source files"
echo "gpu_verify.sh: ${#tests[@]} GPU tests, ${#benchmarks[@]} GPU benchmarks"

bazel build --noshow_progress "${tests[@]}" "${benchmarks[@]}"
bin_dir=$(bazel info bazel-bin 2>/dev/null)

# ---- Stage and pack ----
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/bin" "$stage/lib/fallback" "$stage/lib/cudart" "$stage/data"
for f in "${data_files[@]}"; do
  f="${f#//}" f="${f/://}" f="${f#/}"
  mkdir -p "$stage/data/$(dirname "$f")"
  cp -L "$f" "$stage/data/$f"
done
# A binary's name in the bundle: the target's name, or, where two GPU targets
# of different packages share it, its package too, with / as _
# (nn_models_resnet_cuda_test for //nn/models:resnet_cuda_test).
declare -A name_count=()
for t in "${tests[@]}" "${benchmarks[@]}"; do
  n="${t##*:}"
  name_count[$n]=$((${name_count[$n]:-0} + 1))
done
name_of() {
  local t="${1#//}" n
  n="${t##*:}"
  if ((${name_count[$n]} > 1)); then
    local pkg="${t%%:*}"
    echo "${pkg//\//_}_$n"
  else
    echo "$n"
  fi
}
path_of() { local t="${1#//}"; echo "$bin_dir/${t%%:*}/${t##*:}"; }
declare -A cuda_libs=()
for target in "${tests[@]}" "${benchmarks[@]}"; do
  bin="$(path_of "$target")"
  name="$(name_of "$target")"
  [[ ! -e "$stage/bin/$name" ]] || die "two GPU targets are named $name; rename one"
  cp -L "$bin" "$stage/bin/$name"
  # `soname => path` for every library the loader resolves here.
  while read -r soname path; do
    case "$soname" in
      linux-vdso.so.* | ld-linux-* | /lib64/ld-linux-*) continue ;;
      libc.so.* | libm.so.* | libpthread.so.* | libdl.so.* | librt.so.* | libresolv.so.* | libutil.so.*) continue ;;
    esac
    [[ "$path" == /* ]] || die "$name needs $soname, which does not resolve here"
    if [[ "$path" == "$cuda_root"/* || "$(readlink -f "$path")" == "$(readlink -f "$cuda_root")"/* ]]; then
      cuda_libs[$soname]=1
      # The runtime is small: carried as a fallback for machines without it.
      [[ "$soname" != libcudart.so.* ]] || cp -nL "$path" "$stage/lib/cudart/$soname"
    elif [[ "$soname" == libstdc++.so.* || "$soname" == libgcc_s.so.* ]]; then
      cp -nL "$path" "$stage/lib/fallback/$soname"
    else
      cp -nL "$path" "$stage/lib/$soname"
    fi
  done < <(ldd "$bin" | awk '$2 == "=>" { print $1, $3 } $2 != "=>" { print $1, "-" }')
done
chmod -R u+w "$stage"
find "$stage" -type f -exec strip --strip-unneeded {} + 2>/dev/null || true

timeout_of() {  # Bazel's timeouts for the test's size
  local t="$1" m
  for m in "${large[@]}"; do [[ "$m" != "$t" ]] || { echo 900; return; }; done
  for m in "${medium[@]}"; do [[ "$m" != "$t" ]] || { echo 300; return; }; done
  echo 60
}
rm -rf "$out"
mkdir -p "$out"
{
  echo "# Written by tools/gpu_verify.sh at $(git rev-parse --short HEAD 2>/dev/null || echo unknown)."
  echo "# kind name timeout_s target"
  for t in "${tests[@]}"; do echo "test $(name_of "$t") $(timeout_of "$t") $t"; done
  for t in "${benchmarks[@]}"; do echo "benchmark $(name_of "$t") 180 $t"; done
  for l in "${!cuda_libs[@]}"; do echo "cuda_lib $l"; done | sort
} >"$out/MANIFEST"
# The benchmarks are linked statically, each with its own copy of the same
# libraries: a dictionary larger than any binary lets xz keep each repeat
# once (53 MiB at xz's default 8 MiB dictionary, 40 MiB at 192 MiB). One
# thread: xz's threads compress blocks apart, which loses the repeats.
# Unpacking needs 192 MiB of memory.
tar -C "$stage" -cf - bin lib data | xz -T1 --lzma2=preset=6,dict=192MiB >"$out/payload.tar.xz"
cp tools/gpu_verify_run.sh "$out/run.sh"
chmod +x "$out/run.sh"
cp nn/cuda/torch_train_step.py "$out/torch_train_step.py"
cp multiprocessing/torch_cuda_queue.py "$out/torch_cuda_queue.py"

size_kib=$(du -sk "$out" | cut -f1)
((size_kib < limit_mib * 1024)) ||
  die "the bundle is $((size_kib / 1024)) MiB, over the ${limit_mib} MiB a GPU machine takes"
echo "gpu_verify.sh: bundle $out ($((size_kib / 1024)).$((size_kib % 1024 * 10 / 1024)) MiB; unpacked $(du -sh "$stage" | cut -f1))"

if ((check)); then
  echo "gpu_verify.sh: running it here under env -i"
  env -i bash "$out/run.sh" --log "$out/check.log"
fi
