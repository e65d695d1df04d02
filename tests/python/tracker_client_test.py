"""deltastream.TrackerClient against the real tracker_server on loopback:
push/step/get (one chunk and many), subscribe, acknowledged reads and
commit, consumers, status, errors, touch (a consumer kept from the expiry,
an unknown one NOT_FOUND), and the .npz reader on a file written by the real
deltactl. Malformed delta streams and .npz files, and keepalive on an idle
subscription to a frozen host."""

import os
import re
import signal
import subprocess
import sys
import threading
import time
import unittest
import zipfile
from concurrent import futures
from unittest import mock

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


class TouchTest(unittest.TestCase):
    """touch keeps a consumer that reads nothing (busy elsewhere) from the
    tracker's consumer expiry, moving nothing; one not touched expires
    meanwhile; an unknown one is NOT_FOUND."""

    def test_touch_keeps_a_consumer_that_reads_nothing(self):
        with ServerProcess(SERVER, ["--consumers=declared",
                                    "--expire_consumers_after_s=1"]) as server, \
                deltastream.TrackerClient(server.target,
                                          timeout=10) as client:
            client.add_consumer("touched")
            client.add_consumer("silent")
            with self.assertRaises(grpc.RpcError) as error:
                client.touch("nobody")
            self.assertEqual(error.exception.code(),
                             grpc.StatusCode.NOT_FOUND)
            self.assertIn("'nobody'", error.exception.details())
            with self.assertRaises(ValueError):
                client.touch("")
            ids = 0
            until = time.monotonic() + 3.5
            while time.monotonic() < until:
                self.assertIsNone(client.touch("touched"))
                client.push({"m.t": np.array([ids])})
                client.step()
                ids += 1
                time.sleep(0.25)
            self.assertEqual(client.consumers(), ["declared", "touched"])
            self.assertGreaterEqual(client.status().consumers_expired, 1)
            with self.assertRaises(grpc.RpcError) as error:
                client.touch("silent")
            self.assertEqual(error.exception.code(),
                             grpc.StatusCode.NOT_FOUND)
            # Nothing moved: the touched consumer reads every batch.
            delta = client.get("touched")
            np.testing.assert_array_equal(delta.tables["m.t"].ids,
                                          np.arange(ids))


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

    @staticmethod
    def chunk(fqn, ids, table_rows, row_offset=0, values=None, header=None):
        from deltastream._proto import tracker_pb2
        chunk = tracker_pb2.DeltaChunk(fqn=fqn, row_offset=row_offset,
                                       table_rows=table_rows)
        if header is not None:
            chunk.header.fqns.extend(header)
        deltastream.from_numpy(np.asarray(ids, np.int64), chunk.ids)
        if values is not None:
            deltastream.from_numpy(values, chunk.values)
        return chunk

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

    def test_a_chunk_that_does_not_fit_its_table_is_an_error(self):
        # As the C++ client's RowsDestination: a later chunk of another
        # width, dtype or table size is refused, not broadcast or cast.
        first = self.chunk("t", [1, 2], 4, 0, np.ones((2, 4), np.float32),
                           header=["t"])
        for values, rows in [
                (np.array([[7.0], [8.0]], np.float32), 4),   # width 1
                (np.full((2, 4), 7.0, np.float64), 4),       # float64
                (np.ones((2, 4), np.float32), 3)]:           # 3 rows now
            later = self.chunk("t", [3, 4][:rows - 2], rows, 2,
                               values[:rows - 2])
            with self.subTest(values=values.dtype, rows=rows), \
                    self.assertRaisesRegex(ValueError,
                                           "table 't': a chunk of .* does "
                                           "not fit a table of "):
                self.assemble([first, later])
        # bfloat16 comes as float32, but is another dtype on the wire.
        later = self.chunk("t", [3, 4], 4, 2, np.ones((2, 4), np.float32))
        later.values.dtype = later.values.BFLOAT16
        later.values.data = np.full(8, 0x3F80, "<u2").tobytes()
        with self.assertRaisesRegex(ValueError, "bfloat16 .*float32"):
            self.assemble([first, later])

    def test_tables_and_dense_parameters_the_header_names_must_come(self):
        never = self.chunk("t", [1], 1, header=["t", "u"])
        with self.assertRaisesRegex(ValueError,
                                    "table 'u' named in the header never"):
            self.assemble([never])
        no_dense = self.chunk("t", [1], 1, header=["t"])
        no_dense.header.dense_parameters = 3
        with self.assertRaisesRegex(ValueError,
                                    "ended with 0 of its 3 dense parameters"):
            self.assemble([no_dense])

    def test_a_table_sent_twice_is_an_error(self):
        once = self.chunk("t", [1, 2], 2, header=["t"])
        again = self.chunk("t", [5, 6], 2)
        with self.assertRaisesRegex(ValueError, "table 't'.*sent twice"):
            self.assemble([once, again])

    def test_sizes_past_the_wire_bounds_are_value_errors(self):
        # Bounded before anything is allocated (the C++ CheckLayout), not
        # a MemoryError or NumPy's "array is too big".
        for rows in (1 << 41, 1 << 62):
            with self.subTest(rows=rows), self.assertRaisesRegex(
                    ValueError, f"table 't' ids: bad tensor shape: "
                    f"dimension {rows}"):
                self.assemble([self.chunk("t", [1], rows, header=["t"])])
        # At the bound: no memory for it, or the delta ends short of it.
        with self.assertRaisesRegex(ValueError, "table 't'"):
            self.assemble([self.chunk("t", [1], 1 << 40, header=["t"])])
        from deltastream._proto import tracker_pb2
        dense = tracker_pb2.DeltaChunk(last=True)
        dense.header.dense_parameters = 1
        dense.dense.name = "w"
        dense.dense.piece_of.extend([1 << 31, 1 << 31])
        deltastream.from_numpy(np.ones(4, np.float32), dense.dense.tensor)
        with self.assertRaisesRegex(ValueError, "dense parameter 'w': bad "
                                    "tensor shape"):
            assemble([dense])
        # A wire tensor whose shape's product wraps int64 to 0.
        wrapped = self.chunk("t", [], 0, header=["t"])
        wrapped.values.dtype = wrapped.values.FLOAT32
        wrapped.values.shape.extend([1 << 32, 1 << 32])
        with self.assertRaisesRegex(ValueError, "table 't': values: bad "
                                    "tensor shape"):
            self.assemble([wrapped])


