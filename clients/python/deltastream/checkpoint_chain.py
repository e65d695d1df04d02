"""Checkpoint chains (store/checkpoint_chain.h) read with NumPy.

A chain is a directory of links written by the checkpoint job (or
`deltactl`, the trainer's restore reads them too): a full link holding every
row of every table at its end batch, then increments holding the rows that
changed in batches [start, end), each starting where the previous ended.
Names: "full-<start>-<end>.ckpt", "incr-<start>-<end>.ckpt" (12-digit batch
numbers).

A link file is the 8 bytes "DSCHAIN2", then records, each a uint64
little-endian size, the CRC-32 (zlib) of its bytes as uint32 little-endian,
then the bytes: first a serialized deltastream.v1.CheckpointLink
(proto/checkpoint.proto) whose tensors have dtype and shape but no data, then
the raw little-endian bytes of every tensor it names, in order (each table's
ids then values, then each dense parameter), each split into records.
"DSCHAIN1" links (one record: the whole CheckpointLink with its data) are
read too. Every record's checksum is verified, and a link must hold what its
name says.

    import deltastream
    chain = deltastream.load_chain("/var/lib/deltastream/chain")
    table = chain.tables["sparse_arch.embedding_bag_collection.embedding_bags.t0"]
    table.ids, table.values      # int64 [n] ascending, [n, dim]

Errors: `ChainError` (a ValueError) for a damaged or inconsistent chain,
naming the file and the problem; OSError when a file cannot be read.
bfloat16 tensors, which NumPy lacks, are widened to float32 (exact).
"""

import dataclasses
import os
import re
import struct
import zlib
from typing import BinaryIO, Dict, List, Optional, Tuple, Union

import numpy as np

from ._proto import checkpoint_pb2, tensor_pb2
from .tensors import element_count, numpy_dtype, to_numpy

_MAGIC_V1 = b"DSCHAIN1"
_MAGIC_V2 = b"DSCHAIN2"
_PREFIX = struct.Struct("<QI")  # a record's size and CRC-32
_MAX_DESCRIPTION_BYTES = 256 << 20
# ASCII digits only (\d takes any Unicode digit); numbers past int64 are
# refused as the C++ ListChain's SimpleAtoi refuses them.
_NAME = re.compile(r"(full|incr)-([0-9]+)-([0-9]+)\.ckpt")
_MAX_BATCH = (1 << 63) - 1
_Tensor = tensor_pb2.Tensor

PathLike = Union[str, os.PathLike]


class ChainError(ValueError):
    """A chain or link that is damaged, inconsistent or not a chain."""


@dataclasses.dataclass(frozen=True)
class ChainLink:
    """A link file by its name: kind and batches [start_batch, end_batch)."""
    path: str
    full: bool
    start_batch: int
    end_batch: int
    bytes: int


@dataclasses.dataclass
class ChainTable:
    """A table's rows: ids int64 [n] ascending, values [n, dim]."""
    ids: np.ndarray
    values: np.ndarray


@dataclasses.dataclass
class LinkContent:
    """What one link holds (read_chain_link)."""
    full: bool
    start_batch: int
    end_batch: int
    consumer: str
    written_unix_ms: int
    tables: Dict[str, ChainTable]
    # The model's dense parameters in the model's order, read at dense_batch
    # (-1 and empty when the link carries none).
    dense: List[Tuple[str, np.ndarray]]
    dense_batch: int
    # The trainer run that served the rows and the batch it started at.
    run_id: str
    run_start_batch: int


@dataclasses.dataclass
class LoadedChain:
    """A chain applied in order (load_chain)."""
    tables: Dict[str, ChainTable]
    end_batch: int
    links: List[ChainLink]  # those applied, in order
    dense: List[Tuple[str, np.ndarray]]
    dense_batch: int
    run_id: str
    run_start_batch: int


def list_chain(directory: PathLike) -> List[ChainLink]:
    """The links of `directory` by position (names only; nothing is read).

    Other files (temporaries) are skipped; a missing directory is an empty
    chain; a link removed while listing has 0 bytes. Raises ChainError for a
    ".ckpt" file whose name does not parse (batches are ASCII digits, at
    most 2^63 - 1).
    """
    directory = os.fspath(directory)
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    links = []
    for name in names:
        if not name.endswith(".ckpt"):
            continue
        path = os.path.join(directory, name)
        parsed = _parse_name(name)
        if parsed is None:
            raise ChainError(f"'{path}' is not a checkpoint link name")
        try:
            size = os.path.getsize(path)
        except OSError:  # a link removed meanwhile, as the C++ ListChain
            size = 0
        links.append(ChainLink(path=path, full=parsed[0],
                               start_batch=parsed[1], end_batch=parsed[2],
                               bytes=size))
    # By start, then end; a full link before an increment of the same range.
    links.sort(key=lambda l: (l.start_batch, l.end_batch, not l.full))
    return links


