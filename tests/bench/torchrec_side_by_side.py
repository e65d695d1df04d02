#!/usr/bin/env python3
"""TorchRec's DeltaStore and store_bench on the same IDs, side by side.

Draws the workload's IDs once (store_bench --write_ids: tests/bench/zipf.h's
bounded Zipf), runs TorchRec's Python DeltaStore on them as TorchRec's tracker
drives it (one lookup per table per batch, compaction of [-1, b) after every
step, then compaction and get_delta for one consumer at the end), and
store_bench --ids_file on the same file, alternated round by round (a shared
machine's speed drifts between runs far more than between neighbours): each
round is one TorchRec run and one store_bench of --repeat runs. It prints
the medians of both times, the median of the rounds' ratios and their range,
where the store's time goes, and store_bench's floor (a bitmap pass over
every ID plus a copy of the unique rows): TorchRec's time over the floor
bounds the ratio any store can reach.

Nothing of TorchRec ships with this repository: point --torchrec_dir (or
TORCHREC_MODEL_TRACKER) at a directory holding TorchRec's
torchrec/distributed/model_tracker/{delta_store.py,types.py}. They are loaded
as they are; the one other TorchRec module they import
(torchrec.distributed.utils.none_throws) is provided here. Needs Debian's
python3-torch (apt-get install python3-torch). Both sides run on one thread.

  bazel build -c opt //tests/bench:store_bench
  /usr/bin/python3 tests/bench/torchrec_side_by_side.py \\
      --torchrec_dir=/path/to/model_tracker --mode=first [--batches=30] \\
      [--clock=cpu]
"""

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import types


def load_torchrec(directory):
    """Imports delta_store.py and types.py from `directory` as TorchRec's."""
    for name in ("delta_store.py", "types.py"):
        if not os.path.isfile(os.path.join(directory, name)):
            sys.exit(f"torchrec_side_by_side: no {name} in {directory}")
    for package in ("torchrec", "torchrec.distributed",
                    "torchrec.distributed.model_tracker"):
        module = types.ModuleType(package)
        module.__path__ = []
        sys.modules[package] = module

    def none_throws(value, message="Unexpected None"):
        if value is None:
            raise AssertionError(message)
        return value

    utils = types.ModuleType("torchrec.distributed.utils")
    utils.none_throws = none_throws
    sys.modules["torchrec.distributed.utils"] = utils
    loaded = {}
    for name in ("types", "delta_store"):
        full = f"torchrec.distributed.model_tracker.{name}"
        spec = importlib.util.spec_from_file_location(
            full, os.path.join(directory, f"{name}.py"))
        module = importlib.util.module_from_spec(spec)
        sys.modules[full] = module
        spec.loader.exec_module(module)
        loaded[name] = module
    store_module = loaded["delta_store"]
    # Later TorchRec versions name the class DeltaStoreTrec.
    store_class = getattr(store_module, "DeltaStoreTrec", None) or getattr(
        store_module, "DeltaStore")
    return store_class, loaded["types"].EmbdUpdateMode


class TorchRecRun:
    """TorchRec's DeltaStore driven as its tracker drives it, one run a call."""

    def __init__(self, args, ids_path):
        import torch

        torch.set_num_threads(1)
        self.args = args
        self.clock = time.thread_time if args.clock == "cpu" else time.perf_counter
        self.store_class, update_mode = load_torchrec(args.torchrec_dir)
        self.mode = {"none": update_mode.NONE, "first": update_mode.FIRST,
                     "last": update_mode.LAST}[args.mode]
        all_ids = torch.from_file(ids_path, size=args.tables * args.batches *
                                  args.ids, dtype=torch.int64)
        self.ids = all_ids.view(args.batches, args.tables, args.ids)
        self.fqns = [f"sparse.ebc.embedding_bags.t{t}"
                     for t in range(args.tables)]
        self.states = None
        if args.mode != "none":
            self.states = [[torch.rand(args.ids, args.dim) for _ in self.fqns]
                           for _ in range(args.batches)]

    def __call__(self):
        """Seconds of one run, and the unique rows it read."""
        store = self.store_class(self.mode)
        start = self.clock()
        for b in range(self.args.batches):
            for t, fqn in enumerate(self.fqns):
                store.append(b, fqn, self.ids[b, t],
                             None if self.states is None else self.states[b][t])
            store.compact(-1, b)
        store.compact(-1, self.args.batches)
        delta = store.get_delta(-1)
        seconds = self.clock() - start
        return seconds, sum(rows.ids.numel() for rows in delta.values())


