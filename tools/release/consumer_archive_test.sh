#!/usr/bin/env bash
# Ember as a versioned Bazel dependency, the way README.md shows it: the
# source archive (source_archive.sh) behind an http_archive with a file://
# URL, and examples/consumer built and run against it by a Bazel of its own.
# First with ember_dependencies(system_root = <an empty directory>): the build
# must stop naming the Debian package to install, not fail at link time.
#
# Runs Bazel inside the test (local, no sandbox); it shares Ember's disk cache
# (~/.cache/ember/bazel-disk), so that it rebuilds little after the first run.
set -euo pipefail
src="$TEST_SRCDIR/$TEST_WORKSPACE"
checkout=$(dirname "$(readlink -f "$src/VERSION")")
tmp=$TEST_TMPDIR
version=$(tr -d '[:space:]' <"$src/VERSION")
fail() { echo "FAIL: $*" >&2; exit 1; }

read -r archive sha256 < <("$src/tools/release/source_archive.sh" "$checkout" "$tmp/dist")
consumer="$tmp/consumer"
mkdir -p "$consumer" "$tmp/empty_root"
tar -xzf "$archive" -C "$consumer" --strip-components=3 "ember-$version/examples/consumer"
workspace() {  # $1: the arguments of ember_dependencies()
  cat >"$consumer/WORKSPACE" <<END
workspace(name = "ember_consumer")

load("@bazel_tools//tools/build_defs/repo:http.bzl", "http_archive")

http_archive(
    name = "ember",
    sha256 = "$sha256",
    strip_prefix = "ember-$version",
    urls = ["file://$archive"],
)

load("@ember//tools:repositories.bzl", "ember_dependencies")

ember_dependencies($1)
END
}

home=$(getent passwd "$(id -u)" | cut -d: -f6)
bazel_() {
  (cd "$consumer" && HOME="$tmp/home" bazel --output_user_root="$tmp/bazel" "$@" \
    --disk_cache="$home/.cache/ember/bazel-disk" --noshow_progress)
}
trap '(cd "$consumer" && HOME="$tmp/home" bazel --output_user_root="$tmp/bazel" shutdown) >/dev/null 2>&1 || true' EXIT

workspace "system_root = \"$tmp/empty_root\""
if bazel_ build //:consumer >"$tmp/missing.log" 2>&1; then
  fail "the build succeeded although $tmp/empty_root has no libraries"
fi
# Bazel stops at the first missing package it analyses (which one depends on
# its order): the message names it, the file it lacks and the install command
# (for the CUDA toolkit, which is not a Debian package: where it belongs).
if grep -q "Ember needs the CUDA 13 toolkit" "$tmp/missing.log"; then
  grep -qF "$tmp/empty_root/usr/local/cuda is missing" "$tmp/missing.log" ||
    fail "no missing CUDA path named"
  grep -q "Install NVIDIA's CUDA toolkit so that it lives in /usr/local/cuda" "$tmp/missing.log" ||
    fail "no install hint for the CUDA toolkit"
  package="the CUDA toolkit"
else
  package=$(sed -n 's/.*Ember needs the Debian package \([a-z0-9.+-]*\) (for .*/\1/p' "$tmp/missing.log" | head -1)
  [[ -n "$package" ]] || { cat "$tmp/missing.log" >&2; fail "no message naming a missing package"; }
  grep -q "$tmp/empty_root/usr/.* missing" "$tmp/missing.log" || fail "no missing file named"
  grep -qF "apt-get install $package\`" "$tmp/missing.log" || fail "no install command for $package"
fi
if grep -q "undefined reference\|cannot find -l" "$tmp/missing.log"; then
  fail "the build reached the linker"
fi
echo "ok: a missing system library names its package ($package)"

workspace ""
bazel_ run //:consumer >"$tmp/run.log" 2>&1 || { tail -50 "$tmp/run.log" >&2; fail "bazel run //:consumer"; }
grep -q "consumer built against @ember: " "$tmp/run.log" || { cat "$tmp/run.log" >&2; fail "no output"; }
echo "ok: examples/consumer built and ran against the http_archive of $archive"
