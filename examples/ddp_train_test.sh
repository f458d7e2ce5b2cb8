#!/usr/bin/env bash
# Runs the DDP example the way the README's Quick start does: two processes
# started by the launch utility. Fails unless both exit cleanly, rank 0
# reports a held-out accuracy of at least the given minimum, and the
# checkpoint was written.
set -euo pipefail
launch="$1"
program="$2"
minimum="$3"
dir="${TEST_TMPDIR:-$(mktemp -d)}"
# A port nobody listens on (launch fails clearly if it is taken meanwhile).
port="$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])' 2>/dev/null ||
  echo $((20000 + RANDOM % 20000)))"
output="$("$launch" --nproc_per_node=2 --master_port="$port" "$program" --steps=300 \
  --checkpoint="$dir/ddp_train.pt")"
echo "$output"
accuracy="$(echo "$output" | sed -n 's/^held-out accuracy: \([0-9.]*\)$/\1/p')"
if [[ -z "$accuracy" ]]; then
  echo "FAIL: no 'held-out accuracy:' line in the output" >&2
  exit 1
fi
if ! awk -v a="$accuracy" -v m="$minimum" 'BEGIN { exit !(a >= m) }'; then
  echo "FAIL: held-out accuracy $accuracy is below $minimum" >&2
  exit 1
fi
if ! echo "$output" | grep -q "samples/s over 2 processes"; then
  echo "FAIL: no throughput line" >&2
  exit 1
fi
if [[ ! -s "$dir/ddp_train.pt" ]]; then
  echo "FAIL: no checkpoint at $dir/ddp_train.pt" >&2
  exit 1
fi
echo "PASS: held-out accuracy $accuracy >= $minimum; checkpoint written"
