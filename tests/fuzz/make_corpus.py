#!/usr/bin/env python3
"""Writes the seed inputs of tests/fuzz/service_fuzzer.cc to tests/fuzz/corpus/.

Standard library only. The layout is the one service_fuzzer.cc documents at its
top; raw seeds pick their method by its index in proto/tracker.proto's
`service DeltaTracker`, so rerun this when that list changes:

    python3 tests/fuzz/make_corpus.py [--proto proto/tracker.proto]
        [--out tests/fuzz/corpus]
"""

import argparse
import os
import re
import struct
import sys

STRUCTURED = 0xE0

# ---------------------------------------------------------------------------
# Protobuf wire encoding, enough for the tracker's requests.


def varint(n):
    n &= (1 << 64) - 1
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def field_varint(number, value):
    return varint(number << 3) + varint(value)


def field_bytes(number, data):
    if isinstance(data, str):
        data = data.encode()
    return varint(number << 3 | 2) + varint(len(data)) + data


def field_double(number, value):
    return varint(number << 3 | 1) + struct.pack("<d", value)


INT64, FLOAT32, FLOAT16, BFLOAT16 = 1, 2, 3, 4


def tensor(dtype, shape, data):
    packed = b"".join(varint(s) for s in shape)
    return (field_varint(1, dtype) + field_bytes(2, packed) +
            field_bytes(3, data))


def ids_tensor(ids):
    return tensor(INT64, [len(ids)], struct.pack("<%dq" % len(ids), *ids))


def float_tensor(rows, dim, seed=1):
    values = [((i * 37 + seed) % 19 - 9) / 4.0 for i in range(rows * dim)]
    return tensor(FLOAT32, [rows, dim], struct.pack("<%df" % len(values),
                                                    *values))


def record_request(tables):
    """tables: [(fqn, ids, states_or_None)]."""
    out = b""
    for fqn, ids, states in tables:
        rows = field_bytes(1, fqn) + field_bytes(2, ids_tensor(ids))
        if states is not None:
            rows += field_bytes(3, states)
        out += field_bytes(1, rows)
    return out


def top_k_count(n):
    return field_varint(2, n)


def top_k_percentage(p):
    return field_double(1, p)


def get_delta_request(consumer, fqns=(), top_k=None, per_table=None,
                      include_scores=False, max_chunk_bytes=0):
    out = field_bytes(1, consumer)
    for fqn in fqns:
        out += field_bytes(2, fqn)
    if top_k is not None:
        out += field_bytes(3, top_k)
    for fqn, spec in (per_table or {}).items():
        out += field_bytes(4, field_bytes(1, fqn) + field_bytes(2, spec))
    if include_scores:
        out += field_varint(5, 1)
    if max_chunk_bytes:
        out += field_varint(6, max_chunk_bytes)
    return out


# ---------------------------------------------------------------------------
# Structured mode: the fuzzer's Session reads these fields in this order.

OP = {name: i for i, name in enumerate([
    "Record", "Step", "GetDelta", "Commit", "ListConsumers", "AddConsumer",
    "RemoveConsumer", "Compact", "Clear", "Status", "Raw", "Reflective",
    "Stream"])}
CONSUMERS = ["a", "b", "c", "d", "default", "a.b-c_d"]
TOP_PERCENTAGES = [0, 1e-9, 0.5, 1, 10, 50, 99.9, 100]  # indexes 0..7 used
TOP_COUNTS = [0, 1, 2, 3, 10, 100, 5000, -1]
CHUNK_BYTES = [1, 7, 64, 4096, 1 << 20, 1 << 30, -5, (1 << 63) - 1]


def u16(n):
    return struct.pack("<H", n & 0xFFFF)


def u32(n):
    return struct.pack("<I", n & 0xFFFFFFFF)


def table(index):
    """Name("t") for the test table t<index % 4>."""
    return bytes([index % 4])


def consumer(name):
    return bytes([CONSUMERS.index(name)])


def is_test_table(fqn_byte):
    """Whether Name("t") reading `fqn_byte` gives a table t0..t7."""
    b = fqn_byte[0] % 16
    return b < 12 or (b == 12 and fqn_byte[1] < 8)


