#!/usr/bin/env bash
# Runs every test, as CI does (.ci/run): installs what is missing, runs
# `bazel test` on the given patterns (default //...), then the targets of
# tests/sanitizer_targets.txt under their sanitizer, and ends with the line
# "N passed, N failed[, N skipped]" counting GoogleTest cases. A target that
# fails without a failing case (build error, crash, timeout) counts as one
# failure. Exits non-zero when anything failed or nothing ran.
set -uo pipefail
cd "$(dirname "$0")/.."

bash deploy/install-deps.sh || exit 1

patterns=("$@")
[ ${#patterns[@]} -eq 0 ] && patterns=(//...)

passed=0 failed=0 skipped=0

# run_bazel_test CONFIG TARGET...: runs the tests, then adds up their results.
run_bazel_test() {
  local config=$1
  shift
  local flags=()
  [ -n "$config" ] && flags=(--config="$config")
  echo "== bazel test ${flags[*]} $* =="
  local log
  log=$(mktemp)
  bazel test "${flags[@]}" --keep_going --test_output=errors -- "$@" 2>&1 |
    grep -v 'linux-sandbox' | tee "$log"
  local testlogs
  testlogs=$(bazel info "${flags[@]}" bazel-testlogs 2>/dev/null)
  local target status
  while read -r target status; do
    local xml="$testlogs/${target#//}"
    xml="${xml/://}/test.xml"
    local p=0 f=0 s=0
    if [ -f "$xml" ] && [[ "$status" != "NO STATUS" && "$status" != FAILED\ TO\ BUILD ]]; then
      read -r p f s < <(awk -f tests/count_test_results.awk "$xml")
    fi
    if [[ "$status" != PASSED* && "$status" != FLAKY* && $f -eq 0 ]]; then
      echo "counted as one failure: $target ($status)"
      f=1
    fi
    passed=$((passed + p)) failed=$((failed + f)) skipped=$((skipped + s))
  done < <(sed -nE 's#^(//[^ ]+)[[:space:]]+(\(cached\) )?(PASSED|FLAKY|FAILED TO BUILD|FAILED|TIMEOUT|NO STATUS|INCOMPLETE)( in .*)?$#\1 \3#p' "$log")
  rm -f "$log"
}

run_bazel_test "" "${patterns[@]}"

if [ ${#patterns[@]} -eq 1 ] && [ "${patterns[0]}" = "//..." ]; then
  for config in asan tsan; do
    targets=$(awk -v c="$config" '$1 == c { print $2 }' tests/sanitizer_targets.txt)
    [ -n "$targets" ] && run_bazel_test "$config" $targets
  done
fi

summary="$passed passed, $failed failed"
[ "$skipped" -gt 0 ] && summary="$summary, $skipped skipped"
echo "$summary"
[ "$failed" -eq 0 ] && [ $((passed + skipped)) -gt 0 ]
