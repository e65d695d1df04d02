#ifndef DELTASTREAM_TRAINER_MODELS_ARCHITECTURE_H_
#define DELTASTREAM_TRAINER_MODELS_ARCHITECTURE_H_

// Building blocks the models share. Internal to trainer/models (not in the
// library's hdrs): it pulls in LibTorch's C++ frontend, so include it from
// .cc files only.
#include <torch/nn/module.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "base/torch_status.h"
#include "trainer/data/batch.h"
#include "trainer/modules/embedding_config.h"

namespace deltastream {

// Linear layers of `widths` after an input of `in`, ReLU between them and,
// when `relu_last`, after the last. Submodules are named "0", "1", ... as
// torch::nn::Sequential names them (ReLUs take positions too).
torch::nn::Sequential MakeMlp(int64_t in, const std::vector<int64_t>& widths,
                              bool relu_last);

// Refills every torch::nn::Linear under `module` (in named_modules() order)
// from a CPU generator seeded with `seed`, with LibTorch's default Linear
// distribution: weight and bias uniform in +-1/sqrt(in_features). The same
// module structure and seed give bit-identical parameters on any device,
// whatever the global generator's state; the global generator is neither
// read nor reseeded here (the Linear constructors did draw from it).
void InitializeLinearLayers(torch::nn::Module& module, uint64_t seed);

// The seed of a model's dense parameters, from the model's seed (which also
// seeds its tables): a different stream, so no dense layer repeats a table's
// draws.
inline uint64_t DenseParameterSeed(uint64_t model_seed) {
  return model_seed ^ 0x9E3779B97F4A7C15ULL;
}

// The checks a Forward makes on the batch's metadata (no device read):
// InvalidArgument unless dense is a floating [B, num_dense] tensor on
// `device` and the sparse features have stride B.
absl::Status ValidateBatch(const Batch& batch, int64_t num_dense,
                           c10::Device device);

}  // namespace deltastream

#endif  // DELTASTREAM_TRAINER_MODELS_ARCHITECTURE_H_
