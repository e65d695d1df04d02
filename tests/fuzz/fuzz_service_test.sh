#!/usr/bin/env bash
# Builds tests/fuzz/service_fuzzer.cc with libFuzzer, ASan and UBSan (clang 14,
# against Debian's LibTorch, gRPC, protobuf and Abseil) and fuzzes the tracker
# service's handlers for a bounded time, starting from tests/fuzz/corpus/.
# Fails on a crash, leak, timeout, out-of-memory or sanitizer report; prints
# the number of executions.
#
# Under `bazel test` it runs in the runfiles tree and builds in $TEST_TMPDIR;
# a crashing input lands in the test's undeclared outputs (outputs.zip).
# From the repository root, for local fuzzing:
#   bash tests/fuzz/fuzz_service_test.sh              # 60 s
#   FUZZ_SECONDS=600 bash tests/fuzz/fuzz_service_test.sh
#   bash tests/fuzz/fuzz_service_test.sh CRASH_FILE   # replay inputs only
# Environment (all optional):
#   FUZZ_SECONDS    fuzzing time (default 60)
#   FUZZ_JOBS       parallel compile jobs (default: CPU count)
#   FUZZ_BUILD_DIR  build directory; reused by later runs (default: under
#                   $TEST_TMPDIR, or /tmp/deltastream_fuzz_build locally)
#   FUZZ_CORPUS_DIR where new inputs go (default: $FUZZ_BUILD_DIR/corpus);
#                   the checked-in seeds are never written to
#   FUZZ_ARTIFACTS  where crashing inputs go (default: the undeclared outputs
#                   under Bazel, else $FUZZ_BUILD_DIR/artifacts)
#   FUZZ_ARGS       extra libFuzzer flags, e.g. "-jobs=2 -workers=2"
#   DELTASTREAM_FUZZ_VERBOSE=1  the fuzzer prints every call and its status
set -euo pipefail
shopt -s nullglob

if [ -n "${TEST_SRCDIR:-}" ]; then
  cd "$TEST_SRCDIR/${TEST_WORKSPACE:-deltastream}"
  build=${FUZZ_BUILD_DIR:-$TEST_TMPDIR/fuzz_build}
  artifacts=${FUZZ_ARTIFACTS:-${TEST_UNDECLARED_OUTPUTS_DIR:-$build/artifacts}}
else
  cd "$(dirname "$0")/../.."
  build=${FUZZ_BUILD_DIR:-/tmp/deltastream_fuzz_build}
  artifacts=${FUZZ_ARTIFACTS:-$build/artifacts}
fi
root=$PWD
seconds=${FUZZ_SECONDS:-60}
corpus=${FUZZ_CORPUS_DIR:-$build/corpus}
jobs=${FUZZ_JOBS:-$(nproc)}
mkdir -p "$build" "$corpus" "$artifacts"

CXX=${CXX_FUZZ:-clang++-14}
SANITIZE="-fsanitize=address,undefined -fno-sanitize-recover=undefined"
# As .bazelrc and third_party/system/BUILD.bazel build the project, with
# libFuzzer's coverage instrumentation in every object; line tables only (a
# report's stack still names each file and line), which compile faster.
CXXFLAGS="-std=c++17 -O1 -gline-tables-only -fno-omit-frame-pointer -fsanitize=fuzzer-no-link
  $SANITIZE -isystem /usr/include/torch/csrc/api/include
  -Wno-deprecated-declarations -Wno-unused-parameter"

# Generated protobuf and gRPC code: Bazel's genrule outputs in the runfiles,
# else protoc on proto/*.proto.
if compgen -G "proto/*.pb.cc" >/dev/null; then
  gen=$root
else
  # Into a fresh directory, then only what changed is copied (and what is
  # gone removed), so that a kept build directory rebuilds only what changed.
  gen=$build/gen
  rm -rf "$build/gen.new"
  mkdir -p "$build/gen.new" "$gen/proto"
  protoc --proto_path=. --cpp_out="$build/gen.new" --grpc_out="$build/gen.new" \
    --plugin=protoc-gen-grpc=/usr/bin/grpc_cpp_plugin proto/*.proto
  for f in "$build"/gen.new/proto/*; do
    cmp -s "$f" "$gen/proto/${f##*/}" || cp "$f" "$gen/proto/"
  done
  for f in "$gen"/proto/*; do
    [ -e "$build/gen.new/proto/${f##*/}" ] || rm -f "$f"
  done
fi

