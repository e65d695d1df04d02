"""TrackerClient's fan-in (deltastream/fan_in.py) against the real trainer on
two ranks (processes, Gloo and gRPC on loopback) whose plan mixes every
sharding type: t0 row-wise, t1 column-wise (rank 1's block first), t2
data-parallel, t3 table-wise on rank 1, t4 table-row-wise.

While the ranks train: reads are consistent cuts of full tables, from either
rank's address; a commit moves every rank's cursor; subscriptions push
merged deltas on their schedule; status merges the ranks'; consumers are
added, removed and cleared on every rank; top-k of the column-wise table is
refused; the TorchRec adapter reads through the fan-in. A client follows a
restart of the trainer under another world size. With the ranks expiring
consumers added at run time: touch keeps a consumer on every rank (an
unknown one NOT_FOUND naming the rank), a polling subscription whose next
push is an hour away keeps its consumer past the expiry, and ends
NOT_FOUND, naming the rank, within seconds of its consumer's removal from
one rank. Once a trainer has
stopped training (its tables no longer change): the merged delta equals the
C++ FanInClient's (deltactl get --out=F.npz) exactly, and its values are
those of a merged read of all rows. Without servers: merge_rank_deltas and
merge_statuses on parts made up to hit each merge rule and error.
"""

import faulthandler
import os
import signal
import socket
import subprocess
import threading
import time
import unittest

import grpc
import numpy as np

import deltastream
from deltastream import fan_in
from deltastream._proto import tracker_pb2, tracker_pb2_grpc
from deltastream.torchrec_tracker import RemoteModelDeltaTracker, TrackingMode
from server_process import ServerProcess, runfile

FQN = "sparse_arch.embedding_bag_collection.embedding_bags."
TABLES = {"t0": 40, "t1": 33, "t2": 17, "t3": 21, "t4": 23}  # name: rows
DIM = 8

MODEL = """model {
  kind: "dlrm" num_dense: 4 dense_arch: [16, 8] over_arch: [16, 1]
  tables { name: "t0" num_embeddings: 40 embedding_dim: 8 feature_names: ["f0", "f1"] }
  tables { name: "t1" num_embeddings: 33 embedding_dim: 8 }
  tables { name: "t2" num_embeddings: 17 embedding_dim: 8 }
  tables { name: "t3" num_embeddings: 21 embedding_dim: 8 }
  tables { name: "t4" num_embeddings: 23 embedding_dim: 8 }
  sparse_optimizer { type: "rowwise_adagrad" learning_rate: 0.05 }
  dense_optimizer { type: "adagrad" learning_rate: 0.05 }
}
data { batch_size: 8 synthetic { min_length: 0 max_length: 3 } eval_batches: 1 }
seed: 11
log_every_steps: 0
"""

# (sharding type, [(rank, row_offset, rows, col_offset, cols)]) by table.
PLAN = {
    "t0": ("ROW_WISE", [(0, 0, 20, 0, 8), (1, 20, 20, 0, 8)]),
    "t1": ("COLUMN_WISE", [(1, 0, 33, 0, 4), (0, 0, 33, 4, 4)]),
    "t2": ("DATA_PARALLEL", [(0, 0, 17, 0, 8), (1, 0, 17, 0, 8)]),
    "t3": ("TABLE_WISE", [(1, 0, 21, 0, 8)]),
    "t4": ("TABLE_ROW_WISE", [(0, 0, 12, 0, 8), (1, 12, 11, 0, 8)]),
}


