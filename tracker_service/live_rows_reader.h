#ifndef DELTASTREAM_TRACKER_SERVICE_LIVE_ROWS_READER_H_
#define DELTASTREAM_TRACKER_SERVICE_LIVE_ROWS_READER_H_

#include <ATen/core/Tensor.h>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace deltastream {

// The tracker's only view of the trainer: current rows of its tables. The
// trainer implements it over its live embedding modules and optimizers; a
// standalone server has none.
//
// Implementations must be safe to call from the training thread (when
// recording) and from service threads (when reading). The tracker calls them
// with its lock held, so they must not wait for anything the thread that
// records lookups holds while it records (e.g. a lock around the forward pass).
class LiveRowsReader {
 public:
  virtual ~LiveRowsReader() = default;

  // Current embedding rows of `ids` (int64 [n]) in table `fqn`: [n, dim].
  // NotFound for an unknown table; InvalidArgument for an ID out of range.
  virtual absl::StatusOr<at::Tensor> ReadEmbeddings(absl::string_view fqn,
                                                    const at::Tensor& ids) = 0;

  // Current optimizer row state of `ids` in table `fqn`: [n, k] (the momentum
  // rows, or row-wise Adagrad's [n, 1] sums). Errors as ReadEmbeddings.
  virtual absl::StatusOr<at::Tensor> ReadOptimizerStates(
      absl::string_view fqn, const at::Tensor& ids) = 0;
};

}  // namespace deltastream

#endif  // DELTASTREAM_TRACKER_SERVICE_LIVE_ROWS_READER_H_