def rows(fqn_byte, n, seed=7, pattern=0, base=0, value_range=1000,
         corrupt=0, kind=1 << 2, specials=0, dim=None):
    """One TableRows. kind: (states kind << 2) | dim choice; dim is read
    when the table has no fixed dim (not t0..t7) or kind % 4 == 3."""
    needs_dim = not is_test_table(fqn_byte) or kind % 4 == 3
    assert needs_dim == (dim is not None), (fqn_byte, kind, dim)
    out = fqn_byte
    if n < 17:
        out += bytes([n])
    else:
        out += bytes([200]) + u16(n)
    out += u32(seed) + bytes([pattern, base & 0xFF]) + u16(value_range - 1)
    out += bytes([corrupt, kind])
    if dim is not None:
        out += bytes([dim])
    return out + bytes([specials])


def op_record(*messages):
    """messages: lists of rows()."""
    out = bytes([OP["Record"], len(messages) - 1])
    for tables in messages:
        out += bytes([len(tables)]) + b"".join(tables)
    return out


def op_get(name, fqns=(), top_k=None, per_table=(), scores=False, chunk=None,
           cancel_after=None):
    """top_k: ("count"|"percentage", index) or None; per_table: [(fqn_byte,
    top_k)]."""
    flags = ((1 if fqns else 0) | (2 if top_k else 0) | (4 if per_table else 0)
             | (8 if scores else 0) | (16 if chunk is not None else 0)
             | (32 if cancel_after is not None else 0))
    out = bytes([OP["GetDelta"]]) + consumer(name) + bytes([flags])

    def spec(k):
        kind, index = k
        return bytes([(0 if kind == "percentage" else 1) | index << 2])

    if fqns:
        out += bytes([len(fqns) - 1]) + b"".join(fqns)
    if top_k:
        out += spec(top_k)
    if per_table:
        out += bytes([len(per_table) - 1])
        for fqn_byte, k in per_table:
            out += fqn_byte + spec(k)
    if chunk is not None:
        out += bytes([chunk])
    if cancel_after is not None:
        out += bytes([cancel_after])
    return out


def op_commit(name, how=0):
    """how: 0 the consumer's latest read's end, 1 one past it."""
    return bytes([OP["Commit"]]) + consumer(name) + bytes([how])


def op(name, *fields):
    return bytes([OP[name]]) + b"".join(fields)


def structured(config, *ops):
    return bytes([STRUCTURED + config]) + b"".join(ops)