def write_config(name: str, tracker: str) -> str:
    """$TEST_TMPDIR/name, holding config.txt (the model and `tracker`, the
    tracker block's fields) and plan.txt (the mixed plan on two ranks)."""
    work = os.path.join(os.environ["TEST_TMPDIR"], name)
    os.makedirs(work, exist_ok=True)
    with open(os.path.join(work, "config.txt"), "w") as f:
        f.write(MODEL + f"tracker {{ {tracker} }}\n")
    with open(os.path.join(work, "plan.txt"), "w") as f:
        f.write("world_size: 2\n")
        for table, (kind, shards) in PLAN.items():
            f.write(f'tables {{ table: "{table}" sharding_type: {kind} '
                    f"num_embeddings: {TABLES[table]} embedding_dim: {DIM}\n")
            for rank, row, rows, col, cols in shards:
                f.write(f"  shards {{ rank: {rank} row_offset: {row} rows: "
                        f"{rows} col_offset: {col} cols: {cols} }}\n")
            f.write("}\n")
    return work


def start_trainer(name: str, tracker: str, steps: int) -> ServerProcess:
    """The trainer on two ranks with the mixed plan and `tracker` (the
    tracker block's fields), in $TEST_TMPDIR/name."""
    work = write_config(name, tracker)
    return ServerProcess("trainer/trainer", [
        f"--config={work}/config.txt", f"--plan={work}/plan.txt",
        f"--steps={steps}", "--nproc_per_node=2"])


class Ranks:
    """Each rank's own service, read directly (no fan-in)."""

    def __init__(self, target: str):
        self._channels = [grpc.insecure_channel(target)]
        self.topology = tracker_pb2_grpc.DeltaTrackerStub(
            self._channels[0]).Topology(tracker_pb2.TopologyRequest(),
                                        timeout=20)
        self.addresses = [e.address for e in self.topology.endpoints]
        self._channels += [grpc.insecure_channel(a) for a in self.addresses]
        self.stubs = [tracker_pb2_grpc.DeltaTrackerStub(c)
                      for c in self._channels[1:]]

    def statuses(self):
        return [s.Status(tracker_pb2.StatusRequest(), timeout=20)
                for s in self.stubs]

    def listed(self, consumer: str):
        """Whether each rank lists the consumer."""
        return [consumer in s.ListConsumers(
            tracker_pb2.ListConsumersRequest(), timeout=20).consumers
            for s in self.stubs]

    def cursors(self, consumer: str):
        """The consumer's cursor on each rank."""
        return [next(c.cursor for c in status.consumers if c.name == consumer)
                for status in self.statuses()]

    def close(self):
        for channel in self._channels:
            channel.close()


def wait_for_batch(client, batch: int, timeout: float = 60) -> int:
    """Waits until the (merged) tracker batch reaches `batch`; returns it."""
    deadline = time.monotonic() + timeout
    while True:
        current = client.status().current_batch
        if current >= batch:
            return current
        if time.monotonic() > deadline:
            raise AssertionError(f"batch {current} after {timeout} s, "
                                 f"waiting for {batch}")
        time.sleep(0.05)


class MergedDeltaChecks:
    """Checks of a merged delta every test uses (a TestCase mixin)."""

    def assert_merged(self, delta, all_rows=False):
        """Every table's IDs ascending and unique, rows full width; with
        all_rows, every table whole."""
        self.assertFalse(delta.resync_required)
        self.assertEqual(len(delta.run_id.split(",")), 2, delta.run_id)
        if all_rows:
            self.assertEqual(set(delta.tables), {FQN + t for t in TABLES})
        for fqn, table in delta.tables.items():
            ids = table.ids
            self.assertTrue(np.all(np.diff(ids) > 0), fqn)
            self.assertEqual(table.values.shape, (ids.shape[0], DIM), fqn)
            if all_rows:
                np.testing.assert_array_equal(
                    ids, np.arange(TABLES[fqn[len(FQN):]]), fqn)


class TrainsUntilStopped:
    """A test class's two ranks that train until stopped (setUpClass calls
    start), reached as `ranks` and through `client` once batch 2 closed."""

    @classmethod
    def start(cls, name: str, config: str):
        cls.trainer = start_trainer(name, config, steps=-1)
        cls.ranks = Ranks(cls.trainer.target)
        cls.client = deltastream.TrackerClient(cls.trainer.target, timeout=20)
        wait_for_batch(cls.client, 2)

    @classmethod
    def tearDownClass(cls):
        cls.client.close()
        cls.ranks.close()
        cls.trainer.stop()


