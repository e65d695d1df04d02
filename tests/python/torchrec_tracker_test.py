"""RemoteModelDeltaTracker against the real tracker_server, on TorchRec's
worked cases: each expected value below is what TorchRec's in-process
ModelDeltaTracker returns at the same call (its rules: step() moves the
batch index; get_delta(c) returns the unique rows recorded at or after c's
cursor, through the open batch, and moves c's cursor past the open batch;
clear() forgets everything; clear(c) with several consumers does nothing).
"""

import unittest

import grpc
import torch

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


if __name__ == "__main__":
    unittest.main()
