#!/bin/bash
# Exactness, end to end, against a sharded trainer (issue 16): the trainer
# binary on 2 and 4 ranks (real processes, Gloo on loopback) with a plan that
# mixes row-wise, column-wise, data-parallel and table-wise tables, row-wise
# Adagrad tracking with acknowledged reads; a predictor (every 100 ms, apply
# log, RocksDB replica) and a checkpoint job follow it through one rank's
# address. At the end (SIGTERM: the ranks stop at one step, checkpoint and
# drain the consumers) verify_model finds the predictor's replica and the
# checkpoint chain equal to the trainer's final checkpoint, bit for bit:
#  1. 2 ranks, consumers on rank 0's address;
#  2. 4 ranks, consumers on rank 1's address;
#  3. 2 ranks, rank 1 SIGKILLed mid-run: the launcher exits non-zero, the
#     group is started again by hand on the same --checkpoint_dir and
#     --listen and resumes from the last checkpoint; the consumers carry on,
#     the predictor resyncing once exactly when it held batches the restart
#     lost; then the predictor is SIGKILLed and restarted on its replica
#     database, and carries on without a resync; then rank 1 is SIGKILLed
#     again and the launcher (--max_restarts=1) restarts the group itself.
# Every wait has a timeout; every child is killed on exit.
set -u
# A binary: Bazel's runfile, else (ctest, in the build directory) $1 or its
# base name (CMake writes the clients at the top).
runfile() {  # $1: path in the workspace
  local f
  for f in "${TEST_SRCDIR:-.}/${TEST_WORKSPACE:-deltastream}/$1" "$1" \
      "$(basename "$1")"; do
    [ -x "$f" ] && [ -f "$f" ] && { echo "$f"; return; }
  done
  echo "$1"
}
TRAINER=$(runfile trainer/trainer)
DELTACTL=$(runfile clients/deltactl)
PREDICTOR=$(runfile clients/predictor)
JOB=$(runfile clients/checkpoint_job)
VERIFY=$(runfile trainer/verify_model)
FREE_PORTS=$(runfile deploy/free_ports.py)
[ -f "$FREE_PORTS" ] || FREE_PORTS="$(dirname "$0")/../../../deploy/free_ports.py"
DIR="${TEST_TMPDIR:-$(mktemp -d)}"
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
test_start=$(date +%s)

launcher='' predictor='' job=''
cleanup() {
  for pid in $launcher $predictor $job; do
    kill -9 $(pgrep -P "$pid") "$pid" 2> /dev/null
  done
  wait 2> /dev/null
  # Outside Bazel: the logs stay only when something failed.
  [ -n "${TEST_TMPDIR:-}" ] || [ "$failures" -gt 0 ] || rm -rf "$DIR"
}
trap cleanup EXIT

cat > "$DIR/config.txt" << 'CONFIG'
model {
  kind: "dlrm"
  num_dense: 4
  dense_arch: [16, 8]
  over_arch: [16, 1]
  tables { name: "t0" num_embeddings: 2000 embedding_dim: 8 feature_names: ["f0", "f1"] }
  tables { name: "t1" num_embeddings: 1000 embedding_dim: 8 }
  tables { name: "t2" num_embeddings: 300 embedding_dim: 8 }
  tables { name: "t3" num_embeddings: 500 embedding_dim: 8 }
  sparse_optimizer { type: "rowwise_adagrad" learning_rate: 0.05 }
  dense_optimizer { type: "adagrad" learning_rate: 0.05 }
}
data { batch_size: 16 synthetic { zipf_exponent: 1.05 } eval_batches: 1 }
tracker {
  mode: "rowwise_adagrad"
  consumers: ["predictor", "checkpoint"]
  acknowledged_reads: true
  drain_seconds: 30
}
checkpoints { every_steps: 40 }
seed: 7
log_every_steps: 20
CONFIG

