#!/usr/bin/env bash
# The layering test (tests/lint/layering.bzl): fails when a layer reaches what
# DESIGN.md's arrows forbid, printing the dependency path, or when a library or
# binary of a layer's BUILD file is missing from layering.bzl's LAYERS (and so
# would go unchecked).
#
# Arguments: QUERY_OUTPUT... -- BUILD_FILE... -- DECLARED_LABEL...
# Each QUERY_OUTPUT is a genquery's `somepath` result: empty when no path.
set -euo pipefail
cd "${TEST_SRCDIR:-.}/${TEST_WORKSPACE:-deltastream}"

queries=()
while [[ $# -gt 0 && "$1" != "--" ]]; do queries+=("$1"); shift; done
shift
build_files=()
while [[ $# -gt 0 && "$1" != "--" ]]; do build_files+=("$1"); shift; done
shift
declared=" $* "

status=0
for query in "${queries[@]}"; do
  check=$(basename "$query")
  if [[ -s "$query" ]]; then
    echo "FAILED: $check: a wrong-way dependency (DESIGN.md, docs/layout.md)."
    echo "  One path, from the layer down to what it must not reach:"
    sed 's/^/    /' "$query"
    status=1
  else
    echo "ok: $check"
  fi
done

# cc_library and cc_binary names, "//package:name" for each BUILD file.
for build_file in "${build_files[@]}"; do
  package=$(dirname "$build_file")
  for target in $(awk '
      /^(cc_library|cc_binary)\(/ { in_rule = 1; next }
      in_rule && /^    name = "/ { split($0, q, "\""); print q[2]; in_rule = 0 }
      /^\)/ { in_rule = 0 }' "$build_file"); do
    label="//$package:$target"
    if [[ "$declared" != *" $label "* ]]; then
      echo "FAILED: $label is not in tests/lint/layering.bzl's LAYERS:" \
        "add it to its layer so that the layering test checks it."
      status=1
    fi
  done
done
exit $status
