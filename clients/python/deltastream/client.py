"""Clients of the tracker service (proto/tracker.proto) and the predictor's
lookup API (proto/predictor.proto).

Arrays come back as NumPy arrays over the received bytes: a table that
arrives in one chunk is `np.frombuffer` over the message's bytes (read-only,
no copy); a table streamed in several chunks is assembled with one copy of
each chunk into its array. Errors are `grpc.RpcError` with the server's code
and message (for example NOT_FOUND for an unknown consumer); bad arguments
raise ValueError before anything is sent; a malformed delta stream raises
ValueError (_DeltaAssembler) and is cancelled.

A client holds one gRPC channel (one per rank of a sharded trainer, which
it reads as one model: deltastream/fan_in.py); it is safe to use from several
threads (as gRPC's channels are). Close it with `close()` or a `with` block.
"""

import dataclasses
from typing import Dict, Iterable, Iterator, List, Mapping, Optional, Tuple, Union

import grpc
import numpy as np

from . import tensors
from ._proto import predictor_pb2, predictor_pb2_grpc, tracker_pb2, tracker_pb2_grpc

@dataclasses.dataclass
class TableDelta:
    """One table's rows in a delta, row i for ids[i], IDs ascending.

    ids: int64 [n]. states: [n, ...] the tracked states (by mode; None when
    the mode keeps none). values: [n, dim] the rows' current values (None on
    a standalone server). scores: float32 [n] when asked for.
    """
    ids: np.ndarray
    states: Optional[np.ndarray] = None
    values: Optional[np.ndarray] = None
    scores: Optional[np.ndarray] = None


@dataclasses.dataclass
class Delta:
    """A consumer's read: the batches [start_batch, end_batch), per table.

    end_batch is the token to `commit` in acknowledged mode. When
    resync_required is set the consumer lost `lost_rows` rows to the memory
    cap and must read all rows again (all_rows=True, inside a trainer).
    dense: the model's dense parameters by name, when asked for.
    """
    consumer: str
    start_batch: int
    end_batch: int
    tables: Dict[str, TableDelta]
    resync_required: bool = False
    lost_rows: int = 0
    all_rows: bool = False
    dense: Dict[str, np.ndarray] = dataclasses.field(default_factory=dict)
    oldest_change_unix_micros: int = 0
    newest_change_unix_micros: int = 0
    run_id: str = ""
    run_start_batch: int = 0


TopK = Union[None, int, float]


