#ifndef DELTASTREAM_TRAINER_COMM_C10D_COMPAT_H_
#define DELTASTREAM_TRAINER_COMM_C10D_COMPAT_H_

// Every difference between LibTorch 1.13 (Debian) and 2.x (the GPU boxes'
// wheels) that trainer/comm meets lives here, and only here. Private to
// trainer/comm: it pulls in c10d's headers (USE_DISTRIBUTED and
// USE_C10D_GLOO must be defined: //third_party/system:torch_distributed, or
// Torch's CMake targets).
//
//   - 1.13: ProcessGroupGloo and ProcessGroupNCCL derive from ProcessGroup;
//     2.x: from Backend (a ProcessGroup then wraps backends). We hold the
//     concrete backend through its base, `CollectiveBackend`, and call the
//     collectives both bases declare with the same signatures.
//   - Work: c10d::Work in both (1.13.0 had ProcessGroup::Work; 1.13.1 and
//     2.x have c10d::Work).
//   - Options: ProcessGroupGloo::Options / ProcessGroupNCCL::Options derive
//     from ProcessGroup::Options (1.13) or Backend::Options (2.x); both have
//     create() and a `timeout` member.
//   - Gloo's reduce_scatter throws in 1.13: ReduceScatterSum emulates it for
//     Gloo with an all-reduce and a slice, as PyTorch's fallback does.

#include <torch/csrc/api/include/torch/version.h>

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#if defined(USE_C10D_NCCL)
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include <chrono>
#include <memory>
#include <string>
#include <vector>

namespace deltastream {
namespace c10d_compat {

#if TORCH_VERSION_MAJOR >= 2
using CollectiveBackend = ::c10d::Backend;
#else
using CollectiveBackend = ::c10d::ProcessGroup;
#endif
using Work = ::c10d::Work;

constexpr bool kHasNccl =
#if defined(USE_C10D_NCCL)
    true;
#else
    false;
#endif

inline c10::intrusive_ptr<CollectiveBackend> MakeGloo(
    const c10::intrusive_ptr<::c10d::Store>& store, int rank, int size,
    std::chrono::milliseconds timeout, const std::string& hostname) {
  auto options = ::c10d::ProcessGroupGloo::Options::create(timeout);
  options->devices.push_back(
      hostname.empty()
          ? ::c10d::ProcessGroupGloo::createDefaultDevice()
          : ::c10d::ProcessGroupGloo::createDeviceForHostname(hostname));
  options->threads = 2;
  return c10::make_intrusive<::c10d::ProcessGroupGloo>(store, rank, size,
                                                       options);
}

// nullptr where LibTorch has no NCCL.
inline c10::intrusive_ptr<CollectiveBackend> MakeNccl(
    const c10::intrusive_ptr<::c10d::Store>& store, int rank, int size,
    std::chrono::milliseconds timeout) {
#if defined(USE_C10D_NCCL)
  auto options = ::c10d::ProcessGroupNCCL::Options::create();
  options->timeout = timeout;
  return c10::make_intrusive<::c10d::ProcessGroupNCCL>(store, rank, size,
                                                       options);
#else
  (void)store, (void)rank, (void)size, (void)timeout;
  return {};
#endif
}

// Sums block `rank` of `input` ([size * n, ...]) over ranks into `output`.
inline void ReduceScatterSum(CollectiveBackend& backend, bool is_gloo, int rank,
                             int size, at::Tensor& input, at::Tensor& output) {
  if (is_gloo) {
    std::vector<at::Tensor> tensors = {input.clone()};
    backend.allreduce(tensors)->wait();
    output.copy_(tensors[0].chunk(size, 0)[rank]);
    return;
  }
  backend._reduce_scatter_base(output, input)->wait();
}

}  // namespace c10d_compat
}  // namespace deltastream

#endif  // DELTASTREAM_TRAINER_COMM_C10D_COMPAT_H_
