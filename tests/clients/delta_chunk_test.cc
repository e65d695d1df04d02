// AddDeltaChunk, the client's hand-written DeltaChunk parser, against
// protobuf's own serialization, dense parameters whole and in pieces;
// rows left out or out of order and malformed bytes are DataLoss, never a
// crash.

#include <ATen/core/Tensor.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/randperm.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/support/proto_buffer_writer.h>
#include <gtest/gtest.h>

#include <random>

#include "clients/delta_client.h"
#include "proto/tensor_codec.h"

namespace deltastream {
namespace {

grpc::ByteBuffer Serialize(const v1::DeltaChunk& chunk) {
  grpc::ByteBuffer buffer;
  bool own = false;
  grpc::Status status =
      grpc::GenericSerialize<grpc::ProtoBufferWriter, v1::DeltaChunk>(
          chunk, &buffer, &own);
  EXPECT_TRUE(status.ok());
  return buffer;
}

grpc::ByteBuffer FromBytes(const std::string& bytes) {
  grpc::Slice slice(bytes);
  return grpc::ByteBuffer(&slice, 1);
}

// The chunks of one table, as the service cuts them.
std::vector<v1::DeltaChunk> Chunks(const std::string& fqn,
                                   const at::Tensor& ids,
                                   const at::Tensor& states,
                                   int64_t per_chunk) {
  std::vector<v1::DeltaChunk> chunks;
  const int64_t rows = ids.size(0);
  for (int64_t offset = 0; offset < rows || chunks.empty();
       offset += per_chunk) {
    const int64_t n = std::min(per_chunk, rows - offset);
    v1::DeltaChunk& chunk = chunks.emplace_back();
    chunk.set_fqn(fqn);
    chunk.set_row_offset(offset);
    chunk.set_table_rows(rows);
    EXPECT_TRUE(
        EncodeTensor(ids.narrow(0, offset, n), chunk.mutable_ids()).ok());
    if (states.defined()) {
      EXPECT_TRUE(
          EncodeTensor(states.narrow(0, offset, n), chunk.mutable_states())
              .ok());
    }
  }
  return chunks;
}

TEST(DeltaChunkTest, ReassemblesWhatProtobufSerialized) {
  const at::Tensor ids = at::randperm(1000, at::kLong);
  const at::Tensor states = at::randn({1000, 7}).to(at::kHalf);
  std::vector<v1::DeltaChunk> chunks = Chunks("a", ids, states, 128);
  for (v1::DeltaChunk& c :
       Chunks("b", at::empty({0}, at::kLong), at::empty({0, 3}), 128)) {
    chunks.push_back(c);
  }
  chunks.front().mutable_header()->set_consumer("me");
  chunks.front().mutable_header()->set_end_batch(9);
  chunks.back().set_last(true);
  ReceivedDelta delta;
  bool last = false;
  for (size_t i = 0; i < chunks.size(); ++i) {
    grpc::ByteBuffer buffer = Serialize(chunks[i]);
    ASSERT_TRUE(AddDeltaChunk(buffer, delta, &last).ok()) << i;
    EXPECT_EQ(last, i + 1 == chunks.size());
  }
  EXPECT_EQ(delta.header.consumer(), "me");
  EXPECT_EQ(delta.header.end_batch(), 9);
  EXPECT_TRUE(at::equal(delta.tables["a"].ids, ids));
  EXPECT_TRUE(at::equal(delta.tables["a"].states, states));
  EXPECT_FALSE(delta.tables["a"].values.defined());
  EXPECT_EQ(delta.tables["b"].ids.numel(), 0);
  EXPECT_EQ(delta.tables["b"].states.sizes(), (std::vector<int64_t>{0, 3}));
}

// Dense chunks as the service writes them: `whole` in one, `big` in pieces
// of `per_piece` elements; the last chunk says so.
std::vector<v1::DeltaChunk> DenseChunks(const at::Tensor& whole,
                                        const at::Tensor& big,
                                        int64_t per_piece) {
  std::vector<v1::DeltaChunk> chunks;
  v1::DeltaChunk& first = chunks.emplace_back();
  first.mutable_header()->set_dense_parameters(2);
  first.mutable_dense()->set_name("whole");
  EXPECT_TRUE(
      EncodeTensor(whole, first.mutable_dense()->mutable_tensor()).ok());
  for (int64_t offset = 0; offset < big.numel(); offset += per_piece) {
    v1::NamedTensor* piece = chunks.emplace_back().mutable_dense();
    piece->set_name("big");
    piece->set_piece_offset(offset);
    for (int64_t size : big.sizes()) piece->add_piece_of(size);
    EXPECT_TRUE(
        EncodeTensor(big.view(-1).narrow(
                         0, offset, std::min(per_piece, big.numel() - offset)),
                     piece->mutable_tensor())
            .ok());
  }
  chunks.back().set_last(true);
  return chunks;
}

// Adds `chunks` in order: the first refusal, or OK.
absl::Status AddAll(const std::vector<v1::DeltaChunk>& chunks,
                    ReceivedDelta& delta) {
  bool last = false;
  for (const v1::DeltaChunk& chunk : chunks) {
    grpc::ByteBuffer buffer = Serialize(chunk);
    if (absl::Status s = AddDeltaChunk(buffer, delta, &last); !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

TEST(DeltaChunkTest, ADenseParameterInPiecesIsReassembled) {
  const at::Tensor whole = at::randn({4});
  const at::Tensor big = at::randn({5, 7}).to(at::kHalf);
  ReceivedDelta delta;
  ASSERT_TRUE(AddAll(DenseChunks(whole, big, 12), delta).ok());
  ASSERT_EQ(delta.dense.size(), 2u);
  EXPECT_EQ(delta.dense[0].first, "whole");
  EXPECT_TRUE(at::equal(delta.dense[0].second, whole));
  EXPECT_EQ(delta.dense[1].first, "big");
  EXPECT_TRUE(at::equal(delta.dense[1].second, big));
  EXPECT_EQ(delta.dense_elements_received, 0);
}

TEST(DeltaChunkTest, DensePiecesOutOfOrderOrCutShortAreDataLoss) {
  const at::Tensor whole = at::randn({4});
  const at::Tensor big = at::randn({5, 7});
  auto refused = [](std::vector<v1::DeltaChunk> chunks) {
    ReceivedDelta delta;
    return AddAll(chunks, delta);
  };
  std::vector<v1::DeltaChunk> swapped = DenseChunks(whole, big, 12);
  std::swap(swapped[1], swapped[2]);
  EXPECT_EQ(refused(swapped).code(), absl::StatusCode::kDataLoss);
  std::vector<v1::DeltaChunk> short_of_one = DenseChunks(whole, big, 12);
  short_of_one.erase(short_of_one.end() - 2);  // the delta's last chunk stays
  EXPECT_EQ(refused(short_of_one).code(), absl::StatusCode::kDataLoss);
  std::vector<v1::DeltaChunk> ended = DenseChunks(whole, big, 12);
  ended.pop_back();
  ended.back().set_last(true);  // the delta ends within "big"
  absl::Status within = refused(ended);
  EXPECT_EQ(within.code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(within.message().find("within dense parameter 'big'"),
            std::string::npos)
      << within;
  std::vector<v1::DeltaChunk> other_type = DenseChunks(whole, big, 12);
  ASSERT_TRUE(EncodeTensor(at::randn({12}).to(at::kDouble),
                           other_type[2].mutable_dense()->mutable_tensor())
                  .ok());
  EXPECT_EQ(refused(other_type).code(), absl::StatusCode::kDataLoss);
}

// A parameter named twice would leave a consumer two values for one name.
TEST(DeltaChunkTest, ADenseParameterSentTwiceIsDataLoss) {
  const at::Tensor whole = at::randn({4});
  const at::Tensor big = at::randn({5, 7});
  std::vector<v1::DeltaChunk> chunks = DenseChunks(whole, big, 12);
  chunks.back().set_last(false);
  std::vector<v1::DeltaChunk> again = DenseChunks(whole, big, 100);
  chunks.push_back(again[1]);  // "big" again, in one piece
  chunks.back().set_last(true);
  chunks.front().mutable_header()->set_dense_parameters(3);
  ReceivedDelta delta;
  absl::Status twice = AddAll(chunks, delta);
  EXPECT_EQ(twice.code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(twice.message().find("'big': sent twice"), std::string::npos)
      << twice;
  v1::DeltaChunk whole_again = chunks.front();
  whole_again.clear_header();
  ReceivedDelta other;
  EXPECT_EQ(AddAll({chunks.front(), whole_again}, other).code(),
            absl::StatusCode::kDataLoss);
}

// Rows a server left out would be read uninitialised: a table's chunks must
// come in row order and cover every row of each tensor by the last chunk.
TEST(DeltaChunkTest, RowsLeftOutOrOutOfOrderAreDataLoss) {
  const at::Tensor ids = at::arange(100, at::kLong);
  const at::Tensor states = at::randn({100, 4});
  auto refused = [](std::vector<v1::DeltaChunk> chunks) {
    chunks.back().set_last(true);
    ReceivedDelta delta;
    return AddAll(chunks, delta);
  };
  auto expect_refused = [&](std::vector<v1::DeltaChunk> chunks,
                            absl::string_view says) {
    absl::Status status = refused(std::move(chunks));
    EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;
    EXPECT_NE(status.message().find(says), std::string::npos) << status;
  };
  ASSERT_TRUE(refused(Chunks("t", ids, states, 30)).ok());

  std::vector<v1::DeltaChunk> missing_middle = Chunks("t", ids, states, 30);
  missing_middle.erase(missing_middle.begin() + 1);
  expect_refused(missing_middle, "rows from 60 where row 30 came next");
  std::vector<v1::DeltaChunk> swapped = Chunks("t", ids, states, 30);
  std::swap(swapped[0], swapped[1]);
  expect_refused(swapped, "rows from 30 where row 0 came next");
  std::vector<v1::DeltaChunk> cut_short = Chunks("t", ids, states, 30);
  cut_short.pop_back();
  expect_refused(cut_short, "the delta ended with 90 of its 100 rows of ids");
  // The states of one chunk left out: the ids are whole, the states not.
  std::vector<v1::DeltaChunk> no_states = Chunks("t", ids, states, 30);
  no_states.back().clear_states();
  expect_refused(no_states, "90 of its 100 rows of states");
}

// Tensors of one table with other row counts than its IDs, and a table the
// header names that never came: DataLoss (rows would pair with other IDs).
TEST(DeltaChunkTest, RowsThatDoNotPairWithTheIdsAreDataLoss) {
  std::vector<v1::DeltaChunk> chunks =
      Chunks("t", at::arange(3, at::kLong), at::Tensor(), 3);
  v1::DeltaChunk& values = chunks.emplace_back();
  values.set_fqn("t");
  values.set_table_rows(2);
  ASSERT_TRUE(EncodeTensor(at::randn({2, 4}), values.mutable_values()).ok());
  values.set_last(true);
  ReceivedDelta delta;
  absl::Status status = AddAll(chunks, delta);
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;
  EXPECT_NE(status.message().find("2 rows of values for 3 ids"),
            std::string::npos)
      << status;

  std::vector<v1::DeltaChunk> named =
      Chunks("t", at::arange(3, at::kLong), at::Tensor(), 3);
  named[0].mutable_header()->add_fqns("t");
  named[0].mutable_header()->add_fqns("u");
  named.back().set_last(true);
  ReceivedDelta without_u;
  status = AddAll(named, without_u);
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;
  EXPECT_NE(status.message().find("'u' named in the header never came"),
            std::string::npos)
      << status;
}

// A varint as protobuf writes it.
std::string Varint(uint64_t value) {
  std::string out;
  while (value >= 0x80) {
    out.push_back(static_cast<char>(value | 0x80));
    value >>= 7;
  }
  out.push_back(static_cast<char>(value));
  return out;
}

// A chunk whose IDs claim 2^31 bytes (a shape of 2^28 int64) that do not
// follow: refused before anything is allocated or read (it was read as a
// negative size: a crash).
TEST(DeltaChunkTest, ADataLengthPastTheChunkIsDataLoss) {
  v1::Tensor int64_tensor;
  ASSERT_TRUE(EncodeTensor(at::arange(1, at::kLong), &int64_tensor).ok());
  const int64_t rows = int64_t{1} << 28;
  for (const uint64_t claimed : {uint64_t{1} << 31, (uint64_t{1} << 32) - 8}) {
    const std::string shape = Varint(claimed / 8);
    const std::string tensor = "\x08" + Varint(int64_tensor.dtype()) + "\x12" +
                               Varint(shape.size()) + shape + "\x1a" +
                               Varint(claimed);
    const std::string chunk = "\x12\x01t" + std::string("\x20") + Varint(rows) +
                              "\x2a" + Varint(tensor.size()) + tensor;
    grpc::ByteBuffer buffer = FromBytes(chunk);
    ReceivedDelta delta;
    bool last = false;
    absl::Status status = AddDeltaChunk(buffer, delta, &last);
    EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;
    EXPECT_NE(status.message().find("past the tensor's end"), std::string::npos)
        << status;
    EXPECT_FALSE(delta.tables["t"].ids.defined());  // nothing allocated
  }
}

// A table larger than memory (2^40 rows of int64): a status, never an
// exception through the caller's read loop.
TEST(DeltaChunkTest, ATableLargerThanMemoryIsAStatus) {
  std::vector<v1::DeltaChunk> chunks =
      Chunks("t", at::arange(1, at::kLong), at::Tensor(), 1);
  chunks[0].set_table_rows(int64_t{1} << 40);
  chunks[0].set_last(true);
  ReceivedDelta delta;
  absl::Status status;
  EXPECT_NO_THROW(status = AddAll(chunks, delta));
  // Where the kernel hands out 8 TiB of address space (overcommit always),
  // the table is made and the read ends short of its rows instead.
  if (status.code() != absl::StatusCode::kDataLoss) {
    EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted) << status;
    EXPECT_NE(status.message().find("no memory for a table"), std::string::npos)
        << status;
  }
}

TEST(DeltaChunkTest, MalformedBytesAreDataLossNeverACrash) {
  const std::string good =
      Chunks("t", at::arange(50, at::kLong), at::randn({50, 4}), 50)[0]
          .SerializeAsString();
  ReceivedDelta delta;
  bool last = false;
  // Truncated anywhere.
  for (size_t size = 1; size < good.size(); size += 7) {
    ReceivedDelta partial;
    grpc::ByteBuffer buffer = FromBytes(good.substr(0, size));
    EXPECT_EQ(AddDeltaChunk(buffer, partial, &last).code(),
              absl::StatusCode::kDataLoss)
        << size;
  }
  // Rows outside the table, a shape that does not match the bytes.
  v1::DeltaChunk outside =
      Chunks("t", at::arange(5, at::kLong), at::Tensor(), 5)[0];
  outside.set_row_offset(3);
  grpc::ByteBuffer buffer = Serialize(outside);
  EXPECT_EQ(AddDeltaChunk(buffer, delta, &last).code(),
            absl::StatusCode::kDataLoss);
  v1::DeltaChunk mismatched = outside;
  mismatched.set_row_offset(0);
  mismatched.mutable_ids()->set_shape(0, 6);
  buffer = Serialize(mismatched);
  EXPECT_EQ(AddDeltaChunk(buffer, delta, &last).code(),
            absl::StatusCode::kDataLoss);
  // Random corruption: any status, no crash (run under ASan in CI).
  std::mt19937 rng(3);
  for (int round = 0; round < 2000; ++round) {
    std::string bytes = good;
    for (int flips = 1 + rng() % 4; flips > 0; --flips) {
      bytes[rng() % bytes.size()] = static_cast<char>(rng());
    }
    ReceivedDelta any;
    grpc::ByteBuffer corrupted = FromBytes(bytes);
    AddDeltaChunk(corrupted, any, &last).IgnoreError();
  }
}

}  // namespace
}  // namespace deltastream
