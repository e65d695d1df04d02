// A checkpoint-chain link of over 4 GiB of rows (issue 21, defect 7: a link
// over 2 GiB used to serialize empty) is written and loaded back, without a
// second copy of its rows in memory: peak memory is one table (about 4.3 GiB)
// plus a read buffer; a load of it cancelled a quarter in ends within one
// record of the cancel. Manual (tags = ["manual"]): it needs that much RAM and
// disk and takes about a minute:
//   bazel test //tests/store:checkpoint_chain_large_test
#include <ATen/core/Tensor.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/empty.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "store/checkpoint_chain.h"

namespace deltastream {
namespace {

// The value of element `i` of the values: exact in float32.
float ValueAt(int64_t i) { return static_cast<float>(i % 16777213); }

int64_t PeakResidentBytes() {
  struct rusage usage;
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<int64_t>(usage.ru_maxrss) * 1024;
}

TEST(CheckpointChainLargeTest, LinkOverFourGiBRoundTrips) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string dir = std::string(tmp ? tmp : "/tmp") + "/large_link." +
                          std::to_string(getpid());
  std::filesystem::remove_all(dir);
  constexpr int64_t kRows = int64_t{17} << 20;  // 17.8 M rows
  constexpr int64_t kDim = 64;                  // 4.25 GiB of float32 values
  int64_t link_bytes = 0;
  {
    ChainLinkContent content;
    content.full = true;
    content.end_batch = 1;
    at::Tensor values = at::empty({kRows, kDim}, at::kFloat);
    float* data = values.data_ptr<float>();
    for (int64_t i = 0; i < kRows * kDim; ++i) data[i] = ValueAt(i);
    content.tables["big"] = {at::arange(kRows, at::kLong), values};
    absl::StatusOr<ChainLink> link = WriteChainLinkContent(dir, content);
    ASSERT_TRUE(link.ok()) << link.status();
    link_bytes = link->bytes;
    EXPECT_GT(link_bytes, (int64_t{4} << 30) + 1);
  }
  const int64_t peak_after_write = PeakResidentBytes();
  const absl::Time load_started = absl::Now();
  absl::StatusOr<LoadedChain> loaded = LoadChain(dir);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  const ChainTable& big = loaded->tables.at("big");
  ASSERT_EQ(big.values.size(0), kRows);
  ASSERT_EQ(big.values.size(1), kDim);
  const float* data = big.values.data_ptr<float>();
  const int64_t* ids = big.ids.data_ptr<int64_t>();
  int64_t wrong = 0;
  for (int64_t i = 0; i < kRows * kDim; ++i) wrong += data[i] != ValueAt(i);
  for (int64_t i = 0; i < kRows; ++i) wrong += ids[i] != i;
  EXPECT_EQ(wrong, 0);
  // Loading holds the table once: the peak grows by less than a second copy.
  const int64_t table_bytes = kRows * (kDim * 4 + 8);
  EXPECT_LT(PeakResidentBytes(), peak_after_write + table_bytes / 4)
      << "peak " << PeakResidentBytes() << " after write " << peak_after_write;
  const absl::Duration whole_load = absl::Now() - load_started;
  loaded = absl::UnknownError("released");

  // Cancelled a quarter into a load as long, the load ends within one
  // record (64 MiB) of the cancel, not at the end of the link.
  std::atomic<bool> cancel{false};
  std::thread canceller([&cancel, whole_load] {
    absl::SleepFor(whole_load / 4);
    cancel = true;
  });
  absl::Time cancelled_at;
  absl::StatusOr<LoadedChain> cancelled = LoadChain(dir, [&] {
    if (!cancel.load()) return false;
    if (cancelled_at == absl::Time()) cancelled_at = absl::Now();
    return true;
  });
  const absl::Time ended = absl::Now();
  canceller.join();
  EXPECT_EQ(cancelled.status().code(), absl::StatusCode::kCancelled)
      << cancelled.status();
  std::printf(
      "whole load %s; cancelled a quarter in, it ended %s after the "
      "cancel was seen\n",
      absl::FormatDuration(whole_load).c_str(),
      absl::FormatDuration(ended - cancelled_at).c_str());
  EXPECT_LT(ended - cancelled_at, absl::Seconds(1));
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace deltastream
