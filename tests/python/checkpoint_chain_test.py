"""deltastream's checkpoint-chain reader against chains written by the C++
writer (tests/python/chain_tool: store/checkpoint_chain's
WriteChainLinkContent) and by the real checkpoint job following the real
trainer; every table compared, bit for bit, with what the C++ loader
(LoadChain, the trainer's restore) makes of the same chain. "DSCHAIN1" links,
damaged links and broken chains too, and links written here that the C++
loader refuses (or reads) alike."""

import json
import os
import re
import shutil
import struct
import subprocess
import tracemalloc
import unittest
import zlib

import numpy as np

import deltastream
from deltastream._proto import checkpoint_pb2, tensor_pb2
from server_process import ServerProcess, runfile

TMP = os.environ.get("TEST_TMPDIR", "/tmp")


def run(*args, check=True):
    result = subprocess.run(list(args), capture_output=True, text=True,
                            timeout=120)
    if check and result.returncode != 0:
        raise AssertionError(f"{args} exited {result.returncode}: "
                             f"{result.stderr}")
    return result


def cpp_load(directory):
    """What the C++ loader makes of `directory`, as {name: array}."""
    out = os.path.join(TMP, "cpp_load.npz")
    run(runfile("tests/python/chain_tool"), "load", directory, out)
    with np.load(out, allow_pickle=False) as archive:
        return {name: archive[name] for name in archive.files}


def fresh_dir(name):
    path = os.path.join(TMP, name)
    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(path)
    return path


def write_cpp_chain(name):
    directory = fresh_dir(name)
    run(runfile("tests/python/chain_tool"), "write", directory)
    return directory


