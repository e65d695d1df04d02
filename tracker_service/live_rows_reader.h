#ifndef DELTASTREAM_TRACKER_SERVICE_LIVE_ROWS_READER_H_
#define DELTASTREAM_TRACKER_SERVICE_LIVE_ROWS_READER_H_

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace deltastream {

// The tracker's only view of the trainer: current rows of its tables and its
// dense parameters. The trainer implements it over its live embedding modules
// and optimizers; a standalone server has none.
//
// Pinning: the trainer changes rows and closes a batch (Tracker::Step) while
// it holds its own update lock; PinRows() waits for that lock to be free and
// holds the rows still (shared) until UnpinRows(). The tracker pins before it
// takes its own lock, around every call that reads rows, so that
//   - a read sees the tables exactly as they are after its end batch (no
//     step half-applied, no step applied whose batch is still open), and
//   - the lock order is always rows pin -> tracker lock (the trainer: update
//     lock -> tracker lock in Step), so the two never deadlock.
// The Read* calls expect the caller to hold a pin (or to be the thread that
// changes rows); they take no lock of their own. Pins do not nest.
class LiveRowsReader {
 public:
  virtual ~LiveRowsReader() = default;

  virtual void PinRows() {}
  virtual void UnpinRows() {}

  // Holds a pin for its scope; does nothing for a null reader.
  class Pin {
   public:
    explicit Pin(LiveRowsReader* reader) : reader_(reader) {
      if (reader_ != nullptr) reader_->PinRows();
    }
    ~Pin() {
      if (reader_ != nullptr) reader_->UnpinRows();
    }
    Pin(const Pin&) = delete;
    Pin& operator=(const Pin&) = delete;

   private:
    LiveRowsReader* const reader_;
  };

  // Rows this reader holds of table `fqn`, for reads of whole tables: row
  // IDs FirstRow(fqn) .. FirstRow(fqn) + n - 1. NotFound for an unknown
  // table; FailedPrecondition when the reader cannot tell (the default).
  virtual absl::StatusOr<int64_t> NumRows(absl::string_view fqn) {
    return absl::FailedPreconditionError(
        absl::StrCat("the size of table '", fqn, "' is not known"));
  }
  // The first row ID of table `fqn` this reader holds: 0 for a whole table,
  // the shard's global row offset for a row-wise shard of a sharded trainer
  // (whose IDs, recorded and read, are global). Only meaningful where
  // NumRows succeeds.
  virtual int64_t FirstRow(absl::string_view /*fqn*/) { return 0; }

  // Current embedding rows of `ids` (int64 [n]) in table `fqn`: [n, dim]
  // (a column-wise shard's own columns only). NotFound for an unknown table;
  // InvalidArgument for an ID out of range.
  virtual absl::StatusOr<at::Tensor> ReadEmbeddings(absl::string_view fqn,
                                                    const at::Tensor& ids) = 0;

  // Current optimizer row state of `ids` in table `fqn`: [n, k] (the momentum
  // rows, or row-wise Adagrad's [n, 1] sums). Errors as ReadEmbeddings.
  virtual absl::StatusOr<at::Tensor> ReadOptimizerStates(
      absl::string_view fqn, const at::Tensor& ids) = 0;

  // The model's dense parameters (everything but the embedding tables), by
  // name in the model's order, as host copies. FailedPrecondition when the
  // trainer gave none.
  virtual absl::StatusOr<std::vector<std::pair<std::string, at::Tensor>>>
  ReadDense() {
    return absl::FailedPreconditionError(
        "this trainer publishes no dense parameters");
  }
};

}  // namespace deltastream

#endif  // DELTASTREAM_TRACKER_SERVICE_LIVE_ROWS_READER_H_
