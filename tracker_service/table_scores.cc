#include "tracker_service/table_scores.h"

#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>

#include "base/torch_status.h"

namespace deltastream {

absl::Status FinishTableDelta(TrackingMode mode, LiveRowsReader* reader,
                              const std::string& fqn, const TopK* top_k,
                              bool include_scores, TableDelta& table) {
  return CatchTorchErrors([&]() -> absl::Status {
    table.ids = table.ids.cpu();
    if (table.states.defined()) table.states = table.states.cpu();
    if (reader != nullptr) {
      absl::StatusOr<at::Tensor> values =
          reader->ReadEmbeddings(fqn, table.ids);
      if (!values.ok()) return values.status();
      table.values = values->cpu();
    }
    if (mode != TrackingMode::kIdOnly && !table.states.defined()) {
      // A table with nothing recorded since the cursor: no rows, and states
      // shaped like the values (or [0, 1]) so that scores and diffs compute.
      table.states = at::empty(
          {0, table.values.defined() ? table.values.size(1) : 1}, at::kFloat);
    }
    if ((mode == TrackingMode::kMomentumDiff ||
         mode == TrackingMode::kRowwiseAdagrad) &&
        reader != nullptr) {
      absl::StatusOr<at::Tensor> latest =
          reader->ReadOptimizerStates(fqn, table.ids);
      if (!latest.ok()) return latest.status();
      at::Tensor now = latest->cpu().to(at::kFloat);
      if (table.ids.numel() == 0) {
        now = now.reshape({0, now.dim() > 1 ? now.size(1) : 1});
        table.states = table.states.reshape({0, now.size(1)});
      }
      now = now.reshape_as(table.states);
      table.states = now - table.states.to(at::kFloat);
    }

    if (top_k == nullptr && !include_scores) return absl::OkStatus();
    switch (mode) {
      case TrackingMode::kIdOnly:
        break;  // refused before reading
      case TrackingMode::kEmbedding:
        table.scores =
            (table.values.to(at::kFloat) - table.states.to(at::kFloat))
                .norm(2, {1});
        break;
      case TrackingMode::kMomentumLast:
        table.scores = table.states.to(at::kFloat).reshape({-1});
        break;
      case TrackingMode::kMomentumDiff:
      case TrackingMode::kRowwiseAdagrad:
        table.scores = table.states.to(at::kFloat).norm(2, {1});
        break;
    }
    if (top_k == nullptr) return absl::OkStatus();
    at::Tensor keep = TopKPositions(table.scores, *top_k);
    for (at::Tensor* t :
         {&table.ids, &table.states, &table.values, &table.scores}) {
      if (t->defined()) *t = t->index_select(0, keep);
    }
    return absl::OkStatus();
  });
}

}  // namespace deltastream
