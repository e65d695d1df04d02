"""A sharded trainer read as one model: the fan-in behind TrackerClient, as
the C++ FanInClient does it (clients/fan_in_client.h, whose class comment is
the contract this module follows).

Given any rank's address, the first call discovers every rank (the Topology
RPC) and keeps a channel per rank; the ranks are discovered again after a
rank was unreachable (UNAVAILABLE) or a read came from another run (a
restarted group may have moved). With one rank (tracker_server, a
one-process trainer) every call goes to that server unchanged.

A read is one consistent cut: the same fresh nonzero `cut` id
(GetDeltaRequest.cut) goes to every rank at once, and the ranks serve their
parts at the same step boundary, holding there until every part is read
(trainer/cut_agreement.h), so the parts are read concurrently, one thread
per rank. The parts are merged into one delta per table (merge_rank_deltas):
  - row-wise, table-row-wise and table-wise shards: each rank's rows,
    concatenated and sorted by ID (an ID two ranks serve is an error);
  - column-wise shards: each rank's column block of the same IDs, joined by
    ID in column order into full rows (2-D states joined like values, scores
    the first block's); blocks of other IDs are an error, or, when the parts
    start at different batches (or a rank asks for a resync) and the read is
    not of all rows, a delta without rows that says resync_required;
  - data-parallel tables (whole and equal on every rank): the union of the
    ranks' IDs, one row per ID, the lowest rank's.
The merged delta: resync_required if any part says so, start_batch the
latest part's, end_batch the parts' (equal at a cut: parts ending at other
batches are an error), lost_rows summed, the change times spanning every
part, run_id the ranks' joined with ",", run_start_batch the latest, all_rows
if every part is, dense parameters rank 0's (data-parallel: equal on every
rank).

Errors are grpc.RpcErrors, as the server's: a rank's error as a FanInError
with the rank's code and "rank R: " before its message; parts that do not
fit together DATA_LOSS naming the table; parts ending at different batches
ABORTED; a malformed topology INVALID_ARGUMENT. Top-k of a table split by
columns (each rank would pick its own rows) raises ValueError before any
rank reads.
"""

import dataclasses
import math
import random
import threading
import time
from typing import (Any, Callable, Dict, List, NoReturn, Optional, Sequence,
                    Tuple, TypeVar)

import grpc
import numpy as np

from ._proto import tracker_pb2
from .client import (Delta, Subscription, TableDelta, _read_delta,
                     _TrackerService)

T = TypeVar("T")

# One rank's part of a read: its delta and its tables' column blocks
# (fqn -> (col_offset, table_cols); _DeltaAssembler.columns).
RankPart = Tuple[Delta, Dict[str, Tuple[int, int]]]


class FanInError(grpc.RpcError):
    """A fan-in's error, with a gRPC status code as a server's: code() and
    details(), as a grpc.RpcError raised by a call."""

    def __init__(self, code: grpc.StatusCode, details: str):
        super().__init__(f"{code.name}: {details}")
        self._code = code
        self._details = details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


def _mismatch(fqn: str, what: str) -> FanInError:
    return FanInError(grpc.StatusCode.DATA_LOSS, f"table '{fqn}': {what}")


@dataclasses.dataclass
class _Piece:
    """One rank's rows of a table in a read: full rows (table_cols 0), or
    columns [col_offset, col_offset + width) of a table table_cols wide."""
    table: TableDelta
    col_offset: int = 0
    table_cols: int = 0


_ROW_ARRAYS = ("states", "values", "scores")


def _has_rows(table: TableDelta) -> bool:
    return table.ids is not None and table.ids.size > 0


