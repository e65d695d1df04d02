"""Deltas saved as .npz (`deltactl get --out=F.npz`; clients/npz_file.h).

Layout: "<fqn>/ids" int64 [n] ascending, "<fqn>/states", "<fqn>/values",
"<fqn>/scores" when present; "__delta__/start_batch", "__delta__/end_batch"
int64 scalars, "__delta__/resync_required" bool scalar, "__delta__/consumer"
uint8 UTF-8 bytes. A bfloat16 table was written as float32.
"""

import os
from typing import Union

import numpy as np

from .client import Delta, TableDelta

_META = "__delta__"
_FIELDS = ("ids", "states", "values", "scores")


def read_delta_npz(path: Union[str, os.PathLike]) -> Delta:
    """Reads a delta .npz into a Delta (arrays loaded into memory).

    Raises OSError when the file cannot be read, ValueError when it is not a
    delta (a table without ids, an unknown entry, missing batches).
    """
    with np.load(path, allow_pickle=False) as archive:
        entries = {name: archive[name] for name in archive.files}
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
    tables = {}
    for fqn, fields in sorted(rows.items()):
        if "ids" not in fields:
            raise ValueError(f"{path}: table {fqn!r} has no ids")
        tables[fqn] = TableDelta(**fields)
    consumer = meta.get("consumer")
    return Delta(
        consumer=bytes(consumer).decode("utf-8") if consumer is not None else "",
        start_batch=int(meta["start_batch"]), end_batch=int(meta["end_batch"]),
        tables=tables,
        resync_required=bool(meta.get("resync_required", False)))
