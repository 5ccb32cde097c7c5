#!/usr/bin/env bash
# Installs what SnapMLA needs to build and test, on a fresh Debian/Ubuntu machine:
# g++ (C++20), make, CMake >= 3.25, GoogleTest and python3 (venv, headers) from Debian's
# packages; if Debian's CMake is older than 3.25, the pinned CMake wheel from PyPI. The CUDA
# toolkit is optional: with nvcc on the PATH the CUDA parts build too. Safe to run again: it
# installs only what is missing.
set -euo pipefail

need=()
command -v g++ >/dev/null 2>&1 || need+=(g++)
command -v make >/dev/null 2>&1 || need+=(make)
command -v cmake >/dev/null 2>&1 || need+=(cmake)
[ -f /usr/include/gtest/gtest.h ] || need+=(libgtest-dev)
# Python package build: python3 with venv/pip and its C headers (Debian splits them out).
command -v python3 >/dev/null 2>&1 || need+=(python3)
if command -v python3 >/dev/null 2>&1; then
  python3 -c "import venv, ensurepip" >/dev/null 2>&1 || need+=(python3-venv)
  [ -f "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["include"])')/Python.h" ] ||
    need+=(python3-dev)
else
  need+=(python3-venv python3-dev)
fi

if [ ${#need[@]} -gt 0 ]; then
  echo "setup: installing from Debian packages: ${need[*]}"
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
  $SUDO apt-get update -qq
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}"
fi

cmake_ok() {
  local v
  v=$(cmake --version 2>/dev/null | head -n1 | awk '{print $3}')
  [ -n "$v" ] && [ "$(printf '%s\n' 3.25.0 "$v" | sort -V | head -n1)" = "3.25.0" ]
}
if ! cmake_ok; then
  echo "setup: CMake >= 3.25 needed; installing cmake==3.31.6 from PyPI"
  python3 -m pip install --user --quiet cmake==3.31.6
  export PATH="$HOME/.local/bin:$PATH"
  cmake_ok || { echo "setup: could not get CMake >= 3.25" >&2; exit 1; }
fi

if command -v nvcc >/dev/null 2>&1; then
  echo "setup: nvcc found ($(nvcc --version | tail -n1)); CUDA parts will build"
else
  echo "setup: no nvcc on the PATH; building the CPU parts only"
fi