class LiveShardedTrainerTest(TrainsUntilStopped, unittest.TestCase,
                             MergedDeltaChecks):
    """Against two ranks that train until stopped."""

    @classmethod
    def setUpClass(cls):
        cls.start(
            "live", 'mode: "rowwise_adagrad" acknowledged_reads: true '
            'consumers: ["cuts", "py", "sub", "timed", "lag", "clr", "top"]')

    def test_reads_are_consistent_cuts_of_whole_tables_from_either_rank(self):
        ends = []
        for address in self.ranks.addresses:
            with deltastream.TrackerClient(address, timeout=20) as c:
                delta = c.get("cuts", all_rows=True, include_dense=True,
                              max_chunk_bytes=256)  # several chunks a table
                self.assertTrue(delta.all_rows)
                self.assert_merged(delta, all_rows=True)
                self.assertIn("over_arch.0.weight", delta.dense)
                ends.append(delta.end_batch)
                wait_for_batch(c, delta.end_batch + 1)
        self.assertGreater(ends[1], ends[0])

    def test_commit_moves_every_ranks_cursor(self):
        c = self.client
        delta = c.get("py")
        self.assert_merged(delta)
        c.commit("py", delta.end_batch)
        self.assertEqual(self.ranks.cursors("py"), [delta.end_batch] * 2)
        wait_for_batch(c, delta.end_batch + 1)
        following = c.get("py")
        self.assertEqual(following.start_batch, delta.end_batch)
        self.assertGreater(following.end_batch, delta.end_batch)
        self.assert_merged(following)

    def test_subscription_pushes_merged_deltas_every_steps(self):
        pushes = []
        with self.client.subscribe("sub", every_steps=2, all_rows=True,
                                   timeout=30) as subscription:
            for delta in subscription:
                pushes.append(delta)
                if len(pushes) == 3:
                    break
        self.assertTrue(pushes[0].all_rows)
        self.assert_merged(pushes[0], all_rows=True)
        for before, push in zip(pushes, pushes[1:]):
            self.assertFalse(push.all_rows)
            self.assertEqual(push.start_batch, before.end_batch)
            self.assertGreaterEqual(push.end_batch - push.start_batch, 2)
            self.assert_merged(push)

    def test_subscription_pushes_every_ms(self):
        with self.client.subscribe("timed", every_steps=1 << 30,
                                   every_ms=100, timeout=30) as subscription:
            # The period runs from the start of a push's read, which may
            # take a while on a loaded machine: timed from before the first.
            started = time.monotonic()
            first = next(subscription)
            second = next(subscription)
            self.assertGreaterEqual(time.monotonic() - started, 0.1)
        self.assertEqual(second.start_batch, first.end_batch)
        self.assertGreater(second.end_batch, second.start_batch)
        self.assert_merged(second)

    def test_status_merges_every_ranks(self):
        # A consumer whose ranks' cursors differ: "lag" skips to the present
        # on rank 1 only.
        self.ranks.stubs[1].Clear(tracker_pb2.ClearRequest(consumer="lag"),
                                  timeout=20)
        merged = self.client.status()
        ranks = self.ranks.statuses()
        self.assertLessEqual(merged.current_batch,
                             min(r.current_batch for r in ranks))
        self.assertEqual(merged.run_id, ",".join(r.run_id for r in ranks))
        self.assertEqual({t.fqn for t in merged.tables},
                         {t.fqn for r in ranks for t in r.tables})
        self.assertEqual([c.name for c in merged.consumers],
                         [c.name for c in ranks[0].consumers])
        lag = next(c for c in merged.consumers if c.name == "lag")
        on_ranks = [next(c for c in r.consumers if c.name == "lag")
                    for r in ranks]
        self.assertEqual(lag.cursor, on_ranks[0].cursor)
        self.assertEqual(lag.highest_cursor, on_ranks[1].highest_cursor)
        self.assertLess(lag.cursor, lag.highest_cursor)

    def test_consumers_change_on_every_rank(self):
        c = self.client
        on_every_rank = self.ranks.listed
        self.assertIn("later", c.add_consumer("later"))
        self.assertEqual(on_every_rank("later"), [True, True])
        with self.assertRaises(grpc.RpcError) as error:
            c.add_consumer("later")
        self.assertEqual(error.exception.code(),
                         grpc.StatusCode.ALREADY_EXISTS)
        self.assertNotIn("later", c.remove_consumer("later"))
        self.assertEqual(on_every_rank("later"), [False, False])
        with self.assertRaises(grpc.RpcError) as error:
            c.remove_consumer("later")
        self.assertEqual(error.exception.code(), grpc.StatusCode.NOT_FOUND)
        # What an earlier call that reached rank 1 only left is completed.
        self.ranks.stubs[1].AddConsumer(
            tracker_pb2.ConsumerRequest(consumer="half"), timeout=20)
        self.assertIn("half", c.add_consumer("half"))
        self.assertEqual(on_every_rank("half"), [True, True])
        c.remove_consumer("half")
        self.assertEqual(on_every_rank("half"), [False, False])

    def test_clear_reaches_every_rank(self):
        before = self.client.status().current_batch
        self.client.clear("clr")
        for cursor in self.ranks.cursors("clr"):
            self.assertGreaterEqual(cursor, before)

    def test_top_k_of_the_column_wise_table_is_refused(self):
        with self.assertRaisesRegex(ValueError, "t1', which 2 ranks hold "
                                    "split by columns"):
            self.client.get("top", top_k=3)
        delta = self.client.get("top", fqns=[FQN + "t0", FQN + "t3"],
                                top_k=3, include_scores=True)
        self.assertEqual(set(delta.tables), {FQN + "t0", FQN + "t3"})
        for table in delta.tables.values():
            self.assertLessEqual(table.ids.shape[0], 3 * 2)  # per rank
            self.assertEqual(table.scores.shape, table.ids.shape)
        self.assert_merged(delta)

    def test_torchrec_adapter_reads_the_merged_tables(self):
        # The adapter adds its consumer on every rank, each at its own
        # batch: here rank 1 a batch before rank 0, as a step between two
        # ranks' adds would. The column-wise table's blocks then cover
        # different batches: the first read is a resync, of every row.
        self.ranks.stubs[1].AddConsumer(
            tracker_pb2.ConsumerRequest(consumer="adapter"), timeout=20)
        on_rank1 = self.ranks.statuses()[1].consumers
        wait_for_batch(self.client, 1 + next(
            c.cursor for c in on_rank1 if c.name == "adapter"))
        status = self.client.status()
        tracker = RemoteModelDeltaTracker(
            client=self.client, consumers=["adapter"],
            delete_on_read=status.delete_on_read,
            mode=TrackingMode.ROWWISE_ADAGRAD)
        self.assertEqual(self.ranks.listed("adapter"), [True, True])
        cursors = self.ranks.cursors("adapter")
        self.assertLess(cursors[1], cursors[0])
        rows = tracker.get_delta("adapter")
        self.assertEqual({fqn: r.ids.tolist() for fqn, r in rows.items()},
                         {FQN + t: list(range(n)) for t, n in TABLES.items()})
        # Committed (the trainer reads with acknowledgements) at one cut.
        cursors = self.ranks.cursors("adapter")
        self.assertEqual(cursors[0], cursors[1])
        # Two batches closed after that read: a delta, merged.
        wait_for_batch(self.client, cursors[0] + 2)
        rows = tracker.get_delta("adapter")
        self.assertTrue(any(r.ids.numel() > 0 for r in rows.values()))
        for fqn, table in rows.items():
            ids = table.ids.numpy()
            self.assertTrue(np.all(np.diff(ids) > 0), fqn)
            self.assertEqual(table.states.shape[0], ids.shape[0], fqn)


