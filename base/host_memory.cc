#include "base/host_memory.h"

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/util/Exception.h>
#include <malloc.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>

#if __has_include(<torch/version.h>)
#include <torch/version.h>
#endif

#if defined(TORCH_VERSION_MAJOR) && \
    (TORCH_VERSION_MAJOR > 2 ||     \
     (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 3))
#define DELTASTREAM_ALLOCATE_CONST
#define DELTASTREAM_HAS_COPY_DATA 1
#else
#define DELTASTREAM_ALLOCATE_CONST const
#define DELTASTREAM_HAS_COPY_DATA 0
#endif

namespace deltastream {
namespace {

// LibTorch's alignment for CPU tensors.
constexpr uintptr_t kAlignment = 64;

// malloc'd blocks aligned by hand: the block's own address is kept just below
// the aligned pointer.
class MallocCpuAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t bytes) DELTASTREAM_ALLOCATE_CONST override {
    if (bytes == 0) return {nullptr, nullptr, &Delete, c10::Device(c10::kCPU)};
    // As LibTorch's own allocators report it (a c10::Error, which the
    // project's catch sites handle; IsOutOfMemory in base/torch_status.h).
    void* block = bytes <= SIZE_MAX - kAlignment - sizeof(void*)
                      ? std::malloc(bytes + kAlignment + sizeof(void*))
                      : nullptr;
    TORCH_CHECK_WITH(OutOfMemoryError, block != nullptr,
                     "out of memory: cannot allocate ", bytes, " bytes");
    const uintptr_t start = reinterpret_cast<uintptr_t>(block) + sizeof(void*);
    void* aligned =
        reinterpret_cast<void*>((start + kAlignment - 1) & ~(kAlignment - 1));
    static_cast<void**>(aligned)[-1] = block;
    return {aligned, aligned, &Delete, c10::Device(c10::kCPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &Delete; }
#if DELTASTREAM_HAS_COPY_DATA
  void copy_data(void* dest, const void* src,
                 std::size_t count) const override {
    std::memcpy(dest, src, count);
  }
#endif

 private:
  static void Delete(void* aligned) {
    if (aligned != nullptr) std::free(static_cast<void**>(aligned)[-1]);
  }
};

}  // namespace

void KeepHostMemoryForReuse() {
  mallopt(M_MMAP_THRESHOLD, 1 << 30);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  mallopt(M_ARENA_MAX, 1);
  static MallocCpuAllocator allocator;
  // Above LibTorch's default (priority 0).
  c10::SetCPUAllocator(&allocator, /*priority=*/1);
}

}  // namespace deltastream