def _parse_name(name: str) -> Optional[Tuple[bool, int, int]]:
    """(full, start_batch, end_batch) of a link's file name; None when it is
    not one."""
    match = _NAME.fullmatch(name)
    if match is None:
        return None
    start, end = int(match.group(2)), int(match.group(3))
    if start > _MAX_BATCH or end > _MAX_BATCH:
        return None
    return match.group(1) == "full", start, end


def applied_links(links: List[ChainLink]) -> List[ChainLink]:
    """The links a load applies, in order: the newest full link (latest end
    batch) and the increments that end after it; all links without one."""
    base = None
    for link in links:
        if link.full and (base is None or link.end_batch >= base.end_batch):
            base = link
    if base is None:
        return list(links)
    return [base] + [l for l in links
                     if not l.full and l.end_batch > base.end_batch]


def chain_problems(links: List[ChainLink]) -> List[str]:
    """Holes and overlaps among the applied links, one line each; empty
    when the chain is sound (the same lines as `deltactl chain`)."""
    chain = applied_links(links)
    problems = []
    if chain and not chain[0].full:
        problems.append("no full checkpoint: the chain has no base")
    for previous, link in zip(chain, chain[1:]):
        before, after = (os.path.basename(previous.path),
                         os.path.basename(link.path))
        if link.start_batch > previous.end_batch:
            problems.append(f"batches {previous.end_batch}.."
                            f"{link.start_batch - 1} missing between "
                            f"{before} and {after}")
        elif link.start_batch < previous.end_batch:
            duplicate = (" (a duplicate)"
                         if link.start_batch == previous.start_batch else "")
            problems.append(f"{after} overlaps {before}{duplicate}: batches "
                            f"{link.start_batch}..{previous.end_batch - 1} "
                            "twice")
    return problems


class _LinkFile:
    """Reads a link file front to back, checking sizes and checksums."""

    def __init__(self, path: str, stream: BinaryIO):
        self.path = path
        self._stream = stream
        self.size = os.fstat(stream.fileno()).st_size
        self.offset = 0

    def corrupt(self, what: str) -> ChainError:
        return ChainError(f"'{self.path}' {what}")

    def left(self) -> int:
        return self.size - self.offset

    def read_into(self, view: memoryview) -> None:
        if len(view) > self.left():
            raise self.corrupt(f"is truncated: {self.left()} bytes left where "
                               f"{len(view)} were expected at offset "
                               f"{self.offset}")
        done = 0
        while done < len(view):
            got = self._stream.readinto(view[done:])
            if not got:
                raise OSError(f"cannot read '{self.path}': unexpected end of "
                              "file")
            done += got
        self.offset += len(view)

    def read_prefix(self) -> Tuple[int, int]:
        prefix = bytearray(_PREFIX.size)
        self.read_into(memoryview(prefix))
        return _PREFIX.unpack(prefix)

    def _record_prefix(self, most: int) -> Tuple[int, int]:
        """The next record's size and CRC, the size checked: 1 to `most`
        bytes, all in the file."""
        size, crc = self.read_prefix()
        if size > self.left():
            raise self.corrupt(f"is truncated: a record of {size} bytes at "
                               f"offset {self.offset} has {self.left()} left")
        if size == 0 or size > most:
            raise self.corrupt(f"is corrupt: a record of {size} bytes at "
                               f"offset {self.offset} where 1 to {most} "
                               "belong")
        return size, crc

    def _check_crc(self, record: memoryview, crc: int) -> None:
        if zlib.crc32(record) != crc:
            raise self.corrupt(f"fails its checksum at offset "
                               f"{self.offset - len(record)}: corrupt")

    def read_record(self, view: memoryview) -> int:
        """The next record, of 1 to len(view) bytes, into `view`; its size."""
        size, crc = self._record_prefix(len(view))
        record = view[:size]
        self.read_into(record)
        self._check_crc(record, crc)
        return size

    def read_record_bytes(self, most: int) -> bytearray:
        """The next record, of 1 to `most` bytes, allocated at the size its
        prefix says (checked first), not at the most it may be."""
        size, crc = self._record_prefix(most)
        record = bytearray(size)
        self.read_into(memoryview(record))
        self._check_crc(memoryview(record), crc)
        return record