class HourlySubscription:
    """A subscription of `consumer` through `client` (several ranks: a
    polling one), iterated on a thread of its own, whose next push after the
    first is an hour away, by time and by steps. Cancelled when closed."""

    def __init__(self, client, consumer: str):
        self.subscription = client.subscribe(
            consumer, every_steps=1 << 30, every_ms=3600 * 1000)
        self.pushes = 0
        self.error = None
        self.first_push = threading.Event()
        self.ended = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        try:
            for _ in self.subscription:
                self.pushes += 1
                self.first_push.set()
        except Exception as error:  # pylint: disable=broad-except
            self.error = error
        self.ended.set()

    def close(self):
        self.subscription.cancel()
        self._thread.join(30)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class ConsumerExpiryShardedTrainerTest(TrainsUntilStopped,
                                       unittest.TestCase):
    """Against two ranks that train until stopped and expire a consumer
    added at run time after EXPIRE_SECONDS without a read, commit or touch
    (expire_consumers_after_seconds; declared consumers never expire)."""

    EXPIRE_SECONDS = 2

    @classmethod
    def setUpClass(cls):
        cls.start(
            "expiry", 'mode: "rowwise_adagrad" consumers: ["declared"] '
            f"expire_consumers_after_seconds: {cls.EXPIRE_SECONDS}")

    def assert_not_found(self, error, rank: int, consumer: str):
        self.assertIsInstance(error, fan_in.FanInError, repr(error))
        self.assertEqual(error.code(), grpc.StatusCode.NOT_FOUND,
                         error.details())
        self.assertTrue(error.details().startswith(f"rank {rank}: "),
                        error.details())
        self.assertIn(f"'{consumer}'", error.details())

    def test_touch_keeps_a_consumer_on_every_rank(self):
        c = self.client
        for consumer in ("touched", "silent"):
            c.add_consumer(consumer)
            self.assertEqual(self.ranks.listed(consumer), [True, True])
        with self.assertRaises(grpc.RpcError) as error:
            c.touch("nobody")
        self.assert_not_found(error.exception, 0, "nobody")
        # Three times the expiry, touched every half second, reading
        # nothing: kept on both ranks, while "silent" expires.
        until = time.monotonic() + 3 * self.EXPIRE_SECONDS
        while time.monotonic() < until:
            self.assertIsNone(c.touch("touched"))
            time.sleep(0.5)
        self.assertEqual(self.ranks.listed("touched"), [True, True])
        self.assertEqual(self.ranks.listed("silent"), [False, False])
        c.remove_consumer("touched")
        # Missing on rank 1 only: its NOT_FOUND names that rank.
        c.add_consumer("half")
        self.ranks.stubs[1].RemoveConsumer(
            tracker_pb2.ConsumerRequest(consumer="half"), timeout=20)
        with self.assertRaises(grpc.RpcError) as error:
            c.touch("half")
        self.assert_not_found(error.exception, 1, "half")
        c.remove_consumer("half")  # rank 0's

    def test_a_polling_subscription_keeps_its_consumer_past_the_expiry(self):
        c = self.client
        c.add_consumer("kept")
        c.add_consumer("unsubscribed")  # the control: it expires
        with HourlySubscription(c, "kept") as kept:
            self.assertTrue(kept.first_push.wait(60), kept.error)
            ended = kept.ended.wait(3 * self.EXPIRE_SECONDS)
            self.assertFalse(ended, f"the subscription of 'kept' ended: "
                             f"{kept.error!r}")
            listed = self.ranks.listed("kept")
            self.assertEqual(self.ranks.listed("unsubscribed"),
                             [False, False])
        self.assertEqual(kept.pushes, 1)
        self.assertIsNone(kept.error)  # cancel() ended it
        self.assertEqual(listed, [True, True],
                         "the ranks expired 'kept' while its subscription "
                         "waited for its next push")
        c.remove_consumer("kept")

    def test_a_polling_subscription_ends_once_a_rank_lacks_its_consumer(self):
        c = self.client
        c.add_consumer("watched")
        with HourlySubscription(c, "watched") as watched:
            self.assertTrue(watched.first_push.wait(60), watched.error)
            self.ranks.stubs[1].RemoveConsumer(
                tracker_pb2.ConsumerRequest(consumer="watched"), timeout=20)
            removed = time.monotonic()
            ended = watched.ended.wait(5)
            took = time.monotonic() - removed
        self.assertTrue(ended, "the subscription of 'watched', removed from "
                        f"rank 1, still waited after {took:.1f} s")
        self.assert_not_found(watched.error, 1, "watched")
        self.assertEqual(watched.pushes, 1)
        # The error ended the subscription: a later next() raises it again
        # at once, and reads nothing more (rank 0 still has the consumer).
        started = time.monotonic()
        with self.assertRaises(fan_in.FanInError) as again:
            next(watched.subscription)
        self.assertIs(again.exception, watched.error)
        self.assertLess(time.monotonic() - started, 1)
        c.remove_consumer("watched")  # rank 0's


