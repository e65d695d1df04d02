// KeepHostMemoryForReuse: a freed tensor's memory is reused without faulting
// it in again, and tensors keep LibTorch's alignment.

#include "base/host_memory.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <cstdint>

namespace deltastream {
namespace {

class HostMemoryTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { KeepHostMemoryForReuse(); }
};

// Page faults this process has taken so far.
int64_t MinorFaults() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_minflt;
}

TEST_F(HostMemoryTest, AFreedTensorsMemoryIsReusedWithoutFaultingItInAgain) {
  const int64_t floats = 4 << 20;  // 16 MiB, 4096 pages of 4 KiB
  { at::Tensor warm = at::ones({floats}); }
  const int64_t faults = MinorFaults();
  at::Tensor again = at::zeros({floats});
  EXPECT_LT(MinorFaults() - faults, 64);  // glibc's defaults: over 4096
  EXPECT_EQ(again.sum().item<float>(), 0.0f);
}

TEST_F(HostMemoryTest, TensorsKeepLibTorchsAlignment) {
  for (int64_t bytes : {1, 3, 64, 1000, 1 << 20}) {
    at::Tensor t = at::empty({bytes}, at::kByte);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data_ptr()) % 64, 0u) << bytes;
  }
}

}  // namespace
}  // namespace deltastream
