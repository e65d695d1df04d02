#include "clients/checkpoint_chain.h"

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace deltastream {

absl::StatusOr<ChainLink> WriteChainLink(const std::string& dir,
                                         const ReceivedDelta& delta,
                                         const ChainWriteOptions& options) {
  const v1::DeltaHeader& header = delta.header;
  const bool full = header.all_rows();
  if (header.resync_required() && !full) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the service dropped ", header.lost_rows(),
        " rows this consumer had not read: an increment would miss them; "
        "resync with a full read (all_rows)"));
  }
  ChainLinkContent content;
  for (const auto& [fqn, table] : delta.tables) {
    if (table.ids.numel() > 0 && !table.values.defined()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "table '", fqn,
          "' came without values: checkpoints need a tracker served by the "
          "trainer (live rows)"));
    }
    content.tables[fqn] = {table.ids, table.values.defined()
                                          ? table.values
                                          : at::empty({0, 0}, at::kFloat)};
  }
  content.full = full;
  content.start_batch = full ? 0 : std::max<int64_t>(header.start_batch(), 0);
  content.end_batch = header.end_batch();
  content.consumer = header.consumer();
  content.dense = delta.dense;
  content.dense_batch = header.end_batch();
  content.run_id = header.run_id();
  content.run_start_batch = header.run_start_batch();
  return WriteChainLinkContent(dir, content, options);
}

}  // namespace deltastream