class StillShardedTrainerTest(unittest.TestCase, MergedDeltaChecks):
    """Against two ranks that have trained STEPS steps and serve on (the
    drain) until every consumer has read the final batch: tables that no
    longer change, so that reads at different moments compare."""

    STEPS = 8

    @classmethod
    def setUpClass(cls):
        cls.trainer = start_trainer(
            "still", 'mode: "rowwise_adagrad" drain_seconds: 60 '
            'consumers: ["py", "ctl", "whole"]', steps=cls.STEPS)
        cls.client = deltastream.TrackerClient(cls.trainer.target, timeout=20)

    @classmethod
    def tearDownClass(cls):
        cls.client.close()
        cls.trainer.stop()

    def test_merged_delta_is_the_cpp_fan_ins(self):
        c = self.client
        wait_for_batch(c, self.STEPS)
        out = os.path.join(os.environ["TEST_TMPDIR"], "ctl.npz")
        subprocess.run([runfile("clients/deltactl"),
                        f"--target={self.trainer.target}", "get",
                        "--consumer=ctl", f"--out={out}"],
                       check=True, timeout=60, stdout=subprocess.DEVNULL)
        expected = deltastream.read_delta_npz(out)
        delta = c.get("py")
        self.assert_merged(delta)
        self.assertEqual((delta.start_batch, delta.end_batch,
                          delta.resync_required),
                         (expected.start_batch, expected.end_batch,
                          expected.resync_required))
        self.assertEqual(delta.end_batch, self.STEPS)
        self.assertEqual(set(delta.tables), {FQN + t for t in TABLES})
        self.assertEqual(set(delta.tables), set(expected.tables))
        for fqn, table in delta.tables.items():
            want = expected.tables[fqn]
            for name in ("ids", "states", "values"):
                got, wanted = getattr(table, name), getattr(want, name)
                self.assertEqual(got is None, wanted is None, (fqn, name))
                if got is not None:
                    np.testing.assert_array_equal(got, wanted, (fqn, name))
        # rowwise_adagrad keeps one state per row and column block.
        self.assertEqual(delta.tables[FQN + "t1"].states.shape[1], 2)
        self.assertEqual(delta.tables[FQN + "t0"].states.shape[1], 1)

        # The rows read are the whole tables' rows at those IDs.
        whole = c.get("whole", all_rows=True)
        self.assert_merged(whole, all_rows=True)
        self.assertEqual(whole.end_batch, self.STEPS)
        for fqn, table in delta.tables.items():
            np.testing.assert_array_equal(
                whole.tables[fqn].values[table.ids], table.values, fqn)


