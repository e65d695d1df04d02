#ifndef DELTASTREAM_TRACKER_SERVICE_TRACKER_SNAPSHOTS_H_
#define DELTASTREAM_TRACKER_SERVICE_TRACKER_SNAPSHOTS_H_

#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "base/shared_mutex.h"
#include "store/snapshot_db.h"
#include "tracker_service/tracker.h"

namespace deltastream {

// A tracker's state (TrackerState without its tables) as v1::TrackerState
// bytes, and back. Decode: DataLoss for bytes that do not parse or name an
// unknown mode.
std::string EncodeTrackerState(const TrackerState& state,
                               const TrackerOptions& options);
absl::Status DecodeTrackerState(absl::string_view bytes, TrackerState* state);

// Snapshots of one tracker in one RocksDB database (store/snapshot_db.h): on
// demand, periodically, and restored on start.
//
// A snapshot is the tracker's state between two of its calls: a consumer
// restored from it resumes exactly where it was then. Rows recorded after the
// last snapshot are lost when the process dies; with acknowledged reads, a
// consumer whose committed read is newer than the snapshot reads those batches
// again after a restore (at least once), never misses them.
//
// Thread safety: every method may be called from any thread.
class TrackerSnapshots {
 public:
  // Opens (or creates) the database at `path` for `tracker`, which must
  // outlive this object. Errors as SnapshotDb::Open.
  static absl::StatusOr<std::unique_ptr<TrackerSnapshots>> Open(
      const std::string& path, Tracker* tracker);

  ~TrackerSnapshots() { StopPeriodic(); }

  // Replaces the tracker's state with the database's latest snapshot; nullopt
  // when the database holds none. DataLoss for a corrupt database,
  // FailedPrecondition for one the tracker cannot take (another mode or
  // tables), with the tracker unchanged.
  absl::StatusOr<std::optional<SnapshotInfo>> Restore();

  // Takes a snapshot now; `elapsed` covers gathering and writing.
  absl::StatusOr<SnapshotInfo> Snapshot();

  // Takes a snapshot every `interval` from a thread of its own, reporting
  // failures on stderr, until StopPeriodic() or destruction. Call at most
  // once.
  void StartPeriodic(absl::Duration interval);
  // Stops periodic snapshots; waits for one in progress.
  void StopPeriodic();

  std::optional<SnapshotInfo> latest() const { return db_->latest(); }
  const std::string& path() const { return db_->path(); }

 private:
  TrackerSnapshots(std::unique_ptr<SnapshotDb> db, Tracker* tracker);

  const std::unique_ptr<SnapshotDb> db_;
  Tracker* const tracker_;
  // One snapshot (or restore) at a time, the tracker's state taken and
  // written under it: generations follow the tracker's states in order (the
  // periodic thread, the Snapshot RPC and the trainer's own may overlap).
  std::mutex snapshot_mu_;
  // Wakes the periodic thread to stop (SharedMutex and
  // condition_variable_any: see exclusive_lockable.h).
  SharedMutex periodic_mu_;
  std::condition_variable_any periodic_cv_;
  bool stopping_ ABSL_GUARDED_BY(periodic_mu_) = false;
  std::thread periodic_;
};

}  // namespace deltastream

#endif  // DELTASTREAM_TRACKER_SERVICE_TRACKER_SNAPSHOTS_H_