def _join_columns(fqn: str, blocks: List[_Piece]) -> TableDelta:
    """Column blocks of the same IDs (one per rank holding one), joined into
    full rows in column order."""
    blocks = sorted(blocks, key=lambda block: block.col_offset)
    first = blocks[0]
    rows = first.table.ids.shape[0]
    next_col = 0
    for block in blocks:
        if block.table_cols != first.table_cols:
            raise _mismatch(fqn, f"column blocks say the table is "
                            f"{first.table_cols} and {block.table_cols} "
                            "columns wide")
        block_rows = block.table.ids.shape[0]
        if block_rows != rows or (
                rows > 0 and not np.array_equal(block.table.ids,
                                                first.table.ids)):
            raise _mismatch(fqn, f"the column block at column "
                            f"{block.col_offset} holds other IDs "
                            f"({block_rows} rows) than the one at column "
                            f"{first.col_offset} ({rows} rows)")
        if ((block.table.values is None) != (first.table.values is None) or
                (block.table.states is None) != (first.table.states is None)):
            raise _mismatch(fqn, "column blocks differ in what they carry")
        if block.table.values is None:
            continue
        if block.col_offset != next_col or block.table.values.ndim != 2:
            raise _mismatch(fqn, f"a column block starts at column "
                            f"{block.col_offset}, expected {next_col}")
        next_col += block.table.values.shape[1]
    if first.table.values is not None and next_col != first.table_cols:
        raise _mismatch(fqn, f"the column blocks cover {next_col} of its "
                        f"{first.table_cols} columns")

    def join(name: str) -> Optional[np.ndarray]:
        array = getattr(first.table, name)
        if array is None or array.ndim < 2:
            return array
        return np.concatenate([getattr(b.table, name) for b in blocks], 1)

    return TableDelta(ids=first.table.ids, states=join("states"),
                      values=join("values"), scores=first.table.scores)


def _disjoint_in_id_order(
        tables: List[TableDelta]) -> Optional[List[TableDelta]]:
    """`tables` (each with rows) ordered by their first ID when each one's
    IDs ascend strictly and their ranges do not overlap (row-wise and
    table-row-wise shards), so that concatenated in that order their rows
    ascend; None otherwise."""
    ranges = []
    for table in tables:
        ids = table.ids
        if (ids.dtype != np.int64 or ids.ndim != 1 or
                np.any(ids[1:] <= ids[:-1])):
            return None
        ranges.append((int(ids[0]), int(ids[-1]), table))
    ranges.sort(key=lambda r: r[0])
    if any(a[1] >= b[0] for a, b in zip(ranges, ranges[1:])):
        return None
    return [table for _, _, table in ranges]


def _concat_rows(fqn: str, pieces: List[_Piece],
                 data_parallel: bool) -> TableDelta:
    """Full-width rows of several ranks, sorted by ID; an ID served twice
    keeps the lowest rank's row for a data-parallel table and is an error
    otherwise."""
    filled = [piece.table for piece in pieces if _has_rows(piece.table)]
    if not filled:
        return pieces[0].table
    for name in _ROW_ARRAYS:
        if len({getattr(t, name) is None for t in filled}) > 1:
            raise _mismatch(fqn, "ranks differ in what they carry")
    if len(filled) == 1:
        return filled[0]
    carried = [name for name in _ROW_ARRAYS
               if getattr(filled[0], name) is not None]
    in_order = _disjoint_in_id_order(filled)
    if in_order is not None:
        return TableDelta(ids=np.concatenate([t.ids for t in in_order]), **{
            name: np.concatenate([getattr(t, name) for t in in_order])
            for name in carried})
    ids = np.concatenate([t.ids for t in filled])
    order = np.argsort(ids, kind="stable")  # equal IDs: the lower rank first
    ids = ids[order]
    repeated = ids[1:] == ids[:-1]
    if repeated.any():
        if not data_parallel:
            row = ids[np.flatnonzero(repeated)[0]]
            raise _mismatch(fqn, f"two ranks serve row ID {row} of a table "
                            "that is not data-parallel")
        keep = np.concatenate([[True], ~repeated])
        ids, order = ids[keep], order[keep]
    return TableDelta(ids=ids, **{
        name: np.concatenate([getattr(t, name) for t in filled])[order]
        for name in carried})


