"""RemoteModelDeltaTracker against the real tracker_server, on TorchRec's
worked cases: each expected value below is what TorchRec's in-process
ModelDeltaTracker returns at the same call (its rules: step() moves the
batch index; get_delta(c) returns the unique rows recorded at or after c's
cursor, through the open batch, and moves c's cursor past the open batch;
clear() forgets everything; clear(c) with several consumers does nothing).
"""

import random
import socket
import unittest
from unittest import mock

import grpc
import torch

from deltastream import TrackerClient
from deltastream import torchrec_tracker
from deltastream.torchrec_tracker import RemoteModelDeltaTracker, TrackingMode
from server_process import ServerProcess

SERVER = "tracker_service/tracker_server"


class Jagged:
    """The part of a JaggedTensor the tracker reads: values()."""

    def __init__(self, values):
        self._values = torch.tensor(values, dtype=torch.int64)

    def values(self):
        return self._values


def ids_of(delta):
    return {fqn: rows.ids.tolist() for fqn, rows in delta.items()}


class IdOnlyCases:
    """Run on a server with delete-on-read on and on one with it off: the
    results must be the same (deletion changes memory only)."""

    delete_on_read = None

    @classmethod
    def setUpClass(cls):
        cls.server = ServerProcess(SERVER, [
            "--mode=id_only", f"--delete_on_read={str(cls.delete_on_read).lower()}"])

    @classmethod
    def tearDownClass(cls):
        assert cls.server.stop() == 0

    def tracker(self, consumers, prefix):
        return RemoteModelDeltaTracker(
            self.server.target, consumers=consumers,
            delete_on_read=self.delete_on_read,
            feature_to_fqn={"f1": f"{prefix}.t1", "f1b": f"{prefix}.t1",
                            "f2": f"{prefix}.t2"})

    def test_records_and_reads_between_and_after_steps(self):
        t = self.tracker(["x"], "a")
        t.step()
        t.record_lookup({"f1": Jagged([1, 2, 2]), "f2": Jagged([5])}, None)
        self.assertEqual(ids_of(t.get_delta("x")), {"a.t1": [1, 2], "a.t2": [5]})
        t.step()
        # A read between steps with nothing recorded: the tables, empty.
        self.assertEqual(ids_of(t.get_delta("x")), {"a.t1": [], "a.t2": []})
        t.step()
        t.record_lookup({"f1": Jagged([3]), "f1b": Jagged([9])}, None)
        t.step()
        t.record_lookup({"f1": Jagged([1])}, None)
        # Through the open batch: 1 was recorded after the last step.
        self.assertEqual(ids_of(t.get_delta("x")),
                         {"a.t1": [1, 3, 9], "a.t2": []})
        self.assertEqual(
            {k: v.tolist() for k, v in t.get_delta_ids("x").items()},
            {"a.t1": [], "a.t2": []})
        self.assertEqual(t.curr_batch_idx, 4)

    def test_several_consumers_and_records_after_a_read(self):
        t = self.tracker(["p", "q"], "b")
        t.step()
        t.record_lookup({"f1": Jagged([1])}, None)
        self.assertEqual(ids_of(t.get_delta("p")), {"b.t1": [1]})
        t.record_lookup({"f1": Jagged([2])}, None)  # after p's read
        self.assertEqual(ids_of(t.get_delta("q")), {"b.t1": [1, 2]})
        # p's cursor is past the open batch: 2 never reaches p.
        self.assertEqual(ids_of(t.get_delta("p")), {"b.t1": []})
        t.step()
        t.record_lookup({"f1": Jagged([3])}, None)
        self.assertEqual(ids_of(t.get_delta("p")), {"b.t1": [3]})
        t.step()
        t.record_lookup({"f1": Jagged([4, 4])}, None)
        self.assertEqual(ids_of(t.get_delta("q")), {"b.t1": [3, 4]})
        self.assertEqual(ids_of(t.get_delta("p")), {"b.t1": [4]})
        # clear(c) with several consumers does nothing (TorchRec's rule).
        t.step()
        t.record_lookup({"f2": Jagged([8])}, None)
        t.clear("p")
        self.assertEqual(ids_of(t.get_delta("p")), {"b.t1": [], "b.t2": [8]})
        with self.assertRaises(ValueError):
            t.get_delta("nobody")

    def test_mismatched_settings_are_refused(self):
        with self.assertRaises(ValueError):
            RemoteModelDeltaTracker(self.server.target,
                                    delete_on_read=not self.delete_on_read)
        with self.assertRaises(ValueError):
            RemoteModelDeltaTracker(self.server.target,
                                    delete_on_read=self.delete_on_read,
                                    mode=TrackingMode.EMBEDDING)