# The mixed plan on $1 ranks: t0 row-wise, t1 column-wise (the last rank's
# block first), t2 data-parallel, t3 table-wise on the last rank.
plan() {
  python3 - "$1" << 'PLAN'
import sys
n = int(sys.argv[1])
def table(name, kind, rows, dim, shards):
    print('tables { table: "%s" sharding_type: %s num_embeddings: %d embedding_dim: %d'
          % (name, kind, rows, dim))
    for rank, ro, r, co, c in shards:
        print('  shards { rank: %d row_offset: %d rows: %d col_offset: %d cols: %d }'
              % (rank, ro, r, co, c))
    print('}')
print('world_size: %d' % n)
block = -(-2000 // n)
table("t0", "ROW_WISE", 2000, 8,
      [(r, r * block, min(block, 2000 - r * block), 0, 8) for r in range(n)])
cols = 8 // n
table("t1", "COLUMN_WISE", 1000, 8,
      [((j - 1) % n, 0, 1000, j * cols, cols) for j in range(n)])
table("t2", "DATA_PARALLEL", 300, 8, [(r, 0, 300, 0, 8) for r in range(n)])
table("t3", "TABLE_WISE", 500, 8, [(n - 1, 0, 500, 0, 8)])
PLAN
}

# A base port P with P..P+$1-1 free: rank r serves on P + r, the same after a
# restart.
free_ports() { python3 "$FREE_PORTS" "$1"; }

# Waits up to $2 seconds for process $1 to exit; sets rc (124 on timeout,
# after killing it and its children).
wait_exit() {
  for _ in $(seq $(($2 * 10))); do
    if ! kill -0 "$1" 2> /dev/null; then
      wait "$1"; rc=$?; return
    fi
    sleep 0.1
  done
  kill -9 $(pgrep -P "$1") "$1" 2> /dev/null
  wait "$1" 2> /dev/null
  rc=124
}

# The ranks of case $1 that said they listen, over all its runs.
listening() { cat "$DIR/$1/trainer.out" 2> /dev/null | grep -c 'listening on'; }

# Starts the trainer of case $1 on $2 ranks (more flags: $3...); waits up to 120 s until every
# rank listens. Sets launcher.
start_trainer() {
  "$TRAINER" --config="$DIR/config.txt" --steps=-1 --nproc_per_node="$2" \
    --plan="$DIR/$1.plan" --listen="$listen" --checkpoint_dir="$DIR/$1/run" \
    --collective_timeout_s=5 "${@:3}" >> "$DIR/$1/trainer.out" \
    2>> "$DIR/$1/trainer.log" &
  launcher=$!
  local expected=$(( $(listening "$1") + $2 ))
  for _ in $(seq 1200); do
    [ "$(listening "$1")" -ge "$expected" ] && return 0
    kill -0 "$launcher" 2> /dev/null || break
    sleep 0.1
  done
  fail "$1: the trainer does not serve: $(tail -20 "$DIR/$1/trainer.log")"
  return 1
}

batch() {
  timeout 10 "$DELTACTL" --target="$target" status --json 2> /dev/null |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["current_batch"])' \
      2> /dev/null || echo -1
}
# Waits up to $2 seconds for the trainer to pass batch $1.
wait_batch() {
  for _ in $(seq $(($2 * 2))); do
    [ "$(batch)" -ge "$1" ] && return 0
    sleep 0.5
  done
  fail "$case: the trainer did not reach batch $1 in $2 s (at $(batch))"
  return 1
}

# Starts the predictor of case $1 (appending to its logs); waits up to 60 s
# for its lookup API. Sets predictor and predictor_api.
start_predictor() {
  "$PREDICTOR" --target="$target" --consumer=predictor --every_ms=100 \
    --replica_db="$DIR/$1/replica" --apply_log="$DIR/$1/predictor.applied" \
    > "$DIR/$1/predictor.out" 2>> "$DIR/$1/predictor.log" &
  predictor=$!
  for _ in $(seq 600); do
    grep -q listening "$DIR/$1/predictor.out" && break
    sleep 0.1
  done
  predictor_api=$(sed -nE 's/listening on (.*)/\1/p' "$DIR/$1/predictor.out")
  [ -n "$predictor_api" ] ||
    fail "$1: the predictor does not serve: $(cat "$DIR/$1/predictor.log")"
}

start_consumers() {  # $1: case
  start_predictor "$1"
  "$JOB" --target="$target" --consumer=checkpoint --dir="$DIR/$1/chain" \
    --every_ms=500 --retry_s=60 > "$DIR/$1/job.out" 2> "$DIR/$1/job.log" &
  job=$!
}

# SIGTERM to the launcher: every rank stops at one step, checkpoints and
# drains the consumers; then the job stops, and verify_model compares.
stop_and_verify() {  # $1: case
  before_stop=$(summary "$1")
  kill -TERM "$launcher"
  wait_exit "$launcher" 90
  launcher=
  [ "$rc" = 0 ] ||
    fail "$1: the trainer exited $rc: $(tail -20 "$DIR/$1/trainer.log")"
  grep -q 'drain' "$DIR/$1/trainer.log" ||
    fail "$1: no drain line in the trainer's log"
  kill -0 "$job" 2> /dev/null ||
    fail "$1: the checkpoint job ended early: $(tail -n 3 "$DIR/$1/job.log")"
  kill -TERM "$job"
  wait_exit "$job" 30
  job=
  timeout 120 "$VERIFY" --checkpoint_dir="$DIR/$1/run/checkpoints" \
    --predictors="$predictor_api" --chain="$DIR/$1/chain" \
    > "$DIR/$1/verify.out" 2>&1
  grep -q '^replica of predictor.*matches the trainer: yes' \
    "$DIR/$1/verify.out" ||
    fail "$1: the replica differs: $(cat "$DIR/$1/verify.out")"
  grep -q '^checkpoint chain.*matches the trainer: yes' \
    "$DIR/$1/verify.out" ||
    fail "$1: the chain differs: $(cat "$DIR/$1/verify.out")"
  kill -TERM "$predictor"
  wait_exit "$predictor" 30
  predictor=
  echo "$1: $(grep -c . "$DIR/$1/predictor.applied") applies; freshness" \
    "before the stop: ${before_stop:-no summary yet}, at the end:" \
    "$(summary "$1")"
  sed 's/^/  /' "$DIR/$1/verify.out"
}