def _check_layout(wire: "_Tensor", what: str, file: _LinkFile):
    """(NumPy dtype as stored, shape, bytes) of a described tensor: its
    dtype and shape checked as the C++ reader's CheckLayout checks them
    (tensors.element_count), ChainError otherwise."""
    shape = tuple(int(s) for s in wire.shape)
    if wire.data:
        raise file.corrupt(f": {what} does not decode")
    try:
        stored = (np.dtype("<u2") if wire.dtype == _Tensor.BFLOAT16
                  else numpy_dtype(wire.dtype))
        count = element_count(shape)
    except ValueError as error:
        raise file.corrupt(f": {what} does not decode: {error}") from None
    return stored, shape, count * stored.itemsize


def _read_tensor(file: _LinkFile, wire: "_Tensor", what: str) -> np.ndarray:
    """A "DSCHAIN2" tensor's bytes read straight into its array."""
    stored, shape, nbytes = _check_layout(wire, what, file)
    if nbytes > file.left():
        raise file.corrupt(f"is truncated: {what} needs {nbytes} bytes, "
                           f"{file.left()} are left")
    array = np.empty(shape, dtype=stored)
    view = memoryview(array.reshape(-1).view(np.uint8))
    done = 0
    while done < nbytes:
        done += file.read_record(view[done:])
    if wire.dtype == _Tensor.BFLOAT16:  # flat: a 0-d array cannot view
        wide = array.reshape(-1).astype(np.uint32) << 16
        return wide.view(np.float32).reshape(shape)
    return array


def _check_table_description(table, file: _LinkFile) -> None:
    ids, values = table.ids, table.values
    if (ids.dtype != _Tensor.INT64 or len(ids.shape) != 1 or
            len(values.shape) < 1 or
            (ids.shape[0] > 0 and values.shape[0] != ids.shape[0])):
        raise file.corrupt(f": table '{table.fqn}' does not decode")


def _content(link, tables, dense) -> LinkContent:
    return LinkContent(
        full=link.full, start_batch=link.start_batch,
        end_batch=link.end_batch, consumer=link.consumer,
        written_unix_ms=link.written_unix_ms, tables=tables, dense=dense,
        dense_batch=link.dense_batch if link.dense else -1,
        run_id=link.run_id, run_start_batch=link.run_start_batch)


def _read_v1(file: _LinkFile, stream: BinaryIO) -> LinkContent:
    size, crc = file.read_prefix()
    if file.left() != size:
        raise file.corrupt(f"is truncated: {file.left()} of {size} payload "
                           "bytes")
    payload = stream.read(size)
    file.offset += len(payload)
    if len(payload) != size:
        raise OSError(f"cannot read '{file.path}': unexpected end of file")
    if zlib.crc32(payload) != crc:
        raise file.corrupt("fails its checksum: corrupt")
    link = checkpoint_pb2.CheckpointLink()
    try:
        link.ParseFromString(payload)
    except Exception:  # protobuf's DecodeError differs between versions
        raise file.corrupt("does not parse") from None
    tables = {}
    for table in link.tables:
        try:
            ids, values = to_numpy(table.ids), to_numpy(table.values)
        except ValueError:
            raise file.corrupt(f": table '{table.fqn}' does not decode") from None
        if (ids.ndim != 1 or ids.dtype != np.int64 or
                (ids.size > 0 and (values.ndim < 1 or
                                   values.shape[0] != ids.size))):
            raise file.corrupt(f": table '{table.fqn}' does not decode")
        tables[table.fqn] = ChainTable(ids=ids, values=values)
    dense = []
    for parameter in link.dense:
        try:
            dense.append((parameter.name, to_numpy(parameter.tensor)))
        except ValueError:
            raise file.corrupt(f": dense parameter '{parameter.name}' does "
                               "not decode") from None
    return _content(link, tables, dense)


def _read_v2(file: _LinkFile) -> LinkContent:
    description = file.read_record_bytes(_MAX_DESCRIPTION_BYTES)
    link = checkpoint_pb2.CheckpointLink()
    try:
        link.ParseFromString(bytes(description))
    except Exception:  # protobuf's DecodeError differs between versions
        raise file.corrupt("does not parse") from None
    tables = {}
    for table in link.tables:
        _check_table_description(table, file)
        what = f"table '{table.fqn}'"
        ids = _read_tensor(file, table.ids, what + " ids")
        values = _read_tensor(file, table.values, what + " values")
        tables[table.fqn] = ChainTable(ids=ids, values=values)
    dense = [(p.name, _read_tensor(file, p.tensor,
                                   f"dense parameter '{p.name}'"))
             for p in link.dense]
    if file.left() != 0:
        raise file.corrupt(f"is corrupt: {file.left()} bytes after its last "
                           "record")
    return _content(link, tables, dense)