class DeleteOnReadTest(IdOnlyCases, unittest.TestCase):
    delete_on_read = True


class KeepOnReadTest(IdOnlyCases, unittest.TestCase):
    delete_on_read = False


class EmbeddingModeTest(unittest.TestCase):

    def test_first_embedding_since_the_last_read(self):
        with ServerProcess(SERVER, ["--mode=embedding",
                                    "--delete_on_read=false"]) as server:
            t = RemoteModelDeltaTracker(
                server.target, consumers=["e"], delete_on_read=False,
                mode=TrackingMode.EMBEDDING,
                feature_to_fqn={"f1": "ec.t1", "f1b": "ec.t1"})
            self.assertEqual(t.mode, TrackingMode.EMBEDDING)
            t.step()
            # Two features of one table: one lookup, IDs in key order.
            t.record_lookup({"f1": Jagged([1, 2]), "f1b": Jagged([4])},
                            torch.tensor([[1., 1.], [2., 2.], [4., 4.]]))
            t.step()
            t.record_lookup({"f1": Jagged([1, 3])},
                            torch.tensor([[9., 9.], [3., 3.]]))
            delta = t.get_delta("e")
            self.assertEqual(delta["ec.t1"].ids.tolist(), [1, 2, 3, 4])
            self.assertEqual(delta["ec.t1"].states.tolist(),
                             [[1, 1], [2, 2], [3, 3], [4, 4]])
            t.step()
            t.record_lookup({"f1": Jagged([2])}, torch.tensor([[7., 7.]]))
            delta = t.get_delta("e")
            self.assertEqual(delta["ec.t1"].ids.tolist(), [2])
            self.assertEqual(delta["ec.t1"].states.tolist(), [[7, 7]])
            with self.assertRaises(ValueError):  # 3 elements for 2 IDs
                t.record_lookup({"f1": Jagged([5, 6])}, torch.zeros(3))
            with self.assertRaises(grpc.RpcError) as error:  # dim 6, not 2
                t.record_lookup({"f1": Jagged([5])}, torch.zeros(3, 2))
            self.assertEqual(error.exception.code(),
                             grpc.StatusCode.INVALID_ARGUMENT)
            # Nothing of the refused records was kept.
            self.assertEqual(t.get_delta("e")["ec.t1"].ids.tolist(), [])

    def test_a_batch_of_no_ids_records_nothing(self):
        with ServerProcess(SERVER, ["--mode=embedding",
                                    "--delete_on_read=false"]) as server:
            t = RemoteModelDeltaTracker(
                server.target, consumers=["e"], delete_on_read=False,
                mode=TrackingMode.EMBEDDING, feature_to_fqn={"f1": "en.t1"})
            t.step()
            t.record_lookup({"f1": Jagged([])}, torch.zeros(0, 2))
            t.record_lookup({"f1": Jagged([])}, torch.zeros(0))
            self.assertEqual(ids_of(t.get_delta("e")), {})
            with self.assertRaises(ValueError):  # states for no IDs
                t.record_lookup({"f1": Jagged([])}, torch.zeros(2))
            t.step()
            t.record_lookup({"f1": Jagged([6])}, torch.ones(1, 2))
            self.assertEqual(ids_of(t.get_delta("e")), {"en.t1": [6]})
            t.close()


