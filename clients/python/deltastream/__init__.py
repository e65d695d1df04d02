"""deltastream: a Python client of the delta-streaming service.

Generate the protocol modules once with `bash clients/python/build.sh`, then
put clients/python on PYTHONPATH. See docs/python.md.
"""

try:
    from ._proto import tracker_pb2 as _check  # noqa: F401
except ImportError as e:  # pragma: no cover
    raise ImportError("deltastream's protocol modules are missing: run "
                      "`bash clients/python/build.sh` first") from e

from .client import (Delta, LookupResult, PredictorClient, Subscription,
                     TableDelta, TrackerClient)
from .npz import read_delta_npz
from .tensors import from_numpy, to_numpy

__all__ = ["Delta", "LookupResult", "PredictorClient", "Subscription",
           "TableDelta", "TrackerClient", "from_numpy", "read_delta_npz",
           "to_numpy"]