def run_store_bench(args, ids_path):
    out = subprocess.run(
        [args.store_bench, f"--mode={args.mode}", f"--tables={args.tables}",
         f"--batches={args.batches}", f"--ids={args.ids}",
         f"--rows={args.rows}", f"--dim={args.dim}", f"--zipf={args.zipf}",
         f"--seed={args.seed}", f"--repeat={args.repeat}",
         f"--ids_file={ids_path}", f"--clock={args.clock}", "--json"],
        check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--torchrec_dir",
                        default=os.environ.get("TORCHREC_MODEL_TRACKER"),
                        help="directory with TorchRec's delta_store.py and "
                        "types.py (default: $TORCHREC_MODEL_TRACKER)")
    parser.add_argument("--store_bench",
                        default="bazel-bin/tests/bench/store_bench")
    parser.add_argument("--mode", default="first",
                        choices=["none", "first", "last"])
    parser.add_argument("--tables", type=int, default=8)
    parser.add_argument("--batches", type=int, default=100)
    parser.add_argument("--ids", type=int, default=4096)
    parser.add_argument("--rows", type=int, default=1000000)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--zipf", type=float, default=1.05)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--repeat", type=int, default=5,
                        help="store_bench runs a round (median)")
    parser.add_argument("--torchrec_repeat", type=int, default=1,
                        help="rounds: TorchRec runs, each followed by a "
                        "store_bench of --repeat runs")
    parser.add_argument("--clock", default="wall", choices=["wall", "cpu"],
                        help="wall: elapsed time; cpu: each side's thread CPU "
                        "time, which other work on the machine inflates less")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if not args.torchrec_dir:
        sys.exit("torchrec_side_by_side: give --torchrec_dir or set "
                 "TORCHREC_MODEL_TRACKER")
    if not os.access(args.store_bench, os.X_OK):
        sys.exit(f"torchrec_side_by_side: no store_bench at "
                 f"{args.store_bench} (bazel build -c opt "
                 f"//tests/bench:store_bench)")
    with tempfile.TemporaryDirectory() as tmp:
        ids_path = os.path.join(tmp, "ids.bin")
        subprocess.run(
            [args.store_bench, f"--tables={args.tables}",
             f"--batches={args.batches}", f"--ids={args.ids}",
             f"--rows={args.rows}", f"--zipf={args.zipf}",
             f"--seed={args.seed}", f"--write_ids={ids_path}"], check=True)
        torchrec = TorchRecRun(args, ids_path)
        rounds = []  # (TorchRec's seconds, store_bench's JSON)
        for _ in range(max(1, args.torchrec_repeat)):
            torchrec_s, torchrec_rows = torchrec()
            ours = run_store_bench(args, ids_path)
            if torchrec_rows != ours["unique_rows"]:
                sys.exit(f"torchrec_side_by_side: TorchRec read "
                         f"{torchrec_rows} unique rows, store_bench "
                         f"{ours['unique_rows']}")
            rounds.append((torchrec_s, ours))

    def median(key):
        return round(statistics.median(ours[key] for _, ours in rounds), 6)

    ratios = [t / ours["total_s"] for t, ours in rounds]
    floor_ratios = [t / ours["floor_s"] for t, ours in rounds]
    torchrec_s = statistics.median(t for t, _ in rounds)
    result = {
        "mode": args.mode, "batches": args.batches, "rounds": len(rounds),
        "unique_rows": torchrec_rows, "torchrec_s": round(torchrec_s, 4),
        "store_s": median("total_s"),
        "ratio": round(statistics.median(ratios), 1),
        "ratio_min": round(min(ratios), 1), "ratio_max": round(max(ratios), 1),
        "compact_s": median("compact_s"), "order_s": median("order_s"),
        "gather_s": median("gather_s"),
        "unique_copy_s": median("unique_copy_s"),
        "unique_copy_ratio": median("unique_copy_ratio"),
        "store_bytes": rounds[-1][1]["store_bytes"],
        "unique_bytes": rounds[-1][1]["unique_bytes"], "clock": args.clock,
        "floor_s": median("floor_s"),
        "floor_ratio": round(statistics.median(floor_ratios), 1),
        "floor_ratio_min": round(min(floor_ratios), 1),
        "floor_ratio_max": round(max(floor_ratios), 1),
    }
    if args.json:
        print(json.dumps(result))
        return
    print(f"{args.mode}, {args.tables} tables x {args.batches} batches x "
          f"{args.ids} IDs over {args.rows} rows, dim {args.dim}: "
          f"{torchrec_rows} unique rows")
    print(f"  rounds                {len(rounds):10d}     "
          f"(each: 1 TorchRec run, {args.repeat} store_bench runs; "
          f"{args.clock} clock; medians)")
    print(f"  TorchRec DeltaStore   {torchrec_s:10.4f} s")
    print(f"  store_bench           {result['store_s']:10.4f} s   "
          f"({result['ratio']}x faster; rounds {result['ratio_min']}-"
          f"{result['ratio_max']}x)")
    print(f"    compaction          {result['compact_s']:10.4f} s")
    print(f"    rows found, sorted  {result['order_s']:10.4f} s")
    print(f"    rows gathered       {result['gather_s']:10.4f} s")
    print(f"  unique rows copy      {result['unique_copy_s']:10.4f} s   "
          f"(store / copy: {result['unique_copy_ratio']:.2f}x)")
    print(f"  floor                 {result['floor_s']:10.4f} s   "
          f"(new-ID bitmap pass + unique rows copy: at most "
          f"{result['floor_ratio']}x TorchRec; rounds "
          f"{result['floor_ratio_min']}-{result['floor_ratio_max']}x)")
    print(f"  store holds at read   {result['store_bytes'] / 2**20:10.1f} MiB "
          f"({result['store_bytes'] / result['unique_bytes']:.2f}x the unique "
          f"rows)")


if __name__ == "__main__":
    main()