def _merge_headers(parts: Sequence[Delta]) -> Delta:
    """The merged delta's header fields (see the module comment), without
    tables."""
    oldest = [p.oldest_change_unix_micros for p in parts
              if p.oldest_change_unix_micros > 0]
    return Delta(
        consumer=parts[0].consumer,
        start_batch=max(p.start_batch for p in parts),
        end_batch=min(p.end_batch for p in parts),
        tables={},
        resync_required=any(p.resync_required for p in parts),
        lost_rows=sum(p.lost_rows for p in parts),
        all_rows=all(p.all_rows for p in parts),
        dense=parts[0].dense,
        oldest_change_unix_micros=min(oldest, default=0),
        newest_change_unix_micros=max(p.newest_change_unix_micros
                                      for p in parts),
        run_id=",".join(p.run_id for p in parts),
        run_start_batch=max(p.run_start_batch for p in parts))


def _merge_parts(topology: tracker_pb2.TopologyResponse,
                 parts: Sequence[RankPart]) -> Delta:
    # A rank holding no shard of a table it was asked for (a read of chosen
    # tables goes to every rank) answers it with no rows: not a piece.
    holders: Dict[str, set] = {}
    data_parallel = set()
    for shard in topology.shards:
        holders.setdefault(shard.fqn, set()).add(shard.rank)
        if shard.sharding_type == "DATA_PARALLEL":
            data_parallel.add(shard.fqn)
    pieces: Dict[str, List[_Piece]] = {}
    not_held: Dict[str, _Piece] = {}  # the first, by table
    for rank, (delta, columns) in enumerate(parts):
        for fqn, table in delta.tables.items():
            piece = _Piece(table, *columns.get(fqn, (0, 0)))
            if (fqn not in holders or rank in holders[fqn] or
                    _has_rows(table)):
                pieces.setdefault(fqn, []).append(piece)
            else:
                not_held.setdefault(fqn, piece)
    for fqn, piece in not_held.items():
        pieces.setdefault(fqn, [piece])
    same_start = len({delta.start_batch for delta, _ in parts}) == 1
    merged = _merge_headers([delta for delta, _ in parts])
    for fqn in sorted(pieces):
        listed = pieces[fqn]
        columns = listed[0].table_cols > 0
        if any((piece.table_cols > 0) != columns for piece in listed):
            raise _mismatch(fqn, "some ranks serve column blocks, others rows")
        try:
            merged.tables[fqn] = (
                _join_columns(fqn, listed) if columns else
                _concat_rows(fqn, listed, fqn in data_parallel))
        except FanInError:
            # The blocks of ranks whose parts start at different batches
            # (cursors restored from snapshots of different steps, a commit
            # that reached some ranks) or that dropped rows: a resync. A
            # read of all rows is the resync itself: it gets the error, never
            # an empty table set that would wipe the consumer's replica.
            if columns and not merged.all_rows and (
                    not same_start or merged.resync_required):
                return dataclasses.replace(merged, tables={}, dense={},
                                           resync_required=True)
            raise
    return merged


def merge_rank_deltas(topology: tracker_pb2.TopologyResponse,
                      parts: Sequence[RankPart]) -> Delta:
    """Merges one read's parts, one per rank in rank order, as a fan-in read
    does (the module comment), with `topology` saying which ranks hold which
    tables and which tables are data-parallel. One part is returned as it
    is. FanInError DATA_LOSS, naming the table, when the parts do not fit."""
    if not parts:
        raise ValueError("no rank's delta")
    if len(parts) == 1:
        return parts[0][0]
    try:
        return _merge_parts(topology, parts)
    except ValueError as error:  # arrays of shapes no check foresaw
        raise FanInError(grpc.StatusCode.DATA_LOSS,
                         f"the ranks' deltas do not fit: {error}") from error


