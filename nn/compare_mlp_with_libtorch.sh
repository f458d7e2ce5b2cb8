#!/usr/bin/env bash
# Runs the MLP training-step benchmark (//nn:mlp_benchmark) and the LibTorch
# peer (../shared/peers/libtorch_autograd.cc) alternately, `rounds` times,
# in two thread settings: OpenBLAS's default (the peer as written: its
# set_num_threads(1) leaves Debian's OpenBLAS at one thread per core) and one
# OpenBLAS thread (OPENBLAS_NUM_THREADS=1 for the peer). Prints each round and
# the median ratio Ember / LibTorch per setting. Both sides follow the peer's
# protocol: a fresh process, 30 steps, the median of the last 25. Run from the
# repository root:
#   nn/compare_mlp_with_libtorch.sh [rounds]
set -euo pipefail
rounds="${1:-7}"
# The peers live beside the repository, in ../shared/peers.
peer_src="${EMBER_PEERS_DIR:-$(dirname "$0")/../../shared/peers}/libtorch_autograd.cc"
peer_bin="${TMPDIR:-/tmp}/ember_libtorch_autograd"
if [[ ! -x "$peer_bin" || "$peer_src" -nt "$peer_bin" ]]; then
  if [[ ! -f /usr/include/torch/csrc/api/include/torch/torch.h ]]; then
    echo "compare_mlp_with_libtorch.sh: the LibTorch peer needs LibTorch's headers;" \
      "install Debian's libtorch-dev (apt-get install libtorch-dev) and run again" >&2
    exit 2
  fi
  g++ -O2 -std=c++17 "$peer_src" -I/usr/include/torch/csrc/api/include \
    -ltorch -ltorch_cpu -lc10 -o "$peer_bin"
fi
bazel build //nn:mlp_benchmark >/dev/null 2>&1
ember_bin=bazel-bin/nn/mlp_benchmark

peer_ms() {  # $1: OPENBLAS_NUM_THREADS value or "" for the default
  if [[ -n "$1" ]]; then export OPENBLAS_NUM_THREADS="$1"; else unset OPENBLAS_NUM_THREADS; fi
  "$peer_bin" | sed -n 's/^libtorch mlp_step_64x512x4 \([0-9.]*\)ms$/\1/p'
  unset OPENBLAS_NUM_THREADS
}

ember_ms() {  # $1: benchmark argument (1 or 0); prints "ember cblas" median steps in ms
  "$ember_bin" --benchmark_filter="^PeerProtocol/.*/$1/" 2>/dev/null |
    awk '{ for (i = 1; i <= NF; ++i) if ($i ~ /^median_ms=/) { split($i, kv, "="); m = kv[2] } }
         /EmberMlpStep/ { e = m } /CblasMlpStep/ { c = m } END { print e, c }'
}

for setting in default 1; do
  arg=0; env_threads=""
  if [[ "$setting" == 1 ]]; then arg=1; env_threads=1; fi
  ratios=()
  for ((r = 1; r <= rounds; ++r)); do
    torch="$(peer_ms "$env_threads")"
    read -r ember cblas < <(ember_ms "$arg")
    ratio="$(awk -v e="$ember" -v t="$torch" 'BEGIN { printf "%.3f", e / t }')"
    ratios+=("$ratio")
    echo "openblas threads=$setting round $r: ember ${ember} ms  cblas ${cblas} ms  libtorch ${torch} ms  ember/libtorch ${ratio}"
  done
  printf '%s\n' "${ratios[@]}" | sort -n |
    awk -v s="$setting" '{a[NR]=$1} END {print "openblas threads=" s ": median ember/libtorch " a[int((NR+1)/2)]}'
done