def _top_k(value: TopK, out: tracker_pb2.TopK) -> None:
    """int: a row count (>= 1); float: a percentage in (0, 100]."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"top_k must be an int (rows) or a float (percent), "
                         f"not {value!r}")
    if isinstance(value, int):
        out.count = value
    else:
        out.percentage = value


def _channel(target: str, root_certificates: Optional[bytes],
             max_message_bytes: int) -> grpc.Channel:
    # Keepalive pings while a call is open, as the C++ client's
    # (clients/delta_client.h): a subscription to a server whose host died
    # without a FIN or RST fails as UNAVAILABLE instead of waiting forever.
    # The project's servers accept a ping every 20 s.
    options = [("grpc.max_receive_message_length", max_message_bytes),
               ("grpc.max_send_message_length", max_message_bytes),
               ("grpc.keepalive_time_ms", 20000),
               ("grpc.keepalive_timeout_ms", 20000),
               ("grpc.keepalive_permit_without_calls", 0),
               # Keep pinging a subscription with no deltas to send: gRPC
               # stops after 2 pings without data by default, and a dead
               # host would then hang it (the C++ client sets it too).
               ("grpc.http2.max_pings_without_data", 0),
               # gRPC's transparent retries off: with them (grpcio 1.51,
               # Debian's), the first streaming call after a server's
               # graceful shutdown (a restarted trainer's GOAWAY) waited
               # forever, past its deadline. Without, it fails UNAVAILABLE at
               # once, which tells the fan-in to find the ranks again.
               ("grpc.enable_retries", 0)]
    if root_certificates is None:
        return grpc.insecure_channel(target, options=options)
    credentials = grpc.ssl_channel_credentials(root_certificates)
    return grpc.secure_channel(target, credentials, options=options)


class _Connection:
    """A channel and the call metadata (the bearer token) shared by clients."""

    def __init__(self, target: str, token: Optional[str],
                 root_certificates: Optional[bytes], timeout: Optional[float],
                 max_message_bytes: int):
        if not target:
            raise ValueError("target must be HOST:PORT")
        self.target = target
        self.timeout = timeout
        self._metadata = ((("authorization", f"Bearer {token}"),)
                          if token else ())
        self._channel = _channel(target, root_certificates, max_message_bytes)

    def call(self, method, request, timeout=None, **kwargs):
        return method(request, metadata=self._metadata,
                      timeout=timeout if timeout is not None else self.timeout,
                      **kwargs)

    def close(self) -> None:
        self._channel.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class _DeltaAssembler:
    """Builds Deltas from a stream of DeltaChunks (one delta per `last`).

    A malformed stream raises ValueError naming the table or parameter and
    the problem, where the C++ client (clients/delta_client.cc,
    AddDeltaChunk) refuses it: chunks that do not fit their table (rows out
    of order, another dtype or row shape, a table sent twice), shapes over
    the wire's bounds (tensors.element_count) or that no memory holds, and a
    delta that ends without a table its header names, without its dense
    parameters, or within a table or parameter.
    """

    def __init__(self):
        self._delta: Optional[Delta] = None
        # The last delta's column blocks: fqn -> (col_offset, table_cols) of
        # each table whose chunks name one (DeltaChunk.col_offset: a
        # column-wise shard, served by one rank of a sharded trainer).
        self.columns: Dict[str, Tuple[int, int]] = {}
        # Tables coming in several chunks: their arrays, the arrays' wire
        # dtypes, and the next row.
        self._pending: Dict[str, Tuple[Dict[str, np.ndarray], Dict[str, int],
                                       int]] = {}
        # A dense parameter coming in pieces: its name, array, elements in.
        self._dense_piece: Optional[Tuple[str, np.ndarray, int]] = None
        # The dense parameters the delta's header says it holds.
        self._dense_parameters = 0

    def add(self, chunk: tracker_pb2.DeltaChunk) -> Optional[Delta]:
        """Adds a chunk; returns the delta when `chunk` is its last one."""
        if chunk.HasField("header"):
            h = chunk.header
            self._delta = Delta(
                consumer=h.consumer, start_batch=h.start_batch,
                end_batch=h.end_batch, tables={fqn: None for fqn in h.fqns},
                resync_required=h.resync_required, lost_rows=h.lost_rows,
                all_rows=h.all_rows,
                oldest_change_unix_micros=h.oldest_change_unix_micros,
                newest_change_unix_micros=h.newest_change_unix_micros,
                run_id=h.run_id, run_start_batch=h.run_start_batch)
            self._pending = {}
            self._dense_piece = None
            self._dense_parameters = h.dense_parameters
            self.columns = {}
        if self._delta is None:
            raise ValueError("delta stream without a header")
        if chunk.HasField("dense"):
            self._add_dense(chunk.dense)
        elif chunk.fqn:
            self._add_rows(chunk)
        if not chunk.last:
            return None
        if self._dense_piece is not None:
            raise ValueError("the delta ended within dense parameter "
                             f"'{self._dense_piece[0]}'")
        delta, self._delta = self._delta, None
        if len(delta.dense) != self._dense_parameters:
            raise ValueError(f"the delta ended with {len(delta.dense)} of its "
                             f"{self._dense_parameters} dense parameters")
        for fqn, (arrays, _, received) in self._pending.items():
            raise ValueError(f"table '{fqn}': the delta ended with "
                             f"{received} of its {len(arrays['ids'])} rows")
        for fqn, table in delta.tables.items():
            if table is None:
                raise ValueError(f"table '{fqn}' named in the header never "
                                 "came")
        return delta

    def _add_dense(self, named) -> None:
        """A dense parameter, or the next piece of one (NamedTensor.piece_of):
        pieces in order, each continuing the parameter the last one began."""
        try:
            piece = tensors.to_numpy(named.tensor)
        except ValueError as error:
            raise ValueError(f"dense parameter '{named.name}': "
                             f"{error}") from None
        if named.name in self._delta.dense:
            raise ValueError(f"dense parameter '{named.name}' sent twice")
        if not named.piece_of:
            if self._dense_piece is not None:
                raise ValueError(f"dense parameter '{named.name}' within the "
                                 f"pieces of '{self._dense_piece[0]}'")
            self._delta.dense[named.name] = piece
            return
        if named.piece_offset == 0 and self._dense_piece is None:
            self._dense_piece = (named.name, _allocate(
                f"dense parameter '{named.name}'", tuple(named.piece_of),
                piece.dtype), 0)
        name, whole, received = self._dense_piece or (None, None, 0)
        if name != named.name or named.piece_offset != received:
            raise ValueError(f"dense parameter '{named.name}': a piece at "
                             f"element {named.piece_offset} out of order")
        if (piece.ndim != 1 or piece.size == 0 or piece.dtype != whole.dtype
                or received + piece.size > whole.size):
            raise ValueError(f"dense parameter '{named.name}': a piece of "
                             f"{piece.size} {piece.dtype} elements at "
                             f"{received} of a parameter of {whole.size} "
                             f"{whole.dtype}")
        whole.reshape(-1)[received:received + piece.size] = piece
        received += piece.size
        if received == whole.size:
            self._delta.dense[name] = whole
            self._dense_piece = None
        else:
            self._dense_piece = (name, whole, received)

    def _add_rows(self, chunk: tracker_pb2.DeltaChunk) -> None:
        """One chunk of a table's rows: a table's chunks come in row order
        and, by the delta's last chunk, cover every row of each array (rows
        left out would be read uninitialised)."""
        fields, wire = {}, {}
        for name in ("ids", "states", "values", "scores"):
            if chunk.HasField(name):
                tensor = getattr(chunk, name)
                try:
                    fields[name] = tensors.to_numpy(tensor)
                except ValueError as error:
                    raise ValueError(f"table '{chunk.fqn}': {name}: "
                                     f"{error}") from None
                wire[name] = tensor.dtype
        if "ids" not in fields:
            raise ValueError(f"table '{chunk.fqn}': a chunk without ids")
        rows, start = chunk.table_rows, chunk.row_offset
        end = start + fields["ids"].shape[0]
        if any(a.ndim == 0 or a.shape[0] != end - start
               for a in fields.values()):
            raise ValueError(f"table '{chunk.fqn}': a chunk whose arrays "
                             "hold different numbers of rows")
        if end > rows:
            raise ValueError(f"chunk rows [{start}, {end}) of "
                             f"{chunk.fqn} past its {rows} rows")
        if chunk.table_cols > 0:
            self.columns[chunk.fqn] = (chunk.col_offset, chunk.table_cols)
        if self._delta.tables.get(chunk.fqn) is not None:
            raise ValueError(f"table '{chunk.fqn}': rows from {start} after "
                             "all its rows came (a table sent twice)")
        arrays, dtypes, received = self._pending.pop(chunk.fqn, ({}, {}, 0))
        if start != received:
            raise ValueError(f"table '{chunk.fqn}': rows from {start} where "
                             f"row {received} came next")
        if start == 0 and end == rows:  # one chunk: share the message's bytes
            self._delta.tables[chunk.fqn] = TableDelta(**fields)
            return
        if start > 0 and set(fields) != set(arrays):
            raise ValueError(f"table '{chunk.fqn}': a chunk of "
                             f"{sorted(fields)} after chunks of "
                             f"{sorted(arrays)}")
        for name, part in fields.items():
            if name not in arrays:
                arrays[name] = _allocate(f"table '{chunk.fqn}' {name}",
                                         (rows,) + part.shape[1:], part.dtype)
                dtypes[name] = wire[name]
            whole = arrays[name]
            # bfloat16 and float32 both come as float32: the wire's dtypes.
            if (wire[name] != dtypes[name] or
                    (rows,) + part.shape[1:] != whole.shape):
                raise ValueError(
                    f"table '{chunk.fqn}': a chunk of {name} "
                    f"{_dtype_name(wire[name])} {list(part.shape)} does not "
                    f"fit a table of {_dtype_name(dtypes[name])} "
                    f"{list(whole.shape)}")
            whole[start:end] = part
        if end == rows:
            self._delta.tables[chunk.fqn] = TableDelta(**arrays)
        else:
            self._pending[chunk.fqn] = (arrays, dtypes, end)


def _dtype_name(wire_dtype: int) -> str:
    """A wire dtype's name ("float32"), for messages."""
    try:
        return tensors.Tensor.DType.Name(wire_dtype).lower()
    except ValueError:
        return f"dtype {wire_dtype}"


