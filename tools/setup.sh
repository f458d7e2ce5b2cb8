#!/usr/bin/env bash
# Makes a Debian 12 (bookworm) machine ready to build and test Ember: installs
# the Debian packages below that are missing and looks for the CUDA toolkit,
# which Debian does not ship. Without the toolkit Ember builds without CUDA
# support (tools/cuda_configure.bzl); this script says so once, and how to get
# it. Safe to re-run; when nothing is missing it only says so. Needs root (or
# passwordless sudo) only when it has to install. The PyTorch 2.x peer, which
# Debian does not ship, is tools/install_peers.sh's.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive

PACKAGES=(
  # Bazel 4 and the rule sets Ember's WORKSPACE uses in place of downloads
  # (bazel-bootstrap brings build-essential, a JDK and python3).
  bazel-bootstrap bazel-platforms bazel-skylib bazel-rules-java g++
  # The system libraries wrapped under third_party/, and the code generators.
  libabsl-dev libgtest-dev libgmock-dev libbenchmark-dev
  libprotobuf-dev protobuf-compiler libgrpc++-dev protobuf-compiler-grpc
  libgloo-dev libopenblas-dev libcurl4-openssl-dev libarchive-dev
  libopenmpi-dev libssl-dev
  # oneDNN, the CPU convolution primitives nn/ uses.
  libdnnl-dev
  # libjpeg-turbo, the JPEG decoder of data/'s image folders.
  libjpeg62-turbo-dev
  # hub/ tests: openssl makes the loopback HTTPS server's certificate;
  # python3-torch(vision) check Ember's checkpoints and ResNet-18 against PyTorch.
  openssl python3-torch python3-torchvision
  # `ip netns` for the two-host test of tools/launch (multihost_test).
  iproute2
  # The virtual environment of the PyTorch 2.x peer (tools/install_peers.sh).
  python3-venv
)
# Where the build looks for the toolkit (tools/cuda_configure.bzl reads the
# same variables).
CUDA="${EMBER_CUDA_PATH:-/usr/local/cuda}"

die() { echo "setup.sh: $*" >&2; exit 1; }

# What the build checks, and says in the same words: the CUDA state, once.
cuda_state() {
  if [[ "${EMBER_CUDA:-auto}" == 0 ]]; then
    echo "EMBER_CUDA=0: Ember will be built without CUDA support."
    return
  fi
  local missing=() f lib
  for f in bin/nvcc include/cuda_runtime_api.h include/cublas_v2.h include/cudnn.h include/nccl.h; do
    [[ -e "$CUDA/$f" ]] || missing+=("$f")
  done
  for lib in cudart cublas cublasLt cudnn nccl; do
    [[ -e "$CUDA/lib64/lib$lib.so" || -e "$CUDA/lib/lib$lib.so" ]] || missing+=("lib64/lib$lib.so")
  done
  if ((${#missing[@]} == 0)); then
    echo "CUDA toolkit found at $CUDA: Ember will be built with CUDA support."
  elif [[ "${EMBER_CUDA:-auto}" == 1 ]]; then
    die "EMBER_CUDA=1, but the CUDA toolkit at $CUDA lacks ${missing[*]}."
  else
    local found="no CUDA toolkit at $CUDA"
    [[ -d "$CUDA" ]] && found="the CUDA toolkit at $CUDA lacks ${missing[*]}"
    echo "$found: CUDA support will be left out (Ember builds and its tests run;
  GPU tests report themselves skipped). Debian does not ship CUDA 13: to build
  with CUDA, install NVIDIA's CUDA 13 toolkit with cuDNN and NCCL in
  /usr/local/cuda (or point EMBER_CUDA_PATH at it), then run
  \`bazel sync --configure\` once. Set EMBER_CUDA=0 to leave CUDA out on purpose."
  fi
}
cuda_note="$(cuda_state)"
echo "setup.sh: $cuda_note"

missing=()
for p in "${PACKAGES[@]}"; do
  [[ "$(dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null)" == installed ]] || missing+=("$p")
done
if ((${#missing[@]} == 0)); then
  echo "setup.sh: all ${#PACKAGES[@]} packages installed; nothing to do."
  exit 0
fi

as_root=()
if ((EUID != 0)); then
  sudo -n true 2>/dev/null ||
    die "missing packages: ${missing[*]}. Run this script as root (or with passwordless sudo) to install them."
  as_root=(sudo -n)
fi

echo "setup.sh: installing ${missing[*]}"
"${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -q
unknown=()
for p in "${missing[@]}"; do
  candidate=$(LC_ALL=C apt-cache policy "$p" 2>/dev/null | sed -n 's/^ *Candidate: //p')
  [[ -n "$candidate" && "$candidate" != "(none)" ]] || unknown+=("$p")
done
((${#unknown[@]} == 0)) ||
  die "no installable package named: ${unknown[*]} (is this Debian 12 with its main archive in the apt sources?)"
"${as_root[@]}" env DEBIAN_FRONTEND=noninteractive \
  apt-get install -y --no-install-recommends "${missing[@]}"
echo "setup.sh: done."
