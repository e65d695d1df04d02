#ifndef DELTASTREAM_TESTS_TRAINER_PIPELINE_PIPELINE_FIXTURES_H_
#define DELTASTREAM_TESTS_TRAINER_PIPELINE_PIPELINE_FIXTURES_H_

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <torch/optim/optimizer.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "trainer/data/batch.h"
#include "trainer/models/model.h"
#include "trainer/optim/sparse_optimizer.h"
#include "trainer/pipeline/pipeline_factory.h"
#include "trainer/pipeline/train_pipeline.h"

// What the pipeline tests share (pipelines_test on the CPU,
// cuda_pipelines_test on a GPU): examples, a small DLRM or sequence model
// with its dense optimizer, training through a pipeline, and comparing two
// models.

namespace deltastream {
namespace testing {

inline constexpr int64_t kNumDense = 13;
inline constexpr int64_t kDim = 8;

// Examples in example-major form, so that any range of them is a batch.
struct Examples {
  at::Tensor dense;   // [n, kNumDense]
  at::Tensor labels;  // [n]
  // ids[f][e]: the IDs of feature f in example e.
  std::vector<std::vector<std::vector<int64_t>>> ids;
};

// n examples of features cat_0 (one ID of 25) and cat_1 (one to three of
// 12): few hot rows, so that micro-batches share rows.
Examples MakeExamples(int64_t n, uint64_t seed);

// Examples [begin, end) as a CPU batch.
Batch MakeBatch(const Examples& examples, int64_t begin, int64_t end);

// `batch` with its sparse features handed over as a feature dict
// (Batch::sparse_dict, each feature in tensors of its own; `sparse` empty).
Batch AsFeatureDict(Batch batch);

// Batches of the given sizes, back to back over the examples (which must
// outlive the source); with `feature_dicts`, AsFeatureDict's.
class ExampleSource : public BatchSource {
 public:
  ExampleSource(const Examples& examples, std::vector<int64_t> sizes,
                bool feature_dicts = false)
      : examples_(examples),
        sizes_(std::move(sizes)),
        feature_dicts_(feature_dicts) {}
  absl::StatusOr<std::optional<Batch>> Next() override;

 private:
  const Examples& examples_;
  std::vector<int64_t> sizes_;
  bool feature_dicts_;
  size_t next_ = 0;
  int64_t begin_ = 0;
};

std::vector<int64_t> Repeat(int64_t size, int count);

// A Dlrm (or SequenceModel) on `device` with its dense optimizer (by
// default Adam: stateful, so a dense step taken per micro-batch instead of
// per window would show). Aborts when the model cannot be made.
struct Trainable {
  explicit Trainable(SparseOptimizerType sparse, ProcessGroup* group = nullptr,
                     bool sequence = false,
                     c10::Device device = c10::Device(c10::kCPU),
                     const std::string& dense_optimizer = "adam");

  TrainPipelineParts Parts(ProcessGroup* group = nullptr) const;

  std::unique_ptr<RecModel> model;
  std::unique_ptr<torch::optim::Optimizer> dense;
};

TrainPipelineOptions Options(const std::string& pipeline, int k);

// Trains every batch of `source`; returns how many.
absl::StatusOr<int> TrainAll(TrainPipeline& pipeline, BatchSource& source);

// The largest difference between the two models' dense parameters, tables
// and sparse optimizer states (on any devices); infinity when their layouts
// differ or a value is NaN.
double MaxDifference(RecModel& a, RecModel& b);

// Trains a fresh model on `device` with `options` over batches of `sizes`
// (EXPECTs that every step succeeds); with a `group`, the model is sharded
// over it and the pipeline trains with it.
std::unique_ptr<Trainable> Train(SparseOptimizerType sparse,
                                 const TrainPipelineOptions& options,
                                 const Examples& examples,
                                 std::vector<int64_t> sizes,
                                 c10::Device device = c10::Device(c10::kCPU),
                                 const std::string& dense_optimizer = "adam",
                                 ProcessGroup* group = nullptr);

}  // namespace testing
}  // namespace deltastream

#endif  // DELTASTREAM_TESTS_TRAINER_PIPELINE_PIPELINE_FIXTURES_H_
