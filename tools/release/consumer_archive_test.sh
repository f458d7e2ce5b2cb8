#!/usr/bin/env bash
# Ember as a versioned Bazel dependency, the way README.md shows it: the
# source archive (source_archive.sh) behind an http_archive with a file://
# URL, and examples/consumer built and run against it by a Bazel of its own.
# First with ember_dependencies(system_root = <an empty directory>): the build
# must stop naming the Debian package to install, not fail at link time, and
# must not need the CUDA toolkit (it says it builds without CUDA support).
# Then built and run twice: with CUDA as detected, and with EMBER_CUDA=0.
#
# Runs Bazel inside the test (local, no sandbox), with an output base of its
# own under TEST_TMPDIR, so every run starts from an empty one; what it reuses
# comes from the disk cache Ember's builds share, the one .ci/run names:
# ${XDG_CACHE_HOME:-$HOME/.cache}/ember/bazel-disk, with the HOME and
# XDG_CACHE_HOME of the `bazel test` command (env_inherit in BUILD.bazel; the
# account's home directory when no HOME came through), which is the .bazelrc
# files' ~/.cache/ember/bazel-disk when both have their usual values.
# What Ember's own build puts there is of no use here: there Ember is the main
# repository, here it is @ember (external/ember/... paths, no -Werror), so
# none of their actions are the same. Runs of this test share theirs, and so
# do builds of examples/consumer from a checkout (.ci/run's last steps: there
# too Ember is @ember, with the same files and flags). With an empty cache the
# two builds compile all of //:ember and the CUDA kernels (BUILD.bazel says
# for how long); with a warm one they take seconds.
set -euo pipefail
outer_home=${HOME:-}
[[ "$outer_home" == /* ]] || outer_home=$(getent passwd "$(id -u)" | cut -d: -f6)
disk_cache=${XDG_CACHE_HOME:-$outer_home/.cache}/ember/bazel-disk
# The rest, git included, runs without the user's dotfiles, as before HOME
# was passed in.
unset HOME
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

echo "disk cache: $disk_cache"
bazel_() {
  (cd "$consumer" && HOME="$tmp/home" bazel --output_user_root="$tmp/bazel" "$@" \
    --disk_cache="$disk_cache" --noshow_progress)
}
# $1: a nested build's log, $2: when it started ($SECONDS). Its wall time and
# Bazel's count of the processes it ran ("remote cache hit": from the disk
# cache).
summary() {
  echo "$((SECONDS - $2)) s; $(sed -n 's/^INFO: \([0-9]* processes.*\)\.$/\1/p' "$1" | tail -1)"
}
trap '(cd "$consumer" && HOME="$tmp/home" bazel --output_user_root="$tmp/bazel" shutdown) >/dev/null 2>&1 || true' EXIT

workspace "system_root = \"$tmp/empty_root\""
start=$SECONDS
if bazel_ build //:consumer >"$tmp/missing.log" 2>&1; then
  fail "the build succeeded although $tmp/empty_root has no libraries"
fi
# Bazel stops at the first missing package it analyses (which one depends on
# its order): the message names it, the file it lacks and the install command.
# The CUDA toolkit is not one of them: without it Ember builds without CUDA.
package=$(sed -n 's/.*Ember needs the Debian package \([a-z0-9.+-]*\) (for .*/\1/p' "$tmp/missing.log" | head -1)
[[ -n "$package" ]] || { cat "$tmp/missing.log" >&2; fail "no message naming a missing package"; }
grep -q "$tmp/empty_root/usr/.* missing" "$tmp/missing.log" || fail "no missing file named"
grep -qF "apt-get install $package\`" "$tmp/missing.log" || fail "no install command for $package"
grep -qF "Building Ember without CUDA support: no CUDA toolkit at $tmp/empty_root/usr/local/cuda" \
  "$tmp/missing.log" || { cat "$tmp/missing.log" >&2; fail "no note that CUDA is left out"; }
if grep -q "undefined reference\|cannot find -l" "$tmp/missing.log"; then
  fail "the build reached the linker"
fi
echo "ok: a missing system library names its package ($package); a missing CUDA toolkit is a note ($((SECONDS - start)) s)"

workspace ""
# $1: the log's name; the rest: bazel run's options.
run_consumer() {
  local log="$tmp/$1.log"
  shift
  local start=$SECONDS
  bazel_ run "$@" //:consumer >"$log" 2>&1 || { tail -50 "$log" >&2; fail "bazel run $* //:consumer"; }
  echo "bazel run $* //:consumer: $(summary "$log" "$start")"
  grep -q "consumer built against @ember: " "$log" || { cat "$log" >&2; fail "no output"; }
}
run_consumer without_cuda --repo_env=EMBER_CUDA=0
grep -q "CUDA: not available: Ember was built without CUDA support" "$tmp/without_cuda.log" ||
  { cat "$tmp/without_cuda.log" >&2; fail "EMBER_CUDA=0 built CUDA in"; }
echo "ok: examples/consumer built without CUDA (EMBER_CUDA=0) and ran"
run_consumer run
if [[ -x /usr/local/cuda/bin/nvcc ]] && grep -q "Ember was built without CUDA support" "$tmp/run.log"; then
  cat "$tmp/run.log" >&2
  fail "the toolkit is at /usr/local/cuda, yet the consumer was built without CUDA"
fi
echo "ok: examples/consumer built and ran against the http_archive of $archive"
