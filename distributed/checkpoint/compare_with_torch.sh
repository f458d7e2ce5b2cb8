#!/bin/sh
# Save/load throughput of distributed checkpoints beside one torch.save file of
# the same 64 MiB state: checkpoint_benchmark (Ember's DCP and Ember's
# torch.save writer/reader, one binary) and testdata/torch_bench.py (PyTorch
# 2.x's torch.save/torch.load and torch.distributed.checkpoint), alternated
# ROUNDS times on the same machine, files in DIR.
#
#   distributed/checkpoint/compare_with_torch.sh [PYTHON] [DIR] [ROUNDS]
#
# PYTHON defaults to the PyTorch 2.x peer that tools/install_peers.sh installs
# (or EMBER_TORCH2_PYTHON), found as the tests find it.
set -eu
cd "$(dirname "$0")/../.."
PYTHON=${1:-$(tools/install_peers.sh --python)}
DIR=${2:-${TMPDIR:-/tmp}/dcp_compare}
ROUNDS=${3:-3}
bazel build -c opt //distributed/checkpoint:checkpoint_benchmark
BIN=$(bazel info -c opt bazel-bin)/distributed/checkpoint/checkpoint_benchmark
mkdir -p "$DIR"
uptime
i=1
while [ "$i" -le "$ROUNDS" ]; do
  echo "== round $i"
  EMBER_BENCH_DIR="$DIR" "$BIN" --benchmark_min_time=0.5 --benchmark_repetitions=3 \
    --benchmark_enable_random_interleaving=true --benchmark_report_aggregates_only=true \
    2>&1 | grep -E '_median|^Load'
  "$PYTHON" distributed/checkpoint/testdata/torch_bench.py "$DIR/torch" 3 2>/dev/null
  i=$((i + 1))
done
uptime