def merge_statuses(
        statuses: Sequence[tracker_pb2.StatusResponse]
) -> tracker_pb2.StatusResponse:
    """Every rank's status (at least one, in rank order) as one:
    current_batch the lowest; bytes, caps, drops and each table's lookups,
    IDs and bytes summed; consumers_expired the most; run_id joined; per consumer of rank 0 the lowest
    cursor and the highest highest_cursor, the largest lag and pending
    reads, the earliest pending end, a resync any rank asks for."""
    merged = tracker_pb2.StatusResponse()
    merged.CopyFrom(statuses[0])
    tables = {table.fqn: table for table in merged.tables}
    consumers = {consumer.name: consumer for consumer in merged.consumers}
    for rank in statuses[1:]:
        merged.current_batch = min(merged.current_batch, rank.current_batch)
        for name in ("bytes", "memory_cap_bytes", "cap_compactions",
                     "cap_drops", "dropped_ids", "dropped_bytes"):
            setattr(merged, name, getattr(merged, name) + getattr(rank, name))
        # The ranks expire the same consumers, each by its own clock (one
        # may do so a step before another): the most any rank removed.
        merged.consumers_expired = max(merged.consumers_expired,
                                       rank.consumers_expired)
        merged.run_id = f"{merged.run_id},{rank.run_id}"
        merged.run_start_batch = max(merged.run_start_batch,
                                     rank.run_start_batch)
        merged.serves_live_rows = (merged.serves_live_rows and
                                   rank.serves_live_rows)
        for table in rank.tables:
            into = tables.get(table.fqn)
            if into is None:
                into = merged.tables.add()
                into.CopyFrom(table)
                tables[table.fqn] = into
                continue
            into.lookups += table.lookups
            into.ids += table.ids
            into.bytes += table.bytes
        for consumer in rank.consumers:
            into = consumers.get(consumer.name)
            if into is None:
                continue  # not on rank 0: not listed
            into.cursor = min(into.cursor, consumer.cursor)
            into.highest_cursor = max(into.highest_cursor,
                                      consumer.highest_cursor)
            into.lag_steps = max(into.lag_steps, consumer.lag_steps)
            into.lag_seconds = max(into.lag_seconds, consumer.lag_seconds)
            into.resync_required = (into.resync_required or
                                    consumer.resync_required)
            into.pending_reads = max(into.pending_reads,
                                     consumer.pending_reads)
            if consumer.has_pending_read:
                into.pending_end = (min(into.pending_end, consumer.pending_end)
                                    if into.has_pending_read
                                    else consumer.pending_end)
                into.has_pending_read = True
    return merged


def _refuse_top_k_of_column_blocks(topology: tracker_pb2.TopologyResponse,
                                   request: tracker_pb2.GetDeltaRequest):
    """ValueError when `request` asks top-k of a table split by columns:
    each rank would score its own columns and pick its own rows."""
    for shard in topology.shards:
        if shard.sharding_type != "COLUMN_WISE":
            continue
        read = not request.fqns or shard.fqn in request.fqns
        if shard.fqn in request.per_table_top_k or (
                read and request.HasField("top_k")):
            raise ValueError(
                f"top-k of table '{shard.fqn}', which {topology.world_size} "
                "ranks hold split by columns: each would score its own "
                "columns and pick other rows; read it without top-k")


def _each(count: int,
          call: Callable[[int], Any]) -> List[Tuple[Any, Optional[Exception]]]:
    """call(0), ..., call(count - 1) at once (0 on this thread, the others
    on a thread each); (result, None) or (None, error) of each, in order."""
    outcomes: List[Tuple[Any, Optional[Exception]]] = [(None, None)] * count

    def run(i: int) -> None:
        try:
            outcomes[i] = (call(i), None)
        except Exception as error:  # pylint: disable=broad-except
            outcomes[i] = (None, error)

    threads = [threading.Thread(target=run, args=(i,), daemon=True)
               for i in range(1, count)]
    for thread in threads:
        thread.start()
    run(0)
    for thread in threads:
        thread.join()
    return outcomes


def _earliest(*timeouts: Optional[float]) -> Optional[float]:
    """The shortest of the timeouts given (None: unbounded)."""
    return min((t for t in timeouts if t is not None), default=None)


@dataclasses.dataclass(frozen=True)
class _Ranks:
    """The ranks as discovered: the topology (empty for a server older than
    the Topology call) and a service of each rank, in rank order."""
    topology: tracker_pb2.TopologyResponse
    services: List[_TrackerService]