def _allocate(what: str, shape: Tuple[int, ...], dtype) -> np.ndarray:
    """An uninitialised array for `what` (a table's or parameter's whole,
    assembled from chunks). ValueError, naming it, for a shape the wire does
    not allow (tensors.element_count) or one no memory holds, as the C++
    client's DataLoss and ResourceExhausted."""
    try:
        count = tensors.element_count(shape)
    except ValueError as error:
        raise ValueError(f"{what}: {error}") from None
    try:
        return np.empty(shape, dtype)
    except MemoryError:
        raise ValueError(f"{what}: no memory for {dtype} {list(shape)} "
                         f"({count * np.dtype(dtype).itemsize} bytes)"
                         ) from None


def _read_request(consumer: str, fqns: Optional[Iterable[str]], top_k: TopK,
                  per_table_top_k: Optional[Mapping[str, TopK]],
                  include_scores: bool, all_rows: bool, include_dense: bool,
                  omit_states: bool, omit_values: bool,
                  max_chunk_bytes: int) -> tracker_pb2.GetDeltaRequest:
    if not consumer:
        raise ValueError("consumer must be named")
    request = tracker_pb2.GetDeltaRequest(
        consumer=consumer, fqns=list(fqns or ()),
        include_scores=include_scores, all_rows=all_rows,
        include_dense=include_dense, omit_states=omit_states,
        omit_values=omit_values, max_chunk_bytes=max_chunk_bytes)
    if top_k is not None:
        _top_k(top_k, request.top_k)
    for fqn, k in (per_table_top_k or {}).items():
        _top_k(k, request.per_table_top_k[fqn])
    return request


