"""deltastream.TrackerClient against the real tracker_server on loopback:
push/step/get (one chunk and many), subscribe, acknowledged reads and
commit, consumers, status, errors, and the .npz reader on a file written by
the real deltactl."""

import os
import re
import subprocess
import threading
import time
import unittest

import grpc
import numpy as np

import deltastream
from server_process import ServerProcess, runfile

SERVER = "tracker_service/tracker_server"


class TrackerClientTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.server = ServerProcess(SERVER, ["--mode=embedding",
                                            "--consumers=a,b,sub"])
        cls.client = deltastream.TrackerClient(cls.server.target, timeout=10)

    @classmethod
    def tearDownClass(cls):
        cls.client.close()
        rc = cls.server.stop()
        assert rc == 0, f"tracker_server exited {rc}"

    def test_push_step_get_in_one_chunk_and_in_many(self):
        ids = np.array([7, 3, 7, 5], dtype=np.int32)  # int32 widens to int64
        states = np.arange(12, dtype=np.float16).reshape(4, 3)
        self.client.push({"m.t_half": (ids, states)})
        self.client.step()
        one = self.client.get("a", fqns=["m.t_half"])
        table = one.tables["m.t_half"]
        np.testing.assert_array_equal(table.ids, [3, 5, 7])
        self.assertEqual(table.ids.dtype, np.int64)
        self.assertEqual(table.states.dtype, np.float16)
        # First state of each ID (embedding mode keeps the first).
        np.testing.assert_array_equal(table.states, states[[1, 3, 0]])
        # One chunk: the arrays are views of the received bytes.
        self.assertFalse(table.ids.flags.owndata)
        self.assertFalse(table.ids.flags.writeable)
        self.assertLess(one.start_batch, one.end_batch)
        # 8 bytes per chunk: one row per chunk, assembled into one array.
        many = self.client.get("b", fqns=["m.t_half"], max_chunk_bytes=8)
        np.testing.assert_array_equal(many.tables["m.t_half"].ids, [3, 5, 7])
        np.testing.assert_array_equal(many.tables["m.t_half"].states,
                                      states[[1, 3, 0]])
        self.assertTrue(many.tables["m.t_half"].ids.flags.owndata)

    def test_subscribe_pushes_each_closed_batch(self):
        def push(i):
            self.client.push({"m.sub": (np.array([i, 100 + i]),
                                        np.full((2, 2), i, np.float32))})
            self.client.step()
        push(0)  # the table must be known before a read names it
        got = []
        with self.client.subscribe("sub", fqns=["m.sub"], every_steps=1,
                                   timeout=20) as subscription:
            for i in (1, 2):
                push(i)
            for delta in subscription:
                got.extend(delta.tables["m.sub"].ids.tolist())
                if len(got) >= 6:
                    break
        self.assertEqual(sorted(got), [0, 1, 2, 100, 101, 102])

    def test_cancel_from_another_thread_ends_the_iteration(self):
        # A loop over a subscription ends cleanly when another thread
        # cancels it, as a sharded trainer's polling subscription does.
        self.client.push({"m.cancel": (np.array([1]),
                                       np.ones((1, 2), np.float32))})
        self.client.step()
        self.client.add_consumer("cancelled")
        with self.client.subscribe("cancelled", fqns=["m.cancel"],
                                   every_steps=1, timeout=20) as subscription:
            timer = threading.Timer(0.5, subscription.cancel)
            timer.start()
            start = time.monotonic()
            for _ in subscription:  # no step: only the cancel ends it
                pass
            timer.join()
        self.assertLess(time.monotonic() - start, 10)

    def test_consumers_status_and_errors(self):
        self.assertIn("a", self.client.consumers())
        self.assertIn("late", self.client.add_consumer("late"))
        self.assertNotIn("late", self.client.remove_consumer("late"))
        status = self.client.status()
        self.assertEqual(status.mode, "embedding")
        self.assertTrue(status.delete_on_read)
        self.assertEqual({c.name for c in status.consumers},
                         set(self.client.consumers()))
        with self.assertRaises(grpc.RpcError) as error:
            self.client.get("nobody")
        self.assertEqual(error.exception.code(), grpc.StatusCode.NOT_FOUND)
        with self.assertRaises(ValueError):
            self.client.get("")
        with self.assertRaises(ValueError):
            self.client.get("a", top_k="ten")

    def test_a_refused_read_is_an_rpc_error_with_the_reason(self):
        # Scores in embedding mode need the trainer's live rows.
        with self.assertRaises(grpc.RpcError) as error:
            self.client.get("a", fqns=["m.t_half"], top_k=2,
                            include_scores=True)
        self.assertEqual(error.exception.code(),
                         grpc.StatusCode.FAILED_PRECONDITION)
        self.assertIn("trainer", error.exception.details())

    def test_npz_written_by_deltactl(self):
        self.client.push({"m.npz": (np.array([4, 9]),
                                    np.ones((2, 2), np.float32))})
        self.client.step()
        path = os.path.join(os.environ["TEST_TMPDIR"], "delta.npz")
        subprocess.run([runfile("clients/deltactl"), "get",
                        f"--target={self.server.target}", "--consumer=b",
                        f"--out={path}"], check=True, timeout=30,
                       stdout=subprocess.DEVNULL)
        delta = deltastream.read_delta_npz(path)
        self.assertEqual(delta.consumer, "b")
        self.assertLess(delta.start_batch, delta.end_batch)
        np.testing.assert_array_equal(delta.tables["m.npz"].ids, [4, 9])
        np.testing.assert_array_equal(delta.tables["m.npz"].states,
                                      np.ones((2, 2), np.float32))
        self.assertFalse(delta.resync_required)
        bad = os.path.join(os.environ["TEST_TMPDIR"], "bad.npz")
        np.savez(bad, x=np.zeros(2))
        with self.assertRaises(ValueError):
            deltastream.read_delta_npz(bad)