class FanIn:
    """TrackerClient's consumer calls, on every rank of a sharded trainer
    (the module comment). `first`: the service of the address given, used
    for the rank that answers there; `connect(address)`: a service of
    another rank. Thread-safe."""

    def __init__(self, first: _TrackerService,
                 connect: Callable[[str], _TrackerService]):
        self._first = first
        self._connect = connect
        self._lock = threading.Lock()
        self._ranks: Optional[_Ranks] = None
        self._last_run_id = ""  # of the last merged read: a change rediscovers

    # The ranks.
    def _current(self) -> _Ranks:
        """The ranks, discovered when none are known. The Topology call's
        error; FanInError INVALID_ARGUMENT for a malformed topology."""
        with self._lock:
            if self._ranks is not None:
                return self._ranks
        first = self._first
        try:
            topology = first.call(first.stub.Topology,
                                  tracker_pb2.TopologyRequest())
        except grpc.RpcError as error:
            if error.code() != grpc.StatusCode.UNIMPLEMENTED:
                raise
            topology = tracker_pb2.TopologyResponse()  # one process
        services = [first]
        if topology.world_size > 1:
            n = topology.world_size
            if len(topology.endpoints) != n or not 0 <= topology.rank < n:
                raise FanInError(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"{first.target} answered a topology of {n} ranks with "
                    f"{len(topology.endpoints)} endpoints (rank "
                    f"{topology.rank})")
            for r, endpoint in enumerate(topology.endpoints):
                if endpoint.rank != r or not endpoint.address:
                    raise FanInError(
                        grpc.StatusCode.INVALID_ARGUMENT,
                        f"{first.target} answered no endpoint for rank {r}: "
                        f"{endpoint}")
            services = [first if r == topology.rank else
                        self._connect(endpoint.address)
                        for r, endpoint in enumerate(topology.endpoints)]
        with self._lock:
            if self._ranks is None:
                self._ranks = _Ranks(topology, services)
            return self._ranks

    def _forget(self, ranks: _Ranks) -> None:
        """Forgets `ranks` (when still current): the next call rediscovers."""
        with self._lock:
            if self._ranks is ranks:
                self._ranks = None

    def _rank_error(self, ranks: _Ranks, rank: int,
                    error: Exception) -> Exception:
        """`error` of rank `rank`, named so when there are several ranks;
        forgets the ranks when it says a rank is unreachable."""
        if (isinstance(error, grpc.RpcError) and
                error.code() == grpc.StatusCode.UNAVAILABLE):
            self._forget(ranks)
        if len(ranks.services) == 1:
            return error
        if isinstance(error, grpc.RpcError):
            return FanInError(error.code(), f"rank {rank}: {error.details()}")
        if isinstance(error, ValueError):  # a malformed stream
            return ValueError(f"rank {rank}: {error}")
        if isinstance(error, RuntimeError):  # a stream ended early
            return RuntimeError(f"rank {rank}: {error}")
        return error

    def _raise(self, ranks: _Ranks, rank: int, error: Exception) -> NoReturn:
        """Raises _rank_error's error."""
        named = self._rank_error(ranks, rank, error)
        if named is error:
            raise error
        raise named from error

    def _on_every_rank(self, call: Callable[[_TrackerService], T]) -> List[T]:
        """`call` on every rank at once; the results in rank order, or the
        first rank's error (by rank)."""
        return self._on_ranks(self._current(), call)

    def _on_ranks(self, ranks: _Ranks,
                  call: Callable[[_TrackerService], T]) -> List[T]:
        """_on_every_rank on `ranks`."""
        outcomes = _each(len(ranks.services),
                         lambda r: call(ranks.services[r]))
        for rank, (_, error) in enumerate(outcomes):
            if error is not None:
                self._raise(ranks, rank, error)
        return [result for result, _ in outcomes]

    def _current_batch_of_rank0(self, ranks: _Ranks,
                                timeout: Optional[float]) -> int:
        """Rank 0's current batch (its Status call bounded by `timeout`
        seconds, and by the service's own timeout)."""
        service = ranks.services[0]
        try:
            return service.call(service.stub.Status,
                                tracker_pb2.StatusRequest(),
                                timeout=_earliest(timeout, service.timeout)
                                ).current_batch
        except grpc.RpcError as error:
            self._raise(ranks, 0, error)

    # Reads.
    def get(self, request: tracker_pb2.GetDeltaRequest,
            timeout: Optional[float]) -> Delta:
        """One read (its stream bounded by `timeout` seconds): one rank's
        delta as it is, or every rank's at one cut, merged."""
        ranks = self._current()
        if len(ranks.services) == 1:
            try:
                return _read_delta(ranks.services[0].open_read(
                    request, timeout))[0]
            except grpc.RpcError as error:
                self._raise(ranks, 0, error)
        return self._read_at_cut(ranks, request, timeout)

    def _read_at_cut(self, ranks: _Ranks, request: tracker_pb2.GetDeltaRequest,
                     timeout: Optional[float]) -> Delta:
        """Every rank's part of `request` at one cut (a fresh one unless the
        request names one), read concurrently and merged. The error of the
        first rank whose read fails (the other reads are cancelled then);
        FanInError ABORTED when the parts end at different batches, DATA_LOSS
        when they do not fit together."""
        if not request.all_rows:  # top-k does not apply to all_rows
            _refuse_top_k_of_column_blocks(ranks.topology, request)
        at_cut = tracker_pb2.GetDeltaRequest()
        at_cut.CopyFrom(request)
        if at_cut.cut == 0:
            at_cut.cut = random.randrange(1, 1 << 63)
        streams = [service.open_read(at_cut, timeout)
                   for service in ranks.services]
        failures: List[Tuple[int, Exception]] = []  # in the order they came

        def read(rank: int) -> RankPart:
            try:
                return _read_delta(streams[rank])
            except Exception as error:
                failures.append((rank, error))
                for stream in streams:
                    stream.cancel()
                raise

        outcomes = _each(len(streams), read)
        if failures:
            self._raise(ranks, *failures[0])
        parts = [part for part, _ in outcomes]
        end = parts[0][0].end_batch
        for rank, (delta, _) in enumerate(parts):
            if delta.end_batch != end:
                raise FanInError(
                    grpc.StatusCode.ABORTED,
                    f"rank 0's part ends at batch {end}, rank {rank}'s at "
                    f"{delta.end_batch}: not one cut (a trainer whose ranks "
                    "do not hold at step boundaries?)")
        merged = merge_rank_deltas(ranks.topology, parts)
        with self._lock:
            if (self._last_run_id and merged.run_id != self._last_run_id and
                    self._ranks is ranks):
                self._ranks = None  # another run: the group may have moved
            self._last_run_id = merged.run_id
        return merged

    def subscribe(self, request: tracker_pb2.SubscribeRequest,
                  read_timeout: Optional[float],
                  timeout: Optional[float]) -> Subscription:
        """One rank's Subscribe stream; with several, a PollingSubscription
        (each read bounded by `read_timeout`, the whole by `timeout`)."""
        ranks = self._current()
        if len(ranks.services) == 1:
            return Subscription(ranks.services[0].open_subscription(
                request, timeout))
        return PollingSubscription(self, ranks, request, read_timeout, timeout)

    # Consumers and the tracker.
    def commit(self, request: tracker_pb2.CommitRequest) -> None:
        """On every rank; the first rank's error (the other ranks' commits
        stand)."""
        self._on_every_rank(lambda s: s.call(s.stub.Commit, request))

    def touch(self, request: tracker_pb2.ConsumerRequest) -> None:
        """On every rank; the first rank's error (by rank)."""
        self._touch_ranks(self._current(), request, None)

    def _touch_ranks(self, ranks: _Ranks,
                     request: tracker_pb2.ConsumerRequest,
                     timeout: Optional[float]) -> None:
        """Touch on every one of `ranks`, each call bounded by `timeout`
        seconds and by the service's own timeout; the first rank's error (by
        rank), naming it."""
        self._on_ranks(ranks, lambda s: s.call(
            s.stub.Touch, request, timeout=_earliest(timeout, s.timeout)))

    def consumers(self) -> List[str]:
        """Rank 0's consumers."""
        ranks = self._current()
        service = ranks.services[0]
        try:
            return list(service.call(service.stub.ListConsumers,
                                     tracker_pb2.ListConsumersRequest()
                                     ).consumers)
        except grpc.RpcError as error:
            self._raise(ranks, 0, error)

    def add_consumer(self, consumer: str) -> List[str]:
        """On every rank; ALREADY_EXISTS only when every rank says so."""
        return self._change_consumers("AddConsumer", consumer,
                                      grpc.StatusCode.ALREADY_EXISTS)

    def remove_consumer(self, consumer: str) -> List[str]:
        """On every rank; NOT_FOUND only when every rank says so."""
        return self._change_consumers("RemoveConsumer", consumer,
                                      grpc.StatusCode.NOT_FOUND)

    def _change_consumers(self, method: str, consumer: str,
                          benign: grpc.StatusCode) -> List[str]:
        """RPC `method` (AddConsumer or RemoveConsumer) on every rank:
        `benign` from some ranks is what an earlier, partly failed call
        left, and is passed over; from every rank it is the answer (rank 0's
        error). Otherwise the first other error, naming its rank, or the
        list of the first rank that answered with one."""
        ranks = self._current()
        request = tracker_pb2.ConsumerRequest(consumer=consumer)

        def change(service: _TrackerService) -> List[str]:
            return list(service.call(getattr(service.stub, method),
                                     request).consumers)

        outcomes = _each(len(ranks.services),
                         lambda r: change(ranks.services[r]))
        benign_ranks = 0
        for rank, (_, error) in enumerate(outcomes):
            if error is None:
                continue
            if isinstance(error, grpc.RpcError) and error.code() == benign:
                benign_ranks += 1
                continue
            self._raise(ranks, rank, error)
        if benign_ranks == len(outcomes):
            raise outcomes[0][1]
        return next(result for result, error in outcomes if error is None)

    def clear(self, consumer: str) -> None:
        """On every rank."""
        request = tracker_pb2.ClearRequest(consumer=consumer)
        self._on_every_rank(lambda s: s.call(s.stub.Clear, request))

    def compact(self) -> None:
        """On every rank."""
        request = tracker_pb2.CompactRequest()
        self._on_every_rank(lambda s: s.call(s.stub.Compact, request))

    def status(self) -> tracker_pb2.StatusResponse:
        """Every rank's status, merged (merge_statuses)."""
        request = tracker_pb2.StatusRequest()
        return merge_statuses(self._on_every_rank(
            lambda s: s.call(s.stub.Status, request)))

    def close(self) -> None:
        """Closes the channels of the ranks other than `first`'s."""
        with self._lock:
            ranks = self._ranks
        for service in ranks.services if ranks else ():
            if service is not self._first:
                service.close()


