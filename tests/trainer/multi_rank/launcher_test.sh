#!/bin/bash
# The trainer binary's --nproc_per_node (real processes, Gloo on loopback):
#  1. two ranks of batch 32 print the progress figures (global loss and
#     held-out AUC) of one process of batch 64, step for step, each rank
#     bound to cores of its own (--bind_cores), with one intra-op thread
#     per core of its own;
#  2. a SIGKILLed rank stops the other within the collective timeout, and
#     the launcher exits 1 naming the rank; the other, which failed only
#     because of it, exits --peer_failure_exit_code;
#  3. SIGTERM to the launcher stops both ranks at the same step, cleanly,
#     and so does one SIGINT to the launcher's whole process group (a
#     terminal's Ctrl-C): the ranks run in a group of their own, so that
#     they see the launcher's forwarded signal only (two would stop a rank
#     at once, without its final checkpoint); with --stopped_exit_code=3,
#     SIGTERM to one rank alone (a Kubernetes pod's eviction) stops both,
#     and both and the launcher exit 3, while a run that reaches its step
#     budget exits 0;
#  4. `deltactl topology` against either rank lists both ranks and every
#     table's shard, and `deltactl get` through one rank reads every rank's
#     tables, merged; each rank serves its metrics on --metrics_listen's
#     port plus its local rank;
#  5. a port a rank would serve on, already taken, is refused by the
#     launcher before any rank starts (exit 2, naming the local rank), and
#     so is one named GPU for every rank;
#  6. a rank that cannot start (its checkpoint file damaged) stops the group
#     at once, named with its reason, without waiting out a timeout or the
#     grace period;
#  7. ranks launched with different WORLD_SIZEs, or different configs, are
#     refused (exit 2), naming the difference.
set -u
TRAINER="${TEST_SRCDIR:-.}/${TEST_WORKSPACE:-deltastream}/trainer/trainer"
[ -x "$TRAINER" ] || TRAINER=trainer/trainer
DELTACTL="${TEST_SRCDIR:-.}/${TEST_WORKSPACE:-deltastream}/clients/deltactl"
[ -x "$DELTACTL" ] || DELTACTL=clients/deltactl
DIR="${TEST_TMPDIR:-$(mktemp -d)}"
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

config() {  # $1: batch size, $2: steps
  cat <<CONFIG
model { tables { name: "t0" num_embeddings: 500 embedding_dim: 16 }
        tables { name: "t1" num_embeddings: 300 embedding_dim: 16 }
        tables { name: "t2" num_embeddings: 200 embedding_dim: 16 } }
data { batch_size: $1 eval_batches: 2 }
tracker { mode: "off" }
steps: $2
log_every_steps: 5
CONFIG
}

# 1. The same figures.
config 64 10 > "$DIR/one.txt"
config 32 10 > "$DIR/two.txt"
"$TRAINER" --config="$DIR/one.txt" > "$DIR/one.out" 2> "$DIR/one.err" ||
  fail "one process exited $?: $(cat "$DIR/one.err")"
# (--stopped_exit_code: a run that reaches its budget is done, exit 0.)
timeout 120 "$TRAINER" --config="$DIR/two.txt" --nproc_per_node=2 \
  --bind_cores --stopped_exit_code=3 > "$DIR/two.out" 2> "$DIR/two.err" ||
  fail "two ranks exited $?: $(cat "$DIR/two.err")"
for rank in 0 1; do
  bound=$(grep -oE "local rank $rank of 2 bound to cores [0-9,]+, [0-9]+ intra-op" \
    "$DIR/two.err")
  if [ -z "$bound" ]; then
    fail "rank $rank did not say which cores it is bound to: $(cat "$DIR/two.err")"
    continue
  fi
  # One intra-op thread per core of its own (the launcher set none).
  cores=$(echo "$bound" | sed -E 's/.*cores ([0-9,]+),.*/\1/' | tr ',' '\n' | wc -l)
  threads=$(echo "$bound" | sed -E 's/.*, ([0-9]+) intra-op/\1/')
  [ "$cores" = "$threads" ] ||
    fail "rank $rank: $threads intra-op thread(s) on $cores core(s): $bound"
done
! grep -q "setting OMP_NUM_THREADS" "$DIR/two.err" ||
  fail "the launcher set the threads of ranks that bind: $(cat "$DIR/two.err")"
figures() { grep -oE 'step [0-9]+ \|.*' "$1" | sed -E 's/[0-9]+ ex\/s/_ ex\/s/'; }
if [ "$(figures "$DIR/one.err")" != "$(figures "$DIR/two.err")" ] ||
   [ -z "$(figures "$DIR/one.err")" ]; then
  fail "progress differs:"; diff <(figures "$DIR/one.err") <(figures "$DIR/two.err")
