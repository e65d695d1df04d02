#ifndef DELTASTREAM_TRAINER_TRACKING_MODULE_TRACKING_H_
#define DELTASTREAM_TRAINER_TRACKING_MODULE_TRACKING_H_

#include <ATen/core/Tensor.h>

#include <atomic>
#include <functional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "base/shared_mutex.h"
#include "tracker_service/live_rows_reader.h"
#include "tracker_service/tracked_modules.h"
#include "tracker_service/tracker.h"
#include "trainer/modules/embedding_modules.h"

namespace deltastream {

// How the tracker meets the trainer's embedding modules (TorchRec's
// ModelDeltaTracker wiring):
//   1. DescribeModules(modules) -> TrackerOptions::modules;
//   2. ModuleRowsReader reader(modules) -> Tracker::Create(options, &reader);
//   3. AttachTracker(tracker, modules): every module the tracker tracks gets
//      a post-lookup hook that records its lookup and a post-output hook that
//      triggers auto-compaction. Modules skipped by fqns_to_skip get no hook
//      and so never call one.
//   4. The training loop holds a ModuleRowsReader::UpdateGuard across
//      backward (where the fused optimizers change rows), the dense
//      optimizer's step and Tracker::Step(); the tracker pins the rows
//      (LiveRowsReader::PinRows) around every read, so service threads read
//      rows, optimizer states and dense parameters exactly at a step
//      boundary: after the batches a read covers, before the next one.

// Where each table of the modules starts in its global table, by cleaned
// table FQN: local row i is global row offset + i. A sharded trainer's local
// modules hold its shards with local row IDs (trainer/sharding); the tracker
// records and serves global IDs, so row-wise and table-row-wise shards list
// their row offset here (ShardRowOffsets, trainer/tracking/shard_topology.h).
// A table not listed starts at 0 (unsharded, table-wise, column-wise and
// data-parallel tables).
using RowOffsets = absl::flat_hash_map<std::string, int64_t>;

// The modules as the tracker sees them (path, pooled, tables and features).
std::vector<TrackedModule> DescribeModules(
    absl::Span<EmbeddingModule* const> modules);

// Registers the hooks of step 3. The tracker must outlive the modules' use.
// The hooks record global row IDs: a table's lookup IDs plus its offset in
// `row_offsets` (copied). FailedPrecondition when a tracked module is not in
// the tracker's options (it was created from other modules).
absl::Status AttachTracker(Tracker& tracker,
                           absl::Span<EmbeddingModule* const> modules,
                           const RowOffsets& row_offsets = {});

// The tracker's view of live rows (tracker_service/live_rows_reader.h) over
// the trainer's modules, by table FQN. Results are on the modules' device.
// IDs are global (see RowOffsets): a table with offset o holds rows
// o .. o + num_embeddings - 1 (FirstRow, NumRows), and reads subtract o.
class ModuleRowsReader : public LiveRowsReader {
 public:
  // The modules must outlive the reader.
  explicit ModuleRowsReader(absl::Span<EmbeddingModule* const> modules,
                            RowOffsets row_offsets = {});

  // The thread holding the UpdateGuard holds the rows still already: its
  // pins (the tracker's records of the lookups an accumulation window kept,
  // made when the window is applied under the guard) take no lock. Any other
  // thread's pin waits for the guard.
  void PinRows() override ABSL_NO_THREAD_SAFETY_ANALYSIS {
    if (updating_thread_.load() != std::this_thread::get_id()) {
      mu_.ReaderLock();
    }
  }
  void UnpinRows() override ABSL_NO_THREAD_SAFETY_ANALYSIS {
    if (updating_thread_.load() != std::this_thread::get_id()) {
      mu_.ReaderUnlock();
    }
  }
  absl::StatusOr<int64_t> NumRows(absl::string_view fqn) override;
  int64_t FirstRow(absl::string_view fqn) override;
  // These two take no lock: callers pin (LiveRowsReader).
  absl::StatusOr<at::Tensor> ReadEmbeddings(absl::string_view fqn,
                                            const at::Tensor& ids) override;
  absl::StatusOr<at::Tensor> ReadOptimizerStates(
      absl::string_view fqn, const at::Tensor& ids) override;

  // The dense parameters ReadDense() copies (host copies, by name, in
  // order); unset: ReadDense() is FailedPrecondition. Set before the tracker
  // reads.
  using DenseParameters = std::vector<std::pair<std::string, at::Tensor>>;
  void SetDenseParameters(std::function<DenseParameters()> parameters) {
    dense_parameters_ = std::move(parameters);
  }
  absl::StatusOr<DenseParameters> ReadDense() override;

  // Held by the training loop from backward through Tracker::Step(): other
  // threads' pins (reads) wait until it ends; the holder's own pins pass.
  class ABSL_SCOPED_LOCKABLE UpdateGuard {
   public:
    explicit UpdateGuard(ModuleRowsReader& reader)
        ABSL_EXCLUSIVE_LOCK_FUNCTION(reader.mu_)
        : lock_(&reader.mu_), reader_(reader) {
      reader_.updating_thread_.store(std::this_thread::get_id());
    }
    ~UpdateGuard() ABSL_UNLOCK_FUNCTION() {
      reader_.updating_thread_.store(std::thread::id());
    }

   private:
    WriterLock lock_;
    ModuleRowsReader& reader_;
  };

 private:
  struct Table {
    EmbeddingModule* module;
    int64_t index;
  };
  absl::StatusOr<Table> Find(absl::string_view fqn) const;
  // `ids` as the module's local row IDs (a handle to `ids` at offset 0);
  // InvalidArgument, in global terms, for an ID outside the table's rows.
  absl::StatusOr<at::Tensor> LocalIds(absl::string_view fqn, const Table& table,
                                      const at::Tensor& ids) const;

  absl::flat_hash_map<std::string, Table> tables_;
  const RowOffsets row_offsets_;
  std::function<DenseParameters()> dense_parameters_;
  SharedMutex mu_;
  // The thread holding the UpdateGuard; none when no thread does.
  std::atomic<std::thread::id> updating_thread_{};
};

}  // namespace deltastream

#endif  // DELTASTREAM_TRAINER_TRACKING_MODULE_TRACKING_H_