class _Schedule:
    """When a polling subscription pushes: base/subscription_schedule.h for
    the periods TrackerClient.subscribe takes (dense parameters, when asked,
    go with every push). Times in seconds of time.monotonic()."""

    MAX_EVERY_STEPS = 1 << 40
    MAX_EVERY_MS = 366 * 24 * 3600 * 1000

    def __init__(self, every_steps: int, every_ms: int, now: float):
        for name, value, most in (("every_steps", every_steps,
                                   self.MAX_EVERY_STEPS),
                                  ("every_ms", every_ms, self.MAX_EVERY_MS)):
            if not 0 <= value <= most:
                raise ValueError(f"{name} must be 0 to {most}, got {value}")
        self._every_steps = max(1, every_steps)
        self._every = every_ms / 1000 if every_ms > 0 else math.inf
        self.first = True
        self.pushed_through = 0  # the last push's end_batch
        self._last_push = now

    def due(self, current_batch: int, now: float) -> bool:
        """Whether a push is due with the tracker at `current_batch`: the
        first at once, then once every_steps batches closed since the last
        push, or every_ms passed and a batch closed."""
        closed = current_batch - self.pushed_through
        return self.first or closed >= self._every_steps or (
            closed > 0 and now - self._last_push >= self._every)

    def wait(self, now: float, poll: float) -> float:
        """Seconds to wait before looking again when no push is due: `poll`
        (for a step), or less, to the timer."""
        return max(0.001, min(poll, self._last_push + self._every - now))

    def pushed(self, end_batch: int, now: float) -> None:
        """A push ending at `end_batch` was delivered."""
        self.first = False
        self.pushed_through = end_batch
        self._last_push = now


