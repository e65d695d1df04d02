"""A drop-in for code written against TorchRec's `ModelDeltaTracker`, backed
by a tracker service (tracker_server, or a trainer's --listen port).

TorchRec's trainers call `step()` at the start of each forward, record
lookups during it, and read with `get_delta()` at any point: an in-process
tracker reads through the open batch. The service reads closed batches only,
so this adapter keeps its own batch index (TorchRec's) and maps it onto the
service's batches:

- `get_delta(c)` first closes the service's open batch when it holds records
  (a service Step), so the read covers the open TorchRec batch as well. One
  TorchRec batch may so span several service batches.
- TorchRec's cursor then points past the open batch, so rows recorded into it
  after c's read never reach c. At the next `step()` the adapter reproduces
  that: consumers that read during the batch and missed records since are
  cleared (service Clear(c): the cursor moves past the open batch) before
  the service steps.
- `clear()` (and `clear(c)` with one consumer) drops everything; TorchRec
  forgets the tables too, so the adapter reports only tables recorded (or
  read with rows) since.
  `clear(c)` with several consumers does nothing, as in TorchRec.

Results are what TorchRec's tracker returns at the same call: per table FQN,
`DeltaRows(ids, states)` as torch tensors, IDs unique and ascending, states
(EMBEDDING mode: the first embedding since the consumer's last read) or None.
Compaction and delete-on-read change memory only, never results; the
service's --delete_on_read must match the adapter's (checked at creation).
With the service's acknowledged reads, the adapter commits each read at once
(TorchRec's read moves the cursor).

A read the service answers with `resync_required` (it dropped rows of the
consumer's under its memory cap, or a sharded trainer's ranks hold the
consumer at different batches: one added at run time, as the adapter adds
its consumers, between two of a rank's steps) is read again as every row of
every table (a read of all rows, without top-k; get_unique's scores are then
None): more than TorchRec's delta, never less. A service that cannot read
all rows (tracker_server, with no live model) raises ResyncRequired instead,
once: the rows are lost to that read, and the next reads are deltas again.

Not thread-safe: one training loop drives it, as TorchRec's tracker.
"""

import collections
import enum
from typing import Dict, List, Mapping, Optional

import grpc
import numpy as np
import torch

from .client import TrackerClient


class TrackingMode(enum.Enum):
    """TorchRec's tracking modes, by the service's --mode names."""
    ID_ONLY = "id_only"
    EMBEDDING = "embedding"
    MOMENTUM_LAST = "momentum_last"
    MOMENTUM_DIFF = "momentum_diff"
    ROWWISE_ADAGRAD = "rowwise_adagrad"


class ResyncRequired(RuntimeError):
    """The service lost rows of a consumer's and cannot read every row in
    their place: the read that said so returned no rows to the caller."""


DeltaRows = collections.namedtuple("DeltaRows", ["ids", "states"])
UniqueRows = collections.namedtuple("UniqueRows", ["ids", "states", "scores"])


def _jagged_values(features, key) -> torch.Tensor:
    value = features[key]
    return value.values() if hasattr(value, "values") and not isinstance(
        value, torch.Tensor) else torch.as_tensor(value)


def _tensor(array: Optional[np.ndarray]) -> Optional[torch.Tensor]:
    if array is None:
        return None
    # Arrays over a message's bytes are read-only; torch wants writable.
    return torch.from_numpy(np.array(array, copy=not array.flags.writeable))


