"""Trainer checkpoints a PyTorch user can open (docs/checkpoints.md).

A checkpoint written by 2 sharded ranks (mixed plan: row-wise, column-wise,
data-parallel, table-wise tables; tests/trainer/checkpoint_resharding_test
--write_checkpoint) is opened with Debian's PyTorch: every rank file loads
with torch.load(weights_only=True), its pickle names only the globals that
weights_only allows, and the docs' snippet assembles every table and
optimizer state whole, equal to the values the ranks saved
(tests/trainer/checkpoint_fixtures.h).
"""

import os
import pickletools
import re
import subprocess
import tempfile
import unittest
import zipfile

import torch

from server_process import runfile

FQN = "sparse_arch.embedding_bag_collection.embedding_bags"
ROWS = {"t0": 40, "t1": 33, "t2": 17, "t3": 21}
DIM = 8
# The saved plan's column blocks of t1 (column-wise over 2 ranks).
T1_COLUMN_OFFSETS = (0, 4)
ALLOWED_GLOBALS = {
    "collections OrderedDict",
    "torch._utils _rebuild_tensor_v2",
    "torch FloatStorage",
    "torch DoubleStorage",
    "torch LongStorage",
    "torch ByteStorage",
}


def doc_snippet():
    with open(runfile("docs/checkpoints.md")) as f:
        page = f.read()
    return re.search(r"```python\n(.*?)```", page, re.S).group(1)


def weight(t, name):
    rows = torch.arange(ROWS[name], dtype=torch.float32).unsqueeze(1)
    cols = torch.arange(DIM, dtype=torch.float32).unsqueeze(0)
    return 1000.0 * t + rows + cols / 100.0


class CheckpointWeightsOnlyTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))
        subprocess.run(
            [runfile("tests/trainer/checkpoint_resharding_test"),
             f"--write_checkpoint={cls.dir}"],
            check=True, timeout=120)
        namespace = {}
        exec(doc_snippet(), namespace)  # defines load_checkpoint
        cls.load_checkpoint = staticmethod(namespace["load_checkpoint"])

    def checkpoint(self, optimizer):
        return os.path.join(self.dir, optimizer, "checkpoint-000000000007")

    def test_every_rank_file_loads_with_weights_only(self):
        for optimizer in ("adagrad", "rowwise_adagrad", "adam"):
            for rank in (0, 1):
                path = os.path.join(self.checkpoint(optimizer),
                                    f"rank-{rank:05d}-of-00002.pt")
                with self.subTest(path=path):
                    loaded = torch.load(path, weights_only=True)
                    self.assertIs(type(loaded), dict)
                    self.assertTrue(loaded)
                    for key, value in loaded.items():
                        self.assertIsInstance(key, str)
                        self.assertIsInstance(value, torch.Tensor)
                    with zipfile.ZipFile(path) as archive:
                        pickle = archive.read(next(
                            n for n in archive.namelist()
                            if n.endswith("/data.pkl")))
                    names = {arg for op, arg, _ in pickletools.genops(pickle)
                             if op.name == "GLOBAL"}
                    self.assertTrue(names)
                    self.assertLessEqual(names, ALLOWED_GLOBALS)
                    self.assertFalse(any(op.name == "STACK_GLOBAL"
                                         for op, _, _ in
                                         pickletools.genops(pickle)))

    def test_doc_snippet_assembles_the_whole_model(self):
        manifest, tensors = self.load_checkpoint(self.checkpoint("adagrad"))
        self.assertEqual(int(manifest["step"]), 7)
        self.assertEqual(int(manifest["world_size"]), 2)
        for t, name in enumerate(ROWS):
            key = f"{FQN}.{name}.weight"
            self.assertTrue(torch.equal(tensors[key], weight(t, name)), key)
            state = (f"fused_optimizer.state.{FQN}.{name}.weight."
                     f"{name}.momentum1")
            self.assertTrue(
                torch.equal(tensors[state], weight(t, name) / 2.0 + 7.0),
                state)
        self.assertEqual(tensors["dense_optimizer"].dtype, torch.uint8)
        # Mixed precision's gradient scaler (rank 0's file).
        scale = tensors["grad_scaler.scale"]
        self.assertEqual((scale.dtype, scale.dim()), (torch.float64, 0))
        self.assertEqual(float(scale), 32768.0)
        tracker = tensors["grad_scaler.growth_tracker"]
        self.assertEqual((tracker.dtype, int(tracker)), (torch.int64, 1))
        dense = [k for k in tensors if k.startswith(("dense_arch.",
                                                     "over_arch."))]
        self.assertTrue(dense)

    def test_row_states_of_column_blocks_average(self):
        _, tensors = self.load_checkpoint(self.checkpoint("rowwise_adagrad"))
        state = tensors[f"fused_optimizer.state.{FQN}.t1.weight.t1.momentum1"]
        rows = torch.arange(ROWS["t1"], dtype=torch.float32).unsqueeze(1)
        expected = sum((10.0 + rows / 2.0 + c).double() * 4
                       for c in T1_COLUMN_OFFSETS) / DIM
        self.assertEqual(list(state.shape), [ROWS["t1"], 1])
        self.assertTrue(torch.equal(state, expected.float()))

    def test_adam_step_is_the_largest_shard_step(self):
        _, tensors = self.load_checkpoint(self.checkpoint("adam"))
        # t0 row-wise: shards at rows 0 and 20: 5 + 0 and 5 + 20 % 7.
        step = tensors[f"fused_optimizer.state.{FQN}.t0.weight.t0.step"]
        self.assertEqual(step.dim(), 0)
        self.assertEqual(int(step), 5 + 20 % 7)
        self.assertTrue(torch.equal(
            tensors[f"fused_optimizer.state.{FQN}.t2.weight.t2.momentum2"],
            weight(2, "t2") / 4.0 + 3.0))


if __name__ == "__main__":
    unittest.main()
