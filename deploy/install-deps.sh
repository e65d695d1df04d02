#!/usr/bin/env bash
# Installs the Debian packages the project builds and tests with, and nothing
# else. Idempotent: prints nothing when everything is present.
set -euo pipefail

# Build: Bazel (canonical) and CMake; gRPC/protobuf, Abseil, RocksDB, LibTorch
# (CPU, with Gloo for c10d); tests and benchmarks: GoogleTest/Mock, Google
# Benchmark; sanitizers and formatting: clang with its runtimes, clang-format.
PACKAGES=(
  bazel-bootstrap cmake ninja-build g++
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev librocksdb-dev libtorch-dev libgloo-dev
  libgtest-dev libgmock-dev libbenchmark-dev nlohmann-json3-dev
  clang libclang-rt-14-dev clang-format
)

missing=()
for package in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$package" 2>/dev/null |
      grep -q "install ok installed"; then
    missing+=("$package")
  fi
done
[ ${#missing[@]} -eq 0 ] && exit 0

sudo=()
[ "$(id -u)" -ne 0 ] && sudo=(sudo)
echo "install-deps: installing ${missing[*]}"
"${sudo[@]}" apt-get update -qq
DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq \
  --no-install-recommends "${missing[@]}" >/dev/null
echo "install-deps: done"
