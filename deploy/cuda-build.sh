#!/usr/bin/env bash
# Builds the CMake targets on a GPU machine whose LibTorch comes from a PyTorch
# wheel (CUDA, NCCL) but which has no Debian development packages and no
# network: the packages travel as .deb files, unpacked next to the build.
#
#   # on a machine with Debian's package index (this project's dev machines):
#   bash deploy/cuda-build.sh fetch .debs
#   # on the GPU machine, with .debs copied beside the checkout:
#   bash deploy/cuda-build.sh build .debs [TARGET...]
#   # then, e.g.: LD_LIBRARY_PATH=/tmp/deb/usr/lib/x86_64-linux-gnu \
#   #   /tmp/b/trainer_step_bench --device=cuda
#
# Two things differ from a Debian build: the wheel carries protobuf headers
# of its own (an older protobuf) in its include directory, so Debian's
# protobuf headers are put first from a copy (gcc ignores -I for a directory
# already given as -isystem); and libprotobuf is linked explicitly.
set -euo pipefail
cd "$(dirname "$0")/.."
command=${1:?fetch or build}
debs=${2:?folder of .deb files}
shift 2

PACKAGES=(googletest libabsl-dev libabsl20220623 libbz2-1.0 libbz2-dev
  libc-ares-dev libc-ares2 libgflags-dev libgflags2.2 libgmock-dev
  libgrpc++-dev libgrpc++1.51 libgrpc-dev libgrpc29 libgtest-dev liblz4-1
  liblz4-dev libprotobuf-dev libprotobuf-lite32 libprotobuf32 libprotoc32
  libre2-9 libre2-dev librocksdb-dev librocksdb7.8 libsnappy-dev libsnappy1v5
  libssl-dev libssl3 libzstd-dev libzstd1 nlohmann-json3-dev protobuf-compiler
  protobuf-compiler-grpc zlib1g-dev pkgconf pkgconf-bin libpkgconf3)

if [ "$command" = fetch ]; then
  mkdir -p "$debs"
  (cd "$debs" && apt-get download "${PACKAGES[@]}")
  exit 0
fi

root=/tmp/deb
D=$root/usr
L=$D/lib/x86_64-linux-gnu
mkdir -p "$root" /tmp/pbinc
for f in "$debs"/*.deb; do dpkg -x "$f" "$root"; done
cp -r "$D/include/google" /tmp/pbinc/
export LD_LIBRARY_PATH=$L PATH=$D/bin:$PATH PKG_CONFIG_SYSROOT_DIR=$root \
  PKG_CONFIG_LIBDIR=$L/pkgconfig:$D/share/pkgconfig
torch_dir=$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)')/Torch
cmake -S . -B /tmp/b -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DTorch_DIR="$torch_dir" -DCMAKE_PREFIX_PATH="$D;$L/cmake" \
  -DOPENSSL_ROOT_DIR="$D" -DProtobuf_PROTOC_EXECUTABLE="$D/bin/protoc" \
  -DCMAKE_BUILD_RPATH="$L" "-DCMAKE_CXX_FLAGS=-I/tmp/pbinc" \
  "-DCMAKE_CXX_STANDARD_LIBRARIES=-L$L -lprotobuf"
cmake --build /tmp/b -j"$(nproc)" ${1:+--target "$@"}
