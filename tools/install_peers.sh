#!/usr/bin/env bash
# Installs the peer that Ember's PyTorch 2.x comparisons run against and that
# Debian does not ship (python3-torch is 1.13): PyTorch 2.15.0 from PyPI with
# the torchvision, torchdata and torchft releases pip resolves for it, pinned
# below, in a virtual environment of Debian's /usr/bin/python3 (not whatever
# python3 comes first on PATH) in Ember's cache directory:
#
#   ${XDG_CACHE_HOME:-$HOME/.cache}/ember/peers/torch-2.15.0
#
# PyPI's Linux torch wheel is built with CUDA: it brings NVIDIA's CUDA
# libraries and triton as dependencies (about 4 GiB of the 5.5 GiB), and
# `import torch` fails without them even on a machine without a GPU
# (libtorch_cuda.so links them), so they are installed too.
#
# Usage:
#   tools/install_peers.sh             install; when the peer is complete, only
#                                      says so (no download)
#   tools/install_peers.sh --python    print the peer's interpreter
#                                      ($EMBER_TORCH2_PYTHON when set); exit 1,
#                                      saying why, when there is none
#   tools/install_peers.sh --test-env  print EMBER_TORCH2_PYTHON=<interpreter>
#                                      when `bazel test` would not find the peer
#                                      by itself, nothing otherwise
#
# Tests find the interpreter through //base/testing:peers, the same way as
# --python. `bazel test` gives tests neither HOME nor XDG_CACHE_HOME, so there
# the cache directory is the account's ~/.cache; a peer installed elsewhere
# reaches tests through EMBER_TORCH2_PYTHON, which .bazelrc passes through.
# Needs python3-venv (tools/setup.sh installs it) and pip's access to PyPI; not
# root.
set -euo pipefail

PEER=torch-2.15.0
PINS=(torch==2.15.0 torchvision==0.29.2 torchdata==0.11.0 torchft==0.2.0)
# What a complete install leaves in the environment, last: the pins.
STAMP=ember-peer-installed
# The environment takes about 5.5 GiB; pip unpacks beside it.
NEED_KIB=$((7 * 1024 * 1024))
BASE_PYTHON=/usr/bin/python3

die() {
  echo "install_peers.sh: $*" >&2
  exit 1
}

# The account's home directory, which stands for a missing HOME (as under
# `bazel test`), as it does for the shell's ~ and Python's expanduser.
account_home() { getent passwd "$(id -u)" | cut -d: -f6; }

