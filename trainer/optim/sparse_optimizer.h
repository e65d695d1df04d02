#ifndef DELTASTREAM_TRAINER_OPTIM_SPARSE_OPTIMIZER_H_
#define DELTASTREAM_TRAINER_OPTIM_SPARSE_OPTIMIZER_H_

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace deltastream {

enum class SparseOptimizerType { kSgd, kAdagrad, kRowwiseAdagrad, kAdam };

absl::string_view SparseOptimizerName(SparseOptimizerType type);
// "sgd", "adagrad", "rowwise_adagrad", "adam"; InvalidArgument otherwise.
absl::StatusOr<SparseOptimizerType> ParseSparseOptimizer(
    absl::string_view name);

struct SparseOptimizerConfig {
  SparseOptimizerType type = SparseOptimizerType::kRowwiseAdagrad;
  double learning_rate = 0.01;
  double eps = 1e-8;
  double beta1 = 0.9;    // Adam
  double beta2 = 0.999;  // Adam
  double weight_decay = 0;
  double initial_accumulator_value = 0;  // Adagrad, row-wise Adagrad
};

// InvalidArgument for a negative learning rate, eps <= 0, betas outside
// [0, 1), a negative weight decay or initial accumulator.
absl::Status ValidateOptimizer(const SparseOptimizerConfig& config);

// A fused sparse optimizer over one embedding table: it updates only the rows
// a step touched, with the textbook formulas, where g is a row's gradient
// summed over its occurrences in the batch (plus weight_decay * w):
//   SGD:              w -= lr * g
//   Adagrad:          s += g^2;            w -= lr * g / (sqrt(s) + eps)
//   row-wise Adagrad: s += mean_j(g_j^2);  w -= lr * g / (sqrt(s) + eps)
//                     (s is one value per row)
//   Adam:             t += 1 (per table, once per update);
//                     m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2;
//                     w -= lr * (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)
//                     (rows not touched keep m and v: "lazy" Adam)
//
// Row states ("momentum1", what the tracker's optimizer modes read): the
// Adagrad sum [rows, dim], the row-wise sum [rows, 1], Adam's m [rows, dim];
// SGD has none. Adam also keeps "momentum2" (v). States live with the table,
// on its device, in its dtype.
//
// Not thread-safe: the owner serialises Update with reads (see
// EmbeddingModule).
class SparseTableOptimizer {
 public:
  // `weight` is the table the updates apply to (shape [rows, dim]); states
  // are allocated for it here.
  SparseTableOptimizer(SparseOptimizerConfig config, const at::Tensor& weight);

  const SparseOptimizerConfig& config() const { return config_; }

  // Applies one step to `weight` in place: `ids` int64 [n] rows, `grad`
  // [n, dim] each row's gradient summed over the step. An ID may repeat when
  // all its repeats carry the same gradient: every repeat computes and writes
  // the same values (what lets the caller skip deduplication, whose size a
  // GPU would have to report back). No host synchronisation.
  void Update(at::Tensor& weight, const at::Tensor& ids,
              const at::Tensor& grad);

  // Whether the optimizer keeps a row state the tracker can read.
  bool has_row_state() const { return momentum1_.defined(); }
  // momentum1 rows of `ids`: [n, dim] or [n, 1]. FailedPrecondition for SGD.
  absl::StatusOr<at::Tensor> RowStates(const at::Tensor& ids) const;

  // Named state tensors for checkpoints: "momentum1", "momentum2", "step"
  // (those that exist). The tensors are the live ones (no copy).
  std::vector<std::pair<std::string, at::Tensor>> StateTensors() const;
  // Loads what StateTensors returned. InvalidArgument when a name is missing
  // or unknown or a shape or dtype differs; nothing changes then.
  absl::Status LoadStateTensors(
      const std::vector<std::pair<std::string, at::Tensor>>& states);

 private:
  SparseOptimizerConfig config_;
  at::Tensor momentum1_;
  at::Tensor momentum2_;
  int64_t step_ = 0;
};

}  // namespace deltastream

#endif  // DELTASTREAM_TRAINER_OPTIM_SPARSE_OPTIMIZER_H_