class AcknowledgedReadsTest(unittest.TestCase):

    def test_a_read_repeats_until_committed(self):
        with ServerProcess(SERVER, ["--acknowledged_reads",
                                    "--consumers=ack"]) as server, \
                deltastream.TrackerClient(server.target,
                                          timeout=10) as client:
            client.push({"m.t": np.array([5, 6])})
            client.step()
            first = client.get("ack")
            np.testing.assert_array_equal(first.tables["m.t"].ids, [5, 6])
            again = client.get("ack")  # not committed: the same rows
            np.testing.assert_array_equal(again.tables["m.t"].ids, [5, 6])
            client.commit("ack", again.end_batch)
            client.push({"m.t": np.array([8])})
            client.step()
            after = client.get("ack")
            np.testing.assert_array_equal(after.tables["m.t"].ids, [8])
            status = client.status()
            self.assertTrue(status.acknowledged_reads)


class DocsExamplesTest(unittest.TestCase):
    """The examples of docs/python.md that need only a tracker run as
    written (the trainer's and predictor's are trainer_subscription_test's
    cases)."""

    def test_examples_run(self):
        with open(runfile("docs/python.md")) as f:
            blocks = re.findall(r"```python\n(.*?)```", f.read(), re.S)
        runnable = [b for b in blocks if "DELTASTREAM_TARGET" in b
                    and "embedding_bags" not in b]
        self.assertGreaterEqual(len(runnable), 3)
        with ServerProcess(SERVER, ["--mode=embedding", "--acknowledged_reads",
                                    "--consumers=reader,ack"]) as server:
            os.environ["DELTASTREAM_TARGET"] = server.target
            for block in runnable:
                with self.subTest(block=block.splitlines()[-1]):
                    exec(compile(block, "docs/python.md", "exec"), {})


class TensorsTest(unittest.TestCase):

    def test_round_trips_and_bfloat16(self):
        for array in (np.arange(6, dtype=np.float64).reshape(2, 3),
                      np.array([-1, 2**40], dtype=np.int64),
                      np.array([[0.5, -2]], dtype=np.float32)):
            back = deltastream.to_numpy(deltastream.from_numpy(array))
            np.testing.assert_array_equal(back, array)
            self.assertEqual(back.dtype, array.dtype)
        tensor = deltastream.from_numpy(np.zeros(2, np.float32))
        tensor.dtype = tensor.BFLOAT16
        tensor.data = np.array([0x3F80, 0xC000], "<u2").tobytes()  # 1, -2
        np.testing.assert_array_equal(deltastream.to_numpy(tensor), [1, -2])
        tensor.data = b"\0"
        with self.assertRaises(ValueError):
            deltastream.to_numpy(tensor)
        with self.assertRaises(ValueError):
            deltastream.from_numpy(np.array(["x"]))


def assemble(chunks):
    """What a client's _DeltaAssembler makes of `chunks`: the delta their
    last chunk ends, or None."""
    from deltastream.client import _DeltaAssembler
    assembler = _DeltaAssembler()
    delta = None
    for chunk in chunks:
        delta = assembler.add(chunk)
    return delta


