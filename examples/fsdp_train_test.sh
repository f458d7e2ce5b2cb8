#!/usr/bin/env bash
# Runs the FSDP example as its header says: two processes under the launch
# utility train and save a distributed checkpoint, then one process resumes
# from it. Fails unless both runs exit cleanly, the resumed run starts where
# the first stopped with the saved model (the same held-out accuracy), and
# its held-out accuracy after more steps reaches the given minimum.
set -euo pipefail
launch="$1"
program="$2"
minimum="$3"
dir="${TEST_TMPDIR:-$(mktemp -d)}/fsdp_ckpt"
free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])' \
    2>/dev/null || echo $((20000 + RANDOM % 20000))
}
first="$("$launch" --nproc_per_node=2 --master_port="$(free_port)" "$program" --steps=150 \
  --checkpoint_dir="$dir")"
echo "$first"
if ! echo "$first" | grep -q "saved a distributed checkpoint of step 150 from 2 process(es)"; then
  echo "FAIL: the 2-process run did not save its checkpoint" >&2
  exit 1
fi
second="$("$launch" --nproc_per_node=1 --master_port="$(free_port)" "$program" --steps=100 \
  --checkpoint_dir="$dir" --resume)"
echo "$second"
if ! echo "$second" | grep -q "resumed from .* at step 150 on 1 process(es)"; then
  echo "FAIL: the 1-process run did not resume at step 150" >&2
  exit 1
fi
# The resumed model is the saved one: the same held-out accuracy.
saved="$(echo "$first" | sed -n 's/^held-out accuracy: \([0-9.]*\)$/\1/p')"
if ! echo "$second" | grep -q "at step 150 on 1 process(es); held-out accuracy $saved\$"; then
  echo "FAIL: the resumed model's accuracy differs from the saved model's ($saved)" >&2
  exit 1
fi
accuracy="$(echo "$second" | sed -n 's/^held-out accuracy: \([0-9.]*\)$/\1/p')"
if [[ -z "$accuracy" ]] || ! awk -v a="$accuracy" -v m="$minimum" 'BEGIN { exit !(a >= m) }'; then
  echo "FAIL: held-out accuracy '$accuracy' after resuming is below $minimum" >&2
  exit 1
fi
echo "PASS: trained on 2 processes, resumed on 1 at step 150, held-out accuracy $accuracy >= $minimum"
