#!/usr/bin/env bash
# Builds the CMake targets on a GPU machine whose LibTorch comes from a PyTorch
# wheel (CUDA, NCCL) but which has no Debian development packages and no
# network: the packages travel as .deb files, unpacked next to the build.
#
#   # on a machine with Debian's package index (this project's dev machines):
#   bash deploy/cuda-build.sh fetch .debs
#   bash deploy/cuda-build.sh check .debs   # before spending GPU time
#   # on the GPU machine, with .debs copied beside the checkout:
#   bash deploy/cuda-build.sh build .debs [TARGET...]
#   # then, e.g.: LD_LIBRARY_PATH=/tmp/deb/usr/lib/x86_64-linux-gnu \
#   #   /tmp/b/trainer_step_bench --device=cuda
#
# What differs from a Debian build:
#   - the wheel carries protobuf headers of its own (an older protobuf) in its
#     include directory, so Debian's protobuf headers are put first from a
#     copy (gcc ignores -I for a directory already given as -isystem); and
#     libprotobuf is linked explicitly;
#   - the wheel has c10d's Gloo header but not Gloo's own headers (Gloo is
#     linked into libtorch): Debian's libgloo-dev provides them, copied beside
#     protobuf's (c10d's header compiles against the older Gloo: it uses
#     Gloo's newer store API only where Gloo says it has it);
#   - NCCL: trainer/comm's NCCL backend is compiled (-DDELTASTREAM_WITH_NCCL)
#     when nccl.h is found beside the wheel (nvidia-nccl) or CUDA;
#   - warnings are not errors (-DDELTASTREAM_WERROR=OFF): the tree is kept
#     warning-free against Debian's LibTorch, whose headers differ;
#   - ninja keeps going past a target that fails (-k 0), so one broken target
#     does not stop the others; the script's exit status still says so.
set -euo pipefail
cd "$(dirname "$0")/.."
command=${1:?fetch or build}
debs=${2:?folder of .deb files}
shift 2

# What CMakeLists.txt finds, and what those need at configure time:
# prometheus-cpp's CMake config asks for civetweb (whose config names its
# binary) and CURL (headers and library; nothing links it). libgloo-dev: the
# headers only (above).
PACKAGES=(civetweb googletest libabsl-dev libabsl20220623 libbenchmark-dev
  libbenchmark1debian libbz2-1.0 libbz2-dev libc-ares-dev libc-ares2
  libcivetweb-dev libcivetweb1 libcurl4 libcurl4-openssl-dev libgflags-dev
  libgflags2.2 libgloo-dev libgmock-dev libgrpc++-dev libgrpc++1.51
  libgrpc-dev libgrpc29 libgtest-dev liblz4-1 liblz4-dev libpkgconf3
  libprometheus-cpp-core1.0 libprometheus-cpp-pull1.0
  libprometheus-cpp-push1.0 libprotobuf-dev libprotobuf-lite32 libprotobuf32
  libprotoc32 libre2-9 libre2-dev librocksdb-dev librocksdb7.8 libsnappy-dev
  libsnappy1v5 libssl-dev libssl3 libzstd-dev libzstd1 nlohmann-json3-dev
  pkgconf pkgconf-bin prometheus-cpp-dev protobuf-compiler
  protobuf-compiler-grpc zlib1g-dev)

if [ "$command" = fetch ]; then
  mkdir -p "$debs"
  (cd "$debs" && apt-get download "${PACKAGES[@]}")
  exit 0
fi

# Unpacks the .debs under $root and points pkg-config, the tools and CMake
# (deb_cmake_args) at them.
unpack() {
  root=$1
  D=$root/usr
  L=$D/lib/x86_64-linux-gnu
  mkdir -p "$root"
  for f in "$debs"/*.deb; do dpkg -x "$f" "$root"; done
  export LD_LIBRARY_PATH=$L PATH=$D/bin:$PATH PKG_CONFIG_SYSROOT_DIR=$root \
    PKG_CONFIG_LIBDIR=$L/pkgconfig:$D/share/pkgconfig
  deb_cmake_args=(-DCMAKE_PREFIX_PATH="$D;$L/cmake" -DOPENSSL_ROOT_DIR="$D"
    -DProtobuf_PROTOC_EXECUTABLE="$D/bin/protoc")
}

if [ "$command" = check ]; then
  # Here, on a Debian machine with the project's packages installed:
  # configures CMake with the unpacked .debs searched first and Debian's
  # LibTorch, then lists what was found on this system instead. Apart from
  # LibTorch (with its glog and libunwind), the C library and the toolchain,
  # everything must come from the .debs: anything else is a package PACKAGES
  # lacks, which the GPU machine would not have. (Headers included without a
  # find_package, like Gloo's, are not seen.)
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  unpack "$work/root"
  cmake -S . -B "$work/build" -G Ninja "${deb_cmake_args[@]}" -Wno-dev \
    >"$work/cmake.log" 2>&1 || {
    tail -30 "$work/cmake.log"
    exit 1
  }
  allowed='CMAKE_[A-Z_0-9]+|Caffe2_DIR|Torch_DIR|TORCH_LIBRARY|c10_LIBRARY'
  allowed+='|glog_DIR|Unwind_[A-Z_]+|LIBDL_[A-Z_]+|LIBRT_[A-Z_]+'
  system=$(grep -E '^[^:#]+:(PATH|FILEPATH)=/usr/' "$work/build/CMakeCache.txt" |
    grep -vE "^($allowed):" || true)
  if [ -n "$system" ]; then
    echo "cuda-build.sh: found on this system, not in $debs" \
      "(their packages belong in PACKAGES):"
    echo "$system"
    exit 1
  fi
  echo "cuda-build.sh: everything CMakeLists.txt finds comes from $debs"
  exit 0
fi

unpack /tmp/deb
mkdir -p /tmp/pbinc
cp -r "$D/include/google" "$D/include/gloo" /tmp/pbinc/
torch_dir=$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)')/Torch
site=$(python3 -c 'import torch, os; print(os.path.dirname(os.path.dirname(torch.__file__)))')
nccl_h=$(find "$site/nvidia" /usr/local/cuda/include -name nccl.h 2>/dev/null |
  head -1 || true)  # either folder may be missing
cxx_flags=-I/tmp/pbinc
nccl=OFF
if [ -n "$nccl_h" ]; then
  cxx_flags="$cxx_flags -I$(dirname "$nccl_h")"
  nccl=ON
fi
echo "cuda-build.sh: NCCL backend $nccl${nccl_h:+ ($nccl_h)}"
cmake -S . -B /tmp/b -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DTorch_DIR="$torch_dir" "${deb_cmake_args[@]}" -DCMAKE_BUILD_RPATH="$L" "-DCMAKE_CXX_FLAGS=$cxx_flags" \
  "-DCMAKE_CXX_STANDARD_LIBRARIES=-L$L -lprotobuf" \
  -DDELTASTREAM_WITH_NCCL=$nccl -DDELTASTREAM_WERROR=OFF
cmake --build /tmp/b -j"$(nproc)" ${1:+--target "$@"} -- -k 0
