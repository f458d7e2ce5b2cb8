#!/usr/bin/env bash
# Runs the DataLoader-fed DDP example as a preempted job would run: 4
# processes stopped after 5 steps of the first epoch (a distributed
# checkpoint with the loader's state), then resumed by an elastic launch on
# 3 processes to the end of that epoch.
# Fails unless both runs exit cleanly and, over both, every one of the
# 1,200 samples was trained on, and only 2 twice: the padding
# DistributedSampler adds because the 880 samples left do not divide by 3.
set -euo pipefail
launch="$1"
program="$2"
dir="${TEST_TMPDIR:-$(mktemp -d)}"
port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])' \
    2>/dev/null || echo $((20000 + RANDOM % 20000))
}
args=(--epochs=1 --batch=16 --checkpoint="$dir/ckpt" --seen="$dir")
"$launch" --nproc_per_node=4 --master_port="$(port)" "$program" "${args[@]}" --stop_after=5
# The resumed job runs as an elastic one (a rendezvous of 1 to 2 nodes; this
# host alone joins it).
"$launch" --nproc_per_node=3 --nnodes=1:2 --rdzv_endpoint="127.0.0.1:$(port)" --rdzv_id=data \
  --rdzv_conf=join_timeout=15,last_call_timeout=1 "$program" "${args[@]}" | tee "$dir/resumed.out"
first="$(cat "$dir"/seen.4.* | wc -l)"
second="$(cat "$dir"/seen.3.* | wc -l)"
# 4 ranks x 5 steps x 16; then the 880 left over 3 ranks: 294 each.
if [[ "$first" -ne 320 || "$second" -ne 882 ]]; then
  echo "FAIL: trained on $first samples before the stop and $second after; expected 320 and 882" >&2
  exit 1
fi
distinct="$(cat "$dir"/seen.* | sort -n | uniq | wc -l)"
if [[ "$distinct" -ne 1200 ]]; then
  echo "FAIL: $distinct distinct samples over both runs; expected all 1200" >&2
  exit 1
fi
twice="$(cat "$dir"/seen.* | sort -n | uniq -d | wc -l)"
if [[ "$twice" -ne 2 ]]; then
  echo "FAIL: $twice samples trained on twice; expected the 2 of the padding" >&2
  exit 1
fi
if ! grep -q "starting in epoch 0 (294 samples per rank this epoch)" "$dir/resumed.out"; then
  echo "FAIL: the resumed run did not resume mid-epoch" >&2
  exit 1
fi
if ! grep -q "held-out accuracy" "$dir/resumed.out"; then
  echo "FAIL: no held-out accuracy line" >&2
  exit 1
fi
echo "PASS: 320 samples at 4 ranks, 882 at 3, all 1200 seen, 2 (the padding) twice"
