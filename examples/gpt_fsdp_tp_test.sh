#!/usr/bin/env bash
# Runs the GPT example as its header says: four processes under the launch
# utility train with FSDP 2 x TP 2 and save a distributed checkpoint, two
# processes resume it with TP 2 alone, then one process resumes theirs.
# Fails unless every run exits cleanly, each resumed run starts with the
# model the previous one saved (the same held-out loss), the last held-out
# loss is below the given maximum, and a --tp that does not divide the
# processes is refused by name.
set -euo pipefail
launch="$1"
program="$2"
maximum="$3"
dir="${TEST_TMPDIR:-$(mktemp -d)}/gpt_ckpt"
free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])' \
    2>/dev/null || echo $((20000 + RANDOM % 20000))
}
held_out() { sed -n 's/^held-out loss: \([0-9.]*\)$/\1/p'; }

run() {  # processes, then the example's flags
  local n="$1"
  shift
  "$launch" --nproc_per_node="$n" --master_port="$(free_port)" "$program" \
    --checkpoint_dir="$dir" "$@"
}

first="$(run 4 --tp=2 --steps=200)"
echo "$first"
if ! echo "$first" | grep -q "saved a distributed checkpoint of step 200 from dp 2 x tp 2"; then
  echo "FAIL: the FSDP x TP run did not save its checkpoint" >&2
  exit 1
fi
saved="$(echo "$first" | held_out)"

second="$(run 2 --tp=2 --steps=50 --resume)"
echo "$second"
if ! echo "$second" | grep -q "at step 200 on dp 1 x tp 2; held-out loss $saved\$"; then
  echo "FAIL: TP 2 did not resume the FSDP x TP model of step 200 (held-out loss $saved)" >&2
  exit 1
fi
saved="$(echo "$second" | held_out)"

third="$(run 1 --tp=1 --steps=50 --resume)"
echo "$third"
if ! echo "$third" | grep -q "at step 250 on dp 1 x tp 1; held-out loss $saved\$"; then
  echo "FAIL: one process did not resume the TP model of step 250 (held-out loss $saved)" >&2
  exit 1
fi
loss="$(echo "$third" | held_out)"
if [[ -z "$loss" ]] || ! awk -v l="$loss" -v m="$maximum" 'BEGIN { exit !(l <= m) }'; then
  echo "FAIL: held-out loss '$loss' after resuming is above $maximum" >&2
  exit 1
fi

if refused="$(run 2 --tp=3 2>&1)"; then
  echo "FAIL: --tp=3 on 2 processes was accepted" >&2
  exit 1
fi
if ! echo "$refused" | grep -q -- "--tp=3 does not divide the 2 processes"; then
  echo "FAIL: --tp=3 on 2 processes was refused without naming it: $refused" >&2
  exit 1
fi
echo "PASS: FSDP x TP on 4 processes, resumed with TP 2 and in one process; held-out loss $loss <= $maximum"
