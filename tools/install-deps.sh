#!/usr/bin/env bash
# Installs what strata needs to build and test, from Debian packages only,
# and only what is missing. Run as root on Debian (apt-get); says what it does.
# With --bench it also installs the benchmarks' peer, PyTorch (python3-torch):
# `make bench` prints ratios against it, and has none to print without it.
set -euo pipefail

# package : a file that proves it is installed
needs=(
  "gcc:/usr/bin/gcc"
  "make:/usr/bin/make"
  "pkg-config:/usr/bin/pkg-config"
  "libopenblas-dev:/usr/include/x86_64-linux-gnu/openblas-pthread/cblas.h"
  "libyaml-dev:/usr/include/yaml.h"
  "zlib1g-dev:/usr/include/zlib.h"
  "dataset-fashion-mnist:/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz"
  "fortunes:/usr/share/games/fortunes/cookie"
  "libopenmpi-dev:/usr/lib/x86_64-linux-gnu/openmpi/include/mpi.h"
  "openmpi-bin:/usr/bin/mpirun.openmpi"
  "clang-format:/usr/bin/clang-format"
  # the shell tests' own tools (a container's Debian has neither)
  "python3:/usr/bin/python3"
  "procps:/usr/bin/pgrep"
)

if [ "${1:-}" = --bench ]; then
  needs+=("python3-torch:/usr/lib/python3/dist-packages/torch/__init__.py")
fi

missing=()
for entry in "${needs[@]}"; do
  pkg=${entry%%:*}; file=${entry#*:}
  # Accept any multiarch location of the BLAS and MPI headers.
  if [ "$pkg" = libopenblas-dev ] && ls /usr/include/*/openblas-pthread/cblas.h /usr/include/openblas/cblas.h >/dev/null 2>&1; then
    continue
  fi
  if [ "$pkg" = libopenmpi-dev ] && ls /usr/lib/*/openmpi/include/mpi.h >/dev/null 2>&1; then
    continue
  fi
  [ -e "$file" ] || missing+=("$pkg")
done

if [ ${#missing[@]} -eq 0 ]; then
  if [ "${1:-}" = --bench ]; then
    echo "install-deps: all build, test and benchmark dependencies are present"
  else
    echo "install-deps: all build and test dependencies are present"
  fi
  exit 0
fi

echo "install-deps: missing Debian packages: ${missing[*]}"
if [ "$(id -u)" -ne 0 ]; then
  echo "install-deps: error: not root; run as root or: sudo apt-get install ${missing[*]}" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
echo "install-deps: apt-get update"
apt-get update -q
echo "install-deps: apt-get install -y ${missing[*]}"
apt-get install -y -q --no-install-recommends "${missing[@]}"
echo "install-deps: done"
