// The overlapping pipelines on a CUDA device (memcpy and data-dist streams,
// events, record_stream: trainer/pipeline/device_streams.h) against the same
// training on the CPU: every pipeline, with and without accumulation, on an
// unsharded model and on a sharded one (one rank, NCCL), and bf16 mixed
// precision with gradient scaling. Skipped where LibTorch has no CUDA device
// (the CPU build), except the check that the CPU path makes no CUDA call;
// run on a GPU machine as docs/pipelines.md describes.
#include <ATen/Context.h>
#include <ATen/core/Tensor.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "tests/trainer/pipeline/pipeline_fixtures.h"
#include "trainer/comm/process_group.h"
#include "trainer/pipeline/device_streams.h"
#include "trainer/pipeline/gradient_scaler.h"
#include "trainer/pipeline/pipeline_factory.h"
#include "trainer/sharding/sharded_embedding_modules.h"

namespace deltastream {
namespace {

// CUDA's float kernels (and atomics in embedding backward) round
// differently from the CPU's: parameters after a few steps differ by about
// 1e-6; a broken stream order (a batch read before its copy, or memory
// reused while in use) gives differences of the parameters' own size.
constexpr double kCudaTolerance = 1e-4;
// bf16 autocast against float32 on the CPU (plain SGD, so that differences
// stay proportional to the gradients' rounding).
constexpr double kMixedPrecisionTolerance = 5e-3;

const c10::Device kCuda(c10::kCUDA, 0);
const c10::Device kCpu(c10::kCPU);

// Runs everywhere: on the CPU the stream discipline makes no CUDA call (a
// CPU-only LibTorch has no CUDA guard implementation: any call would throw).
TEST(DeviceStreamsTest, OnTheCpuNothingTouchesCuda) {
  EXPECT_FALSE(SideStream(kCpu).has_value());
  SynchronizeStream(SideStream(kCpu));
  const StreamEvent event = StreamEvent::OnCurrentStream(kCpu);
  event.BlockCurrentStream();
  StreamEvent().BlockCurrentStream();
  const testing::Examples examples = testing::MakeExamples(8, 1);
  RecordOnCurrentStream(testing::MakeBatch(examples, 0, 8));
  RecordOnCurrentStream(std::vector<DistributedBatch>(1));
}

class CudaPipelinesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  }
};

TEST_F(CudaPipelinesTest, EveryPipelineOnCudaGivesTheCpuParameters) {
  const testing::Examples examples = testing::MakeExamples(512, 31);
  for (int k : {1, 2}) {
    std::unique_ptr<testing::Trainable> cpu = testing::Train(
        SparseOptimizerType::kAdam, testing::Options("sequential", k), examples,
        testing::Repeat(64, 8), kCpu);
    for (const char* name : {"sequential", "base", "sparse_dist"}) {
      std::unique_ptr<testing::Trainable> cuda =
          testing::Train(SparseOptimizerType::kAdam, testing::Options(name, k),
                         examples, testing::Repeat(64, 8), kCuda);
      const double difference =
          testing::MaxDifference(*cpu->model, *cuda->model);
      std::printf("%s K=%d: CUDA vs CPU %g\n", name, k, difference);
      EXPECT_LT(difference, kCudaTolerance) << name << " K=" << k;
    }
  }
}

// A one-rank group on `device` (Gloo on the CPU, NCCL on CUDA): the model is
// sharded, so sparse_dist runs its input distribution (on the data-dist
// stream on CUDA).
absl::StatusOr<std::unique_ptr<ProcessGroup>> OneRankGroup(c10::Device device) {
  ProcessGroupOptions options;
  options.device = device;
  options.timeout = absl::Seconds(60);
  options.rendezvous_timeout = absl::Seconds(60);
  return ProcessGroup::Create(options);
}