class RemoteModelDeltaTracker:
    """ModelDeltaTracker's calls against a tracker service.

    target: the service's HOST:PORT (or `client`, an open TrackerClient).
    consumers: the consumer names (default ["default"]); missing ones are
    added to the service. delete_on_read and mode must match the service's
    flags (ValueError otherwise). feature_to_fqn: feature name -> table FQN,
    what TorchRec derives from the model (None: features are FQNs).
    auto_compact is accepted for signature compatibility: the service
    compacts on its own (--auto_compact). When a check or call of the
    creation fails, the client the adapter made for `target` is closed.
    """

    DEFAULT_CONSUMER: str = "default"

    def __init__(self, target: Optional[str] = None,
                 consumers: Optional[List[str]] = None,
                 delete_on_read: bool = True, auto_compact: bool = False,
                 mode: TrackingMode = TrackingMode.ID_ONLY,
                 feature_to_fqn: Optional[Mapping[str, str]] = None,
                 client: Optional[TrackerClient] = None,
                 token: Optional[str] = None):
        if (target is None) == (client is None):
            raise ValueError("pass exactly one of target and client")
        self._client = client or TrackerClient(target, token=token)
        try:
            self._consumers = list(consumers or [self.DEFAULT_CONSUMER])
            self._delete_on_read = delete_on_read
            self._auto_compact = auto_compact
            self._mode = TrackingMode(mode)
            self.feature_to_fqn: Dict[str, str] = dict(feature_to_fqn or {})
            status = self._client.status()
            self._acknowledged = status.acknowledged_reads
            if status.mode != self._mode.value:
                raise ValueError(f"the service tracks {status.mode!r}, the "
                                 f"adapter was asked for "
                                 f"{self._mode.value!r}")
            if status.delete_on_read != delete_on_read:
                raise ValueError(f"the service runs with delete_on_read="
                                 f"{status.delete_on_read}, the adapter was "
                                 f"asked for {delete_on_read}")
            known = set(self._client.consumers())
            for consumer in self._consumers:
                if consumer not in known:
                    self._client.add_consumer(consumer)
        except BaseException:
            if client is None:  # ours: no one else would close it
                self._client.close()
            raise
        self.curr_batch_idx: int = 0
        # Tables TorchRec's store would hold: recorded through the adapter,
        # or read with rows (recorded by a trainer), since the last global
        # delete (TorchRec forgets tables then; the service keeps them).
        self._known_fqns: set = set()
        # The service's open batch holds records.
        self._open_batch_recorded = False
        # Consumers that read during the open TorchRec batch, and whether
        # records came after their read.
        self._read_this_batch: Dict[str, bool] = {}

    # Recording.
    def record_lookup(self, kjt, states: Optional[torch.Tensor] = None) -> None:
        """Records the IDs of `kjt` (a KeyedJaggedTensor, or a dict feature ->
        IDs or jagged tensor) and, with states, their embeddings/states
        ([total IDs, dim] or anything that views as such) into the open batch.
        A batch of no IDs with states of no elements records nothing.
        """
        keys = list(kjt.keys())
        per_table_ids: Dict[str, List[torch.Tensor]] = {}
        per_table_states: Dict[str, List[torch.Tensor]] = {}
        ids_by_key = [(key, _jagged_values(kjt, key).reshape(-1))
                      for key in keys]
        total = sum(int(ids.numel()) for _, ids in ids_by_key)
        rows = None
        if states is not None and self._mode != TrackingMode.ID_ONLY:
            if total == 0 and states.numel() == 0:
                return  # nothing looked up: no rows, no width to send
            if total == 0 or states.numel() % total != 0:
                raise ValueError(f"ids and states size mismatch: {total} IDs, "
                                 f"{states.numel()} state elements")
            rows = states.detach().reshape(total, -1)
        offset = 0
        for key, ids in ids_by_key:
            fqn = self.feature_to_fqn.get(key, key)
            per_table_ids.setdefault(fqn, []).append(ids)
            if rows is not None:
                per_table_states.setdefault(fqn, []).append(
                    rows[offset:offset + ids.numel()])
            offset += int(ids.numel())
        tables = {}
        for fqn, ids_list in per_table_ids.items():
            ids = torch.cat(ids_list).to("cpu", torch.int64).numpy()
            if rows is not None:
                table_states = torch.cat(per_table_states[fqn]).cpu()
                if table_states.dtype == torch.bfloat16:  # NumPy has none
                    table_states = table_states.float()
                tables[fqn] = (ids, table_states.numpy())
            else:
                tables[fqn] = ids
        if not tables:
            return
        self._client.push(tables)
        self._known_fqns.update(tables)
        self._open_batch_recorded = True
        for consumer in self._read_this_batch:
            self._read_this_batch[consumer] = True

    def step(self) -> None:
        """Moves the batch index forward (TorchRec: at each forward's start)."""
        missed = [c for c, m in self._read_this_batch.items() if m]
        self._read_this_batch.clear()
        self._client.step()
        # What was recorded in this batch after their read is not theirs
        # (TorchRec's cursor passed it): a clear now, with the service's
        # batches that hold it closed, moves their cursors past it.
        for consumer in missed:
            self._client.clear(consumer)
        self._open_batch_recorded = False
        self.curr_batch_idx += 1

    # Reading.
    def get_delta(self, consumer: Optional[str] = None) -> Dict[str, DeltaRows]:
        """Unique IDs (and states) per table recorded since `consumer`'s last
        read, through the open batch."""
        delta = self._read(consumer)
        return {fqn: DeltaRows(ids=_tensor(t.ids), states=_tensor(t.states))
                for fqn, t in delta.tables.items() if fqn in self._known_fqns}

    def get_delta_ids(self,
                      consumer: Optional[str] = None) -> Dict[str, torch.Tensor]:
        """get_delta's IDs only."""
        return {fqn: rows.ids for fqn, rows in self.get_delta(consumer).items()}

    def get_unique(self, consumer: Optional[str] = None,
                   top_percentage: Optional[float] = 1.0,
                   per_table_percentage: Optional[Mapping[str, float]] = None,
                   sorted_by_indices: bool = True) -> Dict[str, UniqueRows]:
        """The rows that changed most: `top_percentage` (a fraction in
        (0, 1], as TorchRec's) of each table's rows by score, per table
        overridable. Rows by ascending ID, or by descending score when
        `sorted_by_indices` is False."""
        def percent(fraction: float) -> float:
            if not 0 < fraction <= 1:
                raise ValueError(f"percentage {fraction} not in (0, 1]")
            return float(fraction) * 100.0
        top_k = None if top_percentage in (None, 1.0) else percent(
            top_percentage)
        per_table = {fqn: percent(f)
                     for fqn, f in (per_table_percentage or {}).items()}
        delta = self._read(consumer, top_k=top_k, per_table_top_k=per_table,
                           include_scores=True)
        result = {}
        for fqn, t in delta.tables.items():
            if fqn not in self._known_fqns:
                continue
            order = slice(None)
            if not sorted_by_indices and t.scores is not None:
                order = np.argsort(-t.scores, kind="stable")
            pick = lambda a: None if a is None else _tensor(np.asarray(a)[order])
            result[fqn] = UniqueRows(ids=pick(t.ids), states=pick(t.states),
                                     scores=pick(t.scores))
        return result

    def _read(self, consumer: Optional[str], **kwargs):
        consumer = consumer or self.DEFAULT_CONSUMER
        if consumer not in self._consumers:
            raise ValueError(f"consumer {consumer!r} not in {self._consumers}")
        if self._read_this_batch.get(consumer):
            # A second read in one TorchRec batch starts past what came
            # after the first, which is not c's: the service's batches that
            # hold it are closed, then a clear moves c's cursor past them.
            if self._open_batch_recorded:
                self._client.step()
                self._open_batch_recorded = False
            self._client.clear(consumer)
        if self._open_batch_recorded:
            self._client.step()  # the service reads closed batches only
            self._open_batch_recorded = False
        delta = self._client.get(consumer, **kwargs)
        if delta.resync_required:
            delta = self._read_every_row(consumer, delta)
        self._read_done(consumer, delta)
        self._known_fqns.update(fqn for fqn, table in delta.tables.items()
                                if table.ids.shape[0] > 0)
        return delta

    def _read_every_row(self, consumer: str, resync):
        """The read in place of `resync`, a delta that says resync_required:
        every row of every table, without top-k or scores. When the service
        cannot read them, `resync` was the consumer's read (its rows are
        lost) and ResyncRequired says so."""
        try:
            return self._client.get(consumer, all_rows=True)
        except grpc.RpcError as error:
            if error.code() != grpc.StatusCode.FAILED_PRECONDITION:
                raise
            self._read_done(consumer, resync)
            raise ResyncRequired(
                f"consumer {consumer!r} lost {resync.lost_rows} rows (batches "
                f"{resync.start_batch}-{resync.end_batch}) and the service "
                f"cannot read every row: {error.details()}") from error

    def _read_done(self, consumer: str, delta) -> None:
        """The consumer read `delta`: its cursor moves past it (acknowledged
        reads: a commit), and nothing recorded since is in it."""
        if self._acknowledged:
            self._client.commit(consumer, delta.end_batch)
        self._read_this_batch[consumer] = False

    # Consumers and clearing.
    def clear(self, consumer: Optional[str] = None) -> None:
        """clear(): drops everything tracked; clear(c): the same with one
        consumer, nothing with several (TorchRec's rule)."""
        if consumer is not None:
            if consumer not in self._consumers:
                raise ValueError(
                    f"consumer {consumer!r} not in {self._consumers}")
            if len(self._consumers) > 1:
                return
        # The service deletes what was recorded and leaves its open batch
        # ahead of every cursor; the step after it gives the records that
        # follow in this TorchRec batch a service batch of their own, which
        # every cursor reads, as after TorchRec's delete.
        self._client.clear()
        self._client.step()
        self._open_batch_recorded = False
        # Who read in this batch still must not see what is recorded next.
        for reader in self._read_this_batch:
            self._read_this_batch[reader] = False
        self._known_fqns.clear()

    @property
    def consumers(self) -> List[str]:
        """The adapter's consumers."""
        return list(self._consumers)

    @property
    def mode(self) -> TrackingMode:
        return self._mode

    def fqn_to_feature_names(self) -> Dict[str, List[str]]:
        """Table FQN -> its feature names (from feature_to_fqn)."""
        result: Dict[str, List[str]] = {}
        for feature, fqn in self.feature_to_fqn.items():
            result.setdefault(fqn, []).append(feature)
        return result

    def close(self) -> None:
        self._client.close()