# The predictor's last freshness figures (it logs them every 5 s).
summary() {
  grep -oE 'freshness p50 [0-9]+ ms p99 [0-9]+ ms \([0-9]+ samples\)' \
    "$DIR/$1/predictor.log" | tail -1
}
# Resyncs of the predictor of case $1 (one full read each).
resyncs() { grep -c 'resync: full read' "$DIR/$1/predictor.log"; }

# Cases 1 and 2: a clean run followed to its end.
run_clean() {  # $1: case, $2: ranks, $3: the rank the consumers are given
  case=$1
  mkdir -p "$DIR/$1"
  plan "$2" > "$DIR/$1.plan"
  listen=127.0.0.1:$(free_ports "$2")
  target=127.0.0.1:$(( ${listen##*:} + $3 ))
  start_trainer "$1" "$2" || return
  start_consumers "$1"
  wait_batch 150 120 || return
  stop_and_verify "$1"
  [ "$(resyncs "$1")" = 0 ] ||
    fail "$1: the predictor resynced: $(grep resync "$DIR/$1/predictor.log")"
}

run_clean two_ranks 2 0
run_clean four_ranks 4 1

# The run id of the predictor's last applied version (case $case).
last_run() { awk '{ run = $6 } END { print run }' "$DIR/$case/predictor.applied"; }
# The newest version the predictor applied of run $1.
held_of_run() {
  awk -v run="$1" '$6 == run { v = $2 } END { print v + 0 }' \
    "$DIR/$case/predictor.applied"
}
# The smallest N of the "restored $1 N" lines of the trainer's last start
# (every rank logs one); empty without one.
restored_at() {
  awk '/started [0-9]+ ranks/ { n = 0 } { line[n++] = $0 }
       END { for (i = 0; i < n; i++) print line[i] }' \
    "$DIR/$case/trainer.log" | grep -oE "restored $1 [0-9]+" |
    grep -oE '[0-9]+$' | sort -n | head -1
}
# SIGKILLs the highest rank of the group; sets killed_run (the run the
# predictor held when it died).
kill_rank() {
  killed_run=$(last_run)
  kill -9 "$(pgrep -P "$launcher" | sort -n | tail -1)"
}
# After the group of case $case restarted from a dead rank: whether the
# predictor resynced ($1: resyncs since the death) exactly when the restart
# lost batches it held (it held $2). Sets restored.
check_resyncs() {
  restored=$(restored_at 'checkpoint .*\(step')
  local tracker_at
  tracker_at=$(restored_at 'tracker snapshot .*\(batch')
  echo "$case: group restored at step ${restored:-?} (tracker batch" \
    "${tracker_at:-?}); the predictor held batch $2; $1 resyncs"
  # What the ranks' cursor agreement changed (nothing when the snapshots
  # agreed already).
  grep -o 'cursors agreed.*' "$DIR/$case/trainer.log" | sed "s/^/$case: /"
  if [ -z "$restored" ] || [ -z "$tracker_at" ]; then
    fail "$case: no 'restored' lines: $(grep -i restor "$DIR/$case/trainer.log")"
  elif [ "$tracker_at" != "$restored" ]; then
    # A rank died between writing its checkpoint and its tracker snapshot:
    # the tracker lacks batches tracker_at..restored and tells every
    # consumer to resync (the run starts at tracker_at).
    [ "$1" = 1 ] ||
      fail "$case: the tracker restored batch $tracker_at, the model step" \
        "$restored: expected one resync, saw $1"
  elif [ "$2" -gt "$restored" ]; then
    [ "$1" = 1 ] ||
      fail "$case: the restart lost batches the predictor held" \
        "($2 > $restored): expected one resync, saw $1"
  elif [ "$2" -ge $((restored - 1)) ]; then
    # The predictor held every batch before the restored step. A commit
    # that reached one rank before its tracker snapshot and another after
    # no longer costs a resync (the ranks agree on the cursors before they
    # serve: trainer/cursor_agreement.h), nor does a killed rank whose
    # tracker snapshot is older than its checkpoint (the steps it did not
    # record are steps the predictor held).
    [ "$1" = 0 ] ||
      fail "$case: the restart lost no batch the predictor held" \
        "($2 < $restored): expected no resync, saw $1"
  else
    # The predictor lacks steps $2+1..restored-1: it resyncs only if the
    # killed rank's tracker did not record them (its snapshot older than
    # its checkpoint; rank 0 does not log the other ranks' restores).
    [ "$1" -le 1 ] ||
      fail "$case: expected at most one resync, saw $1"
  fi
}

# When the restart restored step $2 behind batch $1 the predictor held,
# waits up to 30 s for its resync (more than $3 resyncs): it comes with the
# predictor's reconnect, which may follow the trainer's progress.
await_resync() {
  [ "$1" -gt "${2:-0}" ] || return 0
  for _ in $(seq 300); do
    [ "$(resyncs "$case")" -gt "$3" ] && return 0
    sleep 0.1
  done
}

# Case 3: a dead rank and the group restarted by hand, the predictor
# restarted, a dead rank again and the group restarted by the launcher
# (--max_restarts=1).
case=restarts
mkdir -p "$DIR/$case"
plan 2 > "$DIR/$case.plan"
listen=127.0.0.1:$(free_ports 2)
target=$listen
run_case3() {
  start_trainer "$case" 2 || return
  start_consumers "$case"
  wait_batch 100 120 || return
  kill_rank
  wait_exit "$launcher" 60
  launcher=''
  [ "$rc" != 0 ] && [ "$rc" != 124 ] ||
    fail "$case: after a SIGKILLed rank the launcher exited $rc"
  local held
  held=$(held_of_run "$killed_run")
  start_trainer "$case" 2 --max_restarts=1 || return
  wait_batch $(( $(restored_at 'checkpoint .*\(step') + 60 )) 120 || return
  await_resync "$held" "$(restored_at 'checkpoint .*\(step')" 0
  check_resyncs "$(resyncs "$case")" "$held"
  local step=$restored

  # The predictor dies; started again on its replica database it carries
  # on from its version, without a resync. Not before its resync is
  # committed (a resync the trainer never saw committed is asked for again,
  # rightly): the read after a commit applies a version more, so two more
  # applies are the sign.
  local applies
  applies=$(wc -l < "$DIR/$case/predictor.applied")
  for _ in $(seq 300); do
    [ "$(wc -l < "$DIR/$case/predictor.applied")" -ge $((applies + 2)) ] &&
      break
    sleep 0.1
  done
  kill -9 "$predictor"
  wait_exit "$predictor" 10
  local before
  before=$(resyncs "$case")
  start_predictor "$case"
  wait_batch $(( step + 120 )) 120 || return
  [ "$(resyncs "$case")" = "$before" ] ||
    fail "$case: the restarted predictor resynced"
  [ "$(grep -c 'bootstrap:' "$DIR/$case/predictor.log")" = 1 ] &&
    grep -q 'resumes at version' "$DIR/$case/predictor.log" ||
    fail "$case: the restarted predictor did not resume from its replica" \
      "database: $(grep -E 'bootstrap|resumes' "$DIR/$case/predictor.log")"

  # A rank dies again: the launcher starts the group again itself.
  kill_rank
  for _ in $(seq 600); do
    grep -q 'attempt 1' "$DIR/$case/trainer.log" && break
    sleep 0.1
  done
  grep -q 'attempt 1' "$DIR/$case/trainer.log" ||
    { fail "$case: the launcher did not restart the group"; return; }
  # The new attempt's ranks restore (their lines follow 'attempt 1'), train
  # on, and the predictor follows them (a resync takes it a reconnect).
  local again=''
  for _ in $(seq 600); do
    again=$(restored_at 'checkpoint .*\(step')
    [ -n "$again" ] && break
    sleep 0.1
  done
  wait_batch $(( ${again:-$step} + 60 )) 120 || return
  held=$(held_of_run "$killed_run")
  await_resync "$held" "$again" "$before"
  check_resyncs $(( $(resyncs "$case") - before )) "$held"
  stop_and_verify "$case"
  echo "$case: the predictor's resyncs:"
  grep 'resync: the' "$DIR/$case/predictor.log" | sed 's/.*resync: /  /'
}
run_case3

echo "test took $(( $(date +%s) - test_start )) s"
if [ "$failures" -gt 0 ]; then
  echo "$failures failed"
  exit 1
fi
echo "all passed"
