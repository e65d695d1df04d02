#!/usr/bin/env bash
# The README's main job: installs what is missing, builds, then runs the
# trainer on its embedded defaults (DLRM, 8 tables of 100000 x 16, synthetic
# Zipf data, CPU) with the tracker service in-process, pulls deltas with
# deltactl while it trains, stops it with SIGTERM (final snapshot and
# checkpoint), restarts it from them, runs the checkpoint job for a few
# incremental checkpoints, and prints a summary. Also the store
# benchmark on DESIGN.md's workload. A few minutes on 2 cores after the build.
set -euo pipefail
cd "$(dirname "$0")/.."

bash deploy/install-deps.sh
echo "== building (bazel, opt) =="
log=$(mktemp)
if ! bazel build -c opt //tests/bench:store_bench //trainer:trainer \
    //clients:deltactl //clients:checkpoint_job >"$log" 2>&1; then
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
echo "(TorchRec's Python DeltaStore on this workload: ~11 s ID_ONLY, ~115 s EMBEDDING)"

work=$(mktemp -d)
trainer=
trap 'kill $trainer 2>/dev/null && wait $trainer 2>/dev/null; rm -rf "$work"' EXIT
start_trainer() {
  : >"$work/out"
  $bin/trainer/trainer --listen=127.0.0.1:0 --steps=-1 \
    --mode=rowwise_adagrad --consumers=predictor,checkpoint \
    --checkpoint_dir="$work/run" >"$work/out" 2>>"$work/log" &
  trainer=$!
  for _ in $(seq 300); do grep -q listening "$work/out" && break; sleep 0.1; done
  target=$(sed -nE 's/listening on (.*)/\1/p' "$work/out")
  [ -n "$target" ] || { cat "$work/log"; exit 1; }
}
ctl() { $bin/clients/deltactl --target="$target" "$@"; }
batch() { ctl status --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["current_batch"])'; }
wait_batch() { while [ "$(batch)" -lt "$1" ]; do sleep 0.5; done; }
summarize() {  # a GetDelta's JSON on stdin
  python3 -c '
import json, sys
d = json.load(sys.stdin)
tables = d["tables"].values()
rows = sum(len(t["ids"]) for t in tables)
mib = sum(len(t["ids"]) * len(t["values"][0]) * 4 for t in tables if t["ids"]) / 2**20
print("  consumer %s read through batch %d: %d tables, %d changed rows, %.1f MiB of current values"
      % (d["consumer"], d["batch"], len(d["tables"]), rows, mib))'
}

echo "== trainer (embedded defaults, rowwise Adagrad tracking) with deltactl reading while it trains =="
start_trainer
wait_batch 300
echo "-- at step $(batch): the predictor pulls its first delta --"
ctl get --consumer=predictor --json | summarize
wait_batch 600
echo "-- at step $(batch): the predictor pulls again (only rows changed since) --"
ctl get --consumer=predictor --json | summarize
ctl status
echo "-- SIGTERM: the trainer finishes its step, snapshots and checkpoints --"
kill -TERM "$trainer"
wait "$trainer"
grep -E "step [0-9]+ \||checkpoint" "$work/log" | tail -4
cat "$work/out" | grep trained
echo "-- restart from the checkpoint and snapshot; train 100 more steps --"
start_trainer
grep -E "restored" "$work/log" | sed 's/^trainer: /  /'
resumed=$(batch)
wait_batch $((resumed + 100))
echo "-- the checkpoint job: the checkpoint consumer never read, so its first link covers the whole run --"
$bin/clients/checkpoint_job --target="$target" --consumer=checkpoint \
  --dir="$work/chain" --every_ms=300 --count=3 2>/dev/null | sed 's/^/  /'
ctl chain --dir="$work/chain"
kill -TERM "$trainer"
wait "$trainer"
trainer=
echo "== summary =="
grep -E "restored|step [0-9]+ \|" "$work/log" | tail -3
grep trained "$work/out"
du -sh "$work/run/checkpoints" "$work/run/db" "$work/chain" | sed 's/^/  /'
