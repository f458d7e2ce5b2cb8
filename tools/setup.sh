#!/usr/bin/env bash
# Makes a Debian 12 (bookworm) machine ready to build and test Ember: installs
# the Debian packages below that are missing and checks for the CUDA toolkit,
# which Debian does not ship. Safe to re-run; when nothing is missing it only
# says so. Needs root (or passwordless sudo) only when it has to install.
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
  # hub/ tests: openssl makes the loopback HTTPS server's certificate;
  # python3-torch(vision) check Ember's checkpoints and ResNet-18 against PyTorch.
  openssl python3-torch python3-torchvision
  # `ip netns` for the two-host test of tools/launch (multihost_test).
  iproute2
)
CUDA=/usr/local/cuda

die() { echo "setup.sh: $*" >&2; exit 1; }

cuda_missing=()
for f in bin/nvcc include/nccl.h lib/libnccl.so; do
  [[ -e "$CUDA/$f" ]] || cuda_missing+=("$CUDA/$f")
done
((${#cuda_missing[@]} == 0)) || die "CUDA toolkit incomplete, missing: ${cuda_missing[*]}.
Ember needs the CUDA 13 toolkit with NCCL at $CUDA; Debian does not ship
CUDA 13, so install NVIDIA's toolkit and NCCL there first (this script does not)."

missing=()
for p in "${PACKAGES[@]}"; do
  [[ "$(dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null)" == installed ]] || missing+=("$p")
done
if ((${#missing[@]} == 0)); then
  echo "setup.sh: all ${#PACKAGES[@]} packages installed and CUDA found at $CUDA; nothing to do."
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
