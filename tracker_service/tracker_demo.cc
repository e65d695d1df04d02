// A short, self-contained run of the tracker: a CPU embedding table trained by
// plain SGD on Zipf-skewed lookups, tracked in EMBEDDING mode, read by two
// consumers at different rates (a predictor every 5 steps, top 10% by change;
// a checkpoint job every 20 steps, everything). Prints what each read returns
// and what the store holds.
//
//   bazel run //tracker_service:tracker_demo -- [--steps=60]

#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/randn.h>

#include <cstdio>
#include <random>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_format.h"
#include "tracker_service/tracker.h"

ABSL_FLAG(int, steps, 60, "training steps");
ABSL_FLAG(int64_t, rows, 100000, "rows of the table");
ABSL_FLAG(int64_t, dim, 16, "embedding dim");
ABSL_FLAG(int64_t, batch, 512, "IDs per step");

namespace deltastream {
namespace {

constexpr char kFqn[] = "sparse.ec.embeddings.items";

// The trainer's side: live rows of one table.
class DemoTable : public LiveRowsReader {
 public:
  DemoTable(int64_t rows, int64_t dim) : weights_(at::randn({rows, dim})) {}
  at::Tensor& weights() { return weights_; }

  absl::StatusOr<int64_t> NumRows(absl::string_view fqn) override {
    if (fqn != kFqn) return absl::NotFoundError("unknown table");
    return weights_.size(0);
  }
  absl::StatusOr<at::Tensor> ReadEmbeddings(absl::string_view fqn,
                                            const at::Tensor& ids) override {
    if (fqn != kFqn) return absl::NotFoundError("unknown table");
    return weights_.index_select(0, ids);
  }
  absl::StatusOr<at::Tensor> ReadOptimizerStates(absl::string_view,
                                                 const at::Tensor&) override {
    return absl::UnimplementedError("plain SGD keeps no optimizer state");
  }

 private:
  at::Tensor weights_;
};

std::string Bytes(int64_t bytes) {
  if (bytes >= (1 << 20)) return absl::StrFormat("%.1f MiB", bytes / 1048576.0);
  if (bytes >= (1 << 10)) return absl::StrFormat("%.1f KiB", bytes / 1024.0);
  return absl::StrFormat("%d B", bytes);
}

int Main() {
  const int64_t rows = absl::GetFlag(FLAGS_rows);
  const int64_t dim = absl::GetFlag(FLAGS_dim);
  DemoTable table(rows, dim);

  TrackerOptions options;
  options.mode = TrackingMode::kEmbedding;
  options.consumers = {"predictor", "checkpoint"};
  options.auto_compact = true;
  options.modules = {{"module.sparse.ec",
                      /*pooled=*/false,
                      {{"items", {"item_id", "clicked_item"}}}}};
  auto tracker = Tracker::Create(options, &table);
  if (!tracker.ok()) {
    std::fprintf(stderr, "tracker_demo: %s\n",
                 tracker.status().ToString().c_str());
    return 1;
  }
  std::printf("tracking %s (%lld rows x %lld) in %s mode for %s and %s\n", kFqn,
              static_cast<long long>(rows), static_cast<long long>(dim),
              std::string(TrackingModeName(options.mode)).c_str(),
              options.consumers[0].c_str(), options.consumers[1].c_str());
  std::printf("%5s %-10s %9s %12s %12s %14s\n", "step", "consumer", "rows",
              "top score", "store rows", "store bytes");

  std::mt19937_64 rng(1);
  std::exponential_distribution<double> skew(0.002);  // popular low IDs
  const int64_t n = absl::GetFlag(FLAGS_batch);
  for (int step = 0; step < absl::GetFlag(FLAGS_steps); ++step) {
    at::Tensor ids = at::empty({n}, at::kLong);
    for (int64_t i = 0; i < n; ++i) {
      ids.data_ptr<int64_t>()[i] =
          std::min<int64_t>(rows - 1, static_cast<int64_t>(skew(rng)));
    }
    // Forward: look up, record; backward + SGD: move the looked-up rows.
    at::Tensor embeddings = table.weights().index_select(0, ids);
    // Both features ("item_id", "clicked_item") look up the one table.
    absl::Status recorded = (*tracker)->RecordTables({{kFqn, ids, embeddings}});
    if (!recorded.ok()) {
      std::fprintf(stderr, "tracker_demo: %s\n", recorded.ToString().c_str());
      return 1;
    }
    at::Tensor grads = at::randn({n, dim}) * 0.01;
    table.weights().index_add_(0, ids, -grads);
    (*tracker)->TriggerCompaction();

    for (auto [consumer, every, percent] :
         {std::tuple<const char*, int, double>{"predictor", 5, 10.0},
          std::tuple<const char*, int, double>{"checkpoint", 20, 100.0}}) {
      if ((step + 1) % every != 0) continue;
      DeltaRequest request;
      request.consumer = consumer;
      request.top_k = TopK::Percentage(percent);
      auto delta = (*tracker)->GetDelta(request);
      if (!delta.ok()) {
        std::fprintf(stderr, "tracker_demo: %s\n",
                     delta.status().ToString().c_str());
        return 1;
      }
      const TableDelta& rows_read = delta->tables[kFqn];
      const TrackerStatus status = (*tracker)->Status();
      std::printf(
          "%5d %-10s %9lld %12.4f %12lld %14s\n", step, consumer,
          static_cast<long long>(rows_read.ids.numel()),
          rows_read.scores.numel() ? rows_read.scores.max().item<float>() : 0.f,
          static_cast<long long>(status.usage.total.ids),
          Bytes(status.usage.total.bytes).c_str());
    }
    (*tracker)->Step();
  }
  const TrackerStatus status = (*tracker)->Status();
  std::printf("done: %lld steps; consumers:",
              static_cast<long long>(status.current_batch));
  for (const ConsumerStatus& c : status.consumers) {
    std::printf(" %s (lag %lld steps)", c.name.c_str(),
                static_cast<long long>(c.lag_steps));
  }
  std::printf("\n");
  return 0;
}

}  // namespace
}  // namespace deltastream

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return deltastream::Main();
}