def read_chain_link(path: PathLike) -> LinkContent:
    """Reads and verifies one link file (either format).

    A "DSCHAIN2" link's tensors are read straight into their arrays (one
    copy of the rows in memory). When the file's name is a link name, the
    link must hold what it says (kind and batches). Raises ChainError for a
    file that is not a link, is truncated, fails a checksum, does not parse
    or does not match its name; OSError when it cannot be read.
    """
    path = os.fspath(path)
    with open(path, "rb", buffering=0) as stream:
        file = _LinkFile(path, stream)
        magic = bytearray(len(_MAGIC_V2))
        if file.size < len(magic) + _PREFIX.size:
            raise file.corrupt("is not a checkpoint link")
        file.read_into(memoryview(magic))
        if magic == _MAGIC_V1:
            content = _read_v1(file, stream)
        elif magic == _MAGIC_V2:
            content = _read_v2(file)
        else:
            raise file.corrupt("is not a checkpoint link")
    named = _parse_name(os.path.basename(path))
    if named is not None and named != (content.full, content.start_batch,
                                       content.end_batch):
        kind = "a full link" if content.full else "an increment"
        raise ChainError(f"'{path}' holds {kind} of batches "
                         f"[{content.start_batch}, {content.end_batch}), not "
                         "what its name says")
    return content


def merge_tables(base: Dict[str, ChainTable],
                 later: Dict[str, ChainTable]) -> Dict[str, ChainTable]:
    """`later`'s rows over `base`'s, per table: IDs ascending, a row in both
    takes `later`'s values (what the C++ loader does). Raises ChainError,
    naming the table, when its rows have another width or dtype in `later`
    (the C++ MergeTables' DataLoss)."""
    merged = dict(base)
    for fqn, table in later.items():
        old = merged.get(fqn)
        if old is None or old.ids.size == 0:
            merged[fqn] = table
            continue
        if table.ids.size == 0:
            continue
        if (old.values.shape[1:] != table.values.shape[1:] or
                old.values.dtype != table.values.dtype):
            raise ChainError(
                f"table '{fqn}' has rows of {list(old.values.shape[1:])} "
                f"{old.values.dtype} in one link and of "
                f"{list(table.values.shape[1:])} {table.values.dtype} in a "
                "later one")
        ids = np.concatenate([old.ids, table.ids])
        values = np.concatenate([old.values, table.values])
        # A stable sort keeps equal IDs in order: the last of a run is newer.
        order = np.argsort(ids, kind="stable")
        sorted_ids = ids[order]
        last = np.ones(sorted_ids.size, dtype=bool)
        last[:-1] = sorted_ids[:-1] != sorted_ids[1:]
        keep = order[last]
        merged[fqn] = ChainTable(ids=ids[keep], values=values[keep])
    return merged


def load_chain(directory: PathLike) -> LoadedChain:
    """Applies the newest full link and every increment after it, in order,
    later rows replacing earlier ones: the tables at the chain's end batch.

    Raises ChainError for an empty directory, a chain without a full link or
    with holes or overlaps (chain_problems), a link that does not verify
    (read_chain_link), or an increment whose rows of a table have another
    width or dtype than the links before (merge_tables; naming the link).
    """
    directory = os.fspath(directory)
    links = list_chain(directory)
    if not links:
        raise ChainError(f"'{directory}' holds no checkpoint")
    problems = chain_problems(links)
    if problems:
        raise ChainError(f"the checkpoint chain in '{directory}' is broken: "
                         + "; ".join(problems))
    loaded = LoadedChain(tables={}, end_batch=0, links=[], dense=[],
                         dense_batch=-1, run_id="", run_start_batch=0)
    for link in applied_links(links):
        content = read_chain_link(link.path)
        if content.dense:
            loaded.dense = content.dense
            loaded.dense_batch = content.dense_batch
        try:
            loaded.tables = (content.tables if link.full
                             else merge_tables(loaded.tables, content.tables))
        except ChainError as error:
            raise ChainError(f"cannot load '{link.path}': {error}") from None
        loaded.end_batch = link.end_batch
        loaded.run_id = content.run_id
        loaded.run_start_batch = content.run_start_batch
        loaded.links.append(link)
    return loaded
