#!/usr/bin/env bash
# Runs the fault-tolerance example as its header says: a lighthouse, then
# three replica groups under launch --replica_groups; group 1 kills itself in
# the middle of step 120. Fails unless launch restarted it alone (the others
# went on), every group committed all 300 steps, the replacement recovered
# the state from a peer, a survivor discarded the broken step, and the loss
# at step 300 is below 1.0 (it starts near 2.3).
set -euo pipefail
launch="$1"
lighthouse="$2"
program="$3"
out="${TEST_TMPDIR:-$(mktemp -d)}/ft"
mkdir -p "$out"
free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])' \
    2>/dev/null || echo $((20000 + RANDOM % 20000))
}
"$lighthouse" --bind=127.0.0.1:0 --min_replicas=2 --join_timeout_ms=200 \
  --heartbeat_timeout_ms=1000 >"$out/lighthouse.txt" 2>&1 &
lighthouse_pid=$!
trap 'kill "$lighthouse_pid" 2>/dev/null || true' EXIT
address=""
for _ in $(seq 1 100); do
  address="$(sed -n 's/^lighthouse: serving on //p' "$out/lighthouse.txt")"
  [[ -n "$address" ]] && break
  sleep 0.1
done
if [[ -z "$address" ]]; then
  echo "FAIL: the lighthouse did not start: $(cat "$out/lighthouse.txt")" >&2
  exit 1
fi
run="$(timeout 300 "$launch" --nproc_per_node=3 --replica_groups --max_restarts=3 \
  --lighthouse="$address" --master_port="$(free_port)" "$program" --steps=300 --die_at=120 2>&1)"
echo "$run"
expect() {
  if ! echo "$run" | grep -q -- "$1"; then
    echo "FAIL: $2" >&2
    exit 1
  fi
}
expect "worker rank 1 was killed by signal 9 (SIGKILL); restarting it alone" \
  "launch did not restart replica group 1 alone"
for g in 0 1 2; do
  expect "replica group $g: 300 steps committed" "replica group $g did not commit 300 steps"
done
# Its first step may be discarded: the quorum overlaps each step (Note
# [Overlapping the quorum]), and a membership change costs one step.
if ! echo "$run" | grep -E -q "replica group 1: 300 steps committed, [01] discarded, 1 recoveries"; then
  echo "FAIL: the replacement of group 1 did not recover the state from a peer" >&2
  exit 1
fi
if ! echo "$run" | grep -E -q "replica group [02]: 300 steps committed, [1-9][0-9]* discarded"; then
  echo "FAIL: no survivor discarded the step in which group 1 died" >&2
  exit 1
fi
loss="$(echo "$run" | sed -n 's/^step 300  loss \([0-9.]*\).*/\1/p')"
if [[ -z "$loss" ]] || ! awk -v l="$loss" 'BEGIN { exit !(l < 1.0) }'; then
  echo "FAIL: the loss at step 300 is '$loss', not below 1.0" >&2
  exit 1
fi
echo "PASS: group 1 killed at step 120 and restarted alone, recovered from a peer; loss $loss"
