// Checkpoint chains: base + increments load to the rows a replica would hold;
// a missing, duplicated or overlapping increment, a corrupt or truncated file
// are refused with a clear error; compaction gives the same tables; dense
// parameters and run ids round-trip; a newer full link supersedes older
// increments; truncation after a trainer's restart point; links are chunked
// (any size) and every byte of them is verified, by the loader and by
// `deltactl chain`; a load ends within one record of its cancel.
#include "store/checkpoint_chain.h"

#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/full.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/tensor.h>
#include <ATen/ops/zeros.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "clients/checkpoint_chain.h"
#include "tests/testing/tensor_values.h"
#include "tests/testing/test_dirs.h"

namespace deltastream {
namespace {

using ::testing::HasSubstr;

// A read of batches [start, end): rows `ids` of table "t" with values id*10+v.
ReceivedDelta Read(int64_t start, int64_t end, std::vector<int64_t> ids,
                   float v) {
  ReceivedDelta delta;
  delta.header.set_consumer("checkpoint");
  delta.header.set_start_batch(start);
  delta.header.set_end_batch(end);
  at::Tensor id_tensor = at::tensor(ids, at::kLong);
  delta.tables["t"] = {
      id_tensor,
      {},
      (id_tensor.to(at::kFloat) * 10 + v).unsqueeze(1).repeat({1, 2}),
      {}};
  return delta;
}

// An all_rows read ending at `end` (a full link).
ReceivedDelta Full(int64_t end, std::vector<int64_t> ids, float v) {
  ReceivedDelta delta = Read(/*start=*/7, end, std::move(ids), v);
  delta.header.set_all_rows(true);
  return delta;
}

// `delta` as a trainer's run `run`, started at batch `run_start`, serves it.
ReceivedDelta InRun(ReceivedDelta delta, const std::string& run,
                    int64_t run_start) {
  delta.header.set_run_id(run);
  delta.header.set_run_start_batch(run_start);
  return delta;
}

// Dense parameters whose values say which read they came from.
std::vector<std::pair<std::string, at::Tensor>> Dense(float v) {
  return {{"bottom.0.weight", at::full({2, 3}, v)},
          {"bottom.0.bias", at::full({3}, v + 0.5f)}};
}

std::vector<float> Column(const at::Tensor& values) {
  at::Tensor c = values.select(1, 0).contiguous();
  return {c.data_ptr<float>(), c.data_ptr<float>() + c.numel()};
}
TEST(CheckpointChainTest, BaseAndIncrementsLoadNewestValues) {
  const std::string dir = FreshDir("chain");
  ASSERT_TRUE(WriteChainLink(dir, Full(10, {1, 2, 3}, 0)).ok());
  ASSERT_TRUE(WriteChainLink(dir, Read(10, 20, {2, 5}, 1)).ok());
  ASSERT_TRUE(WriteChainLink(dir, Read(20, 25, {5, 0}, 2)).ok());
  absl::StatusOr<LoadedChain> loaded = LoadChain(dir);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->end_batch, 25);
  EXPECT_EQ(loaded->links.size(), 3u);
  const ChainTable& t = loaded->tables.at("t");
  EXPECT_EQ(Longs(t.ids), (std::vector<int64_t>{0, 1, 2, 3, 5}));
  EXPECT_EQ(Column(t.values), (std::vector<float>{2, 10, 21, 30, 52}));