class DenseAssemblyTest(unittest.TestCase):
    """A dense parameter in pieces (NamedTensor.piece_of), as the service
    sends one larger than a message, is put back together; pieces out of
    order, or a delta that ends within one, are an error."""

    @staticmethod
    def chunks(whole, big, per_piece):
        from deltastream._proto import tracker_pb2
        first = tracker_pb2.DeltaChunk()
        first.header.dense_parameters = 2
        first.dense.name = "whole"
        deltastream.from_numpy(whole, first.dense.tensor)
        out = [first]
        flat = big.reshape(-1)
        for offset in range(0, flat.size, per_piece):
            chunk = tracker_pb2.DeltaChunk()
            chunk.dense.name = "big"
            chunk.dense.piece_offset = offset
            chunk.dense.piece_of.extend(big.shape)
            deltastream.from_numpy(flat[offset:offset + per_piece],
                                   chunk.dense.tensor)
            out.append(chunk)
        out[-1].last = True
        return out

    def test_pieces_in_order_make_the_parameter(self):
        whole = np.arange(4, dtype=np.float32)
        big = np.random.default_rng(3).standard_normal((5, 7)).astype(
            np.float32)
        delta = assemble(self.chunks(whole, big, 12))
        self.assertEqual(list(delta.dense), ["whole", "big"])
        np.testing.assert_array_equal(delta.dense["whole"], whole)
        np.testing.assert_array_equal(delta.dense["big"], big)

    def test_pieces_out_of_order_or_cut_short_are_errors(self):
        whole = np.arange(4, dtype=np.float32)
        big = np.ones((5, 7), np.float32)
        swapped = self.chunks(whole, big, 12)
        swapped[1], swapped[2] = swapped[2], swapped[1]
        with self.assertRaisesRegex(ValueError, "out of order"):
            assemble(swapped)
        ended = self.chunks(whole, big, 12)[:-1]
        ended[-1].last = True
        with self.assertRaisesRegex(ValueError, "within dense parameter"):
            assemble(ended)


class RowAssemblyTest(unittest.TestCase):
    """A table in several chunks is put back together; chunks out of row
    order, or a delta that ends before a table's last rows, are an error
    (rows left out would be read uninitialised, or the table lost)."""

    @staticmethod
    def chunks(ids, states, per_chunk):
        from deltastream._proto import tracker_pb2
        out = []
        for offset in range(0, len(ids), per_chunk):
            chunk = tracker_pb2.DeltaChunk(fqn="t", row_offset=offset,
                                           table_rows=len(ids))
            deltastream.from_numpy(ids[offset:offset + per_chunk], chunk.ids)
            deltastream.from_numpy(states[offset:offset + per_chunk],
                                   chunk.states)
            out.append(chunk)
        out[0].header.fqns.append("t")
        return out

    @staticmethod
    def assemble(chunks):
        chunks[-1].last = True
        return assemble(chunks)

    def setUp(self):
        self.ids = np.arange(100, dtype=np.int64)
        self.states = np.random.default_rng(5).standard_normal(
            (100, 4)).astype(np.float32)

    def test_chunks_in_order_make_the_table(self):
        delta = self.assemble(self.chunks(self.ids, self.states, 30))
        np.testing.assert_array_equal(delta.tables["t"].ids, self.ids)
        np.testing.assert_array_equal(delta.tables["t"].states, self.states)

    def test_rows_left_out_or_out_of_order_are_errors(self):
        missing = self.chunks(self.ids, self.states, 30)
        del missing[1]
        with self.assertRaisesRegex(ValueError,
                                    "rows from 60 where row 30 came next"):
            self.assemble(missing)
        swapped = self.chunks(self.ids, self.states, 30)
        swapped[1], swapped[2] = swapped[2], swapped[1]
        with self.assertRaisesRegex(ValueError, "came next"):
            self.assemble(swapped)
        cut_short = self.chunks(self.ids, self.states, 30)[:-1]
        with self.assertRaisesRegex(ValueError, "ended with 90 of its 100"):
            self.assemble(cut_short)
        no_states = self.chunks(self.ids, self.states, 30)
        no_states[-1].ClearField("states")
        with self.assertRaisesRegex(ValueError, "a chunk of"):
            self.assemble(no_states)


if __name__ == "__main__":
    unittest.main()
