#!/usr/bin/env bash
# Runs every test, as CI does (.ci/run):
#   1. deploy/install-deps.sh installs whatever Debian package is missing;
#   2. `bazel test` on the given target patterns (default //...);
#   3. with the default patterns only, the targets of tests/sanitizer_targets.txt
#      under their sanitizer (`bazel test --config=asan|tsan`) instead: step 2
#      leaves them out, since a sanitizer's run checks what the plain one
#      does and more (and building them twice more than one build costs CI
#      minutes on 2 cores);
#   4. the last line counts GoogleTest cases (not targets) over all runs:
#      "N passed, N failed" or "N passed, N failed, N skipped".
# A target that fails without a failing case (build error, crash, timeout,
# sanitizer report at exit) counts as one failure, and so does a bazel run
# that fails without any target to blame (a broken BUILD file).
# Exits non-zero when anything failed or nothing passed.
#
# Usage: tests/run_all.sh [PATTERN...] [--bazel_test_flag...]
#   Arguments starting with "--" go to every `bazel test`, the others are
#   target patterns, e.g. tests/run_all.sh //tests/store/... --test_filter=Foo.*
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1

bash deploy/install-deps.sh || exit 1

patterns=() extra_flags=()
for arg in "$@"; do
  if [[ "$arg" == --* ]]; then extra_flags+=("$arg"); else patterns+=("$arg"); fi
done
run_sanitizers=0
if [ ${#patterns[@]} -eq 0 ]; then
  patterns=(//...)
  run_sanitizers=1
fi

passed=0 failed=0 skipped=0

# run_bazel_test CONFIG TARGET...: `bazel test` (under --config=CONFIG unless
# CONFIG is empty), then adds its targets' cases to the counts.
run_bazel_test() {
  local config=$1
  shift
  local flags=(--keep_going --test_output=errors --color=no --curses=no)
  [ -n "$config" ] && flags=(--config="$config" "${flags[@]}")
  # The counting below reads the short summary, whatever the caller asks for.
  flags+=("${extra_flags[@]}" --test_summary=short)
  echo "== bazel test ${flags[*]} -- $* =="

  local log rc
  log=$(mktemp)
  bazel test "${flags[@]}" -- "$@" 2>&1 | grep --line-buffered -v linux-sandbox | tee "$log"
  rc=${PIPESTATUS[0]}
  # Each config has its own testlogs tree; the bazel-testlogs symlink follows
  # only the latest build, so ask for this one's.
  local testlogs
  testlogs=$(bazel info "${flags[@]}" bazel-testlogs 2>/dev/null ||
             bazel info ${config:+--config="$config"} bazel-testlogs 2>/dev/null)

  # Bazel's summary: "//pkg:target   [(cached) ]STATUS[ in 1.2s | , ...]".
  local failed_before=$failed target status dir p f s xml xmls
  while read -r target status; do
    p=0 f=0 s=0
    if [[ "$status" == PASSED || "$status" == FLAKY || "$status" == FAILED ||
          "$status" == TIMEOUT ]]; then
      # //pkg:target -> TESTLOGS/pkg/target/, with a subdirectory per shard or
      # run when the target is sharded or run several times.
      dir="$testlogs/${target#//}"
      dir="${dir/://}"
      xmls=()
      for xml in "$dir"/test.xml "$dir"/shard_*/test.xml "$dir"/run_*/test.xml; do
        [ -f "$xml" ] && xmls+=("$xml")
      done
      [ ${#xmls[@]} -gt 0 ] &&
        read -r p f s < <(awk -f tests/count_test_results.awk "${xmls[@]}")
    fi
    if [[ "$status" != PASSED && "$status" != FLAKY && $f -eq 0 ]]; then
      echo "counted as one failure: $target ($status)"
      f=1
    fi
    passed=$((passed + p)) failed=$((failed + f)) skipped=$((skipped + s))
  done < <(awk '
    /^\/\/[^ ]+ +[(A-Z]/ {
      line = $0
      sub(/^[^ ]+ +/, "", line)
      sub(/^\([^)]*cached\) /, "", line)
      if (!match(line, /^[A-Z][A-Z ]*[A-Z]/)) next
      status = substr(line, 1, RLENGTH)
      print $1, status
    }' "$log")
  rm -f "$log"

  # 0: all passed; 4: no test targets. Anything else with no failure counted
  # (a BUILD file error, a bad target name) still has to fail the run.
  if [ "$rc" -ne 0 ] && [ "$rc" -ne 4 ] && [ "$failed" -eq "$failed_before" ]; then
    echo "counted as one failure: bazel test exited with status $rc"
    failed=$((failed + 1))
  fi
}

# tests/sanitizer_targets.txt: "asan //pkg:target" or "tsan //pkg:target" per
# line; "#" starts a comment.
if [ "$run_sanitizers" -eq 1 ] && [ -s tests/sanitizer_targets.txt ]; then
  while read -r target; do
    patterns+=("-$target")
  done < <(awk '{ sub(/#.*/, "") } NF >= 2 { print $2 }' \
    tests/sanitizer_targets.txt | sort -u)
fi
run_bazel_test "" "${patterns[@]}"

if [ "$run_sanitizers" -eq 1 ] && [ -s tests/sanitizer_targets.txt ]; then
  for config in asan tsan; do
    mapfile -t targets < <(awk -v c="$config" \
      '{ sub(/#.*/, "") } $1 == c && NF >= 2 { print $2 }' tests/sanitizer_targets.txt)
    [ ${#targets[@]} -gt 0 ] && run_bazel_test "$config" "${targets[@]}"
  done
fi

summary="$passed passed, $failed failed"
[ "$skipped" -gt 0 ] && summary="$summary, $skipped skipped"
echo "$summary"
[ "$failed" -eq 0 ] && [ "$passed" -gt 0 ]