  // Compaction: one full link, the same tables.
  absl::StatusOr<ChainLink> full = CompactChain(dir);
  ASSERT_TRUE(full.ok()) << full.status();
  EXPECT_TRUE(full->full);
  EXPECT_EQ(full->end_batch, 25);
  EXPECT_EQ(ListChain(dir)->size(), 1u);
  absl::StatusOr<LoadedChain> again = LoadChain(dir);
  ASSERT_TRUE(again.ok());
  EXPECT_TRUE(at::equal(again->tables.at("t").ids, t.ids));
  EXPECT_TRUE(at::equal(again->tables.at("t").values, t.values));
  // Increments after the compacted base keep applying.
  ASSERT_TRUE(WriteChainLink(dir, Read(25, 30, {3}, 3)).ok());
  EXPECT_EQ(Column(LoadChain(dir)->tables.at("t").values),
            (std::vector<float>{2, 10, 21, 33, 52}));
}

TEST(CheckpointChainTest, ATableWhoseWidthChangesBetweenLinksIsDataLoss) {
  const std::string dir = FreshDir("chain_width");
  ASSERT_TRUE(WriteChainLink(dir, Full(10, {1, 2, 3}, 0)).ok());
  ReceivedDelta wider = Read(10, 20, {2, 5}, 1);
  wider.tables["t"].values = at::zeros({2, 3});
  ASSERT_TRUE(WriteChainLink(dir, wider).ok());
  absl::StatusOr<LoadedChain> loaded = LoadChain(dir);
  EXPECT_EQ(loaded.status().code(), absl::StatusCode::kDataLoss)
      << loaded.status();
  EXPECT_THAT(std::string(loaded.status().message()),
              HasSubstr("table 't' has rows of [2] Float in one link and of "
                        "[3] Float in a later one"));
  EXPECT_EQ(CompactChain(dir).status().code(), absl::StatusCode::kDataLoss);
}

TEST(CheckpointChainTest, MissingDuplicatedOrOverlappingIncrementsAreRefused) {
  const std::string dir = FreshDir("gap");
  ASSERT_TRUE(WriteChainLink(dir, Full(10, {1}, 0)).ok());
  ASSERT_TRUE(WriteChainLink(dir, Read(20, 30, {2}, 1)).ok());
  absl::StatusOr<LoadedChain> loaded = LoadChain(dir);
  EXPECT_EQ(loaded.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(loaded.status().message(), HasSubstr("batches 10..19 missing"));

  const std::string dup = FreshDir("dup");
  ASSERT_TRUE(WriteChainLink(dup, Full(10, {1}, 0)).ok());
  ASSERT_TRUE(WriteChainLink(dup, Read(10, 20, {2}, 1)).ok());
  ASSERT_TRUE(WriteChainLink(dup, Read(15, 25, {3}, 1)).ok());
  EXPECT_THAT(LoadChain(dup).status().message(), HasSubstr("overlaps"));
  EXPECT_EQ(ChainProblems(*ListChain(dup)).size(), 1u);

  const std::string no_base = FreshDir("nobase");
  ASSERT_TRUE(WriteChainLink(no_base, Read(10, 20, {2}, 1)).ok());
  EXPECT_THAT(LoadChain(no_base).status().message(), HasSubstr("no full"));
}

TEST(CheckpointChainTest, CorruptOrTruncatedLinksAreDataLoss) {
  const std::string dir = FreshDir("corrupt");
  absl::StatusOr<ChainLink> base = WriteChainLink(dir, Full(10, {1, 2}, 0));
  ASSERT_TRUE(base.ok());
  std::string bytes;
  {
    std::ifstream in(base->path, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  bytes[bytes.size() - 3] ^= 0x40;
  std::ofstream(base->path, std::ios::binary) << bytes;
  EXPECT_THAT(LoadChain(dir).status().message(), HasSubstr("checksum"));
  std::ofstream(base->path, std::ios::binary)
      << bytes.substr(0, bytes.size() / 2);
  EXPECT_THAT(LoadChain(dir).status().message(), HasSubstr("truncated"));
}

TEST(CheckpointChainTest, ReadsThatCannotMakeAnIncrementAreRefused) {
  const std::string dir = FreshDir("refuse");
  ReceivedDelta dropped = Read(-1, 10, {1}, 0);
  dropped.header.set_resync_required(true);
  dropped.header.set_lost_rows(7);
  EXPECT_THAT(WriteChainLink(dir, dropped).status().message(),
              HasSubstr("dropped 7 rows"));
  // A read of every row is whole whatever was dropped before it.
  ReceivedDelta resync = Full(10, {1}, 0);
  resync.header.set_resync_required(true);
  EXPECT_TRUE(WriteChainLink(dir, resync).ok());
  ReceivedDelta no_values = Read(-1, 10, {1}, 0);
  no_values.tables["t"].values = at::Tensor();
  EXPECT_THAT(WriteChainLink(dir, no_values).status().message(),
              HasSubstr("without values"));
  EXPECT_EQ(WriteChainLink(dir, Read(10, 10, {}, 0)).status().code(),
            absl::StatusCode::kInvalidArgument);
}

bool SameDense(const std::vector<std::pair<std::string, at::Tensor>>& a,
               const std::vector<std::pair<std::string, at::Tensor>>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].first != b[i].first || !at::equal(a[i].second, b[i].second)) {
      return false;
    }
  }
  return true;
}

TEST(CheckpointChainTest, DenseParametersAndRunsRoundTrip) {
  const std::string dir = FreshDir("dense");
  ReceivedDelta base = InRun(Full(10, {1, 2}, 0), "run-a", 0);
  base.dense = Dense(1);
  ReceivedDelta second = InRun(Read(10, 20, {2}, 1), "run-a", 0);
  second.dense = Dense(2);
  // Another run, without dense parameters (--dense=false).
  ReceivedDelta third = InRun(Read(20, 25, {1}, 2), "run-b", 18);
  absl::StatusOr<ChainLink> first_link = WriteChainLink(dir, base);
  ASSERT_TRUE(first_link.ok()) << first_link.status();
  absl::StatusOr<ChainLink> second_link = WriteChainLink(dir, second);
  ASSERT_TRUE(second_link.ok()) << second_link.status();
  absl::StatusOr<ChainLink> third_link = WriteChainLink(dir, third);
  ASSERT_TRUE(third_link.ok()) << third_link.status();

  absl::StatusOr<ChainLinkInfo> info = ReadChainLinkInfo(first_link->path);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->consumer, "checkpoint");
  EXPECT_EQ(info->tables, 1);
  EXPECT_EQ(info->dense_parameters, 2);
  EXPECT_EQ(info->dense_batch, 10);
  EXPECT_EQ(info->run_id, "run-a");
  EXPECT_GT(info->written_unix_ms, 0);
  info = ReadChainLinkInfo(third_link->path);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->dense_parameters, 0);
  EXPECT_EQ(info->dense_batch, -1);
  EXPECT_EQ(info->run_id, "run-b");
  EXPECT_EQ(info->run_start_batch, 18);

  // The newest dense parameters of the chain, and the batch they are from:
  // not the chain's end, since the last link carried none.
  absl::StatusOr<LoadedChain> loaded = LoadChain(dir);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->end_batch, 25);
  EXPECT_TRUE(SameDense(loaded->dense, Dense(2)));
  EXPECT_EQ(loaded->dense_batch, 20);
  EXPECT_EQ(loaded->run_id, "run-b");
  EXPECT_EQ(loaded->run_start_batch, 18);

  // Compaction keeps them, with their batch, and the newest run.
  absl::StatusOr<ChainLink> compacted = CompactChain(dir);
  ASSERT_TRUE(compacted.ok()) << compacted.status();
  ASSERT_EQ(ListChain(dir)->size(), 1u);
  info = ReadChainLinkInfo(compacted->path);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->consumer, "compaction");
  EXPECT_EQ(info->dense_parameters, 2);
  EXPECT_EQ(info->dense_batch, 20);
  EXPECT_EQ(info->run_id, "run-b");
  absl::StatusOr<LoadedChain> again = LoadChain(dir);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE(SameDense(again->dense, Dense(2)));
  EXPECT_EQ(again->dense_batch, 20);
  EXPECT_EQ(again->run_id, "run-b");
  EXPECT_TRUE(
      at::equal(again->tables.at("t").values, loaded->tables.at("t").values));

  // A link with dense parameters at the end: they match the chain's end.
  ReceivedDelta fourth = Read(25, 30, {2}, 3);
  fourth.dense = Dense(4);
  ASSERT_TRUE(WriteChainLink(dir, fourth).ok());
  loaded = LoadChain(dir);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_TRUE(SameDense(loaded->dense, Dense(4)));
  EXPECT_EQ(loaded->dense_batch, loaded->end_batch);

  // None anywhere: empty, -1.
  const std::string plain = FreshDir("nodense");
  ASSERT_TRUE(WriteChainLink(plain, Full(10, {1}, 0)).ok());
  loaded = LoadChain(plain);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_TRUE(loaded->dense.empty());
  EXPECT_EQ(loaded->dense_batch, -1);
  EXPECT_EQ(loaded->run_id, "");
}