class CheckpointChainTest(unittest.TestCase):

    def assert_same_as_cpp(self, directory):
        """Python's load_chain equals the C++ loader's, table by table."""
        loaded = deltastream.load_chain(directory)
        cpp = cpp_load(directory)
        fqns = sorted({name.rsplit("/", 1)[0] for name in cpp
                       if not name.startswith(("dense/", "chain/"))})
        self.assertEqual(sorted(loaded.tables), fqns)
        for fqn in fqns:
            table = loaded.tables[fqn]
            np.testing.assert_array_equal(table.ids, cpp[fqn + "/ids"])
            self.assertEqual(table.ids.dtype, np.int64)
            self.assertEqual(table.values.dtype, cpp[fqn + "/values"].dtype,
                             fqn)
            self.assertEqual(table.values.shape, cpp[fqn + "/values"].shape,
                             fqn)
            np.testing.assert_array_equal(table.values, cpp[fqn + "/values"])
        dense = {name[len("dense/"):]: array for name, array in cpp.items()
                 if name.startswith("dense/")}
        self.assertEqual(sorted(name for name, _ in loaded.dense),
                         sorted(dense))
        for name, array in loaded.dense:
            np.testing.assert_array_equal(array, dense[name])
        self.assertEqual(loaded.end_batch, int(cpp["chain/end_batch"]))
        self.assertEqual(loaded.dense_batch, int(cpp["chain/dense_batch"]))
        return loaded

    def test_reads_a_chain_written_by_the_cpp_writer(self):
        directory = write_cpp_chain("cpp_chain")
        links = deltastream.list_chain(directory)
        self.assertEqual([(l.full, l.start_batch, l.end_batch) for l in links],
                         [(True, 0, 10), (False, 10, 20), (False, 20, 25)])
        self.assertEqual(deltastream.chain_problems(links), [])
        loaded = self.assert_same_as_cpp(directory)
        self.assertEqual(loaded.end_batch, 25)
        self.assertEqual(loaded.run_id, "run-2")
        self.assertEqual(loaded.run_start_batch, 20)
        self.assertEqual(loaded.dense_batch, 25)
        self.assertEqual([name for name, _ in loaded.dense],
                         ["mlp.weight", "mlp.bias"])
        # Independently of the C++ loader: rows 40..59 of m.f32 are the
        # increment's ((id % 16) / 2 + column + 1), the rest the full link's.
        f32 = loaded.tables["m.f32"]
        np.testing.assert_array_equal(f32.ids, np.arange(60))
        expected = ((f32.ids % 16) / 2)[:, None] + np.arange(4)[None, :]
        expected[40:] += 1
        np.testing.assert_array_equal(f32.values, expected)
        self.assertEqual(loaded.tables["m.f16"].values.dtype, np.float16)
        self.assertEqual(loaded.tables["m.f64"].values.dtype, np.float64)
        bf16 = loaded.tables["m.bf16"]  # widened to float32, exactly
        self.assertEqual(bf16.values.dtype, np.float32)
        np.testing.assert_array_equal(bf16.ids,
                                      np.union1d([1, 7], np.arange(5, 25)))
        np.testing.assert_array_equal(loaded.tables["m.empty"].ids, [-3, 9])
        third = deltastream.read_chain_link(links[2].path)
        self.assertEqual(third.consumer, "chain_tool")
        self.assertEqual((third.run_id, third.run_start_batch), ("run-2", 20))
        self.assertEqual(third.tables["m.f32"].ids.size, 0)
        self.assertGreater(third.written_unix_ms, 0)

    def test_reads_dschain1_links(self):
        # A "DSCHAIN1" full link (one message with its data) made here, under
        # the C++ writer's increments: both loaders agree, and deltactl
        # verifies it.
        directory = write_cpp_chain("v1_chain")
        os.remove(os.path.join(directory, "full-000000000000-000000000010.ckpt"))
        link = checkpoint_pb2.CheckpointLink(
            full=True, start_batch=0, end_batch=10, consumer="old",
            written_unix_ms=1, run_id="run-0", dense_batch=10)
        for fqn, ids, values in [
                ("m.f32", np.arange(0, 45, 3),
                 np.arange(15 * 4, dtype=np.float32).reshape(15, 4)),
                ("m.f16", np.array([4, 5]), np.ones((2, 3), np.float16))]:
            table = link.tables.add(fqn=fqn)
            deltastream.from_numpy(ids, table.ids)
            deltastream.from_numpy(values, table.values)
        parameter = link.dense.add(name="mlp.weight")
        deltastream.from_numpy(np.eye(2, dtype=np.float32), parameter.tensor)
        payload = link.SerializeToString()
        with open(os.path.join(
                directory, "full-000000000000-000000000010.ckpt"), "wb") as f:
            f.write(b"DSCHAIN1" + struct.pack("<QI", len(payload),
                                              zlib.crc32(payload)) + payload)
        loaded = self.assert_same_as_cpp(directory)
        np.testing.assert_array_equal(
            loaded.tables["m.f32"].ids,
            np.union1d(np.arange(0, 45, 3), np.arange(40, 60)))
        listed = run(runfile("clients/deltactl"), "chain",
                     f"--dir={directory}", "--json")
        self.assertEqual(json.loads(listed.stdout)["problems"], [])

    def test_damaged_links_and_broken_chains_are_refused(self):
        directory = write_cpp_chain("damaged_chain")
        incr = os.path.join(directory, "incr-000000000010-000000000020.ckpt")
        with open(incr, "rb") as f:
            original = f.read()

        def refused(data, message):
            with open(incr, "wb") as f:
                f.write(data)
            with self.assertRaises(deltastream.ChainError) as raised:
                deltastream.load_chain(directory)
            self.assertIn(message, str(raised.exception))
            # The C++ loader refuses it too.
            result = run(runfile("tests/python/chain_tool"), "load",
                         directory, os.path.join(TMP, "x.npz"), check=False)
            self.assertEqual(result.returncode, 1, result.stderr)

        flipped = bytearray(original)
        flipped[-3] ^= 0x40  # inside the last record's data
        refused(bytes(flipped), "fails its checksum")
        refused(original[:-5], "truncated")
        refused(original + b"\0", "after its last record")
        refused(b"NOTACHAIN" + original[9:], "is not a checkpoint link")
        with open(incr, "wb") as f:
            f.write(original)
        deltastream.load_chain(directory)  # sound again

        # A link renamed to other batches, then a hole.
        moved = os.path.join(directory, "incr-000000000010-000000000021.ckpt")
        os.rename(incr, moved)
        with self.assertRaises(deltastream.ChainError) as raised:
            deltastream.read_chain_link(moved)
        self.assertIn("not what its name says", str(raised.exception))
        os.remove(moved)
        problems = deltastream.chain_problems(deltastream.list_chain(directory))
        self.assertEqual(len(problems), 1)
        self.assertIn("batches 10..19 missing between", problems[0])
        with self.assertRaises(deltastream.ChainError):
            deltastream.load_chain(directory)
        with self.assertRaises(deltastream.ChainError):
            deltastream.load_chain(fresh_dir("empty_chain"))

    def test_reads_the_chain_the_checkpoint_job_writes(self):
        work = fresh_dir("job")
        config = os.path.join(work, "trainer.textproto")
        with open(config, "w") as f:
            f.write('model { tables { name: "t0" num_embeddings: 500 '
                    'embedding_dim: 8 } tables { name: "t1" num_embeddings: '
                    '300 embedding_dim: 8 } dense_arch: 8 }\n'
                    'data { batch_size: 32 }\n'
                    'tracker { consumers: "checkpoint" acknowledged_reads: '
                    'true }\nlog_every_steps: 0\n')
        chain = os.path.join(work, "chain")
        with ServerProcess("trainer/trainer",
                           [f"--config={config}", "--steps=-1"]) as trainer:
            job = run(runfile("clients/checkpoint_job"),
                      f"--target={trainer.target}", f"--dir={chain}",
                      "--every_ms=200", "--count=3", "--retry_s=30")
            self.assertEqual(job.returncode, 0, job.stderr)
        links = deltastream.list_chain(chain)
        self.assertEqual(len(links), 3)
        self.assertTrue(links[0].full)
        listed = json.loads(run(runfile("clients/deltactl"), "chain",
                                f"--dir={chain}", "--json").stdout)
        self.assertEqual(
            [(l.full, l.start_batch, l.end_batch, l.bytes) for l in links],
            [(e["kind"] == "full", e["start_batch"], e["end_batch"],
              e["bytes"]) for e in listed["links"]])
        loaded = self.assert_same_as_cpp(chain)
        # The full link holds every row of both tables.
        rows = {fqn: t.values.shape for fqn, t in loaded.tables.items()}
        self.assertEqual(sorted(shape for shape in rows.values()),
                         [(300, 8), (500, 8)], rows)
        self.assertTrue(loaded.dense)
        full = deltastream.read_chain_link(links[0].path)
        self.assertEqual(full.consumer, "checkpoint")
        self.assertTrue(full.run_id)

        # docs/python.md's example, run as the page says, on this chain.
        with open(runfile("docs/python.md")) as f:
            blocks = [b for b in re.findall(r"```python\n(.*?)```", f.read(),
                                            re.S) if "load_chain(" in b]
        self.assertEqual(len(blocks), 1)
        example = os.path.join(work, "example.py")
        with open(example, "w") as f:
            f.write(blocks[0])
        printed = run("/usr/bin/python3", example, chain).stdout
        self.assertIn(f"{loaded.end_batch} {loaded.run_id}", printed)


