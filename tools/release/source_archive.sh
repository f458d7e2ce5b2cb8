#!/usr/bin/env bash
# Writes the source archive Bazel users point an http_archive at:
# OUT_DIR/ember-<version>.tar.gz, every file git tracks as it is in the working
# tree, under the prefix ember-<version>/ (README.md "Using Ember from your own
# Bazel workspace"). Prints the archive's path and its sha256.
#
#   bazel run //tools/release:source_archive -- /tmp/dist
#   tools/release/source_archive.sh CHECKOUT OUT_DIR    (what the test runs)
set -euo pipefail
if (($# == 1)) && [[ -n "${BUILD_WORKSPACE_DIRECTORY:-}" ]]; then
  checkout=$BUILD_WORKSPACE_DIRECTORY
  out=$(cd "${BUILD_WORKING_DIRECTORY:-.}" && mkdir -p "$1" && cd "$1" && pwd)
elif (($# == 2)); then
  checkout=$1 out=$2
else
  echo "usage: bazel run //tools/release:source_archive -- OUT_DIR" >&2
  echo "       source_archive.sh CHECKOUT OUT_DIR" >&2
  exit 2
fi
git -C "$checkout" rev-parse --git-dir >/dev/null 2>&1 || {
  echo "source_archive.sh: $checkout is not a git checkout; the archive holds the files git tracks" >&2
  exit 1
}
version=$(tr -d '[:space:]' <"$checkout/VERSION")
mkdir -p "$out"
archive="$out/ember-$version.tar.gz"
# `git stash create` makes a commit of the working tree without touching it
# (nothing when it is clean), so that uncommitted edits are in the archive.
tree=$(git -C "$checkout" stash create)
git -C "$checkout" archive --format=tar --prefix="ember-$version/" "${tree:-HEAD}" | gzip -9n >"$archive"
echo "$archive $(sha256sum "$archive" | cut -d' ' -f1)"