def part(tables, start=0, end=5, **header):
    """A rank's part: tables {fqn: (ids, values[, col_offset, table_cols])}."""
    delta = deltastream.Delta(
        consumer="c", start_batch=start, end_batch=end, tables={},
        run_id=header.pop("run_id", "r"), **header)
    columns = {}
    for fqn, (ids, values, *block) in tables.items():
        delta.tables[fqn] = deltastream.TableDelta(
            ids=np.asarray(ids, np.int64),
            values=np.asarray(values, np.float32).reshape(len(ids), -1))
        if block:
            columns[fqn] = tuple(block)
    return delta, columns


def topology(**kinds):
    """Two ranks; every table kinds[fqn] on both."""
    return tracker_pb2.TopologyResponse(world_size=2, shards=[
        tracker_pb2.TableShard(fqn=fqn, sharding_type=kind, rank=r)
        for fqn, kind in kinds.items() for r in range(2)])


def free_port_pair() -> int:
    """A loopback port P with P + 1 free too (the second rank's), as free
    as a probe can tell."""
    for _ in range(50):
        with socket.socket() as first:
            first.bind(("127.0.0.1", 0))
            port = first.getsockname()[1]
            if port >= 65535:
                continue
            with socket.socket() as second:
                try:
                    second.bind(("127.0.0.1", port + 1))
                except OSError:
                    continue
            return port
    raise AssertionError("no two free ports in a row")


