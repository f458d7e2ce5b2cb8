#!/usr/bin/env bash
# run.sh of the bundle tools/gpu_verify.sh writes: runs Ember's GPU tests and
# benchmarks on a GPU machine with no Bazel and nothing set up (it also runs
# under `env -i`), then once more under compute-sanitizer memcheck as far as
# the time budget allows, and ends with one line: `N passed, M failed, K skipped`.
#
#   run.sh [--budget SECONDS] [--log FILE] [--no-memcheck] [--filter REGEX]
#          [--exclude REGEX]
#     --budget     seconds for everything (default 450: done within 8 minutes
#                  with unpacking and the CUDA libraries' first load); the
#                  tests stop starting when a third of it (at most 150 s) is
#                  left, which the benchmarks and the PyTorch peer may use
#     --log        the whole log (default $OUT/gpu_verify.log when $OUT is a
#                  folder, else gpu_verify.log beside this script)
#     --filter     run only the binaries whose name matches REGEX (grep -E)
#     --exclude    leave out the binaries whose name matches REGEX (the
#                  peers are named torch_train_step and torch_cuda_queue)
#
# Counting: every GoogleTest case of the first pass (a binary that crashes,
# times out or prints no summary counts as one failure); every benchmark
# binary (skipped when no GPU is present and it reports errors, as Ember's
# benchmarks do without one); every test binary's memcheck run (skipped with
# no GPU, no compute-sanitizer or no time left); the PyTorch peer
# (torch_train_step.py, run after the benchmarks when python3 has torch with
# CUDA: it measures the same training steps and prints Ember's figures beside
# PyTorch's, with their ratios; skipped otherwise). Exits 0 when nothing failed.
#
# CUDA libraries: each one the binaries need (MANIFEST) is taken from the
# first of: $EMBER_CUDA_PATH or /usr/local/cuda (lib64, lib,
# targets/x86_64-linux/lib), then the Python wheels' nvidia/*/lib folders
# (python3's `nvidia` package, then every site-packages folder); the CUDA
# runtime, last, from the bundle. The log says which folder served each.
set -uo pipefail
[[ -n "${PATH:-}" ]] || export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
here="$(cd "$(dirname "$0")" && pwd)"
budget=450
logfile=""
memcheck=1
filter=""
exclude=""
while (($#)); do
  case "$1" in
    --budget) budget="$2"; shift 2 ;;
    --log) logfile="$2"; shift 2 ;;
    --no-memcheck) memcheck=0; shift ;;
    --filter) filter="$2"; shift 2 ;;
    --exclude) exclude="$2"; shift 2 ;;
    -h | --help) sed -n '2,26p' "$0"; exit 0 ;;
    *) echo "run.sh: unknown argument '$1'; see --help" >&2; exit 2 ;;
  esac
done
[[ "$budget" =~ ^[0-9]+$ ]] || { echo "run.sh: --budget takes whole seconds, not '$budget'" >&2; exit 2; }
if [[ -z "$logfile" ]]; then
  if [[ -n "${OUT:-}" && -d "${OUT:-}" ]]; then logfile="$OUT/gpu_verify.log"; else logfile="$here/gpu_verify.log"; fi
fi
: >"$logfile" || { echo "run.sh: cannot write the log $logfile" >&2; exit 2; }
# Absolute: the binaries and the PyTorch peer (which reads it) run elsewhere.
logfile="$(cd "$(dirname "$logfile")" && pwd)/$(basename "$logfile")"
SECONDS=0
passed=0 failed=0 skipped=0

say() { printf '%s\n' "$*" | tee -a "$logfile"; }
finish() {
  say ""
  say "log: $logfile ($SECONDS s)"
  say "$passed passed, $failed failed, $skipped skipped"
  rm -rf "${work:-}"
  exit $((failed > 0))
}

say "=== Ember GPU verification: $(date -u '+%Y-%m-%d %H:%M:%S UTC'), $(uname -n), budget ${budget}s"
sed -n '1p' "$here/MANIFEST" | tee -a "$logfile"

# ---- Unpack ----
work="$(mktemp -d "${TMPDIR:-/tmp}/ember-gpu-verify.XXXXXX")"
if command -v xz >/dev/null; then
  tar -C "$work" -xJf "$here/payload.tar.xz"
else
  python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' "$here/payload.tar.xz" "$work"
fi || { say "cannot unpack $here/payload.tar.xz"; failed=$((failed + 1)); finish; }

