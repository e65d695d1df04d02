"""deltastream: a Python client of the delta-streaming service.

Generate the protocol modules once with `bash clients/python/build.sh`, then
put clients/python on PYTHONPATH. See docs/python.md.
"""

import importlib.util

if importlib.util.find_spec(".tracker_pb2", __name__ + "._proto") is None:
    raise ImportError("deltastream's protocol modules are missing: run "
                      "`bash clients/python/build.sh` first")

from .checkpoint_chain import (ChainError, ChainLink, ChainTable,
                               LinkContent, LoadedChain, applied_links,
                               chain_problems, list_chain, load_chain,
                               read_chain_link)
from .client import (Delta, LookupResult, PredictorClient, Subscription,
                     TableDelta, TrackerClient)
from .fan_in import FanInError
from .npz import read_delta_npz
from .tensors import from_numpy, to_numpy

__all__ = ["ChainError", "ChainLink", "ChainTable", "Delta", "FanInError",
           "LinkContent",
           "LoadedChain", "LookupResult", "PredictorClient", "Subscription",
           "TableDelta", "TrackerClient", "applied_links", "chain_problems",
           "from_numpy", "list_chain", "load_chain", "read_chain_link",
           "read_delta_npz", "to_numpy"]