def structured_seeds(methods):
    step, status = op("Step"), op("Status")
    t0, t1, t2, t3 = table(0), table(1), table(2), table(3)
    seeds = {}
    # Embedding with live rows: records, reads with top-k and scores, compact,
    # consumers.
    seeds["embedding_topk"] = structured(
        0,
        op_record([rows(t0, 8), rows(t1, 16, pattern=1, value_range=50)]),
        step,
        op_get("a", top_k=("count", 3), scores=True),
        op_get("b", fqns=[t0], per_table=[(t0, ("percentage", 5))]),
        op_record([rows(t0, 12, pattern=1, value_range=20)],
                  [rows(t3, 5, kind=7, dim=16)]),
        step, op("Compact"), status,
        op_get("a", chunk=2),
        op("Clear", b"\x01", consumer("a")),
        op("ListConsumers"), op("AddConsumer", consumer("c")),
        op("RemoveConsumer", consumer("b")),
        op_record([rows(t1, 16, pattern=1, value_range=10)]), step,
        op_get("c", chunk=0, top_k=("percentage", 6)), status)
    # ID_ONLY with acknowledged reads: read, commit, read again.
    seeds["id_only_commit"] = structured(
        1,
        op_record([rows(t0, 16, pattern=1, value_range=30, kind=0)]), step,
        op_get("a"), op_commit("a"), op_get("a"), op_commit("a", how=1),
        op_record([rows(t2, 10, kind=0)]), step,
        op_get("b", cancel_after=1), op_commit("b"), op_get("b"),
        op_commit("b"), status)
    # Embedding without live rows, no delete-on-read: the memory cap drops.
    seeds["embedding_cap"] = structured(
        2,
        op_record([rows(b"\x0c\x04", 2000, pattern=1, value_range=60000,
                        kind=7, dim=64)]), step,
        op_record([rows(b"\x0c\x04", 2000, pattern=0, base=5, kind=7,
                        dim=64)]), step,
        op_get("a"), op_get("b", top_k=("count", 2)), status)
    # Momentum, last norm: top-k by stored norm, no live rows needed.
    seeds["momentum_last"] = structured(
        3,
        op_record([rows(t1, 16, pattern=1, value_range=12)]), step,
        op_record([rows(t1, 16, pattern=1, value_range=12, seed=9)]), step,
        op_get("a", top_k=("percentage", 4)), op_get("b", scores=True),
        status)
    # Momentum diff with live rows and acknowledged reads; a record without
    # states reads them from the live rows.
    seeds["momentum_diff"] = structured(
        4,
        op_record([rows(t1, 8)]), step,
        op_get("a", top_k=("count", 2)), op_commit("a"),
        op_record([rows(t1, 8, kind=0)]), step,
        op_get("a", scores=True), op_commit("a"), op("Compact"), status)
    # Row-wise Adagrad: one state per row, 1-D states.
    seeds["rowwise_adagrad"] = structured(
        5,
        op_record([rows(t2, 12, kind=6 << 2)]), step,
        op_record([rows(t2, 12, kind=6 << 2, seed=3)]), step,
        op_get("a", top_k=("count", 4)), op_get("b", scores=True,
                                                cancel_after=0), status)
    # ID_ONLY under a tiny cap: rows dropped, readers told to resync.
    seeds["id_only_cap"] = structured(
        6,
        op_record([rows(t0, 2000, pattern=1, value_range=65536, kind=0)]),
        step,
        op_record([rows(t0, 2000, pattern=3, kind=0)]), step,
        op_get("a"), op_get("b"), status, op("Clear", b"\x00"), status)
    # Refusals: corrupt tensors, bad names, NaN and half-precision states,
    # negative IDs against live rows, states that do not match the IDs.
    seeds["refusals"] = structured(
        7,
        op_record([rows(t0, 4, corrupt=240)], [rows(t0, 4, corrupt=241)],
                  [rows(t0, 4, corrupt=242)]),
        op_record([rows(t0, 4, corrupt=243)], [rows(b"\x0d", 4, dim=4)],
                  [rows(b"\x0e\x01", 4, dim=4)]),
        op_record([rows(t0, 6, specials=1), rows(t1, 6, specials=3),
                   rows(t3, 6, kind=5 << 2, specials=12)]),
        op_record([rows(t0, 6, pattern=5, value_range=4)],
                  [rows(t0, 6, kind=7 << 2, specials=16)]),
        step, op_get("a", top_k=("count", 0)), op_get("a", top_k=("count", 7)),
        op_get("a", top_k=("percentage", 0)), op_get("a", fqns=[b"\x0d"]),
        op_get("a", per_table=[(t2, ("count", 1))]),
        op_get("a", scores=True, chunk=0), op_commit("a"),
        op("AddConsumer", b"\xff\x0e\x00"), op("RemoveConsumer", consumer("d")),
        op("RemoveConsumer", consumer("a")), op("RemoveConsumer", consumer("b")),
        op("Clear", b"\x01", consumer("d")), status)
    # Server streams other than GetDelta (a subscription): pushes every
    # step, then every 5 ms; cut after one message.
    streams = [m for m in methods if m[2] and m[0] != "GetDelta"]
    if streams:
        seeds["stream"] = structured(
            0, op_record([rows(t0, 8)]), step,
            op("Stream", b"\x00", consumer("a"), b"\x02\x0d", b"\x01",
               b"\x05"),
            op_record([rows(t1, 4)]), step,
            op("Stream", b"\x00", consumer("b"), b"\x20\x01", b"\x00",
               b"\x00"), status)
    # Every method, after some rows: a raw message, then a request filled by
    # reflection (last: how many bytes it reads depends on the message).
    for index, (name, client_streaming, _) in enumerate(methods):
        count = b"\x00" if client_streaming else b""
        seeds["method_%s" % name] = structured(
            7, op_record([rows(t0, 8)]), step,
            bytes([OP["Raw"], index]) + count + b"\x02\x0a\x00",
            bytes([OP["Reflective"], index]) + count + b"\x01" * 24)
    return seeds