class _Stream:
    """A stand-in for a gRPC response stream: the chunks, then the end;
    records cancel()."""

    def __init__(self, chunks):
        self._chunks = iter(chunks)
        self.cancelled = False

    def __iter__(self):
        return self

    def __next__(self):
        if self.cancelled:
            raise StopIteration
        return next(self._chunks)

    def cancel(self):
        self.cancelled = True


class MalformedStreamTest(unittest.TestCase):
    """A malformed delta ends its stream: the server stops sending."""

    @staticmethod
    def malformed():
        return [RowAssemblyTest.chunk("t", [1], 1, header=["t", "u"]),
                RowAssemblyTest.chunk("t", [2], 1)]

    def test_a_subscription_cancels_its_stream(self):
        chunks = self.malformed()
        chunks[0].last = True
        stream = _Stream(chunks)
        subscription = deltastream.Subscription(stream)
        with self.assertRaisesRegex(ValueError, "never came"):
            next(subscription)
        self.assertTrue(stream.cancelled)
        self.assertEqual(list(subscription), [])

    def test_a_read_cancels_its_stream(self):
        from deltastream.client import _read_delta
        chunks = self.malformed()
        chunks[1].last = True
        stream = _Stream(chunks)
        with self.assertRaisesRegex(ValueError, "sent twice"):
            _read_delta(stream)
        self.assertTrue(stream.cancelled)


class _Options:
    """Records the channel options grpc.insecure_channel and
    grpc.secure_channel are given; with `keepalive_ms`, shortens the
    keepalive to it (the rest of the options as the client set them)."""

    def __init__(self, keepalive_ms=None):
        self.seen = []
        self._keepalive_ms = keepalive_ms
        self._insecure = grpc.insecure_channel
        self._secure = grpc.secure_channel

    def _options(self, options):
        self.seen.append(dict(options))
        if self._keepalive_ms is None:
            return options
        short = ("grpc.keepalive_time_ms", "grpc.keepalive_timeout_ms")
        return [(k, self._keepalive_ms if k in short else v)
                for k, v in options]

    def insecure(self, target, options=None, **kwargs):
        return self._insecure(target, self._options(options), **kwargs)

    def secure(self, target, credentials, options=None, **kwargs):
        return self._secure(target, credentials, self._options(options),
                            **kwargs)

    def __enter__(self):
        self._patches = [mock.patch.object(grpc, "insecure_channel",
                                           self.insecure),
                         mock.patch.object(grpc, "secure_channel",
                                           self.secure)]
        for patch in self._patches:
            patch.start()
        return self

    def __exit__(self, *exc):
        for patch in self._patches:
            patch.stop()


# A TCP relay to 127.0.0.1:PORT (argv[1]); prints its own port.
_RELAY = """
import socket, sys, threading
listener = socket.socket()
listener.bind(("127.0.0.1", 0))
listener.listen()
print(listener.getsockname()[1], flush=True)
def pipe(a, b):
    while True:
        data = a.recv(65536)
        if not data:
            break
        b.sendall(data)
while True:
    client, _ = listener.accept()
    server = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
    for a, b in ((client, server), (server, client)):
        threading.Thread(target=pipe, args=(a, b), daemon=True).start()
"""