class CreationTest(unittest.TestCase):
    """The client the adapter makes for a target is closed when a check or
    call of its creation fails; a client passed in is the caller's."""

    def setUp(self):
        self.closed = []
        test = self

        class Recording(TrackerClient):
            def close(self):
                test.closed.append(self)
                super().close()
        self.Recording = Recording
        patch = mock.patch.object(torchrec_tracker, "TrackerClient",
                                  Recording)
        patch.start()
        self.addCleanup(patch.stop)

    def test_a_failed_creation_closes_its_client(self):
        with socket.socket() as s:  # a port nothing listens on
            s.bind(("127.0.0.1", 0))
            dead = f"127.0.0.1:{s.getsockname()[1]}"
        with self.assertRaises(grpc.RpcError):  # the status() call fails
            RemoteModelDeltaTracker(dead)
        self.assertEqual(len(self.closed), 1)
        with ServerProcess(SERVER, ["--mode=id_only"]) as server:
            for kwargs in ({"mode": TrackingMode.EMBEDDING},
                           {"delete_on_read": False},
                           {"mode": "no_such_mode"}):
                with self.subTest(**kwargs), self.assertRaises(ValueError):
                    RemoteModelDeltaTracker(server.target, **kwargs)
            self.assertEqual(len(self.closed), 4)
            client = self.Recording(server.target)
            with self.assertRaises(ValueError):
                RemoteModelDeltaTracker(client=client,
                                        mode=TrackingMode.EMBEDDING)
            self.assertEqual(len(self.closed), 4)  # not the caller's
            client.close()


class ClearTest(unittest.TestCase):

    def test_clear_forgets_everything_and_later_records_count(self):
        with ServerProcess(SERVER, ["--mode=id_only"]) as server:
            t = RemoteModelDeltaTracker(
                server.target, feature_to_fqn={"f1": "c.t1", "f2": "c.t2"})
            self.assertEqual(t.consumers, ["default"])
            t.step()
            t.record_lookup({"f1": Jagged([1]), "f2": Jagged([2])}, None)
            t.clear()
            t.record_lookup({"f1": Jagged([3])}, None)  # same batch
            # TorchRec forgot both tables; only t1 was recorded since.
            self.assertEqual(ids_of(t.get_delta()), {"c.t1": [3]})
            t.step()
            t.record_lookup({"f2": Jagged([4])}, None)
            t.clear("default")  # one consumer: the same as clear()
            t.record_lookup({"f2": Jagged([5])}, None)
            self.assertEqual(ids_of(t.get_delta()), {"c.t2": [5]})


class TorchRecRules:
    """TorchRec's tracker as its rules say (docs/tracker-semantics.md): a
    read returns, per table recorded since the last clear, the unique IDs
    (and first states) of the lookups at or after the reader's cursor, and
    moves the cursor past the open batch. Compaction and deletion change
    no result, so they are left out."""

    def __init__(self, consumers):
        self.curr = 0
        self.cursor = {c: -1 for c in consumers}
        self.lookups = []  # (batch, fqn, ids, states)
        self.known = set()

    def step(self):
        self.curr += 1

    def record(self, tables):
        for fqn, (ids, states) in tables.items():
            self.lookups.append((self.curr, fqn, ids, states))
            self.known.add(fqn)

    def get_delta(self, consumer):
        rows = {fqn: {} for fqn in self.known}
        for batch, fqn, ids, states in self.lookups:
            if batch >= self.cursor[consumer]:
                for i, row_id in enumerate(ids):
                    rows[fqn].setdefault(row_id, states[i] if states else None)
        self.cursor[consumer] = self.curr + 1
        return {fqn: sorted(r.items()) for fqn, r in rows.items()}

    def clear(self, consumer=None):
        if consumer is None or len(self.cursor) == 1:
            self.lookups, self.known = [], set()


