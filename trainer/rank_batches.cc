#include "trainer/rank_batches.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "trainer/comm/process_group.h"

namespace deltastream {

RankBatchSource::RankBatchSource(std::unique_ptr<BatchSource> global,
                                 ProcessGroup* group, int64_t batch_size,
                                 const std::atomic<bool>* stop)
    : global_(std::move(global)),
      group_(group),
      batch_size_(batch_size),
      stop_(stop) {}

absl::StatusOr<std::optional<Batch>> RankBatchSource::Next() {
  absl::StatusOr<std::optional<Batch>> global = global_->Next();
  const bool full = global.ok() && global->has_value() &&
                    (*global)->size() == group_->world_size() * batch_size_;
  // The lowest wins: 0 the data ended (or failed), 1 a stop was requested,
  // 2 go on.
  const int64_t mine_says =
      !full ? 0 : (stop_ != nullptr && stop_->load() ? 1 : 2);
  absl::StatusOr<int64_t> all = group_->AllReduceMin(mine_says, "data.next");
  if (!all.ok()) return all.status();
  if (!global.ok()) return global.status();
  stop_requested_ = *all == 1;
  if (*all < 2) return std::nullopt;
  absl::StatusOr<Batch> part =
      RankExamples(**global, group_->rank(), group_->world_size(), batch_size_);
  if (!part.ok()) return part.status();
  return std::optional<Batch>(*std::move(part));
}

absl::StatusOr<int64_t> RankBatchSource::Skip(int64_t batches) {
  absl::StatusOr<int64_t> skipped = global_->Skip(batches);
  // A rank whose source failed says 0, so that every rank leaves the
  // collective; it returns its error, the others the fewest skipped.
  absl::StatusOr<int64_t> all =
      group_->AllReduceMin(skipped.ok() ? *skipped : 0, "data.skip");
  if (!all.ok()) return all.status();
  if (!skipped.ok()) return skipped.status();
  return *all;
}

absl::StatusOr<Batch> RankExamples(const Batch& global, int rank,
                                   int world_size, int64_t batch_size) {
  if (global.size() != world_size * batch_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("a global batch of ", global.size(), " examples for ",
                     world_size, " ranks of ", batch_size));
  }
  return global.Examples(rank * batch_size, (rank + 1) * batch_size);
}

}  // namespace deltastream
