#!/usr/bin/env bash
# Checks the lock annotations (ABSL_GUARDED_BY, ABSL_EXCLUSIVE_LOCKS_REQUIRED,
# ...) of the concurrent parts with clang's -Wthread-safety, as errors: Bazel's
# toolchain is gcc, which ignores them. Run from the runfiles tree.
set -euo pipefail
cd "${TEST_SRCDIR:-.}/${TEST_WORKSPACE:-deltastream}"
flags=(-std=c++17 -isystem /usr/include/torch/csrc/api/include
  -DUSE_DISTRIBUTED -DUSE_C10D_GLOO)
# LibTorch's and gRPC's headers, parsed once into a precompiled header that
# every source below starts from (they are most of each front end's time).
pch_dir=$(mktemp -d "${TEST_TMPDIR:-/tmp}/thread_safety.XXXXXX")
trap 'rm -rf "$pch_dir"' EXIT
printf '#include <%s>\n' ATen/ATen.h grpcpp/grpcpp.h string vector >"$pch_dir/common.h"
clang++ "${flags[@]}" -x c++-header "$pch_dir/common.h" -o "$pch_dir/common.h.pch"
status=0
# store/, tracker_service/ and trainer/tracking/: every source. base/,
# clients/ and the rest of trainer/: every source that holds a lock, in its
# own text or its header (a new one is covered as soon as it takes one).
for source in store/*.cc tracker_service/*.cc base/*.cc clients/*.cc \
    trainer/*/*.cc; do
  [[ "$source" == *_demo.cc ]] && continue
  case "$source" in
    store/* | tracker_service/* | trainer/tracking/*) ;;
    *)
      grep -qE 'Mutex|ABSL_GUARDED_BY|ABSL_PT_GUARDED_BY' \
        "$source" "${source%.cc}.h" 2>/dev/null || continue
      ;;
  esac
  if ! clang++ "${flags[@]}" -include-pch "$pch_dir/common.h.pch" \
      -fsyntax-only -I. -Wthread-safety -Werror=thread-safety "$source"; then
    echo "FAILED: $source"
    status=1
  else
    echo "ok: $source"
  fi
done
exit $status