class RestartedTrainerTest(unittest.TestCase, MergedDeltaChecks):
    """A client follows the trainer behind its address through a restart
    under another world size (two ranks, then one process restored from
    their checkpoint): the stale topology's reads fail, the next call
    discovers the new one, which tells the consumer to resync (its tracker
    holds nothing of the ranks'), and reads go on from the one process."""

    def test_a_client_follows_a_restart_to_another_world_size(self):
        port = free_port_pair()
        # Acknowledged reads: a read that reached the new process while the
        # stale topology's other read failed is delivered again, not lost.
        work = write_config("restarted",
                            'acknowledged_reads: true consumers: ["py"]')
        common = [f"--listen=127.0.0.1:{port}", f"--checkpoint_dir={work}/run",
                  "--drain_s=0", "--steps=-1"]
        two = ServerProcess("trainer/trainer", [
            f"--config={work}/config.txt", f"--plan={work}/plan.txt",
            "--nproc_per_node=2"] + common)
        target = f"127.0.0.1:{port}"  # rank 0's (two.target: either's)
        client = deltastream.TrackerClient(target, timeout=20)
        try:
            wait_for_batch(client, 2)
            before = client.get("py")
            self.assert_merged(before)
            client.commit("py", before.end_batch)
            self.assertEqual(two.stop(), 0)

            one = ServerProcess("trainer/trainer",
                                [f"--config={work}/config.txt"] + common)
            try:
                self.assertEqual(one.target, target)
                errors = []
                deadline = time.monotonic() + 60
                while True:
                    try:
                        after = client.get("py")
                        break
                    except grpc.RpcError as error:
                        # The old ranks' addresses, gone: UNAVAILABLE, and
                        # the ranks forgotten.
                        errors.append(error.code())
                        self.assertEqual(error.code(),
                                         grpc.StatusCode.UNAVAILABLE, error)
                        self.assertLess(time.monotonic(), deadline, errors)
                        time.sleep(0.2)
                # Rank 1's address serves no more: the stale topology's
                # read failed before the new one was discovered.
                self.assertTrue(errors)
                self.assertNotIn(",", after.run_id)  # one process's run
                self.assertNotEqual(after.run_id, before.run_id)
                # Its tracker holds no snapshot of this plan: it cannot know
                # the rows the consumer had not read, and says so.
                self.assertTrue(after.resync_required)
                client.commit("py", after.end_batch)
                wait_for_batch(client, after.end_batch + 1)
                later = client.get("py")
                self.assertFalse(later.resync_required)
                self.assertEqual(later.run_id, after.run_id)
                self.assertGreater(later.end_batch, after.end_batch)
                for fqn, table in later.tables.items():
                    self.assertTrue(np.all(np.diff(table.ids) > 0), fqn)
                    self.assertEqual(table.values.shape,
                                     (table.ids.shape[0], DIM), fqn)
                status = client.status()
                self.assertNotIn(",", status.run_id)
                self.assertEqual([c.name for c in status.consumers], ["py"])
            finally:
                one.stop()
        finally:
            client.close()
            two.stop()