def _read_delta(stream) -> Tuple[Delta, Dict[str, Tuple[int, int]]]:
    """The delta a GetDelta stream carries, and its tables' column blocks
    (_DeltaAssembler.columns). RuntimeError when the stream ends early."""
    assembler = _DeltaAssembler()
    try:
        for chunk in stream:
            delta = assembler.add(chunk)
            if delta is not None:
                return delta, assembler.columns
    except ValueError:
        stream.cancel()  # a malformed chunk: the rest is of no use
        raise
    raise RuntimeError("the delta stream ended before its last chunk")


class _TrackerService(_Connection):
    """A channel to one tracker service and its stub: a one-process server,
    or one rank of a sharded trainer."""

    def __init__(self, target: str, token: Optional[str],
                 root_certificates: Optional[bytes], timeout: Optional[float],
                 max_message_bytes: int):
        super().__init__(target, token, root_certificates, timeout,
                         max_message_bytes)
        self.stub = tracker_pb2_grpc.DeltaTrackerStub(self._channel)

    def open_read(self, request: tracker_pb2.GetDeltaRequest,
                  timeout: Optional[float]):
        """Starts a GetDelta stream, bounded by `timeout` seconds (None:
        unbounded); the stream is an iterator of chunks with cancel()."""
        return self.stub.GetDelta(request, metadata=self._metadata,
                                  timeout=timeout)

    def open_subscription(self, request: tracker_pb2.SubscribeRequest,
                          timeout: Optional[float]):
        """Starts a Subscribe stream, bounded by `timeout` seconds."""
        return self.stub.Subscribe(request, metadata=self._metadata,
                                   timeout=timeout)


