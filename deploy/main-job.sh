#!/usr/bin/env bash
# The README's main job: installs what is missing, builds, runs the store
# benchmark on DESIGN.md's workload, then the whole loop on loopback:
#   - the trainer on its embedded defaults (DLRM, 8 tables of 100000 x 16,
#     synthetic Zipf data, CPU) as $TRAINER_RANKS ranks (default 2: the
#     tables sharded table-wise by the planner, Gloo on loopback), each
#     rank serving its shards' deltas in-process on PORT + rank;
#   - a predictor (clients:predictor) keeping a live replica of the tables and
#     dense parameters, every 100 ms, given rank 0's address: it reads every
#     rank at one consistent cut and merges (clients/fan_in_client.h);
#   - a checkpoint job (clients:checkpoint_job) writing a full checkpoint and
#     then one increment per second;
#   - midway, the trainer is stopped (SIGTERM: final snapshot and checkpoint)
#     and restarted from them on the same address; the predictor and the job
#     carry on;
#   - at the end, the trainer drains (keeps serving until both consumers have
#     read its final batch), and trainer:verify_model compares the replica and
#     the checkpoint chain with the trainer's final checkpoint, bit for bit.
# Ends with a summary. A few minutes on 2 cores after the build.
set -euo pipefail
cd "$(dirname "$0")/.."

STEPS_FIRST_RUN=${STEPS_FIRST_RUN:-300}
STEPS_TOTAL=${STEPS_TOTAL:-600}
TRAINER_RANKS=${TRAINER_RANKS:-2}

bash deploy/install-deps.sh
echo "== building (bazel, opt) =="
log=$(mktemp)
if ! bazel build -c opt //tests/bench:store_bench //trainer:trainer \
    //trainer:verify_model //clients:deltactl //clients:checkpoint_job \
    //clients:predictor >"$log" 2>&1; then
  grep -v linux-sandbox "$log" | tail -30
  exit 1
fi
rm -f "$log"
# The opt build's outputs (bazel-bin may point at another configuration's).
bin=$(bazel info -c opt bazel-bin 2>/dev/null)

echo "== store benchmark: DESIGN.md workload (8 tables x 100 batches x 4096 Zipf IDs) =="
printf '%-6s %10s %14s %12s %12s\n' mode total_s "IDs/s" unique_rows copy_ratio
for mode in none first; do
  $bin/tests/bench/store_bench --mode="$mode" --json |
    sed -E 's/.*"mode":"([a-z]+)","total_s":([0-9.]+),"ids_per_s":([0-9]+),"unique_rows":([0-9]+),"copy_ratio":([0-9.]+).*/\1 \2 \3 \4 \5/' |
    awk '{printf "%-6s %10.3f %14d %12d %12.2f\n", $1, $2, $3, $4, $5}'
done
echo "(TorchRec's DeltaStore on these IDs, by tests/bench/torchrec_side_by_side.py: ~4 s ID_ONLY, 7-17 s EMBEDDING on the 2-core VMs; README)"