TEST(CheckpointChainTest, ANewerFullLinkSupersedesOlderIncrements) {
  const std::string dir = FreshDir("supersede");
  ASSERT_TRUE(WriteChainLink(dir, Full(10, {1, 2, 3}, 0)).ok());
  ASSERT_TRUE(WriteChainLink(dir, Read(10, 20, {2}, 1)).ok());
  ASSERT_TRUE(WriteChainLink(dir, Read(20, 30, {3}, 2)).ok());
  // A resync: a full read at the chain's end, then one after it.
  ASSERT_TRUE(WriteChainLink(dir, Full(30, {1, 2, 3, 4}, 5)).ok());
  std::vector<ChainLink> links = *ListChain(dir);
  EXPECT_EQ(links.size(), 4u);
  EXPECT_TRUE(ChainProblems(links).empty());
  std::vector<ChainLink> applied = AppliedLinks(links);
  ASSERT_EQ(applied.size(), 1u);
  EXPECT_TRUE(applied[0].full);
  EXPECT_EQ(applied[0].end_batch, 30);
  absl::StatusOr<LoadedChain> loaded = LoadChain(dir);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->links.size(), 1u);
  EXPECT_EQ(Column(loaded->tables.at("t").values),
            (std::vector<float>{15, 25, 35, 45}));

  // Increments ending after it apply; a later full read supersedes them all,
  // the older full links included.
  ASSERT_TRUE(WriteChainLink(dir, Read(30, 40, {9}, 6)).ok());
  EXPECT_EQ(LoadChain(dir)->links.size(), 2u);
  ASSERT_TRUE(WriteChainLink(dir, Full(45, {1}, 7)).ok());
  loaded = LoadChain(dir);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  ASSERT_EQ(loaded->links.size(), 1u);
  EXPECT_EQ(loaded->end_batch, 45);
  EXPECT_EQ(Longs(loaded->tables.at("t").ids), (std::vector<int64_t>{1}));

  // Compacting a chain that loads from its one full link writes nothing and
  // removes the five links that link superseded.
  EXPECT_EQ(ListChain(dir)->size(), 6u);
  absl::StatusOr<ChainLink> compacted = CompactChain(dir);
  ASSERT_TRUE(compacted.ok()) << compacted.status();
  EXPECT_EQ(compacted->end_batch, 45);
  ASSERT_EQ(ListChain(dir)->size(), 1u);
  EXPECT_EQ(ListChain(dir)->front().path, compacted->path);

  // A full link that ends before an increment does is not the newer one
  // (names order links by batch, not by time): a trainer that went back must
  // have the chain truncated first (TruncateChainAfter), or the load refuses.
  const std::string back = FreshDir("back");
  ASSERT_TRUE(WriteChainLink(back, Full(10, {1}, 0)).ok());
  ASSERT_TRUE(WriteChainLink(back, Read(10, 30, {2}, 1)).ok());
  ASSERT_TRUE(WriteChainLink(back, Full(25, {1, 2}, 2)).ok());
  EXPECT_THAT(LoadChain(back).status().message(), HasSubstr("overlaps"));
}