# ---------------------------------------------------------------------------
# Raw mode: a method, a layout byte, cut points, then the messages verbatim.


def raw(method_index, config, messages, client_streaming):
    if client_streaming:
        layout = config | (len(messages) - 1) << 3
    else:
        assert len(messages) <= 1
        layout = config | (0 if messages else 31 << 3)
    cuts, position = b"", 0
    for message in messages[:-1]:
        position += len(message)
        cuts += u16(position)
    return bytes([method_index, layout]) + cuts + b"".join(messages)


def raw_seeds(methods):
    index = {name: i for i, (name, _, _) in enumerate(methods)}
    requests = {
        "Record": [record_request([("t0", [3, 1, 2], float_tensor(3, 4))]),
                   record_request([("t1", [5, 5, 9], float_tensor(3, 8, 2)),
                                   ("t0", [1], float_tensor(1, 4, 3))]),
                   record_request([("t2", list(range(6)), None)])],
        "Step": [b""],
        "GetDelta": [get_delta_request("a", top_k=top_k_count(3),
                                       include_scores=True,
                                       max_chunk_bytes=64)],
        "Subscribe": [field_bytes(1, get_delta_request("a")) +
                      field_varint(2, 1) + field_varint(3, 5)],
        "Commit": [field_bytes(1, "a") + field_varint(2, 1)],
        "ListConsumers": [b""],
        "AddConsumer": [field_bytes(1, "c")],
        "RemoveConsumer": [field_bytes(1, "b")],
        "Compact": [b""],
        "Clear": [field_bytes(1, "a")],
        "Snapshot": [b""],
        "Status": [b""],
    }
    seeds = {}
    for name, client_streaming, _ in methods:
        messages = requests.get(name, [b""])
        i = index[name]
        if client_streaming:
            seeds["raw_%s" % name] = raw(i, 0, messages, True)
            seeds["raw_%s_one" % name] = raw(i, 2, messages[:1], True)
        else:
            seeds["raw_%s" % name] = raw(i, 0, messages[:1], False)
            seeds["raw_%s_none" % name] = raw(i, 1, [], False)
        if name == "Record":
            # A message protobuf cannot parse between two good ones.
            seeds["raw_Record_bad_middle"] = raw(i, 0, [
                messages[0], b"\x0a\x05\xff\xff\xff\xff\xff", messages[0]],
                True)
        if name == "GetDelta":
            seeds["raw_GetDelta_per_table"] = raw(i, 0, [get_delta_request(
                "b", fqns=["t0"], per_table={"t0": top_k_percentage(50)})],
                False)
    return seeds


def service_methods(proto_path):
    """[(name, client_streaming, server_streaming)] in declaration order."""
    text = open(proto_path).read()
    service = re.search(r"service\s+DeltaTracker\s*{(.*?)\n}", text, re.S)
    if not service:
        sys.exit("no service DeltaTracker in %s" % proto_path)
    methods = []
    for m in re.finditer(
            r"rpc\s+(\w+)\s*\(\s*(stream\s+)?[\w.]+\s*\)\s*returns\s*\(\s*"
            r"(stream\s+)?[\w.]+\s*\)", service.group(1)):
        methods.append((m.group(1), bool(m.group(2)), bool(m.group(3))))
    return methods


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(os.path.dirname(here))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--proto",
                        default=os.path.join(root, "proto", "tracker.proto"))
    parser.add_argument("--out", default=os.path.join(here, "corpus"))
    args = parser.parse_args()
    methods = service_methods(args.proto)
    seeds = structured_seeds(methods)
    seeds.update(raw_seeds(methods))
    os.makedirs(args.out, exist_ok=True)
    for old in os.listdir(args.out):
        os.remove(os.path.join(args.out, old))
    for name, data in sorted(seeds.items()):
        with open(os.path.join(args.out, name), "wb") as f:
            f.write(data)
    print("%d seeds for %d methods (%s) in %s" % (
        len(seeds), len(methods), ", ".join(m[0] for m in methods), args.out))


if __name__ == "__main__":
    main()