work=$(mktemp -d)
trainer= predictor= job=
cleanup() {
  for pid in $trainer $predictor $job; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

cat >"$work/trainer.textproto" <<'EOF'
tracker {
  mode: "rowwise_adagrad"
  consumers: "predictor"
  consumers: "checkpoint"
  acknowledged_reads: true
  drain_seconds: 60
}
checkpoints { every_steps: 100 }
log_every_steps: 100
EOF

# Rank r serves on PORT + r: a run of free ports, the same after a restart.
listen=127.0.0.1:$(python3 deploy/free_ports.py "$TRAINER_RANKS")
start_trainer() {
  : >"$work/trainer.out"
  $bin/trainer/trainer --config="$work/trainer.textproto" --steps=-1 \
    --nproc_per_node="$TRAINER_RANKS" \
    --listen="$listen" --checkpoint_dir="$work/run" \
    >"$work/trainer.out" 2>>"$work/trainer.log" &
  trainer=$!
  serving() { [ "$(grep -c listening "$work/trainer.out")" -ge "$TRAINER_RANKS" ]; }
  for _ in $(seq 600); do serving && break; sleep 0.1; done
  serving || { cat "$work/trainer.log"; exit 1; }
  target=$listen  # rank 0: every client discovers the other ranks from it
}
ctl() { $bin/clients/deltactl --target="$target" "$@"; }
batch() { ctl status --json 2>/dev/null | python3 -c 'import json,sys; print(json.load(sys.stdin)["current_batch"])' 2>/dev/null || echo -1; }
# Waits for the trainer's batch $1; fails (with the trainer's log) if the
# trainer exits first.
wait_batch() {
  while [ "$(batch)" -lt "$1" ]; do
    if ! kill -0 "$trainer" 2>/dev/null; then
      echo "main job: the trainer exited before batch $1:" >&2
      tail -20 "$work/trainer.log" >&2
      exit 1
    fi
    sleep 0.5
  done
}
stop_trainer() {
  kill -TERM "$trainer"
  wait "$trainer"
  trainer=
}

echo "== trainer + predictor + checkpoint job on loopback =="
start_trainer
echo "trainer: $TRAINER_RANKS ranks, rank 0 serving on $target"
ctl topology | sed 's/^/  /'
$bin/clients/predictor --target="$target" --consumer=predictor --every_ms=100 \
  --apply_log="$work/predictor.applied" >"$work/predictor.out" 2>"$work/predictor.log" &
predictor=$!
for _ in $(seq 300); do grep -q listening "$work/predictor.out" && break; sleep 0.1; done
predictor_api=$(sed -nE 's/listening on (.*)/\1/p' "$work/predictor.out")
[ -n "$predictor_api" ] || { cat "$work/predictor.log"; exit 1; }
echo "predictor lookup API on $predictor_api"
$bin/clients/checkpoint_job --target="$target" --consumer=checkpoint \
  --dir="$work/chain" --every_ms=1000 --retry_s=60 >"$work/job.out" 2>"$work/job.log" &
job=$!

wait_batch "$STEPS_FIRST_RUN"
echo "-- at step $(batch): SIGTERM; the trainer finishes its step, checkpoints, drains its consumers --"
stop_trainer
grep -E "drain|checkpoint /" "$work/trainer.log" | tail -2 | sed 's/^trainer: /  /'
echo "-- restart from the checkpoint and snapshot, on $listen --"
start_trainer
grep -E "restored" "$work/trainer.log" | tail -2 | sed 's/^trainer: /  /'
wait_batch "$STEPS_TOTAL"
echo "-- at step $(batch): SIGTERM; final checkpoint, drain --"
stop_trainer
grep -E "drain" "$work/trainer.log" | tail -1 | sed 's/^trainer: /  /'
kill -TERM "$job" 2>/dev/null || true
wait "$job" 2>/dev/null || true
job=

echo "== checkpoint chain =="
$bin/clients/deltactl chain --dir="$work/chain" | sed 's/^/  /'
echo "== verification: replica and chain against the trainer's final checkpoint =="
verified=0
$bin/trainer/verify_model --checkpoint_dir="$work/run/checkpoints" \
  --predictors="$predictor_api" --chain="$work/chain" | tee "$work/verify.out" |
  sed 's/^/  /' || verified=$?

echo "== summary =="
grep -E "^trained" "$work/trainer.out" | sed 's/^/  trainer (second run): /'
grep -E "step [0-9]+ \|" "$work/trainer.log" | tail -1 | sed 's/^trainer: /  last progress: /'
grep -E "^predictor" "$work/verify.out" | sed 's/^/  /'
printf '  checkpoint chain: %s links, %s on disk; trainer checkpoints: %s\n' \
  "$(ls "$work/chain" | grep -c ckpt)" "$(du -sh "$work/chain" | cut -f1)" \
  "$(du -sh "$work/run/checkpoints" | cut -f1)"
if grep -q "^replica of predictor.*matches the trainer: yes" "$work/verify.out" &&
   grep -q "^checkpoint chain.*matches the trainer: yes" "$work/verify.out"; then
  echo "  replica matches trainer: yes; checkpoint chain matches trainer: yes"
else
  echo "  replica or chain DIFFERS from the trainer (see above)"
  exit 1
fi
kill -TERM "$predictor" 2>/dev/null || true
wait "$predictor" 2>/dev/null || true
predictor=
exit "$verified"