TEST_F(CudaPipelinesTest, ShardedPipelinesOnCudaGiveTheCpuParameters) {
  absl::StatusOr<std::unique_ptr<ProcessGroup>> nccl = OneRankGroup(kCuda);
  if (nccl.status().code() == absl::StatusCode::kUnimplemented) {
    GTEST_SKIP() << nccl.status();
  }
  ASSERT_TRUE(nccl.ok()) << nccl.status();
  absl::StatusOr<std::unique_ptr<ProcessGroup>> gloo = OneRankGroup(kCpu);
  ASSERT_TRUE(gloo.ok()) << gloo.status();
  const testing::Examples examples = testing::MakeExamples(512, 32);
  auto train = [&](const std::string& name, int k, c10::Device device,
                   ProcessGroup& group) {
    auto trainable = std::make_unique<testing::Trainable>(
        SparseOptimizerType::kAdam, &group, false, device);
    EXPECT_FALSE(trainable->model->sharded_modules().empty());
    absl::StatusOr<std::unique_ptr<TrainPipeline>> pipeline =
        MakeTrainPipeline(testing::Options(name, k), trainable->Parts(&group));
    EXPECT_TRUE(pipeline.ok()) << pipeline.status();
    if (!pipeline.ok()) return trainable;
    testing::ExampleSource source(examples, testing::Repeat(64, 8));
    absl::StatusOr<int> trained = testing::TrainAll(**pipeline, source);
    EXPECT_TRUE(trained.ok()) << trained.status();
    std::printf(
        "%s K=%d on %s: input dist exposed %s\n", name.c_str(), k,
        device.str().c_str(),
        absl::FormatDuration((*pipeline)->stats().exposed_input_dist).c_str());
    return trainable;
  };
  for (int k : {1, 2}) {
    std::unique_ptr<testing::Trainable> cpu =
        train("sequential", k, kCpu, **gloo);
    for (const char* name : {"sequential", "base", "sparse_dist"}) {
      std::unique_ptr<testing::Trainable> cuda = train(name, k, kCuda, **nccl);
      const double difference =
          testing::MaxDifference(*cpu->model, *cuda->model);
      std::printf("sharded %s K=%d: CUDA vs CPU %g\n", name, k, difference);
      EXPECT_LT(difference, kCudaTolerance) << name << " K=" << k;
    }
  }
}

TEST_F(CudaPipelinesTest, MixedPrecisionOnEveryPipelineIsCloseToFloat32) {
  const testing::Examples examples = testing::MakeExamples(512, 33);
  std::unique_ptr<testing::Trainable> cpu = testing::Train(
      SparseOptimizerType::kSgd, testing::Options("sequential", 2), examples,
      testing::Repeat(64, 8), kCpu, "sgd");
  std::unique_ptr<testing::Trainable> reference;
  for (const char* name : {"sequential", "base", "sparse_dist"}) {
    auto cuda = std::make_unique<testing::Trainable>(
        SparseOptimizerType::kSgd, nullptr, false, kCuda, "sgd");
    TrainPipelineOptions options = testing::Options(name, 2);
    options.mixed_precision = true;
    absl::StatusOr<std::unique_ptr<TrainPipeline>> pipeline =
        MakeTrainPipeline(options, cuda->Parts());
    ASSERT_TRUE(pipeline.ok()) << pipeline.status();
    testing::ExampleSource source(examples, testing::Repeat(64, 8));
    absl::StatusOr<int> trained = testing::TrainAll(**pipeline, source);
    ASSERT_TRUE(trained.ok()) << trained.status();
    ASSERT_NE((*pipeline)->gradient_scaler(), nullptr);
    EXPECT_EQ((*pipeline)->gradient_scaler()->skipped_steps(), 0) << name;
    const double to_float32 = testing::MaxDifference(*cpu->model, *cuda->model);
    std::printf("%s bf16: vs CPU float32 %g\n", name, to_float32);
    EXPECT_LT(to_float32, kMixedPrecisionTolerance) << name;
    if (reference == nullptr) {
      reference = std::move(cuda);
      continue;
    }
    // The streams change no result: every pipeline gives the sequential
    // loop's bf16 training.
    const double to_sequential =
        testing::MaxDifference(*reference->model, *cuda->model);
    std::printf("%s bf16: vs sequential bf16 %g\n", name, to_sequential);
    EXPECT_LT(to_sequential, kCudaTolerance) << name;
  }
}

}  // namespace
}  // namespace deltastream
