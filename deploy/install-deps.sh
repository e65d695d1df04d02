#!/usr/bin/env bash
# Installs the Debian (12, bookworm) packages the project builds and tests
# with, and nothing else. Idempotent: prints nothing and exits 0 when every
# package is already installed; otherwise one `apt-get update` and one
# `apt-get install` of the missing ones (through sudo when not root).
set -euo pipefail

# Build: Bazel 4.2.3 (canonical) and CMake + ninja (GPU machines), g++ (Bazel's
# toolchain); gRPC/protobuf, Abseil, RocksDB, LibTorch 1.13 (CPU, with Gloo for
# c10d), nlohmann JSON (deltactl); tests and benchmarks: GoogleTest/GoogleMock,
# Google Benchmark; lint and formatting: clang (-Wthread-safety) with its
# runtimes, clang-format, clang-tidy (tests/lint); NumPy (tests read .npz
# files as users do), openssl (tests make TLS certificates) and libssl-dev
# (the servers check TLS files); prometheus-cpp
# (metrics over HTTP); the Python client and its tests (clients/python:
# gRPC, protobuf, PyTorch; tests/deploy: YAML). All names checked with
# `apt-cache policy`.
PACKAGES=(
  bazel-bootstrap cmake ninja-build g++
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev librocksdb-dev libtorch-dev libgloo-dev nlohmann-json3-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  clang libclang-rt-14-dev clang-format clang-tidy
  python3-numpy openssl libssl-dev prometheus-cpp-dev
  python3-grpcio python3-protobuf python3-torch python3-yaml
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
# env, not a plain assignment: sudo would drop DEBIAN_FRONTEND.
"${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
  --no-install-recommends "${missing[@]}" >/dev/null
echo "install-deps: done"
