#!/usr/bin/env bash
# Runs clang-tidy with the root .clang-tidy over the project's changed C++
# files; any finding fails the test.
#
# "Changed" means: the .cc and .h files under base/ clients/ proto/ store/
# tests/ tracker_service/ trainer/ that differ between the source tree
# (uncommitted edits included) and CLANG_TIDY_BASE, by default each parent of
# HEAD. In CI's fresh clone that is the commit under test (for a merge commit,
# what the merge changed beyond both sides: its conflict resolutions); it
# needs a clone with at least two commits of history (git clone --depth=2). A changed header is checked through the .cc file of
# the same name when there is one, else through a unit that includes it. Where the tree is not a git checkout, or
# the base is not in it, the test says so and checks nothing.
#
#   bazel test //tests/lint:clang_tidy_test [--test_env=CLANG_TIDY_BASE=main]
#   bash tests/lint/clang_tidy_test.sh FILE...    # from the repository root
#
# Bazel runs it on every invocation (tag "external"): its input is the
# checkout's git state, which Bazel does not see.
set -euo pipefail

if [[ -n "${TEST_SRCDIR:-}" ]]; then
  # Under Bazel: generated headers live in the runfiles; the sources, and
  # git, in the checkout the runfiles link to.
  generated="$TEST_SRCDIR/${TEST_WORKSPACE:-deltastream}"
  config=$(readlink -f "$generated/.clang-tidy")
  root=$(dirname "$config")
else
  # By hand or from CMake's ctest, from the repository root: generated
  # headers from bazel-bin, or from CLANG_TIDY_GENERATED (CMake's gen/).
  root=$(pwd)
  generated="${CLANG_TIDY_GENERATED:-$root/bazel-bin}"
fi
cd "$root"

project='^(base|clients|proto|store|tests|tracker_service|trainer)/.*\.(cc|h)$'
files=()
if [[ $# -gt 0 ]]; then
  files=("$@")
else
  if ! git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    echo "SKIPPED: $root is not a git checkout: no changed files to check."
    exit 0
  fi
  # The bases: CLANG_TIDY_BASE, else every parent of HEAD. A file counts as
  # changed when it differs from each base, so for a merge commit only what
  # the merge itself changed (its resolutions): what it brought in was
  # checked on its own branch.
  if [[ -n "${CLANG_TIDY_BASE:-}" ]]; then
    bases=("$CLANG_TIDY_BASE")
  else
    read -r -a bases < <(git rev-list --parents -n 1 HEAD | cut -d' ' -f2-)
  fi
  base="${bases[*]:-HEAD~1}"
  for parent in "${bases[@]:-HEAD~1}"; do
    if ! git rev-parse --verify --quiet "$parent^{commit}" >/dev/null; then
      echo "SKIPPED: base $parent is not in this clone (clone with" \
        "--depth=2): no changed files to check."
      exit 0
    fi
  done
  while IFS= read -r changed; do
    [[ -e "$changed" ]] || continue  # deleted
    if [[ "$changed" == *.h && -e "${changed%.h}.cc" ]]; then
      changed="${changed%.h}.cc"
    fi
    [[ "$changed" == *.pb.* ]] && continue
    files+=("$changed")
  done < <(for parent in "${bases[@]}"; do
             git --no-optional-locks diff --name-only --diff-filter=d \
               "$parent" | grep -E "$project" | sort -u
           done | sort | uniq -c | awk -v n=${#bases[@]} '$1 == n { print $2 }')
  # A header and its .cc both changed: check the .cc once.
  if [[ ${#files[@]} -gt 0 ]]; then
    mapfile -t files < <(printf '%s\n' "${files[@]}" | sort -u)
  fi
fi

if [[ ${#files[@]} -eq 0 ]]; then
  echo "ok: no changed C++ files since ${base:-the base}."
  exit 0
fi

# One clang-tidy per file, as many at once as there are cores; a header with
# no .cc of its own is checked through a file that only includes it.
tmp=$(mktemp -d "${TEST_TMPDIR:-/tmp}/tidy.XXXXXX")
export root generated tmp
tidy_one() {
  local file=$1 unit=$1 log
  log="$tmp/$(echo "$file" | tr / _).log"
  if [[ "$file" == *.h ]]; then
    unit="$tmp/$(echo "$file" | tr / _).cc"
    echo "#include \"$file\"" >"$unit"
  fi
  clang-tidy --quiet --config-file="$root/.clang-tidy" \
    --header-filter="^$root/(base|clients|store|tests|tracker_service|trainer)/.*\\.h\$" \
    "$unit" -- \
    -std=c++17 -I"$root" -I"$generated" \
    -isystem /usr/include/torch/csrc/api/include \
    -DUSE_DISTRIBUTED -DUSE_C10D_GLOO -Wno-deprecated-declarations \
    >"$log" 2>&1 || true
  if grep -qE "(warning|error):" "$log"; then
    grep -v "warnings generated" "$log"
    echo "FAILED: $file"
  else
    echo "ok: $file"
  fi
}
export -f tidy_one
printf '%s\n' "${files[@]}" |
  xargs -P "$(nproc)" -I{} bash -c 'tidy_one "$1"' _ {} | tee "$tmp/summary"
! grep -q "^FAILED: " "$tmp/summary"