TEST(CheckpointChainTest, TruncationRemovesTheLinksAfterARestartPoint) {
  const std::string dir = FreshDir("truncate");
  ASSERT_TRUE(WriteChainLink(dir, Full(10, {1, 2}, 0)).ok());
  ASSERT_TRUE(WriteChainLink(dir, Read(10, 20, {2}, 1)).ok());
  ASSERT_TRUE(WriteChainLink(dir, Read(20, 30, {1}, 2)).ok());
  // The trainer restarted from batch 15: [10, 20) and [20, 30) hold changes
  // it lost; the newest goes first.
  absl::StatusOr<std::vector<ChainLink>> removed = TruncateChainAfter(dir, 15);
  ASSERT_TRUE(removed.ok()) << removed.status();
  ASSERT_EQ(removed->size(), 2u);
  EXPECT_EQ((*removed)[0].start_batch, 20);
  EXPECT_EQ((*removed)[1].start_batch, 10);
  EXPECT_FALSE(std::filesystem::exists((*removed)[0].path));
  absl::StatusOr<LoadedChain> loaded = LoadChain(dir);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->end_batch, 10);
  EXPECT_EQ(Column(loaded->tables.at("t").values),
            (std::vector<float>{10, 20}));
  // The chain continues from its end; at or after the end nothing goes.
  ASSERT_TRUE(WriteChainLink(dir, Read(10, 18, {2}, 3)).ok());
  removed = TruncateChainAfter(dir, 18);
  ASSERT_TRUE(removed.ok());
  EXPECT_TRUE(removed->empty());
  EXPECT_EQ(LoadChain(dir)->end_batch, 18);
  // Superseded links go as well; before the base, everything goes.
  ASSERT_TRUE(WriteChainLink(dir, Full(18, {1}, 4)).ok());
  removed = TruncateChainAfter(dir, 5);
  ASSERT_TRUE(removed.ok());
  EXPECT_EQ(removed->size(), 3u);
  EXPECT_TRUE(ListChain(dir)->empty());
  // No directory: nothing to remove.
  removed = TruncateChainAfter(FreshDir("none"), 0);
  ASSERT_TRUE(removed.ok()) << removed.status();
  EXPECT_TRUE(removed->empty());
}