# ---- The machine ----
gpus=0
if command -v nvidia-smi >/dev/null && nvidia-smi -L >"$work/gpus.txt" 2>&1; then
  gpus=$(grep -c '^GPU ' "$work/gpus.txt")
  cat "$work/gpus.txt" | tee -a "$logfile"
  nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -1 | sed 's/^/driver: /' | tee -a "$logfile"
elif compgen -G '/dev/nvidia[0-9]*' >/dev/null; then
  gpus=$(compgen -G '/dev/nvidia[0-9]*' | wc -l)
fi
say "GPUs: $gpus; $(getconf GNU_LIBC_VERSION 2>/dev/null || echo 'glibc ?')"

# ---- The CUDA libraries ----
cuda="${EMBER_CUDA_PATH:-/usr/local/cuda}"
dirs=("$cuda/lib64" "$cuda/lib" "$cuda/targets/x86_64-linux/lib")
if command -v python3 >/dev/null; then
  while read -r d; do [[ -z "$d" ]] || dirs+=("$d"/*/lib); done < <(
    python3 -c 'import nvidia; print("\n".join(nvidia.__path__))' 2>/dev/null
    python3 -c 'import site; print("\n".join(site.getsitepackages() + [site.getusersitepackages()]))' 2>/dev/null |
      sed 's|$|/nvidia|')
fi
dirs+=("$work/lib/cudart")
ld_path=("$work/lib")
missing=()
while read -r _ lib; do
  found=""
  for d in "${dirs[@]}"; do
    if [[ -e "$d/$lib" ]]; then found="$d"; break; fi
  done
  if [[ -z "$found" ]]; then
    missing+=("$lib")
    say "CUDA library $lib: not found (looked in $cuda and the Python wheels' nvidia/*/lib)"
    continue
  fi
  say "CUDA library $lib: $found"
  [[ " ${ld_path[*]} " == *" $found "* ]] || ld_path+=("$found")
done < <(grep '^cuda_lib ' "$here/MANIFEST")
export LD_LIBRARY_PATH
LD_LIBRARY_PATH="$(IFS=:; echo "${ld_path[*]}")"

mapfile -t tests < <(awk '$1 == "test" { print $2, $3 }' "$here/MANIFEST")
mapfile -t benchmarks < <(awk '$1 == "benchmark" { print $2, $3 }' "$here/MANIFEST")
if [[ -n "$filter" ]]; then
  mapfile -t tests < <(printf '%s\n' "${tests[@]}" | grep -E "^[^ ]*($filter)[^ ]* " || true)
  mapfile -t benchmarks < <(printf '%s\n' "${benchmarks[@]}" | grep -E "^[^ ]*($filter)[^ ]* " || true)
fi
if [[ -n "$exclude" ]]; then
  mapfile -t tests < <(printf '%s\n' "${tests[@]}" | grep -vE "^[^ ]*($exclude)[^ ]* " || true)
  mapfile -t benchmarks < <(printf '%s\n' "${benchmarks[@]}" | grep -vE "^[^ ]*($exclude)[^ ]* " || true)
fi
# Whether the peer named $1 runs under --filter and --exclude.
peer_selected() {
  { [[ -z "$filter" ]] || grep -qE "$filter" <<<"$1"; } && { [[ -z "$exclude" ]] || ! grep -qE "$exclude" <<<"$1"; }
}

