#!/usr/bin/env bash
# Runs the DDP benchmark (//parallel:ddp_benchmark) and the PyTorch peer
# (../shared/peers/torch_ddp.py: DDP over gloo, 2 ranks x batch 32, one
# thread each, and one process on batch 64) alternately, `rounds` times, one
# OpenBLAS thread on both sides. Both follow the peer's protocol: a fresh
# process, 30 steps, the median of the last 25. Prints each round and the
# medians over rounds of the ratios measured within a round. Run from the
# repository root:
#   parallel/compare_ddp_with_torch.sh [rounds]
set -euo pipefail
rounds="${1:-5}"
bazel build //parallel:ddp_benchmark >/dev/null 2>&1
ember_bin=bazel-bin/parallel/ddp_benchmark
export OPENBLAS_NUM_THREADS=1

counter() {  # $1: row pattern, $2: counter name; reads the benchmark output on stdin
  awk -v row="$1" -v name="$2" '$1 ~ row { for (i = 1; i <= NF; ++i) { split($i, kv, "=");
    if (kv[1] == name) print kv[2] } }'
}

median() { sort -n | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }'; }

results=()
for ((r = 1; r <= rounds; ++r)); do
  peer="$(/usr/bin/python3 "${EMBER_PEERS_DIR:-$(dirname "$0")/../../shared/peers}/torch_ddp.py" 2>/dev/null)"
  torch_one="$(echo "$peer" | sed -n 's/^single_process_step_b64_1thread \([0-9.]*\)ms$/\1/p')"
  torch_ddp="$(echo "$peer" | sed -n 's/^ddp_gloo_2rank_step_b32each \([0-9.]*\)ms$/\1/p')"
  out="$("$ember_bin" --benchmark_filter='^BM_(OneProcessStep|DdpStep|AllReduceBuckets)/' 2>/dev/null)"
  one="$(echo "$out" | counter '^BM_OneProcessStep/64/' median_ms)"
  half="$(echo "$out" | counter '^BM_OneProcessStep/32/' median_ms)"
  ddp="$(echo "$out" | counter '^BM_DdpStep/0/' median_ms)"
  view="$(echo "$out" | counter '^BM_DdpStep/1/' median_ms)"
  wait0="$(echo "$out" | counter '^BM_DdpStep/0/' comm_wait_ms)"
  wait1="$(echo "$out" | counter '^BM_DdpStep/1/' comm_wait_ms)"
  allreduce="$(echo "$out" | counter '^BM_AllReduceBuckets' median_ms)"
  line="$(awk -v one="$one" -v ddp="$ddp" -v view="$view" -v tone="$torch_one" -v tddp="$torch_ddp" \
    -v half="$half" -v ar="$allreduce" 'BEGIN {
      printf "%.3f %.3f %.3f %.3f %.3f %.3f", ddp / tddp, view / tddp, ddp / one, view / one,
        1 - (ddp - half) / ar, 1 - (view - half) / ar }')"
  results+=("$line")
  echo "round $r: torch ddp ${torch_ddp} one ${torch_one} | ember ddp ${ddp} view ${view}" \
    "one ${one} (b32: ${half}) | all_reduce alone ${allreduce}, waited after backward ${wait0} / ${wait1} (ms) | ratios: $line"
done
names=("ember ddp / torch ddp" "ember ddp (bucket view) / torch ddp" "ember ddp / ember one process b64"
  "ember ddp (bucket view) / ember one process b64" "all_reduce hidden behind backward"
  "all_reduce hidden behind backward (bucket view)")
for i in 0 1 2 3 4 5; do
  m="$(printf '%s\n' "${results[@]}" | awk -v c=$((i + 1)) '{ print $c }' | median)"
  echo "median ${names[$i]}: $m"
done