class TrackerClient(_TrackerService):
    """A client of a tracker: tracker_server, or a trainer's --listen port.

    Consumer side: get, subscribe, commit, touch, consumers, add_consumer,
    remove_consumer, clear, compact, status. Producer side (a Python trainer
    beside tracker_server): push (one record of lookups) and step (closes
    the batch). `token`: the bearer token (tracker_service/auth.h roles);
    `root_certificates`: PEM bytes to verify a TLS server (None: plaintext);
    `timeout`: seconds per unary call (None: none); `read_timeout`: seconds
    for a whole `get` stream (None: none), as the C++ client's 600 s.

    A sharded trainer (several ranks, each serving its own shards from its
    own address) is read as one model, as the C++ FanInClient reads it
    (clients/fan_in_client.h): given any rank's address, the first call
    discovers every rank (the Topology RPC) and the consumer-side calls fan
    in: `get` reads every rank at one consistent cut and merges the parts
    into full tables with global row IDs, ascending and each once;
    `subscribe` polls; `commit`, `touch`, `add_consumer`,
    `remove_consumer`, `clear` and `compact` reach every rank; `status`
    merges the ranks'; `consumers` is rank 0's. See deltastream/fan_in.py
    for the merge rules and errors (a FanInError, a grpc.RpcError, names
    the rank or the table). With one process (tracker_server, a
    one-process trainer) every call goes to `target` unchanged. `push` and
    `step` always go to `target` (a trainer refuses them: it records its
    own lookups).
    """

    def __init__(self, target: str, token: Optional[str] = None,
                 root_certificates: Optional[bytes] = None,
                 timeout: Optional[float] = 30.0,
                 max_message_bytes: int = 64 << 20,
                 read_timeout: Optional[float] = 600.0):
        super().__init__(target, token, root_certificates, timeout,
                         max_message_bytes)
        from .fan_in import FanIn  # fan_in imports this module
        self.read_timeout = read_timeout
        self._fan_in = FanIn(self, lambda address: _TrackerService(
            address, token, root_certificates, timeout, max_message_bytes))

    def close(self) -> None:
        """Closes the channels (every rank's)."""
        self._fan_in.close()
        super().close()

    # Producer.
    def push(self, tables: Mapping[str, Union[np.ndarray, Tuple]]) -> int:
        """Records one lookup per table into the current batch, all or none.

        tables: fqn -> ids, or fqn -> (ids, states) with states [n, ...]
        (the modes that keep states need them). ids: int64 [n] (any integer
        array or CPU tensor). Returns the batch they went to.
        """
        request = tracker_pb2.RecordRequest()
        for fqn, rows in tables.items():
            ids, states = (rows if isinstance(rows, tuple) else (rows, None))
            table = request.tables.add(fqn=fqn)
            tensors.from_numpy(np.asarray(ids).reshape(-1), table.ids)
            if states is not None:
                tensors.from_numpy(states, table.states)
        response = self.call(self.stub.Record, iter([request]))
        if response.records != 1:
            raise RuntimeError(f"the server recorded {response.records} of 1 "
                               "record message")
        return response.batch

    def step(self) -> int:
        """Closes the current batch; returns the new current batch."""
        return self.call(self.stub.Step, tracker_pb2.StepRequest()).batch

    # Consumer.
    def get(self, consumer: str, fqns: Optional[Iterable[str]] = None,
            top_k: TopK = None,
            per_table_top_k: Optional[Mapping[str, TopK]] = None,
            include_scores: bool = False, all_rows: bool = False,
            include_dense: bool = False, omit_states: bool = False,
            omit_values: bool = False, max_chunk_bytes: int = 0) -> Delta:
        """The consumer's delta since its last read (closed batches only).

        fqns: the tables to read (None: all); top_k / per_table_top_k: a row
        count (int) or a percentage (float). The consumer's cursor moves (in
        acknowledged mode, only once `commit` is called). A sharded trainer:
        every rank's part at one cut, merged (top-k of a table split by
        columns is refused: ValueError).
        """
        request = _read_request(consumer, fqns, top_k, per_table_top_k,
                                include_scores, all_rows, include_dense,
                                omit_states, omit_values, max_chunk_bytes)
        return self._fan_in.get(request, self.read_timeout)

    def subscribe(self, consumer: str, every_steps: int = 1,
                  every_ms: int = 0, fqns: Optional[Iterable[str]] = None,
                  top_k: TopK = None, include_scores: bool = False,
                  all_rows: bool = False, include_dense: bool = False,
                  omit_states: bool = False, omit_values: bool = False,
                  timeout: Optional[float] = None) -> "Subscription":
        """Pushed deltas: every `every_steps` closed batches or `every_ms`
        milliseconds, whichever first, starting with what is unread now.

        Returns a Subscription: iterate it for Deltas; `cancel()` ends it.
        `timeout` bounds the whole stream (None: until cancelled). A sharded
        trainer: a fan_in.PollingSubscription, merged reads on the same
        schedule, which touches its consumer on every rank every second
        while a push waits (it ends NOT_FOUND, naming the rank, once a rank
        lacks the consumer), as the server's Subscribe keeps its own.
        """
        request = tracker_pb2.SubscribeRequest(
            read=_read_request(consumer, fqns, top_k, None, include_scores,
                               all_rows, include_dense, omit_states,
                               omit_values, 0),
            every_steps=every_steps, every_ms=every_ms)
        return self._fan_in.subscribe(request, self.read_timeout, timeout)

    def commit(self, consumer: str, end_batch: int) -> None:
        """Acknowledged mode: makes the read that ended at `end_batch` final
        (on every rank of a sharded trainer)."""
        self._fan_in.commit(tracker_pb2.CommitRequest(
            consumer=consumer, end_batch=end_batch))

    def touch(self, consumer: str) -> None:
        """Keeps `consumer` from expiring on the tracker (its consumer
        expiry), reading and moving nothing: for a consumer busy elsewhere
        longer than the expiry (loading a checkpoint chain, say). NOT_FOUND
        when the tracker has no such consumer (removed, or expired already);
        a sharded trainer: on every rank, the first rank's error naming the
        rank."""
        if not consumer:
            raise ValueError("consumer must be named")
        self._fan_in.touch(tracker_pb2.ConsumerRequest(consumer=consumer))

    def consumers(self) -> List[str]:
        """The tracker's consumers (rank 0's of a sharded trainer)."""
        return self._fan_in.consumers()

    def add_consumer(self, consumer: str) -> List[str]:
        """Adds a consumer (its cursor starts at the current batch)."""
        return self._fan_in.add_consumer(consumer)

    def remove_consumer(self, consumer: str) -> List[str]:
        """Removes a consumer (not the last one)."""
        return self._fan_in.remove_consumer(consumer)

    def clear(self, consumer: str = "") -> None:
        """clear(c): c skips to the present; clear(): drops everything."""
        self._fan_in.clear(consumer)

    def compact(self) -> None:
        """Compacts what compaction can merge without changing any read."""
        self._fan_in.compact()

    def status(self) -> tracker_pb2.StatusResponse:
        """The tracker's state: mode, batch, consumers' lag, tables, bytes
        (a sharded trainer's ranks' merged: fan_in.merge_statuses)."""
        return self._fan_in.status()


