"""Deltas saved as .npz (`deltactl get --out=F.npz`; clients/npz_file.h).

Layout: "<fqn>/ids" int64 [n] ascending, "<fqn>/states", "<fqn>/values",
"<fqn>/scores" when present; "__delta__/start_batch", "__delta__/end_batch"
int64 scalars, "__delta__/resync_required" bool scalar, "__delta__/consumer"
uint8 UTF-8 bytes. A bfloat16 table was written as float32.
"""

import os
import zipfile
import zlib
from typing import Union

import numpy as np

from .client import Delta, TableDelta

_META = "__delta__"
_FIELDS = ("ids", "states", "values", "scores")


def read_delta_npz(path: Union[str, os.PathLike]) -> Delta:
    """Reads a delta .npz into a Delta (arrays loaded into memory).

    Raises OSError when the file cannot be read, ValueError naming the path
    when it is not a delta: not a whole .npz (truncated, a checksum that
    fails), a table without int64 [n] ids or with another row count in its
    states, values or scores, an unknown entry, batches that are not integer
    scalars or are missing.
    """
    try:
        with np.load(path, allow_pickle=False) as archive:
            entries = {name: archive[name] for name in archive.files}
    except (ValueError, EOFError, zipfile.BadZipFile, zlib.error) as error:
        raise ValueError(f"{path}: not a readable .npz: {error}") from None
    meta = {}
    rows = {}
    for name, array in entries.items():
        fqn, sep, field = name.rpartition("/")
        if not sep or field not in _FIELDS and fqn != _META:
            raise ValueError(f"{path}: unexpected entry {name!r}")
        if fqn == _META:
            meta[field] = array
        else:
            rows.setdefault(fqn, {})[field] = array
    for key in ("start_batch", "end_batch"):
        if key not in meta:
            raise ValueError(f"{path}: no {_META}/{key}: not a delta file")
        if meta[key].shape != () or meta[key].dtype.kind not in "iu":
            raise ValueError(f"{path}: {_META}/{key} is {meta[key].dtype} "
                             f"{list(meta[key].shape)}, not an integer scalar")
    resync = meta.get("resync_required", np.bool_(False))
    if resync.shape != ():
        raise ValueError(f"{path}: {_META}/resync_required is not a scalar")
    tables = {}
    for fqn, fields in sorted(rows.items()):
        ids = fields.get("ids")
        if ids is None:
            raise ValueError(f"{path}: table {fqn!r} has no ids")
        if ids.dtype != np.int64 or ids.ndim != 1:
            raise ValueError(f"{path}: table {fqn!r} has ids of {ids.dtype} "
                             f"{list(ids.shape)}, not int64 [n]")
        for field, array in fields.items():
            if array.ndim == 0 or array.shape[0] != ids.shape[0]:
                raise ValueError(f"{path}: table {fqn!r} has {ids.shape[0]} "
                                 f"ids and {field} of {list(array.shape)}")
        tables[fqn] = TableDelta(**fields)
    consumer = meta.get("consumer")
    try:
        name = bytes(consumer).decode("utf-8") if consumer is not None else ""
    except UnicodeDecodeError as error:
        raise ValueError(f"{path}: {_META}/consumer: {error}") from None
    return Delta(
        consumer=name,
        start_batch=int(meta["start_batch"]), end_batch=int(meta["end_batch"]),
        tables=tables, resync_required=bool(resync))