fi
final() { grep -oE 'final loss .*' "$1"; }
[ "$(final "$DIR/one.out")" = "$(final "$DIR/two.out")" ] ||
  fail "final line differs: '$(final "$DIR/one.out")' vs '$(final "$DIR/two.out")'"
[ "$(grep -c '^trained' "$DIR/two.out")" = 1 ] ||
  fail "expected one summary line (rank 0's): $(cat "$DIR/two.out")"

# Starts two ranks training until stopped (the launcher under the command
# words after $1, if any); waits for step 5.
start_endless() {
  local name=$1
  shift
  config 32 -1 > "$DIR/endless.txt"
  "$@" "$TRAINER" --config="$DIR/endless.txt" --nproc_per_node=2 \
    --collective_timeout_s=2 ${ENDLESS_FLAGS:-} > "$DIR/$name.out" \
    2> "$DIR/$name.err" &
  launcher=$!
  for _ in $(seq 600); do
    grep -q 'step 5 ' "$DIR/$name.err" && return 0
    sleep 0.1
  done
  fail "$name: no progress: $(cat "$DIR/$name.err")"
  return 1
}

# Waits up to $1 seconds for the launcher; sets rc (124 on timeout).
wait_launcher() {
  for _ in $(seq $(($1 * 10))); do
    if ! kill -0 "$launcher" 2> /dev/null; then
      wait "$launcher"; rc=$?; return
    fi
    sleep 0.1
  done
  kill -9 "$launcher" $(pgrep -P "$launcher") 2> /dev/null
  rc=124
}

# 2. A dead rank.
if ENDLESS_FLAGS=--peer_failure_exit_code=4 start_endless dead; then
  rank1=$(pgrep -P "$launcher" | sort -n | tail -1)
  start=$(date +%s)
  kill -9 "$rank1"
  wait_launcher 30
  elapsed=$(( $(date +%s) - start ))
  [ "$rc" = 1 ] || fail "dead rank: launcher exited $rc: $(cat "$DIR/dead.err")"
  grep -q 'rank 1 was killed by signal 9' "$DIR/dead.err" ||
    fail "dead rank: not named: $(cat "$DIR/dead.err")"
  grep -q 'rank 0: .*rank 1' "$DIR/dead.err" ||
    fail "dead rank: rank 0's error does not name rank 1: $(cat "$DIR/dead.err")"
  grep -q "rank 0 exited with code 4 (another rank's failure)" "$DIR/dead.err" ||
    fail "dead rank: rank 0 did not exit 4: $(cat "$DIR/dead.err")"
  echo "a SIGKILLed rank stopped the group in ${elapsed} s"
fi

# 3. SIGTERM.
if start_endless term; then
  kill -TERM "$launcher"
  wait_launcher 30
  [ "$rc" = 0 ] || fail "SIGTERM: launcher exited $rc: $(cat "$DIR/term.err")"
  grep -q 'stop requested at step' "$DIR/term.err" ||
    fail "SIGTERM: no stop line: $(cat "$DIR/term.err")"
  grep -q '^trained' "$DIR/term.out" || fail "SIGTERM: no summary"
fi
# The launcher leads a process group of its own (setsid), as a shell's job.
if start_endless ctrl_c setsid; then
  kill -INT -- "-$launcher"
  wait_launcher 30
  [ "$rc" = 0 ] || fail "Ctrl-C: launcher exited $rc: $(cat "$DIR/ctrl_c.err")"
  grep -q 'stop requested at step' "$DIR/ctrl_c.err" ||
    fail "Ctrl-C: no stop line: $(cat "$DIR/ctrl_c.err")"
fi
# One rank's SIGTERM (its pod evicted) stops the group at an agreed step;
# with a stopped code every rank and the launcher exit with it.
if ENDLESS_FLAGS=--stopped_exit_code=3 start_endless evicted; then
  kill -TERM "$(pgrep -P "$launcher" | sort -n | tail -1)"
  wait_launcher 30
  [ "$rc" = 3 ] || fail "evicted: launcher exited $rc: $(cat "$DIR/evicted.err")"
  # Rank 0 logs the stop that rank 1's signal asked for.
  grep -q 'stop requested at step' "$DIR/evicted.err" ||
    fail "evicted: rank 0 did not stop: $(cat "$DIR/evicted.err")"
  grep -q 'rank .* exited' "$DIR/evicted.err" &&
    fail "evicted: a stopped rank counted as failed: $(cat "$DIR/evicted.err")"
fi

