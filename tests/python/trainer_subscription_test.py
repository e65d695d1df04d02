"""A PyTorch model kept up to date from a subscription to the real trainer,
checked row for row against the real predictor's Lookup at the same model
version; plus top-k with scores and the predictor's errors."""

import os
import time
import unittest

import grpc
import numpy as np
import torch

import deltastream
from deltastream.torchrec_tracker import RemoteModelDeltaTracker, TrackingMode
from server_process import ServerProcess

PROBE_IDS = np.arange(16, dtype=np.int64)  # Zipf data: the hot rows


def traced_tables(client, timeout=60):
    """The fqns in the trainer's status. They appear with the first step's
    lookups, which on a loaded machine may come after the listening line."""
    deadline = time.monotonic() + timeout
    while True:
        tables = [t.fqn for t in client.status().tables]
        if tables:
            return tables
        if time.monotonic() > deadline:
            raise AssertionError(f"no table in status after {timeout} s")
        time.sleep(0.1)


class TrainerSubscriptionTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        work = os.path.join(os.environ["TEST_TMPDIR"], "trainer")
        os.makedirs(work, exist_ok=True)
        config = os.path.join(work, "trainer.textproto")
        with open(config, "w") as f:
            f.write('tracker { consumers: "predictor" consumers: "py" '
                    'consumers: "top" mode: "rowwise_adagrad" acknowledged_reads: true }\n'
                    "log_every_steps: 0\n")
        cls.trainer = ServerProcess("trainer/trainer", [
            f"--config={config}", "--steps=-1",
            f"--checkpoint_dir={work}/run"])
        cls.predictor = ServerProcess("clients/predictor", [
            f"--target={cls.trainer.target}"])

    @classmethod
    def tearDownClass(cls):
        cls.predictor.stop()
        cls.trainer.stop()

    def test_model_follows_the_trainer_as_the_predictor_does(self):
        with deltastream.TrackerClient(self.trainer.target, timeout=20) as c, \
                deltastream.PredictorClient(self.predictor.target,
                                            timeout=10) as p:
            fqn = sorted(traced_tables(c))[0]
            model = None
            history = {}  # model version -> probe rows
            matched = None
            lookup = None
            with c.subscribe("py", fqns=[fqn], all_rows=True,
                             every_steps=1, timeout=60) as subscription:
                for delta in subscription:
                    table = delta.tables[fqn]
                    if model is None:  # the first push holds every row
                        self.assertTrue(delta.all_rows)
                        rows, dim = table.values.shape
                        model = torch.nn.EmbeddingBag(rows, dim, mode="sum")
                        model.requires_grad_(False)
                    ids = torch.from_numpy(np.array(table.ids))
                    model.weight[ids] = torch.from_numpy(
                        np.array(table.values))
                    c.commit("py", delta.end_batch)
                    history[delta.end_batch] = model.weight[
                        torch.from_numpy(PROBE_IDS)].numpy().copy()
                    # The predictor follows the same trainer: at a version
                    # the model passed through, its rows are the model's.
                    try:
                        lookup = p.lookup(fqn, PROBE_IDS)
                    except grpc.RpcError as e:  # not bootstrapped yet
                        self.assertEqual(e.code(), grpc.StatusCode.UNAVAILABLE)
                        continue
                    if lookup.version in history:
                        matched = lookup
                        break
            seen = lookup.version if lookup is not None else None
            self.assertIsNotNone(matched, f"no common version: predictor at "
                                 f"{seen}, model at {sorted(history)[-5:]}")
            self.assertEqual(matched.missing_ids, [])
            np.testing.assert_array_equal(matched.rows,
                                          history[matched.version])
            # A forward pass of the updated model works on its rows.
            pooled = model(torch.tensor([[0, 1]]))
            self.assertEqual(tuple(pooled.shape), (1, model.weight.shape[1]))
            self.assertTrue(p.status().ready)
            # No IDs, and IDs of another integer width, are IDs too.
            self.assertEqual(p.lookup(fqn, []).rows.shape,
                             (0, model.weight.shape[1]))
            narrow = p.lookup(fqn, np.asarray(PROBE_IDS, np.int32))
            self.assertEqual(narrow.rows.shape[0], len(PROBE_IDS))
            with self.assertRaises(grpc.RpcError) as error:
                p.lookup("no.such.table", PROBE_IDS)
            self.assertEqual(error.exception.code(), grpc.StatusCode.NOT_FOUND)

    def test_top_k_with_scores_from_the_trainer(self):
        with deltastream.TrackerClient(self.trainer.target, timeout=20) as c:
            c.get("top")  # skip to now
            c.commit("top", c.get("top").end_batch)
            time.sleep(0.2)
            delta = c.get("top", top_k=3, include_scores=True)
            for fqn, table in delta.tables.items():
                self.assertLessEqual(table.ids.shape[0], 3, fqn)
                self.assertEqual(table.scores.shape, table.ids.shape)
                self.assertEqual(table.values.shape[0], table.ids.shape[0])
            c.commit("top", delta.end_batch)

    def test_get_unique_through_the_torchrec_adapter(self):
        with deltastream.TrackerClient(self.trainer.target, timeout=20) as c:
            settings = c.status()
            tracker = RemoteModelDeltaTracker(
                client=c, consumers=["unique"],
                delete_on_read=settings.delete_on_read,
                mode=TrackingMode.ROWWISE_ADAGRAD)
            time.sleep(0.2)
            unique = tracker.get_unique("unique", top_percentage=0.5,
                                        sorted_by_indices=False)
            self.assertEqual(set(unique), {t.fqn for t in settings.tables})
            for fqn, rows in unique.items():
                scores = rows.scores.tolist()
                self.assertEqual(scores, sorted(scores, reverse=True), fqn)
                self.assertEqual(rows.ids.shape[0], rows.states.shape[0])


if __name__ == "__main__":
    unittest.main()