class RandomizedAgainstTheRulesTest(unittest.TestCase):
    """Random sequences of steps, records, reads by three consumers and
    clears: the adapter over the service answers every read as the rules."""

    def run_sequence(self, server, mode, delete_on_read, seed, ops=150):
        rng = random.Random(seed)
        # What earlier sequences left in the open batch is not this one's.
        with TrackerClient(server.target) as client:
            client.step()
        consumers = [f"s{seed}_{i}" for i in range(3)]
        features = {"f0": f"r{seed}.t0", "f1": f"r{seed}.t0",
                    "f2": f"r{seed}.t1"}
        tracker = RemoteModelDeltaTracker(
            server.target, consumers=consumers, delete_on_read=delete_on_read,
            mode=mode, feature_to_fqn=features)
        rules = TorchRecRules(consumers)
        embedding = mode == TrackingMode.EMBEDDING
        for op in range(ops):
            r = rng.random()
            if r < 0.25:
                tracker.step()
                rules.step()
            elif r < 0.65:
                keys = sorted(rng.sample(sorted(features), rng.randint(1, 3)))
                batch = {k: [rng.randrange(12) for _ in range(rng.randint(1, 4))]
                         for k in keys}
                per_table = {}
                for k in keys:  # a table's IDs in key order, as TorchRec
                    per_table.setdefault(features[k], []).extend(batch[k])
                state_rows = [[float(op), float(i)] for k in keys
                              for i in batch[k]]
                tracker.record_lookup(
                    {k: Jagged(v) for k, v in batch.items()},
                    torch.tensor(state_rows) if embedding else None)
                tables, offset = {}, 0
                for k in keys:
                    n = len(batch[k])
                    fqn = features[k]
                    ids, states = tables.setdefault(
                        fqn, ([], [] if embedding else None))
                    ids.extend(batch[k])
                    if embedding:
                        states.extend(state_rows[offset:offset + n])
                    offset += n
                rules.record(tables)
            elif r < 0.95:
                consumer = rng.choice(consumers)
                got = tracker.get_delta(consumer)
                want = rules.get_delta(consumer)
                got_rows = {
                    fqn: sorted(zip(d.ids.tolist(),
                                    d.states.tolist() if embedding
                                    else [None] * len(d.ids)))
                    for fqn, d in got.items()}
                self.assertEqual(got_rows, want,
                                 f"seed {seed}, op {op}: {consumer}")
            else:
                consumer = rng.choice([None] + consumers)
                tracker.clear(consumer)
                rules.clear(consumer)

    def test_id_only_with_delete_on_read(self):
        with ServerProcess(SERVER, ["--mode=id_only"]) as server:
            for seed in range(4):
                self.run_sequence(server, TrackingMode.ID_ONLY, True, seed)

    def test_embedding_without_delete_on_read(self):
        with ServerProcess(SERVER, ["--mode=embedding",
                                    "--delete_on_read=false"]) as server:
            for seed in range(4, 8):
                self.run_sequence(server, TrackingMode.EMBEDDING, False, seed)

    def test_embedding_with_acknowledged_reads(self):
        # The adapter commits each read: TorchRec's read moves the cursor.
        with ServerProcess(SERVER, ["--mode=embedding",
                                    "--acknowledged_reads"]) as server:
            for seed in range(8, 10):
                self.run_sequence(server, TrackingMode.EMBEDDING, True, seed)


class LostRowsTest(unittest.TestCase):
    """Rows dropped under the service's memory cap: tracker_server cannot
    read every row in their place, so the read says they are lost, once."""

    def test_a_read_after_a_drop_raises_once(self):
        with ServerProcess(SERVER, ["--mode=id_only",
                                    "--memory_cap_bytes=4096"]) as server:
            t = RemoteModelDeltaTracker(server.target, consumers=["x"])
            t.record_lookup({"f": Jagged(list(range(5000)))}, None)
            t.step()  # the service's step drops what is over the cap
            t.step()
            with self.assertRaisesRegex(torchrec_tracker.ResyncRequired,
                                        r"consumer 'x' lost [1-9]\d* rows.*"
                                        "cannot read every row"):
                t.get_delta("x")
            t.step()  # TorchRec's read moved the cursor past the open batch
            t.record_lookup({"f": Jagged([7, 3, 7])}, None)
            self.assertEqual(ids_of(t.get_delta("x")), {"f": [3, 7]})


if __name__ == "__main__":
    unittest.main()