class MergeRankDeltasTest(unittest.TestCase):
    """The merge rules and errors, on parts made up for them."""

    def test_rows_columns_and_data_parallel_tables(self):
        merged = fan_in.merge_rank_deltas(
            topology(rows="ROW_WISE", cols="COLUMN_WISE", dp="DATA_PARALLEL"),
            [part({"rows": ([5, 6], [[5], [6]]),
                   "cols": ([1, 3], [[0, 0], [0, 0]], 2, 4),
                   "dp": ([2, 4], [[0], [0]])},
                  start=1, lost_rows=2, run_id="a", dense={"w": np.ones(1)}),
             part({"rows": ([1, 2], [[1], [2]]),
                   "cols": ([1, 3], [[1, 1], [1, 1]], 0, 4),
                   "dp": ([4, 9], [[1], [1]])},
                  start=3, lost_rows=1, run_id="b")])
        self.assertEqual((merged.start_batch, merged.end_batch,
                          merged.lost_rows, merged.run_id, list(merged.dense)),
                         (3, 5, 3, "a,b", ["w"]))
        self.assertEqual(list(merged.tables), ["cols", "dp", "rows"])
        np.testing.assert_array_equal(merged.tables["rows"].ids, [1, 2, 5, 6])
        np.testing.assert_array_equal(merged.tables["rows"].values[:, 0],
                                      [1, 2, 5, 6])
        np.testing.assert_array_equal(merged.tables["cols"].values,
                                      [[1, 1, 0, 0], [1, 1, 0, 0]])
        np.testing.assert_array_equal(merged.tables["dp"].ids, [2, 4, 9])
        np.testing.assert_array_equal(merged.tables["dp"].values[:, 0],
                                      [0, 0, 1])  # ID 4: rank 0's row

    def test_parts_that_do_not_fit(self):
        with self.assertRaisesRegex(fan_in.FanInError,
                                    "table 'rows': two ranks serve row ID 2"):
            fan_in.merge_rank_deltas(topology(rows="ROW_WISE"), [
                part({"rows": ([1, 2], [[1], [2]])}),
                part({"rows": ([2, 3], [[2], [3]])})])
        blocks = [part({"cols": ([1], [[0, 0]], 0, 4)}),
                  part({"cols": ([2], [[0, 0]], 2, 4)}, start=1)]
        # Parts from different batches: the blocks ask for a resync...
        merged = fan_in.merge_rank_deltas(topology(cols="COLUMN_WISE"), blocks)
        self.assertTrue(merged.resync_required)
        self.assertEqual(merged.tables, {})
        # ...which a read of all rows cannot give: an error.
        for delta, _ in blocks:
            delta.all_rows = True
        with self.assertRaises(fan_in.FanInError) as error:
            fan_in.merge_rank_deltas(topology(cols="COLUMN_WISE"), blocks)
        self.assertEqual(error.exception.code(), grpc.StatusCode.DATA_LOSS)
        self.assertIn("table 'cols': the column block at column 2 holds other "
                      "IDs", error.exception.details())

    def test_statuses(self):
        def status(batch, cursor, bytes_):
            return tracker_pb2.StatusResponse(
                current_batch=batch, bytes=bytes_, run_id=str(batch),
                consumers=[tracker_pb2.ConsumerStatus(
                    name="c", cursor=cursor, highest_cursor=cursor)],
                tables=[tracker_pb2.TableStatus(fqn="t", ids=bytes_)])
        merged = fan_in.merge_statuses([status(7, 3, 10), status(6, 5, 20)])
        self.assertEqual((merged.current_batch, merged.bytes, merged.run_id,
                          merged.tables[0].ids, merged.consumers[0].cursor,
                          merged.consumers[0].highest_cursor),
                         (6, 30, "7,6", 30, 3, 5))


if __name__ == "__main__":
    # Bazel's timeout sends SIGTERM: every thread's stack, to see where.
    faulthandler.register(signal.SIGTERM, all_threads=True)
    unittest.main()