# 4. The topology, from either rank; each rank's metrics on its own port
# (--metrics_listen's plus its local rank).
config 32 -1 | sed 's/mode: "off"/mode: "id_only"/' > "$DIR/served.txt"
metrics_port=$(python3 -c '
import socket
for _ in range(100):
    a, b = socket.socket(), socket.socket()
    a.bind(("127.0.0.1", 0))
    try:
        b.bind(("127.0.0.1", a.getsockname()[1] + 1))
    except OSError:
        continue
    print(a.getsockname()[1])
    break')
"$TRAINER" --config="$DIR/served.txt" --nproc_per_node=2 \
  --listen=127.0.0.1:0 --metrics_listen="127.0.0.1:$metrics_port" \
  > "$DIR/served.out" 2> "$DIR/served.err" &
launcher=$!
for _ in $(seq 600); do
  [ "$(grep -c 'listening on' "$DIR/served.out")" = 2 ] && break
  sleep 0.1
done
[ "$(grep -c 'listening on' "$DIR/served.out")" = 2 ] ||
  fail "expected two ranks listening: $(cat "$DIR/served.out" "$DIR/served.err")"
checked=0
for address in $(grep -o 'listening on .*' "$DIR/served.out" | cut -d' ' -f3); do
  checked=$((checked + 1))
  "$DELTACTL" topology --target="$address" -o json > "$DIR/topology.json" ||
    fail "topology from $address: $(cat "$DIR/topology.json")"
  python3 - "$DIR/topology.json" <<'CHECK' || fail "topology from $address: $(cat "$DIR/topology.json")"
import json, sys
t = json.load(open(sys.argv[1]))
assert t["world_size"] == 2, t
assert sorted(e["rank"] for e in t["endpoints"]) == [0, 1], t
# Three tables, table-wise round robin: t0 and t2 on rank 0, t1 on rank 1.
ranks = {s["fqn"].rsplit(".", 1)[1]: s["rank"] for s in t["shards"]}
assert ranks == {"t0": 0, "t1": 1, "t2": 0}, ranks
CHECK
done
[ "$checked" = 2 ] || fail "asked $checked ranks for their topology"
# A read through one rank's address holds every rank's tables, merged.
"$DELTACTL" get --consumer=default --target="$address" -o json \
  > "$DIR/merged.json" || fail "get: $(cat "$DIR/merged.json")"
python3 - "$DIR/merged.json" <<'CHECK' || fail "merged get: $(head -c 2000 "$DIR/merged.json")"
import json, sys
d = json.load(open(sys.argv[1]))
tables = {fqn.rsplit(".", 1)[1]: t for fqn, t in d["tables"].items()}
assert sorted(tables) == ["t0", "t1", "t2"], sorted(tables)
for name, t in tables.items():
    ids = t["ids"]
    assert ids and ids == sorted(set(ids)), name
CHECK
# Each rank counts its own examples (32 a step; Prometheus sums the ranks').
for port in "$metrics_port" $((metrics_port + 1)); do
  python3 -c '
import re, sys, time, urllib.request
def value(body, name):
    return float(re.search("^" + name + r"(?:\{[^}]*\})? (\S+)$", body, re.M).group(1))
for _ in range(300):
    body = urllib.request.urlopen(sys.argv[1], timeout=10).read().decode()
    steps = value(body, "deltastream_trainer_steps_total")
    if steps >= 3:
        break
    time.sleep(0.1)
examples = value(body, "deltastream_trainer_examples_total")
assert steps >= 3 and abs(examples - 32 * steps) <= 32, (steps, examples)' \
    "http://127.0.0.1:$port/metrics" ||
    fail "trainer metrics on port $port: $(cat "$DIR/served.err")"
done
kill -TERM "$launcher"
wait_launcher 30
[ "$rc" = 0 ] || fail "served run exited $rc: $(cat "$DIR/served.err")"

# 5. Rank 1's port (PORT + 1) is taken.
python3 - "$DIR/port" <<'HOLD' &
import socket, sys, time
for _ in range(100):
    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    port = held.getsockname()[1]
    taken = socket.socket()
    try:
        taken.bind(("127.0.0.1", port - 1))  # free: rank 0's
    except OSError:
        continue
    taken.close()
    held.listen()
    open(sys.argv[1], "w").write(str(port - 1))
    time.sleep(120)
    break
HOLD
holder=$!
for _ in $(seq 100); do [ -s "$DIR/port" ] && break; sleep 0.1; done
port=$(cat "$DIR/port")
"$TRAINER" --config="$DIR/served.txt" --nproc_per_node=2 \
  --listen="127.0.0.1:$port" > "$DIR/taken.out" 2> "$DIR/taken.err" &
launcher=$!
wait_launcher 30
kill "$holder" 2> /dev/null
[ "$rc" = 2 ] || fail "taken port: launcher exited $rc: $(cat "$DIR/taken.err")"
grep -q "local rank 1's service: cannot listen on 127.0.0.1:$((port + 1)): address in use" \
  "$DIR/taken.err" || fail "taken port: not named: $(cat "$DIR/taken.err")"
! grep -q 'started 2 ranks' "$DIR/taken.err" ||
  fail "taken port: ranks were started: $(cat "$DIR/taken.err")"

# 5b. One named GPU for two ranks is refused before any rank starts (NCCL
# would refuse two ranks on one GPU); "cuda" gives each rank its own.
"$TRAINER" --config="$DIR/two.txt" --nproc_per_node=2 --device=cuda:1 \
  > "$DIR/gpu.out" 2> "$DIR/gpu.err"
rc=$?
[ "$rc" = 2 ] || fail "one GPU for two ranks: exited $rc: $(cat "$DIR/gpu.err")"
grep -q 'device cuda:1 for each of 2 ranks: NCCL needs a GPU per rank' \
  "$DIR/gpu.err" || fail "one GPU for two ranks: not said: $(cat "$DIR/gpu.err")"

# 6. Rank 1's checkpoint file is damaged (one byte flipped: its size, which
# the manifest lists, is unchanged, so only reading it finds the fault).
config 32 4 > "$DIR/saved.txt"
"$TRAINER" --config="$DIR/saved.txt" --nproc_per_node=2 \
  --checkpoint_dir="$DIR/ckpt" > "$DIR/saved.out" 2> "$DIR/saved.err" ||
  fail "checkpointed run exited $?: $(cat "$DIR/saved.err")"
python3 - "$DIR"/ckpt/checkpoints/checkpoint-*4/rank-00001-of-00002.pt <<'FLIP'
import sys
data = bytearray(open(sys.argv[1], "rb").read())
data[len(data) // 2] ^= 0xFF
open(sys.argv[1], "wb").write(data)
FLIP
start=$(date +%s)
"$TRAINER" --config="$DIR/saved.txt" --nproc_per_node=2 --steps=8 \
  --checkpoint_dir="$DIR/ckpt" --collective_timeout_s=60 \
  > "$DIR/damaged.out" 2> "$DIR/damaged.err" &
launcher=$!
wait_launcher 60
elapsed=$(( $(date +%s) - start ))
[ "$rc" = 2 ] || fail "damaged checkpoint: launcher exited $rc: $(cat "$DIR/damaged.err")"
grep -q 'rank 1 exited with code 2' "$DIR/damaged.err" ||
  fail "damaged checkpoint: rank 1's failure not named: $(cat "$DIR/damaged.err")"
grep -q "rank 1: .*rank-00001-of-00002.pt' is a damaged archive" "$DIR/damaged.err" ||
  fail "damaged checkpoint: no reason: $(cat "$DIR/damaged.err")"
! grep -q 'did not report' "$DIR/damaged.err" ||
  fail "damaged checkpoint: rank 1 taken for dead or hung: $(cat "$DIR/damaged.err")"
[ "$elapsed" -lt 20 ] ||
  fail "damaged checkpoint: the group took ${elapsed} s to stop"
echo "a rank that could not start stopped the group in ${elapsed} s"

# 7. Ranks started by hand (as torchrun's environment) that cannot run
# together are refused, each with exit 2 (a restart would be refused
# again), naming the fault: different WORLD_SIZEs, or different configs.
# by_hand NAME CONFIG0 CONFIG1 WORLD_SIZE1 SAYS
by_hand() {
  local name=$1 says=$5 port rank rc
  local configs=("$2" "$3") sizes=(2 "$4")
  port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  for rank in 0 1; do
    RANK=$rank LOCAL_RANK=$rank WORLD_SIZE=${sizes[$rank]} LOCAL_WORLD_SIZE=2 \
      MASTER_ADDR=127.0.0.1 MASTER_PORT=$port timeout 60 "$TRAINER" \
      --config="${configs[$rank]}" > "$DIR/$name-$rank.out" \
      2> "$DIR/$name-$rank.err" &
    pids[$rank]=$!
  done
  for rank in 0 1; do
    wait "${pids[$rank]}"
    rc=$?
    [ "$rc" = 2 ] ||
      fail "$name: rank $rank exited $rc: $(cat "$DIR/$name-$rank.err")"
    grep -qF "$says" "$DIR/$name-$rank.err" ||
      fail "$name: rank $rank: not said: $(cat "$DIR/$name-$rank.err")"
  done
}
by_hand sizes "$DIR/two.txt" "$DIR/two.txt" 3 \
  'every rank must be given the same WORLD_SIZE'
sed 's/log_every_steps: 5/log_every_steps: 7/' "$DIR/two.txt" > "$DIR/other.txt"
by_hand configs "$DIR/two.txt" "$DIR/other.txt" 2 \
  "rank 0 has 'log_every_steps: 5', rank 1 'log_every_steps: 7'"

if [ "$failures" -gt 0 ]; then
  echo "$failures failed"
  exit 1
fi
echo "all passed"
