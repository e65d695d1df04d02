// KeepHostMemoryForReuse: a freed tensor's memory is reused without faulting
// it in again, tensors keep LibTorch's alignment, and an allocation that
// fails is LibTorch's out-of-memory error.

#include "base/host_memory.h"

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/zeros.h>
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <cstdint>

#include "base/torch_status.h"

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

// Memory the allocator cannot give is LibTorch's out-of-memory error, as its
// own allocators report it, so that every catch site maps it to
// ResourceExhausted, never to a crash (a std::bad_alloc their c10::Error
// handlers let through) or to damage.
TEST_F(HostMemoryTest, AnAllocationThatFailsIsOutOfMemory) {
  const absl::Status status = CatchTorchErrors([]() -> absl::Status {
    at::Tensor petabyte = at::empty({int64_t{1} << 50}, at::kByte);
    return absl::OkStatus();
  });
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted) << status;
  EXPECT_NE(status.message().find("out of memory: cannot allocate "
                                  "1125899906842624 bytes"),
            absl::string_view::npos)
      << status;
  try {
    at::Tensor petabyte = at::empty({int64_t{1} << 50}, at::kByte);
    ADD_FAILURE() << "allocated 1 PiB";
  } catch (const c10::Error& e) {
    EXPECT_TRUE(IsOutOfMemory(e)) << e.what_without_backtrace();
  }
}

}  // namespace
}  // namespace deltastream