class PollingSubscription(Subscription):
    """A subscription to a sharded trainer, as the C++ FanInClient's: no
    rank pushes a merged delta, so the client reads every rank at one cut on
    the subscription's schedule, the tracker's batch taken from rank 0's
    status (every 10 ms while a push waits). While a push waits it keeps its
    consumer on every rank every second (the Touch call; a push is contact
    too), as the server's Subscribe keeps its own: a schedule longer than
    the ranks' consumer expiry keeps its consumer, and a consumer removed
    from any rank (or expired there) ends the subscription within about a
    second, the iteration raising FanInError NOT_FOUND naming the rank and
    the consumer, however far off the next push. The first push reads
    from the consumer's cursor (all rows, when asked); each later one the
    batches closed since, on from the previous push's end (continue_from:
    in acknowledged mode it may still be uncommitted). The same interface
    as Subscription: iterate for merged Deltas; cancel() ends it (iteration
    stops); past `timeout` seconds iteration raises FanInError
    DEADLINE_EXCEEDED; a read's error (naming the rank) is raised by the
    iteration."""

    POLL_SECONDS = 0.01
    # How often the consumer is touched on every rank while a push waits.
    KEEP_CONSUMER_SECONDS = 1.0

    def __init__(self, fan_in: FanIn, ranks: _Ranks,
                 request: tracker_pb2.SubscribeRequest,
                 read_timeout: Optional[float], timeout: Optional[float]):
        # Not Subscription.__init__: no stream.
        self._schedule = _Schedule(request.every_steps, request.every_ms,
                                   time.monotonic())
        self._fan_in = fan_in
        self._ranks = ranks
        self._read = request.read
        self._read_timeout = read_timeout
        self._timeout = timeout
        self._deadline = (None if timeout is None
                          else time.monotonic() + timeout)
        self._cancelled = threading.Event()
        # When the consumer was last touched on every rank (or read there).
        self._consumer_kept = time.monotonic()
        self._touch = tracker_pb2.ConsumerRequest(
            consumer=request.read.consumer)
        # The error that ended the subscription, raised again by every later
        # __next__.
        self._error: Optional[Exception] = None

    def _time_left(self) -> Optional[float]:
        """Seconds until the deadline (None: none); FanInError when past."""
        if self._deadline is None:
            return None
        left = self._deadline - time.monotonic()
        if left <= 0:
            raise FanInError(grpc.StatusCode.DEADLINE_EXCEEDED,
                             f"the subscription's {self._timeout} s passed")
        return left

    def __next__(self) -> Delta:
        """The next push. An error ends the subscription: it is raised
        again by every later call, as a gRPC stream's is, and nothing more
        is read (a later push would skip the batches of the one that
        failed)."""
        if self._error is not None:
            raise self._error
        try:
            return self._next_push()
        except StopIteration:
            raise
        except Exception as error:
            self._error = error
            raise

    def _next_push(self) -> Delta:
        schedule = self._schedule
        while not self._cancelled.is_set():
            left = self._time_left()
            current = self._fan_in._current_batch_of_rank0(self._ranks, left)
            now = time.monotonic()
            if not schedule.due(current, now):
                if now - self._consumer_kept >= self.KEEP_CONSUMER_SECONDS:
                    self._fan_in._touch_ranks(self._ranks, self._touch, left)
                    self._consumer_kept = now
                self._cancelled.wait(_earliest(
                    schedule.wait(now, self.POLL_SECONDS), left))
                continue
            read = tracker_pb2.GetDeltaRequest()
            read.CopyFrom(self._read)
            read.all_rows = read.all_rows and schedule.first
            if not schedule.first:
                read.continue_from = schedule.pushed_through
            delta = self._fan_in._read_at_cut(
                self._ranks, read, _earliest(self._read_timeout, left))
            schedule.pushed(delta.end_batch, now)
            self._consumer_kept = now  # a read reaches every rank
            return delta
        raise StopIteration

    def cancel(self) -> None:
        """Ends the subscription: iteration stops (after a read in flight)."""
        self._cancelled.set()
