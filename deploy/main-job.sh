#!/usr/bin/env bash
# The README's main job: installs what is missing, builds, then runs the store
# benchmark on DESIGN.md's workload (8 tables x 100 batches x 4096 Zipf(1.05)
# IDs over 1M rows, dim 64) in every update mode, a short tracker demo, and the
# standalone server driven by deltactl on loopback, killed and restarted from
# its RocksDB snapshot.
# Later issues turn this into the end-to-end trainer run.
set -euo pipefail
cd "$(dirname "$0")/.."

bash deploy/install-deps.sh
echo "== building (bazel, opt) =="
log=$(mktemp)
if ! bazel build -c opt //tests/bench:store_bench //tracker_service:tracker_demo \
    //tracker_service:tracker_server //clients:deltactl >"$log" 2>&1; then
  grep -v linux-sandbox "$log" | tail -30
  exit 1
fi
rm -f "$log"

echo "== store benchmark: DESIGN.md workload, median of 3 runs =="
printf '%-6s %10s %14s %12s %12s\n' mode total_s "IDs/s" unique_rows copy_ratio
for mode in none first last; do
  ./bazel-bin/tests/bench/store_bench --mode="$mode" --json |
    sed -E 's/.*"mode":"([a-z]+)","total_s":([0-9.]+),"ids_per_s":([0-9]+),"unique_rows":([0-9]+),"copy_ratio":([0-9.]+).*/\1 \2 \3 \4 \5/' |
    awk '{printf "%-6s %10.3f %14d %12d %12.2f\n", $1, $2, $3, $4, $5}'
done
echo "(TorchRec's Python DeltaStore on this workload: ~11 s ID_ONLY, ~115 s EMBEDDING)"

echo "== tracker demo =="
./bazel-bin/tracker_service/tracker_demo

echo "== tracker_server + deltactl on loopback, snapshots in RocksDB =="
work=$(mktemp -d)
server=
trap 'kill $server 2>/dev/null && wait $server 2>/dev/null; rm -rf "$work"' EXIT
start_server() {
  : >"$work/out"
  ./bazel-bin/tracker_service/tracker_server --listen=127.0.0.1:0 \
    --mode=embedding --consumers=predictor,checkpoint --db="$work/db" \
    >"$work/out" &
  server=$!
  for _ in $(seq 100); do grep -q listening "$work/out" && break; sleep 0.1; done
  target=$(sed -nE 's/listening on (.*)/\1/p' "$work/out")
}
ctl() { ./bazel-bin/clients/deltactl --target="$target" "$@"; }
start_server
echo '{"tables": {"sparse.items": {"ids": [3, 1, 3], "states": [[0.1, 0.2], [0.3, 0.4], [0.5, 0.6]]}}}' |
  ctl push --json_file=-
ctl step
ctl get --consumer=predictor --json
ctl snapshot
echo "-- kill -9 the server, restart it on the same --db --"
kill -9 "$server"
wait "$server" 2>/dev/null || true
start_server
ctl status
echo "-- the checkpoint consumer had not read: its rows survived --"
ctl get --consumer=checkpoint --json