def record(data):
    """One "DSCHAIN2" record: size, CRC-32, bytes."""
    return struct.pack("<QI", len(data), zlib.crc32(data)) + data


def describe(wire, array_or_shape, dtype=None):
    """Fills a description (dtype and shape, no data); the array's bytes,
    or b"" for a bare shape."""
    if dtype is None:
        deltastream.from_numpy(array_or_shape, wire)
        data, wire.data = wire.data, b""
        return data
    wire.dtype = dtype
    wire.shape.extend(array_or_shape)
    return b""


def write_link(directory, full, start, end, tables=(), dense=(), name=None):
    """A "DSCHAIN2" link made here: tables (fqn, ids, values), each an
    array or, for a bare description, (shape, wire dtype); dense (name,
    shape, wire dtype, bytes)."""
    link = checkpoint_pb2.CheckpointLink(full=full, start_batch=start,
                                         end_batch=end)
    data = b""
    for fqn, ids, values in tables:
        table = link.tables.add(fqn=fqn)
        for wire, array in ((table.ids, ids), (table.values, values)):
            raw = (describe(wire, *array) if isinstance(array, tuple)
                   else describe(wire, array))
            data += record(raw) if raw else b""
    for parameter_name, shape, dtype, raw in dense:
        parameter = link.dense.add(name=parameter_name)
        describe(parameter.tensor, shape, dtype)
        data += record(raw) if raw else b""
    if dense:
        link.dense_batch = end
    kind = "full" if full else "incr"
    path = os.path.join(directory,
                        name or f"{kind}-{start:012d}-{end:012d}.ckpt")
    with open(path, "wb") as f:
        f.write(b"DSCHAIN2" + record(link.SerializeToString()) + data)
    return path


