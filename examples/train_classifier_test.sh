#!/usr/bin/env bash
# Runs the classifier example and fails unless it exits cleanly and reports a
# test accuracy of at least the given minimum.
set -euo pipefail
binary="$1"
minimum="$2"
output="$("$binary")"
echo "$output"
accuracy="$(echo "$output" | sed -n 's/^test accuracy: \([0-9.]*\)$/\1/p')"
if [[ -z "$accuracy" ]]; then
  echo "FAIL: no 'test accuracy:' line in the output" >&2
  exit 1
fi
if ! awk -v a="$accuracy" -v m="$minimum" 'BEGIN { exit !(a >= m) }'; then
  echo "FAIL: test accuracy $accuracy is below $minimum" >&2
  exit 1
fi
echo "PASS: test accuracy $accuracy >= $minimum"
