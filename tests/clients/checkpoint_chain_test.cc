// Checkpoint chains: base + increments load to the rows a replica would hold;
// a missing, duplicated or overlapping increment, a corrupt or truncated file
// are refused with a clear error; compaction gives the same tables.
#include "clients/checkpoint_chain.h"

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

namespace deltastream {
namespace {

using ::testing::HasSubstr;

std::string FreshDir(const std::string& name) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  std::string dir = std::string(tmp ? tmp : "/tmp") + "/" + name + "." +
                    std::to_string(getpid());
  std::filesystem::remove_all(dir);
  return dir;
}

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

std::vector<float> Column(const at::Tensor& values) {
  at::Tensor c = values.select(1, 0).contiguous();
  return {c.data_ptr<float>(), c.data_ptr<float>() + c.numel()};
}
std::vector<int64_t> Longs(const at::Tensor& t) {
  at::Tensor c = t.contiguous();
  return {c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel()};
}

TEST(CheckpointChainTest, BaseAndIncrementsLoadNewestValues) {
  const std::string dir = FreshDir("chain");
  ASSERT_TRUE(WriteChainLink(dir, Read(-1, 10, {1, 2, 3}, 0), true).ok());
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

TEST(CheckpointChainTest, MissingDuplicatedOrOverlappingIncrementsAreRefused) {
  const std::string dir = FreshDir("gap");
  ASSERT_TRUE(WriteChainLink(dir, Read(-1, 10, {1}, 0), true).ok());
  ASSERT_TRUE(WriteChainLink(dir, Read(20, 30, {2}, 1)).ok());
  absl::StatusOr<LoadedChain> loaded = LoadChain(dir);
  EXPECT_EQ(loaded.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(loaded.status().message(), HasSubstr("batches 10..19 missing"));

  const std::string dup = FreshDir("dup");
  ASSERT_TRUE(WriteChainLink(dup, Read(-1, 10, {1}, 0), true).ok());
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
  absl::StatusOr<ChainLink> base =
      WriteChainLink(dir, Read(-1, 10, {1, 2}, 0), true);
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
  ReceivedDelta no_values = Read(-1, 10, {1}, 0);
  no_values.tables["t"].values = at::Tensor();
  EXPECT_THAT(WriteChainLink(dir, no_values).status().message(),
              HasSubstr("without values"));
  EXPECT_EQ(WriteChainLink(dir, Read(10, 10, {}, 0)).status().code(),
            absl::StatusCode::kInvalidArgument);
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
  ASSERT_TRUE(WriteChainLink(dir, Read(-1, 10, {1, 2}, 0), true).ok());
  ASSERT_TRUE(WriteChainLink(dir, Read(10, 20, {2}, 1)).ok());
  int code = -1;
  std::string out = Deltactl("chain --dir=" + dir, &code);
  EXPECT_EQ(code, 0) << out;
  EXPECT_THAT(out, HasSubstr("2 links"));
  EXPECT_THAT(out, HasSubstr("no gaps"));
  ASSERT_TRUE(WriteChainLink(dir, Read(30, 40, {3}, 1)).ok());
  out = Deltactl("chain --json --dir=" + dir, &code);
  EXPECT_EQ(code, 1) << out;
  EXPECT_THAT(out, HasSubstr("batches 20..29 missing"));
  EXPECT_THAT(out, HasSubstr("\"kind\":\"increment\""));
}

}  // namespace
}  // namespace deltastream