# The project's libraries: every source of base/, store/, proto/ and
# tracker_service/ but the binaries' mains, and the fuzz target.
sources=()
for f in base/*.cc store/*.cc proto/*.cc tracker_service/*.cc; do
  [[ "$f" == *.pb.cc ]] && continue  # generated: below
  grep -qE '^int main\(' "$f" && continue
  sources+=("$f")
done
sources+=("$gen"/proto/*.pb.cc tests/fuzz/*.cc)

# System libraries: the linkopts of third_party/system/BUILD.bazel when it is
# at hand, else the same list spelled out here; never the test frameworks,
# whose main would replace libFuzzer's.
libs=""
if [ -f third_party/system/BUILD.bazel ]; then
  libs=$(grep -oE '"-l[^"]+"' third_party/system/BUILD.bazel | tr -d '"' |
    grep -vE '^-l(gtest|gtest_main|gmock|benchmark)$' | awk '!seen[$0]++' |
    tr '\n' ' ')
fi
if [ -z "$libs" ]; then
  libs="-ltorch -ltorch_cpu -lc10 -lgrpc++_reflection -lgrpc++ -lgrpc -lgpr
    -lprotobuf -lrocksdb -lpthread"
  libs="$libs $(ls /usr/lib/x86_64-linux-gnu/libabsl_*.so |
    sed 's|.*/lib\(absl_[a-z0-9_]*\)\.so|-l\1|' | tr '\n' ' ')"
fi

# LibTorch's and gRPC's headers, parsed once into a precompiled header that
# every object starts from (tracker_reads.cc: 19.0 s of CPU without it, 15.6 s
# with it, 13.0 s with line tables only as well).
pch_header=$build/common.h
printf '#include <%s>\n' ATen/ATen.h grpcpp/grpcpp.h >"$build/common.h.new"
if cmp -s "$build/common.h.new" "$pch_header"; then
  rm "$build/common.h.new"
else
  mv "$build/common.h.new" "$pch_header"
fi

# A generated Makefile: parallel, and incremental when the build directory is
# kept (header dependencies through -MMD).
{
  echo "CXX := $CXX"
  echo "CXXFLAGS := $(echo $CXXFLAGS) -I$root -I$gen"
  echo "PCH := $pch_header.pch"
  echo "\$(PCH): $pch_header"
  printf '\t@echo "  PCH $<" && $(CXX) $(CXXFLAGS) -MMD -MP -x c++-header $< -o $@\n'
  echo "OBJS :="
  for f in "${sources[@]}"; do
    obj=$build/obj/$(echo "${f#"$gen"/}" | tr '/' '_').o
    echo "OBJS += $obj"
    echo "$obj: $f \$(PCH)"
    printf '\t@mkdir -p $(dir $@) && echo "  CXX $<" && $(CXX) $(CXXFLAGS) -include-pch $(PCH) -MMD -MP -c $< -o $@\n'
  done
  echo "$build/service_fuzzer: \$(OBJS)"
  printf '\t@echo "  LINK $@" && $(CXX) -fsanitize=fuzzer %s $^ -o $@ %s\n' \
    "$SANITIZE" "$(echo $libs)"
  echo '-include $(OBJS:.o=.d) $(PCH:.pch=.d)'
} >"$build/Makefile"
start=$(date +%s)
make -s -f "$build/Makefile" -j"$jobs" "$build/service_fuzzer"
echo "built $build/service_fuzzer in $(($(date +%s) - start)) s"

# Leaks are bugs here (unlike the repo's --config=asan, which skips them).
export ASAN_OPTIONS="detect_leaks=1:allocator_may_return_null=1:${ASAN_OPTIONS:-}"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:${UBSAN_OPTIONS:-}"
export GRPC_VERBOSITY=${GRPC_VERBOSITY:-ERROR}
fuzzer=$build/service_fuzzer

if [ $# -gt 0 ]; then
  # Replays the given inputs (a reproducer) once each.
  exec "$fuzzer" -rss_limit_mb=4096 -timeout=20 "$@"
fi

log=$build/fuzz.log
start=$(date +%s)
set +e
# shellcheck disable=SC2086
"$fuzzer" "$corpus" tests/fuzz/corpus -max_total_time="$seconds" \
  -rss_limit_mb=4096 -timeout=20 -max_len=8192 -print_final_stats=1 \
  -artifact_prefix="$artifacts/" ${FUZZ_ARGS:-} 2>&1 |
  grep --line-buffered -vE '^(#[0-9]+\s+(NEW|REDUCE|pulse)|\s+NEW_FUNC)' |
  tee "$log"
rc=${PIPESTATUS[0]}
set -e
execs=$(awk '/stat::number_of_executed_units/ { print $2 }' "$log" | tail -1)
echo "fuzzed for $(($(date +%s) - start)) s: ${execs:-?} executions," \
  "corpus $(ls "$corpus" | wc -l) inputs, exit status $rc"
if [ "$rc" -ne 0 ] || grep -qE '^(==[0-9]+==ERROR|SUMMARY: |.*runtime error:)' "$log"; then
  echo "FAILED: the fuzzer found a crash, leak, timeout or sanitizer report;"
  echo "reproducer(s) in $artifacts (under bazel: bazel-testlogs/tests/fuzz/"
  echo "fuzz_service_test/test.outputs/outputs.zip; the log above has Base64):"
  ls -l "$artifacts" 2>/dev/null | grep -E 'crash-|leak-|timeout-|oom-' || true
  echo "replay: bash tests/fuzz/fuzz_service_test.sh REPRODUCER" \
    "(DELTASTREAM_FUZZ_VERBOSE=1 prints each call)"
  exit 1
fi
echo "PASSED"
