#ifndef DELTASTREAM_TRAINER_MODELS_ARCHITECTURE_H_
#define DELTASTREAM_TRAINER_MODELS_ARCHITECTURE_H_

// Building blocks the models share (LibTorch's C++ frontend: include only
// from models' .cc files).
#include <torch/torch.h>

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "trainer/modules/embedding_config.h"

namespace deltastream {

// Linear layers of `widths` after an input of `in`, ReLU between them and,
// when `relu_last`, after the last.
torch::nn::Sequential MakeMlp(int64_t in, const std::vector<int64_t>& widths,
                              bool relu_last);

// InvalidArgument unless num_dense >= 1, both archs are non-empty with
// positive widths, over_arch ends in 1, there are tables, and every table's
// dim is dense_arch's last width.
absl::Status ValidateArchitecture(
    int64_t num_dense, const std::vector<int64_t>& dense_arch,
    const std::vector<int64_t>& over_arch,
    const std::vector<EmbeddingTableConfig>& tables);

// No exception crosses a model's API: LibTorch's errors become Internal.
template <typename F>
auto CatchModelErrors(F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const c10::Error& e) {
    return absl::InternalError(e.what_without_backtrace());
  }
}

}  // namespace deltastream

#endif  // DELTASTREAM_TRAINER_MODELS_ARCHITECTURE_H_
