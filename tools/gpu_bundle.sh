#!/usr/bin/env bash
# Kept for the commands that name it (`tools/gpu_bundle.sh [folder]`):
# tools/gpu_verify.sh builds the GPU bundle and says how to run it.
if (($# == 1)) && [[ "$1" != -* ]]; then set -- --out "$1"; fi
exec "$(dirname "$0")/gpu_verify.sh" "$@"