TEST(CheckpointChainTest, AChainThatCannotBeListedIsAnErrorNotEmpty) {
  // No directory: an empty chain. A path that is no directory (as one that
  // cannot be read): an error naming it, never an empty chain a job would
  // start again beside.
  EXPECT_TRUE(ListChain(FreshDir("absent"))->empty());
  const std::string file = FreshDir("file_not_dir");
  std::FILE* f = std::fopen(file.c_str(), "w");
  ASSERT_NE(f, nullptr);
  std::fclose(f);
  absl::StatusOr<std::vector<ChainLink>> listed = ListChain(file);
  // ENOTDIR, the OS's code.
  EXPECT_EQ(listed.status().code(), absl::StatusCode::kFailedPrecondition)
      << listed.status();
  EXPECT_NE(listed.status().message().find(file), std::string::npos);
  EXPECT_EQ(LoadChain(file).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(CheckpointChainTest, LinkInfoOfBadFilesIsRefused) {
  const std::string dir = FreshDir("info");
  EXPECT_EQ(ReadChainLinkInfo(dir + "/missing.ckpt").status().code(),
            absl::StatusCode::kNotFound);
  ReceivedDelta base = Full(10, {1, 2}, 0);
  base.dense = Dense(1);
  absl::StatusOr<ChainLink> link = WriteChainLink(dir, base);
  ASSERT_TRUE(link.ok());
  std::string bytes;
  {
    std::ifstream in(link->path, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  // The info reads the description only; verifying reads the rest.
  std::ofstream(link->path, std::ios::binary)
      << bytes.substr(0, bytes.size() - 5);
  EXPECT_TRUE(ReadChainLinkInfo(link->path).ok());
  EXPECT_THAT(VerifyChainLink(*link).message(), HasSubstr("truncated"));
  std::ofstream(link->path, std::ios::binary) << bytes.substr(0, 40);
  EXPECT_THAT(ReadChainLinkInfo(link->path).status().message(),
              HasSubstr("truncated"));
  std::ofstream(link->path, std::ios::binary) << "not a link at all, no";
  EXPECT_EQ(ReadChainLinkInfo(link->path).status().code(),
            absl::StatusCode::kDataLoss);
  // A payload of the right size that is not a link message.
  std::string garbage = bytes;
  for (size_t i = 20; i < garbage.size(); ++i) garbage[i] = '\xff';
  std::ofstream(link->path, std::ios::binary) << garbage;
  EXPECT_EQ(ReadChainLinkInfo(link->path).status().code(),
            absl::StatusCode::kDataLoss);
}

std::string ReadBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void WriteBytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

// A link of 1000 rows of dim 3 and a dense parameter, written in records of
// at most 100 bytes: dozens of records per tensor.
ChainLinkContent ChunkedContent() {
  ChainLinkContent content;
  content.full = true;
  content.end_batch = 10;
  content.consumer = "chunked";
  at::Tensor ids = at::arange(1000, at::kLong) * 3;
  content.tables["big"] = {ids,
                           at::arange(3000, at::kFloat).reshape({1000, 3})};
  content.tables["half"] = {at::arange(5, at::kLong),
                            at::ones({5, 2}, at::kHalf)};
  content.tables["empty"] = {at::empty({0}, at::kLong),
                             at::empty({0, 4}, at::kFloat)};
  content.dense = {{"w", at::arange(70, at::kDouble).reshape({7, 10})}};
  content.dense_batch = 10;
  return content;
}

TEST(CheckpointChainTest, ChunkedLinksRoundTripAndEveryByteIsVerified) {
  const std::string dir = FreshDir("chunked");
  const ChainLinkContent content = ChunkedContent();
  absl::StatusOr<ChainLink> link =
      WriteChainLinkContent(dir, content, ChainWriteOptions{100});
  ASSERT_TRUE(link.ok()) << link.status();
  // 8000 + 12000 bytes of the big table alone: 200 records of 12 + 100.
  EXPECT_GT(link->bytes, 20000 + 200 * 12);
  absl::StatusOr<LoadedChain> loaded = LoadChain(dir);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  for (const auto& [fqn, table] : content.tables) {
    SCOPED_TRACE(fqn);
    ASSERT_EQ(loaded->tables.count(fqn), 1u);
    EXPECT_TRUE(at::equal(loaded->tables.at(fqn).ids, table.ids));
    EXPECT_EQ(loaded->tables.at(fqn).values.scalar_type(),
              table.values.scalar_type());
    EXPECT_TRUE(at::equal(loaded->tables.at(fqn).values, table.values));
  }
  ASSERT_EQ(loaded->dense.size(), 1u);
  EXPECT_TRUE(at::equal(loaded->dense[0].second, content.dense[0].second));
  EXPECT_TRUE(VerifyChainLink(*link).ok());

  const std::string good = ReadBytes(link->path);
  // Every 197th byte flipped, one at a time: framing, description, rows.
  int refused = 0;
  for (size_t at = 0; at < good.size(); at += 197) {
    std::string bad = good;
    bad[at] ^= 0x10;
    WriteBytes(link->path, bad);
    absl::Status load = LoadChain(dir).status();
    absl::Status verify = VerifyChainLink(*link);
    EXPECT_EQ(load.code(), absl::StatusCode::kDataLoss) << at << ": " << load;
    EXPECT_EQ(verify.code(), absl::StatusCode::kDataLoss) << at;
    refused += load.code() == absl::StatusCode::kDataLoss;
  }
  EXPECT_GT(refused, 100);
  // Cut at every 151st byte, and one byte too many.
  for (size_t size = 0; size < good.size(); size += 151) {
    WriteBytes(link->path, good.substr(0, size));
    EXPECT_EQ(LoadChain(dir).status().code(), absl::StatusCode::kDataLoss)
        << size;
    EXPECT_EQ(VerifyChainLink(*link).code(), absl::StatusCode::kDataLoss)
        << size;
  }
  WriteBytes(link->path, good + "x");
  EXPECT_THAT(LoadChain(dir).status().message(), HasSubstr("after its last"));
  WriteBytes(link->path, good);
  EXPECT_TRUE(LoadChain(dir).ok());
}

// A load is asked before every record it reads and every link it applies
// whether to go on: cancelled at any of those points it ends Cancelled,
// naming the link it was in, having read no further; never cancelled, it
// loads as without the question.
TEST(CheckpointChainTest, ALoadEndsWithinOneRecordOfItsCancel) {
  const std::string dir = FreshDir("cancelled");
  const ChainLinkContent content = ChunkedContent();
  absl::StatusOr<ChainLink> full =
      WriteChainLinkContent(dir, content, ChainWriteOptions{100});
  ASSERT_TRUE(full.ok()) << full.status();
  absl::StatusOr<ChainLink> increment = WriteChainLink(
      dir, Read(content.end_batch, content.end_batch + 5, {3, 7}, 1));
  ASSERT_TRUE(increment.ok()) << increment.status();

  int asked = 0;
  absl::StatusOr<LoadedChain> whole = LoadChain(dir, [&asked] {
    ++asked;
    return false;
  });
  ASSERT_TRUE(whole.ok()) << whole.status();
  // The full link's 200 and more records of 100 bytes, each asked for.
  EXPECT_GT(asked, 200);
  absl::StatusOr<LoadedChain> unasked = LoadChain(dir);
  ASSERT_TRUE(unasked.ok()) << unasked.status();
  EXPECT_EQ(whole->end_batch, content.end_batch + 5);
  for (const auto& [fqn, table] : unasked->tables) {
    EXPECT_TRUE(at::equal(whole->tables.at(fqn).values, table.values)) << fqn;
  }

  const int questions = asked;
  for (int cancel_at : {1, 2, 100, questions - 1, questions}) {
    SCOPED_TRACE(cancel_at);
    int asked_now = 0;
    absl::StatusOr<LoadedChain> cancelled = LoadChain(
        dir, [&asked_now, cancel_at] { return ++asked_now >= cancel_at; });
    EXPECT_EQ(cancelled.status().code(), absl::StatusCode::kCancelled)
        << cancelled.status();
    EXPECT_EQ(asked_now, cancel_at);  // nothing read after the cancel
    const std::string& in =
        cancel_at >= questions - 1 ? increment->path : full->path;
    EXPECT_THAT(cancelled.status().message(),
                HasSubstr("loading '" + in + "' was cancelled"));
  }
}

TEST(CheckpointChainTest, ALinkHoldingOtherBatchesThanItsNameIsRefused) {
  const std::string dir = FreshDir("renamed");
  absl::StatusOr<ChainLink> base = WriteChainLink(dir, Full(10, {1, 2}, 0));
  absl::StatusOr<ChainLink> next = WriteChainLink(dir, Read(10, 20, {2}, 1));
  ASSERT_TRUE(base.ok() && next.ok());
  // An increment of [10, 20) renamed to claim [10, 30).
  const std::string renamed = dir + "/incr-000000000010-000000000030.ckpt";
  std::filesystem::rename(next->path, renamed);
  absl::Status load = LoadChain(dir).status();
  EXPECT_EQ(load.code(), absl::StatusCode::kDataLoss) << load;
  EXPECT_THAT(load.message(), HasSubstr("not what its name says"));
  ChainLink claimed{renamed, false, 10, 30, 0};
  EXPECT_THAT(VerifyChainLink(claimed).message(),
              HasSubstr("not what its name says"));
}

TEST(CheckpointChainTest, LinksOfTheFirstFormatAreStillRead) {
  // "DSCHAIN1": size, CRC-32, one v1::CheckpointLink message with its data
  // (a full link of table "t": rows 1 and 2, values [[10, 10], [20, 20]]).
  const std::string dir = FreshDir("v1");
  std::filesystem::create_directories(dir);
  const std::string payload(
      "\x08\x01\x18\x0a\x22\x36\x0a\x01\x74\x12\x17\x08\x01\x12\x01\x02"
      "\x1a\x10\x01\x00\x00\x00\x00\x00\x00\x00\x02\x00\x00\x00\x00\x00"
      "\x00\x00\x1a\x18\x08\x02\x12\x02\x02\x02\x1a\x10\x00\x00\x20\x41"
      "\x00\x00\x20\x41\x00\x00\xa0\x41\x00\x00\xa0\x41",
      60);
  const uint64_t size = payload.size();
  const uint32_t crc = static_cast<uint32_t>(
      crc32(crc32(0, nullptr, 0),
            reinterpret_cast<const Bytef*>(payload.data()), payload.size()));
  std::string bytes("DSCHAIN1", 8);
  bytes.append(reinterpret_cast<const char*>(&size), 8);
  bytes.append(reinterpret_cast<const char*>(&crc), 4);
  WriteBytes(dir + "/full-000000000000-000000000010.ckpt", bytes + payload);
  absl::StatusOr<LoadedChain> loaded = LoadChain(dir);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(Longs(loaded->tables.at("t").ids), (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(Column(loaded->tables.at("t").values),
            (std::vector<float>{10, 20}));
  bytes[16] ^= 1;
  WriteBytes(dir + "/full-000000000000-000000000010.ckpt", bytes + payload);
  EXPECT_THAT(LoadChain(dir).status().message(), HasSubstr("checksum"));

  // The IDs as float64 (the same 16 bytes), under a checksum that matches:
  // damage, not a link that is sound until a load uses its IDs.
  std::string float_ids = payload;
  ASSERT_EQ(float_ids[12], '\x01');  // the IDs' dtype: INT64
  float_ids[12] = '\x05';            // FLOAT64
  const uint32_t float_crc = static_cast<uint32_t>(crc32(
      crc32(0, nullptr, 0), reinterpret_cast<const Bytef*>(float_ids.data()),
      float_ids.size()));
  std::string header("DSCHAIN1", 8);
  header.append(reinterpret_cast<const char*>(&size), 8);
  header.append(reinterpret_cast<const char*>(&float_crc), 4);
  WriteBytes(dir + "/full-000000000000-000000000010.ckpt", header + float_ids);
  const absl::Status refused = LoadChain(dir).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kDataLoss) << refused;
  EXPECT_THAT(refused.message(), HasSubstr("table 't' does not decode"));
}

// deltactl chain: the operator's view of a chain.
std::string Deltactl(const std::string& args, int* exit_code) {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  const std::string binary =
      srcdir ? std::string(srcdir) + "/deltastream/clients/deltactl"
             : "bazel-bin/clients/deltactl";
  FILE* pipe = popen((binary + " " + args + " 2>&1").c_str(), "r");
  std::string out;
  char buffer[4096];
  for (size_t n; (n = std::fread(buffer, 1, sizeof(buffer), pipe)) > 0;) {
    out.append(buffer, n);
  }
  const int status = pclose(pipe);
  *exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return out;
}

TEST(CheckpointChainTest, DeltactlShowsLinksAndGaps) {
  const std::string dir = FreshDir("view");
  ASSERT_TRUE(WriteChainLink(dir, Full(10, {1, 2}, 0)).ok());
  ASSERT_TRUE(WriteChainLink(dir, Read(10, 20, {2}, 1)).ok());
  int code = -1;
  std::string out = Deltactl("chain --dir=" + dir, &code);
  EXPECT_EQ(code, 0) << out;
  EXPECT_THAT(out, HasSubstr("2 links"));
  EXPECT_THAT(out, HasSubstr("no gaps"));
  // Batches [START, END), as the JSON and the file names give them.
  EXPECT_THAT(out, HasSubstr("START_BATCH"));
  EXPECT_THAT(out, ::testing::ContainsRegex("increment +10 +20 "));
  ASSERT_TRUE(WriteChainLink(dir, Read(30, 40, {3}, 1)).ok());
  out = Deltactl("chain --json --dir=" + dir, &code);
  EXPECT_EQ(code, 1) << out;
  EXPECT_THAT(out, HasSubstr("batches 20..29 missing"));
  EXPECT_THAT(out, HasSubstr("\"kind\":\"increment\""));
  // The exit code's reason on stderr too, as every failed command's.
  EXPECT_THAT(out, HasSubstr("deltactl: the chain in '" + dir +
                             "' has 1 problem(s); the first: "));
}

// Issue 21, defect 6: `deltactl chain` said "no gaps" and exit 0 for links
// the loader refuses.
TEST(CheckpointChainTest, DeltactlReportsWhatTheLoaderRefuses) {
  const std::string dir = FreshDir("view_corrupt");
  ASSERT_TRUE(WriteChainLink(dir, Full(10, {1, 2, 3}, 0)).ok());
  absl::StatusOr<ChainLink> next = WriteChainLink(dir, Read(10, 20, {2}, 1));
  ASSERT_TRUE(next.ok());
  const std::string good = ReadBytes(next->path);
  int code = -1;
  struct Case {
    const char* what;
    std::string bytes;
  };
  std::string flipped_payload = good;
  flipped_payload[good.size() - 2] ^= 0x01;
  std::string wrong_crc = good;
  wrong_crc[17] ^= 0x01;  // the description record's CRC
  for (const Case& c : {Case{"flipped payload byte", flipped_payload},
                        Case{"wrong CRC", wrong_crc}}) {
    SCOPED_TRACE(c.what);
    WriteBytes(next->path, c.bytes);
    ASSERT_FALSE(LoadChain(dir).ok());
    std::string out = Deltactl("chain --dir=" + dir, &code);
    EXPECT_NE(code, 0) << out;
    EXPECT_THAT(out, HasSubstr("problem: '" + next->path));
    EXPECT_THAT(out, HasSubstr("checksum"));
    EXPECT_THAT(out, ::testing::Not(HasSubstr("no gaps")));
  }
  // Content that does not match the name: [10, 20) saved as [10, 30).
  WriteBytes(next->path, good);
  std::filesystem::rename(next->path,
                          dir + "/incr-000000000010-000000000030.ckpt");
  ASSERT_FALSE(LoadChain(dir).ok());
  std::string out = Deltactl("chain --dir=" + dir, &code);
  EXPECT_NE(code, 0) << out;
  EXPECT_THAT(out, HasSubstr("not what its name says"));
}

TEST(CheckpointChainTest, DeltactlShowsDenseRunsAndSupersededLinks) {
  const std::string dir = FreshDir("view_dense");
  ReceivedDelta base = InRun(Full(10, {1, 2}, 0), "5f3a9c", 4);
  base.dense = Dense(1);
  ASSERT_TRUE(WriteChainLink(dir, base).ok());
  ASSERT_TRUE(WriteChainLink(dir, Read(10, 20, {2}, 1)).ok());
  ASSERT_TRUE(WriteChainLink(dir, Full(20, {1, 2}, 2)).ok());
  int code = -1;
  std::string out = Deltactl("chain --dir=" + dir, &code);
  EXPECT_EQ(code, 0) << out;
  EXPECT_THAT(out, HasSubstr("DENSE"));
  EXPECT_THAT(out, HasSubstr("yes  5f3a9c (from batch 4)  superseded"));
  EXPECT_THAT(out, HasSubstr("3 links"));
  out = Deltactl("chain --json --dir=" + dir, &code);
  EXPECT_EQ(code, 0) << out;
  EXPECT_THAT(out, HasSubstr("\"dense\":2"));
  EXPECT_THAT(out, HasSubstr("\"dense_batch\":10"));
  EXPECT_THAT(out, HasSubstr("\"run_id\":\"5f3a9c\""));
  EXPECT_THAT(out, HasSubstr("\"run_start_batch\":4"));
  EXPECT_THAT(out, HasSubstr("\"superseded\":true"));
  EXPECT_THAT(out, HasSubstr("\"superseded\":false"));
}

}  // namespace
}  // namespace deltastream