class KeepaliveTest(unittest.TestCase):
    """The channel keeps pinging a call that receives nothing (gRPC stops
    after 2 pings without data unless told otherwise), as the C++ client's
    (clients/delta_client.cc): an idle subscription to a host that died
    without a FIN or RST fails as UNAVAILABLE instead of hanging."""

    def test_channel_options_keep_pinging_without_data(self):
        with _Options() as options:
            deltastream.TrackerClient("127.0.0.1:1").close()
            deltastream.PredictorClient("127.0.0.1:1").close()
            deltastream.TrackerClient(
                "127.0.0.1:1", root_certificates=b"not a PEM").close()
        self.assertEqual(len(options.seen), 3)
        for seen in options.seen:
            self.assertEqual(seen.get("grpc.http2.max_pings_without_data"), 0)
            self.assertEqual(seen.get("grpc.keepalive_time_ms"), 20000)
            self.assertEqual(seen.get("grpc.keepalive_timeout_ms"), 20000)

    def test_an_idle_call_to_a_frozen_host_fails(self):
        # A call that never receives, through a relay that freezes (SIGSTOP:
        # no FIN, no RST) after 3 pings' time; keepalive shortened to 1 s.
        # Without pings past the second, the call would wait out its
        # deadline.
        def idle(request, context):
            while context.is_active():
                time.sleep(0.05)
            yield from ()
        server = grpc.server(futures.ThreadPoolExecutor(2), options=[
            ("grpc.http2.min_ping_interval_without_data_ms", 100),
            ("grpc.http2.max_ping_strikes", 0)])
        server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(
            "test.Idle",
            {"Wait": grpc.unary_stream_rpc_method_handler(idle)})])
        port = server.add_insecure_port("127.0.0.1:0")
        server.start()
        relay = subprocess.Popen([sys.executable, "-c", _RELAY, str(port)],
                                 stdout=subprocess.PIPE, text=True)
        try:
            relay_port = int(relay.stdout.readline())
            from deltastream.client import _channel
            with _Options(keepalive_ms=1000):
                channel = _channel(f"127.0.0.1:{relay_port}", None, 1 << 20)
            call = channel.unary_stream("/test.Idle/Wait")(b"", timeout=30)
            start = time.monotonic()
            freeze = threading.Timer(
                3.5, lambda: os.kill(relay.pid, signal.SIGSTOP))
            freeze.start()
            with self.assertRaises(grpc.RpcError) as error:
                for _ in call:
                    pass
            freeze.join()
            self.assertEqual(error.exception.code(),
                             grpc.StatusCode.UNAVAILABLE,
                             error.exception.details())
            self.assertLess(time.monotonic() - start, 20)
            channel.close()
        finally:
            relay.kill()
            relay.wait()
            relay.stdout.close()
            server.stop(0)


class NpzTest(unittest.TestCase):
    """read_delta_npz raises ValueError naming the file for a file that is
    not a whole delta (as its docstring promises), never zipfile's or
    NumPy's own errors, nor a delta with arrays that do not fit."""

    def write(self, name, **arrays):
        path = os.path.join(os.environ.get("TEST_TMPDIR", "/tmp"), name)
        entries = {"__delta__/start_batch": np.int64(0),
                   "__delta__/end_batch": np.int64(3),
                   "t/ids": np.array([1, 2], np.int64),
                   "t/values": np.ones((2, 4), np.float32)}
        entries.update(arrays)
        np.savez(path, **{k: v for k, v in entries.items() if v is not None})
        return path

    def refused(self, path, message):
        with self.assertRaisesRegex(ValueError, message) as raised:
            deltastream.read_delta_npz(path)
        self.assertIn(path, str(raised.exception))

    def test_damaged_files_are_value_errors(self):
        good = self.write("good.npz")
        delta = deltastream.read_delta_npz(good)
        np.testing.assert_array_equal(delta.tables["t"].ids, [1, 2])
        with open(good, "rb") as f:
            raw = bytearray(f.read())
        truncated = good[:-4] + "_truncated.npz"
        with open(truncated, "wb") as f:
            f.write(raw[:len(raw) // 2])
        self.refused(truncated, "not a readable .npz")
        with zipfile.ZipFile(good) as archive:
            info = archive.getinfo("t/values.npy")
        data = (info.header_offset + 30 + len(info.filename.encode()) +
                len(info.extra))
        raw[data + info.file_size - 1] ^= 0x01  # the last value's last byte
        flipped = good[:-4] + "_flipped.npz"
        with open(flipped, "wb") as f:
            f.write(raw)
        self.refused(flipped, "CRC")

    def test_arrays_that_are_not_a_delta_are_value_errors(self):
        self.refused(self.write("batch.npz", **{
            "__delta__/start_batch": np.array([0, 1])}),
                     "start_batch is int64 \\[2\\], not an integer scalar")
        self.refused(self.write("float_ids.npz", **{
            "t/ids": np.array([[1.5, 2]]), "t/values": None}),
                     "ids of float64 \\[1, 2\\], not int64")
        self.refused(self.write("rows.npz", **{
            "t/values": np.ones((5, 4), np.float32)}),
                     "2 ids and values of \\[5, 4\\]")


if __name__ == "__main__":
    unittest.main()
