#include "tracker_service/tracker_snapshots.h"

#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/exclusive_lockable.h"
#include "base/log.h"
#include "proto/snapshot.pb.h"

namespace deltastream {

std::string EncodeTrackerState(const TrackerState& state,
                               const TrackerOptions& options) {
  v1::TrackerState out;
  out.set_mode(std::string(TrackingModeName(state.mode)));
  out.set_current_batch(state.current_batch);
  out.set_compact_index(state.compact_index);
  for (const ConsumerState& c : state.consumers) {
    v1::ConsumerState* consumer = out.add_consumers();
    consumer->set_name(c.name);
    consumer->set_cursor(c.cursor);
    consumer->mutable_table_cursors()->insert(c.table_cursors.begin(),
                                              c.table_cursors.end());
    for (const PendingRead& read : c.pending_reads) {
      v1::PendingRead* out_read = consumer->add_pending_reads();
      out_read->set_end(read.end);
      for (const std::string& fqn : read.fqns) out_read->add_fqns(fqn);
      out_read->set_lost_through(read.lost_through);
    }
    consumer->set_resync_required(c.resync_required);
    consumer->set_lost_ids(c.lost_ids);
  }
  out.set_cap_compactions(state.cap_compactions);
  out.set_cap_drops(state.cap_drops);
  out.set_dropped_ids(state.dropped_ids);
  out.set_dropped_bytes(state.dropped_bytes);
  out.set_delete_on_read(options.delete_on_read);
  out.set_auto_compact(options.auto_compact);
  out.set_acknowledged_reads(options.acknowledged_reads);
  out.set_memory_cap_bytes(options.memory_cap_bytes);
  return out.SerializeAsString();
}

absl::Status DecodeTrackerState(absl::string_view bytes, TrackerState* state) {
  v1::TrackerState in;
  if (!in.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
    return absl::DataLossError("the snapshot's tracker state does not parse");
  }
  absl::StatusOr<TrackingMode> mode = ParseTrackingMode(in.mode());
  if (!mode.ok()) {
    return absl::DataLossError(absl::StrCat("the snapshot's tracker state: ",
                                            mode.status().message()));
  }
  state->mode = *mode;
  state->current_batch = in.current_batch();
  state->compact_index = in.compact_index();
  state->consumers.clear();
  for (const v1::ConsumerState& c : in.consumers()) {
    ConsumerState& consumer = state->consumers.emplace_back();
    consumer.name = c.name();
    consumer.cursor = c.cursor();
    consumer.table_cursors.insert(c.table_cursors().begin(),
                                  c.table_cursors().end());
    for (const v1::PendingRead& read : c.pending_reads()) {
      consumer.pending_reads.push_back(
          PendingRead{read.end(),
                      {read.fqns().begin(), read.fqns().end()},
                      read.lost_through()});
    }
    if (c.pending_reads().empty() && c.has_pending_read()) {
      // Written before pending_reads: the one newest uncommitted read.
      consumer.pending_reads.push_back(
          PendingRead{c.pending_end(),
                      {c.pending_fqns().begin(), c.pending_fqns().end()},
                      INT64_MIN});
    }
    consumer.resync_required = c.resync_required();
    consumer.lost_ids = c.lost_ids();
  }
  state->cap_compactions = in.cap_compactions();
  state->cap_drops = in.cap_drops();
  state->dropped_ids = in.dropped_ids();
  state->dropped_bytes = in.dropped_bytes();
  return absl::OkStatus();
}

TrackerSnapshots::TrackerSnapshots(std::unique_ptr<SnapshotDb> db,
                                   Tracker* tracker)
    : db_(std::move(db)), tracker_(tracker) {}

absl::StatusOr<std::unique_ptr<TrackerSnapshots>> TrackerSnapshots::Open(
    const std::string& path, Tracker* tracker) {
  absl::StatusOr<std::unique_ptr<SnapshotDb>> db = SnapshotDb::Open(path);
  if (!db.ok()) return db.status();
  return std::unique_ptr<TrackerSnapshots>(
      new TrackerSnapshots(*std::move(db), tracker));
}

void TrackerSnapshots::StopPeriodic() {
  {
    WriterLock lock(&periodic_mu_);
    stopping_ = true;
  }
  periodic_cv_.notify_all();
  if (periodic_.joinable()) periodic_.join();
}

absl::StatusOr<std::optional<SnapshotInfo>> TrackerSnapshots::Restore() {
  std::lock_guard<std::mutex> lock(snapshot_mu_);
  SnapshotInfo info;
  absl::StatusOr<std::optional<deltastream::Snapshot>> snapshot =
      db_->Read(&info);
  if (!snapshot.ok()) return snapshot.status();
  if (!snapshot->has_value()) return std::optional<SnapshotInfo>();
  TrackerState state;
  if (absl::Status status =
          DecodeTrackerState((*snapshot)->owner_state, &state);
      !status.ok()) {
    return absl::DataLossError(absl::StrCat("snapshot database '", db_->path(),
                                            "': ", status.message()));
  }
  state.tables = std::move((*snapshot)->tables);
  if (absl::Status status = tracker_->RestoreState(std::move(state));
      !status.ok()) {
    return absl::Status(status.code(),
                        absl::StrCat("cannot restore from '", db_->path(),
                                     "': ", status.message()));
  }
  return std::optional<SnapshotInfo>(info);
}

absl::StatusOr<SnapshotInfo> TrackerSnapshots::Snapshot() {
  std::lock_guard<std::mutex> lock(snapshot_mu_);
  const absl::Time start = absl::Now();
  TrackerState state = tracker_->SaveState();
  deltastream::Snapshot snapshot;
  snapshot.owner_state = EncodeTrackerState(state, tracker_->options());
  snapshot.owner_batch = state.current_batch;
  snapshot.tables = std::move(state.tables);
  absl::StatusOr<SnapshotInfo> info = db_->Write(snapshot);
  if (!info.ok()) return info.status();
  info->elapsed = absl::Now() - start;
  return info;
}

void TrackerSnapshots::StartPeriodic(absl::Duration interval) {
  periodic_ = std::thread([this, interval] {
    const auto period = absl::ToChronoMilliseconds(interval);
    while (true) {
      {
        WriterLock lock(&periodic_mu_);
        ExclusiveLockable held(periodic_mu_);
        if (periodic_cv_.wait_for(held, period,
                                  [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(
                                      periodic_mu_) { return stopping_; })) {
          return;
        }
      }
      absl::StatusOr<SnapshotInfo> info = Snapshot();
      if (!info.ok()) {
        LogError(absl::StrCat("snapshot failed: ", info.status().message()));
      }
    }
  });
}

}  // namespace deltastream