class HandWrittenLinksTest(unittest.TestCase):
    """Links made here, each read by load_chain as the C++ loader (the
    trainer's restore) reads it."""

    def cpp_refuses(self, directory):
        result = run(runfile("tests/python/chain_tool"), "load", directory,
                     os.path.join(TMP, "x.npz"), check=False)
        self.assertEqual(result.returncode, 1, result.stderr)
        return result.stderr

    def test_rows_of_another_width_or_dtype_in_a_later_link(self):
        # The C++ MergeTables' DataLoss, naming the link and the table: not
        # NumPy's concatenate error, nor float16 rows silently widened.
        for name, later in [("width", np.ones((1, 2), np.float32)),
                            ("dtype", np.full((1, 4), 1e6, np.float32))]:
            with self.subTest(name):
                directory = fresh_dir("merge_" + name)
                write_link(directory, True, 0, 5, [
                    ("t", np.array([1, 2]), np.ones((2, 4), np.float16))])
                incr = write_link(directory, False, 5, 6, [
                    ("t", np.array([3]), later)])
                with self.assertRaises(deltastream.ChainError) as raised:
                    deltastream.load_chain(directory)
                message = str(raised.exception)
                self.assertIn(f"cannot load '{incr}'", message)
                self.assertIn("table 't' has rows of [4] float16 in one link",
                              message)
                self.assertIn("rows of", self.cpp_refuses(directory))

    def test_a_0d_bfloat16_dense_parameter(self):
        directory = fresh_dir("bf16_scalar")
        write_link(directory, True, 0, 5, [
            ("t", np.array([1]), np.ones((1, 2), np.float32))], dense=[
                ("temperature", [], tensor_pb2.Tensor.BFLOAT16,
                 struct.pack("<H", 0x3FC0)),  # 1.5
                ("scale", [2], tensor_pb2.Tensor.BFLOAT16,
                 struct.pack("<2H", 0x4000, 0xBF80))])  # 2, -1
        dense = dict(deltastream.load_chain(directory).dense)
        self.assertEqual(dense["temperature"].shape, ())
        self.assertEqual(dense["temperature"].dtype, np.float32)
        self.assertEqual(float(dense["temperature"]), 1.5)
        np.testing.assert_array_equal(dense["scale"], [2, -1])
        cpp = cpp_load(directory)
        for name, array in dense.items():
            np.testing.assert_array_equal(array, cpp["dense/" + name])
            self.assertEqual(array.shape, cpp["dense/" + name].shape)

    def test_shapes_past_the_bounds_do_not_decode(self):
        # CheckLayout's bounds (at most 8 dims, 2^40 elements in each and in
        # all), checked before a product can wrap int64.
        directory = fresh_dir("bad_shapes")
        f32 = tensor_pb2.Tensor.FLOAT32
        for shape, message in [
                ([1 << 32, 1 << 32], "dimension 4294967296"),
                ([0, 1 << 62], f"dimension {1 << 62}"),
                ([0, (1 << 40) + 1], f"dimension {(1 << 40) + 1}"),
                ([0] + [1] * 8, "tensor of 9 dims: at most 8")]:
            with self.subTest(shape=shape):
                path = write_link(directory, True, 0, 5, [
                    ("t", np.zeros(0, np.int64), (shape, f32))])
                with self.assertRaises(deltastream.ChainError) as raised:
                    deltastream.read_chain_link(path)
                self.assertIn("table 't' values does not decode: ",
                              str(raised.exception))
                self.assertIn(message, str(raised.exception))
                self.assertIn("does not decode", self.cpp_refuses(directory))

    def test_the_description_is_allocated_at_its_size(self):
        # A large link (sparse here) with a small description: read with
        # the memory its record says, not min(256 MiB, the file).
        directory = fresh_dir("big_link")
        path = write_link(directory, True, 0, 5)
        with open(path, "r+b") as f:
            f.truncate(64 << 20)
        tracemalloc.start()
        try:
            with self.assertRaisesRegex(deltastream.ChainError,
                                        "bytes after its last record"):
                deltastream.read_chain_link(path)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        self.assertLess(peak, 1 << 20)

    def test_link_names_and_links_that_vanish(self):
        # As the C++ ListChain: ASCII digits within int64 only; a link gone
        # between the listing and its size has 0 bytes.
        directory = fresh_dir("names")
        write_link(directory, True, 0, 5, [
            ("t", np.array([1]), np.ones((1, 2), np.float32))])
        gone = os.path.join(directory, "incr-000000000005-000000000006.ckpt")
        os.symlink(os.path.join(directory, "nowhere"), gone)
        links = deltastream.list_chain(directory)
        self.assertEqual([(l.start_batch, l.end_batch, l.bytes > 0)
                          for l in links], [(0, 5, True), (5, 6, False)])
        os.remove(gone)
        top = (1 << 63) - 1
        for name, batches in [
                ("incr-\u0665-\u0666.ckpt", None),  # Arabic-Indic 5, 6
                (f"incr-5-{top + 1}.ckpt", None),
                (f"incr-{top - 1}-{top}.ckpt", (top - 1, top))]:
            with self.subTest(name=name):
                path = os.path.join(directory, name)
                open(path, "wb").close()
                try:
                    if batches is None:
                        with self.assertRaisesRegex(
                                deltastream.ChainError,
                                "is not a checkpoint link name"):
                            deltastream.list_chain(directory)
                        self.assertIn("not a checkpoint link name",
                                      self.cpp_refuses(directory))
                    else:
                        self.assertEqual(
                            [(l.start_batch, l.end_batch)
                             for l in deltastream.list_chain(directory)],
                            [(0, 5), batches])
                finally:
                    os.remove(path)


if __name__ == "__main__":
    unittest.main()
