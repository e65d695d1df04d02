#!/usr/bin/env bash
# The GPU checks as one bounded script, for a GPU machine lent for minutes:
# builds the CUDA targets with CMake (deploy/cuda-build.sh), runs every test
# that has a CUDA path, then times training steps on CUDA
# (trainer_step_bench: tracking off, ID_ONLY and EMBEDDING, with and without
# auto-compaction, paired per round; then the sharded path at world size 1
# over NCCL; then the train pipelines side by side on one GPU (pipeline_bench),
# if time is left).
#
#   bash deploy/cuda-build.sh fetch .debs            # where apt works, once
#   bash deploy/cuda-build.sh check .debs            # there too
#   bash deploy/gpu-checks.sh .debs OUT [SECONDS]    # on the GPU machine
#
# Each step runs under a time limit within SECONDS (default 540) and logs to
# OUT/<step>.log; stdout gets one line per step (its exit status and time)
# and the lines that matter (compile errors, test results, the bench's
# table). Exit status: 0 when every step that ran passed.
set -uo pipefail
cd "$(dirname "$0")/.." || exit
debs=${1:?folder of .deb files}
out=${2:?folder for the logs}
budget=${3:-540}
mkdir -p "$out"

TESTS=(delta_store_test embedding_modules_test models_test
  keyed_jagged_tensor_test keyed_tensor_test feature_dict_test
  cuda_pipelines_test)
BENCH=trainer_step_bench
PIPELINE_BENCH=pipeline_bench
failed=0

# step NAME LIMIT COMMAND...: runs COMMAND for at most LIMIT seconds (and no
# later than the budget), logging to OUT/NAME.log.
step() {
  local name=$1 limit=$2 left=$((budget - SECONDS))
  shift 2
  if ((left < 10)); then
    echo "$name: skipped, the budget is spent"
    return 1
  fi
  ((limit > left)) && limit=$left
  local start=$SECONDS
  timeout "$limit" "$@" >"$out/$name.log" 2>&1
  local rc=$?
  echo "$name: exit $rc after $((SECONDS - start)) s (limit $limit s)"
  ((rc == 0)) || failed=1
  return $rc
}

# built NAME: whether /tmp/b/NAME was built; says so when not.
built() {
  [ -x "/tmp/b/$1" ] && return 0
  echo "$1: not built"
  failed=1
  return 1
}

nvidia-smi -L
step build 360 bash deploy/cuda-build.sh build "$debs" "${TESTS[@]}" "$BENCH" \
  "$PIPELINE_BENCH"
grep -E "NCCL backend|error:|FAILED:" "$out/build.log" | head -40

export LD_LIBRARY_PATH=/tmp/deb/usr/lib/x86_64-linux-gnu
for test in "${TESTS[@]}"; do
  built "$test" || continue
  step "$test" 90 "/tmp/b/$test"
  grep -E "^\[  (PASSED|FAILED|SKIPPED) |difference|Failure|skipped" \
    "$out/$test.log" | head -30
done

if built "$BENCH"; then
  step step_bench 240 "/tmp/b/$BENCH" --device=cuda --uncompacted
  grep -v "^round" "$out/step_bench.log"
  step sharded_step_bench 150 "/tmp/b/$BENCH" --device=cuda --rounds=10 \
    --sharded
  grep -v "^round" "$out/sharded_step_bench.log"
fi

if built "$PIPELINE_BENCH"; then
  step pipeline_bench 120 "/tmp/b/$PIPELINE_BENCH" --device=cuda --ranks=1
  grep -v "^round" "$out/pipeline_bench.log"
fi
exit $failed
