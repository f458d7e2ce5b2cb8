#!/usr/bin/env bash
# Runs an example binary and fails when it exits non-zero.
set -euo pipefail
"$1"