# The machine's libstdc++ serves when it is new enough; otherwise the
# bundle's (which needs glibc 2.36).
if ((${#tests[@]})); then
  probe="${tests[0]%% *}"
  if ! "$work/bin/$probe" --gtest_list_tests >"$work/probe.txt" 2>&1; then
    if grep -q 'not found' "$work/probe.txt"; then
      LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$work/lib/fallback"
      say "the machine's libstdc++ is too old for the binaries: using the bundle's"
    fi
  fi
fi
say "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"

# Runs `$@` for at most $1 seconds, and not past $deadline (seconds since the
# start), output in $work/out.txt; returns its exit status, 124 on a timeout,
# 125 when no time is left.
deadline=$budget
run_timed() {
  local limit="$1" left
  shift
  left=$((deadline - SECONDS))
  ((left < limit)) && limit=$left
  ((limit >= 5)) || return 125
  local tmp
  tmp="$(mktemp -d "$work/tmp.XXXXXX")"
  # The working folder holds the data files where Bazel's runfiles would.
  local d
  for d in "$work/data"/*; do [[ ! -e "$d" ]] || ln -s "$d" "$tmp/"; done
  (cd "$tmp" && TEST_TMPDIR="$tmp" timeout -k 10 "$limit" "$@") >"$work/out.txt" 2>&1
  local rc=$?
  cat "$work/out.txt" >>"$logfile"
  rm -rf "$tmp"
  return $rc
}
# The output's last lines on the console (the log has all of it).
show_tail() { tail -n 25 "$work/out.txt" | sed 's/^/    | /'; }

# The tests leave a third of the budget (at most 150 s) to the benchmarks
# and the PyTorch peer, so that slow tests do not cost the figures; what the
# benchmarks leave goes to memcheck.
if ((${#benchmarks[@]})); then
  reserve=$((budget / 3 < 150 ? budget / 3 : 150))
  deadline=$((budget - reserve))
fi
say ""
say "=== tests (${#tests[@]})"
for entry in "${tests[@]}"; do
  name="${entry%% *}" limit="${entry##* }"
  echo ">>> $name" >>"$logfile"
  run_timed "$limit" "$work/bin/$name"
  rc=$?
  p=$(sed -n 's/^\[  PASSED  \] \([0-9]*\) tests\{0,1\}[.,].*/\1/p' "$work/out.txt" | tail -1)
  s=$(sed -n 's/^\[  SKIPPED \] \([0-9]*\) tests\{0,1\}[.,].*/\1/p' "$work/out.txt" | tail -1)
  f=$(sed -n 's/^\[  FAILED  \] \([0-9]*\) tests\{0,1\}[.,].*/\1/p' "$work/out.txt" | tail -1)
  if ((rc == 125)); then
    skipped=$((skipped + 1))
    say "SKIP $name: no time left in the budget"
    continue
  fi
  passed=$((passed + ${p:-0})) skipped=$((skipped + ${s:-0})) failed=$((failed + ${f:-0}))
  if ((rc == 0)) && [[ -n "$p" ]]; then
    say "ok   $name: ${p:-0} passed, ${s:-0} skipped (${SECONDS}s)"
  elif [[ -n "$f" && "$f" != 0 ]] && ((rc == 1)); then
    say "FAIL $name: $f failed, ${p:-0} passed, ${s:-0} skipped"
    grep '^\[  FAILED  \] [A-Za-z]' "$work/out.txt" | sort -u | sed 's/^/    /' | tee -a "$logfile"
  else
    failed=$((failed + 1))
    why="exit status $rc"
    ((rc == 124)) && why="timed out after ${limit}s"
    say "FAIL $name: $why, no complete test summary"
    show_tail
  fi
done

deadline=$budget
say ""
say "=== benchmarks (${#benchmarks[@]})"
for entry in "${benchmarks[@]}"; do
  name="${entry%% *}" limit="${entry##* }"
  echo ">>> $name" >>"$logfile"
  run_timed "$limit" "$work/bin/$name"
  rc=$?
  errors=$(grep -c 'ERROR OCCURRED' "$work/out.txt")
  if ((rc == 125)); then
    skipped=$((skipped + 1)); say "SKIP $name: no time left in the budget"
  elif ((rc != 0)); then
    failed=$((failed + 1)); say "FAIL $name: exit status $rc"; show_tail
  elif ((errors > 0 && gpus == 0)); then
    skipped=$((skipped + 1)); say "SKIP $name: no GPU ($errors benchmarks report it)"
  elif ((errors > 0)); then
    failed=$((failed + 1)); say "FAIL $name: $errors benchmarks report errors"
    grep 'ERROR OCCURRED' "$work/out.txt" | head -5 | sed 's/^/    /' | tee -a "$logfile"
  else
    passed=$((passed + 1)); say "ok   $name (${SECONDS}s)"
  fi
done

say ""
say "=== PyTorch side by side (torch_train_step.py: the same steps in PyTorch eager, then the ratios)"
peer="$here/torch_train_step.py"
if ! peer_selected torch_train_step; then
  : # filtered out
elif [[ ! -f "$peer" ]]; then
  skipped=$((skipped + 1)); say "SKIP PyTorch peer: $peer is missing"
elif ((gpus == 0)); then
  skipped=$((skipped + 1)); say "SKIP PyTorch peer: no GPU"
elif ! command -v python3 >/dev/null ||
  ! env -u LD_LIBRARY_PATH python3 -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' >/dev/null 2>&1; then
  skipped=$((skipped + 1)); say "SKIP PyTorch peer: python3 has no torch that sees a GPU"
else
  echo ">>> torch_train_step.py" >>"$logfile"
  # PyTorch loads its own CUDA libraries: none of the bundle's paths.
  run_timed 150 env -u LD_LIBRARY_PATH python3 "$peer" --ember-log "$logfile"
  rc=$?
  if ((rc == 125)); then
    skipped=$((skipped + 1)); say "SKIP PyTorch peer: no time left in the budget"
  elif ((rc == 0)); then
    passed=$((passed + 1)); say "ok   PyTorch peer (${SECONDS}s)"
    sed -n '/^figure /,$p' "$work/out.txt" | sed 's/^/    /'
  else
    failed=$((failed + 1)); say "FAIL PyTorch peer: exit status $rc"; show_tail
  fi
fi

say ""
say "=== CUDA tensors through a Queue beside torch.multiprocessing (cuda_queue_benchmark, torch_cuda_queue.py)"
qpeer="$here/torch_cuda_queue.py"
qbin="$work/bin/cuda_queue_benchmark"
if ! peer_selected torch_cuda_queue; then
  : # filtered out
elif ((gpus == 0)) || [[ ! -f "$qpeer" || ! -x "$qbin" ]]; then
  skipped=$((skipped + 1)); say "SKIP torch_cuda_queue: no GPU, or no $qpeer or $qbin"
else
  echo ">>> cuda_queue_benchmark with EMBER_TORCH_PEER=$qpeer" >>"$logfile"
  # The benchmark strips LD_LIBRARY_PATH for the peer itself.
  run_timed 300 env EMBER_TORCH_PEER="$qpeer" "$qbin"
  rc=$?
  if ((rc == 125)); then
    skipped=$((skipped + 1)); say "SKIP torch_cuda_queue: no time left in the budget"
  elif ((rc == 0)) && ! grep -qE '^FAIL |ERROR OCCURRED' "$work/out.txt"; then
    passed=$((passed + 1)); say "ok   torch_cuda_queue (${SECONDS}s)"
  else
    failed=$((failed + 1)); say "FAIL torch_cuda_queue: exit status $rc"; show_tail
  fi
  # Rates, ratios, the floor, SKIP/FAIL lines, and only the leak counts that are not 0.
  awk '$1 == "SKIP" || $1 == "FAIL" || ($1 == "figure" && ($2 !~ /_(d_[a-z_]+|blocks_held)$/ || $3 != 0)) { print "    " $0 }' \
    "$work/out.txt" | tee -a "$logfile"
fi

say ""
say "=== memcheck (${#tests[@]} test binaries, while the budget lasts)"
sanitizer=""
for c in "$cuda/bin/compute-sanitizer" "$cuda/compute-sanitizer/compute-sanitizer" \
  "$(command -v compute-sanitizer 2>/dev/null)" "${dirs[@]/%\/lib/\/compute-sanitizer\/compute-sanitizer}" \
  "${dirs[@]/%\/lib/\/bin\/compute-sanitizer}"; do
  if [[ -n "$c" && -f "$c" && -x "$c" ]]; then sanitizer="$c"; break; fi
done
why=""
((memcheck)) || why="--no-memcheck"
[[ -n "$why" || -n "$sanitizer" ]] || why="no compute-sanitizer found"
[[ -n "$why" ]] || ((gpus > 0)) || why="no GPU"
[[ -z "$sanitizer" ]] || say "compute-sanitizer: $sanitizer"
for entry in "${tests[@]}"; do
  name="${entry%% *}" limit="${entry##* }"
  if [[ -n "$why" ]]; then
    skipped=$((skipped + 1)); say "SKIP memcheck $name: $why"
    continue
  fi
  echo ">>> memcheck $name" >>"$logfile"
  # Memcheck slows kernels down many times over: up to 5 times the limit.
  run_timed $((limit * 5)) "$sanitizer" --tool memcheck --error-exitcode 86 --print-limit 20 \
    --leak-check no "$work/bin/$name" --gtest_brief=1
  rc=$?
  if ((rc == 125 || (rc == 124 && SECONDS + 5 >= budget))); then
    skipped=$((skipped + 1)); say "SKIP memcheck $name: the budget ran out (${SECONDS}s)"
  elif ((rc == 124)); then
    skipped=$((skipped + 1)); say "SKIP memcheck $name: slower than $((limit * 5))s under memcheck"
  elif ((rc == 0)); then
    passed=$((passed + 1)); say "ok   memcheck $name (${SECONDS}s)"
  else
    failed=$((failed + 1))
    ((rc == 86)) && say "FAIL memcheck $name: memory errors" || say "FAIL memcheck $name: exit status $rc"
    show_tail
  fi
done
((${#missing[@]} == 0)) || say "missing CUDA libraries: ${missing[*]}"
finish