# Ember's cache directory; a relative XDG_CACHE_HOME is ignored, as the XDG
# base directory specification says.
cache_home() {
  if [[ "${XDG_CACHE_HOME:-}" == /* ]]; then
    echo "$XDG_CACHE_HOME"
  else
    echo "${HOME:-$(account_home)}/.cache"
  fi
}

DIR="$(cache_home)/ember/peers/$PEER"
PY="$DIR/bin/python"
# Where tests look when EMBER_TORCH2_PYTHON is not set.
TESTS_DIR="$(account_home)/.cache/ember/peers/$PEER"

# Succeeds when the environment is complete: its interpreter runs and has the
# pinned distributions, and the stamp of a finished install names the pins.
complete() {
  [[ -x "$PY" && -f "$DIR/$STAMP" ]] || return 1
  [[ "$(cat "$DIR/$STAMP")" == "$(printf '%s\n' "${PINS[@]}")" ]] || return 1
  "$PY" - "${PINS[@]}" <<'EOF' 2>/dev/null
import importlib.metadata, sys
for pin in sys.argv[1:]:
    name, version = pin.split("==")
    if importlib.metadata.version(name) != version:
        sys.exit(1)
EOF
}

missing_reason() {
  if [[ ! -x "$PY" ]]; then
    echo "no PyTorch 2.x peer at $DIR; install it with tools/install_peers.sh"
  else
    echo "the PyTorch 2.x peer at $DIR is incomplete or not the pinned one; rerun tools/install_peers.sh"
  fi
}

case "${1:-}" in
  --python)
    if [[ -n "${EMBER_TORCH2_PYTHON:-}" ]]; then
      [[ -x "$EMBER_TORCH2_PYTHON" ]] ||
        die "EMBER_TORCH2_PYTHON is $EMBER_TORCH2_PYTHON, which is not an executable file"
      echo "$EMBER_TORCH2_PYTHON"
      exit 0
    fi
    complete || die "$(missing_reason)"
    echo "$PY"
    exit 0
    ;;
  --test-env)
    complete || die "$(missing_reason)"
    [[ -n "${EMBER_TORCH2_PYTHON:-}" || "$DIR" == "$TESTS_DIR" ]] || echo "EMBER_TORCH2_PYTHON=$PY"
    exit 0
    ;;
  "") ;;
  -h | --help)
    sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"
    exit 0
    ;;
  *) die "unknown argument $1 (usage: tools/install_peers.sh [--python | --test-env | --help])" ;;
esac

# A second run, or CI's, must not race the first.
mkdir -p "$(dirname "$DIR")" || die "cannot create $(dirname "$DIR")"
exec 9>"$DIR.lock"
flock 9

if complete; then
  echo "install_peers.sh: the PyTorch 2.x peer is installed at $DIR (${PINS[*]}); nothing to do."
  [[ "$DIR" == "$TESTS_DIR" ]] ||
    echo "install_peers.sh: bazel test looks in $TESTS_DIR; export EMBER_TORCH2_PYTHON=$PY for tests to use this one."
  exit 0
fi

[[ -x "$BASE_PYTHON" ]] ||
  die "Debian's $BASE_PYTHON is missing; run tools/setup.sh (it installs python3 and python3-venv)."
"$BASE_PYTHON" -c 'import ensurepip, venv' 2>/dev/null ||
  die "$BASE_PYTHON cannot create virtual environments (python3-venv is missing); run tools/setup.sh, or apt-get install python3-venv."
# The environment is unusable until the stamp is written: a failed or
# interrupted install is removed, here and by the next run.
if [[ -e "$DIR" ]]; then
  echo "install_peers.sh: removing the incomplete or outdated peer at $DIR"
  rm -rf "$DIR"
fi
free_kib="$(df -Pk "$(dirname "$DIR")" | awk 'NR == 2 { print $4 }')"
((free_kib >= NEED_KIB)) ||
  die "$(dirname "$DIR") has $((free_kib / 1024)) MiB free; the peer needs about $((NEED_KIB / 1024)) MiB. Free some space (or set XDG_CACHE_HOME to a larger disk) and rerun."

trap 'rm -rf "$DIR"' EXIT
unset PYTHONHOME PYTHONPATH
start=$SECONDS
echo "install_peers.sh: installing ${PINS[*]} from PyPI into $DIR (about 5.5 GiB)"
"$BASE_PYTHON" -m venv "$DIR" || die "$BASE_PYTHON -m venv $DIR failed (its message is above)."
"$PY" -m pip install --no-cache-dir --only-binary=:all: --disable-pip-version-check \
  --progress-bar off "${PINS[@]}" ||
  die "pip could not install ${PINS[*]} (its message is above). Check that pip reaches PyPI (proxy, pip.conf) and that $(dirname "$DIR") has space, then rerun tools/install_peers.sh."

# What the comparisons use: torch.distributed.checkpoint with its converters,
# the gloo backend, and CPU math.
"$PY" - <<'EOF' || die "the installed peer does not work (its error is above) and was removed; rerun tools/install_peers.sh to install it again."
import torch, torchvision, torchdata, torchft
from torch.distributed.checkpoint import format_utils
assert torch.__version__.split("+")[0] == "2.15.0", torch.__version__
assert torch.distributed.is_gloo_available(), "torch without gloo"
x = torch.arange(6, dtype=torch.float32).view(2, 3)
assert (x @ x.T).tolist() == [[5.0, 14.0], [14.0, 50.0]]
EOF
printf '%s\n' "${PINS[@]}" >"$DIR/$STAMP.tmp" && mv "$DIR/$STAMP.tmp" "$DIR/$STAMP"
trap - EXIT
echo "install_peers.sh: installed the PyTorch 2.x peer at $DIR in $((SECONDS - start)) s ($(du -sh "$DIR" | cut -f1))."
[[ "$DIR" == "$TESTS_DIR" ]] ||
  echo "install_peers.sh: bazel test looks in $TESTS_DIR; export EMBER_TORCH2_PYTHON=$PY for tests to use this one."