class Subscription:
    """An open Subscribe stream: an iterator of Deltas until cancelled."""

    def __init__(self, stream):
        self._stream = stream
        self._assembler = _DeltaAssembler()
        self._cancelled = False

    def __iter__(self) -> Iterator[Delta]:
        return self

    def __next__(self) -> Delta:
        """The next delta. A malformed one (_DeltaAssembler) raises
        ValueError and cancels the stream: iteration ends there."""
        try:
            for chunk in self._stream:
                delta = self._assembler.add(chunk)
                if delta is not None:
                    return delta
        except grpc.RpcError as e:
            # Our own cancel() (from any thread) ends the iteration, as it
            # ends a sharded trainer's polling subscription; any other
            # error is the caller's to see.
            if not (self._cancelled and
                    e.code() == grpc.StatusCode.CANCELLED):
                raise
        except ValueError:
            # The chunks after a malformed one cannot be assembled: the
            # server stops pushing, as with the C++ client.
            self.cancel()
            raise
        raise StopIteration

    def cancel(self) -> None:
        """Ends the stream (the server stops pushing) and the iteration. A
        delta partly received then is dropped: in non-acknowledged mode its
        rows are lost to this consumer, as with any cancelled read."""
        self._cancelled = True
        self._stream.cancel()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.cancel()


@dataclasses.dataclass
class LookupResult:
    """Rows of one table from a predictor: rows[i] for ids[i] (zeros for a
    missing ID), the model version they belong to, the IDs not held."""
    version: int
    rows: np.ndarray
    missing_ids: List[int]
    run_id: str


class PredictorClient(_Connection):
    """A client of a predictor's lookup API (clients:predictor)."""

    def __init__(self, target: str, token: Optional[str] = None,
                 root_certificates: Optional[bytes] = None,
                 timeout: Optional[float] = 30.0,
                 max_message_bytes: int = 64 << 20):
        super().__init__(target, token, root_certificates, timeout,
                         max_message_bytes)
        self._stub = predictor_pb2_grpc.ReplicaLookupStub(self._channel)

    def lookup(self, fqn: str, ids) -> LookupResult:
        """Rows of table `fqn` for `ids` (int64 [n]). UNAVAILABLE before the
        predictor holds a version; NOT_FOUND for a table it does not hold."""
        request = predictor_pb2.LookupRequest(fqn=fqn)
        array = np.asarray(ids).reshape(-1)
        # [] is float64 to NumPy, and narrower integers are IDs all the same.
        if array.size == 0 or array.dtype.kind == "i" or (
                array.dtype.kind == "u" and array.dtype.itemsize < 8):
            array = array.astype(np.int64)
        tensors.from_numpy(array, request.ids)
        response = self.call(self._stub.Lookup, request)
        return LookupResult(version=response.version,
                            rows=tensors.to_numpy(response.rows),
                            missing_ids=list(response.missing_ids),
                            run_id=response.run_id)

    def dense(self) -> Tuple[int, Dict[str, np.ndarray]]:
        """The replica's version and its dense parameters by name."""
        response = self.call(self._stub.GetDense,
                             predictor_pb2.GetDenseRequest())
        return response.version, {p.name: tensors.to_numpy(p.tensor)
                                  for p in response.parameters}

    def status(self) -> predictor_pb2.PredictorStatus:
        """The predictor's version, lag, freshness and tables."""
        return self.call(self._stub.Status,
                         predictor_pb2.PredictorStatusRequest())
