#include <ATen/core/Tensor.h>

#include <algorithm>
#include <memory>
#include <set>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "tracker_service/names.h"
#include "tracker_service/tracker.h"
#include "tracker_service/tracker_consumer.h"

// Tracker: save and restore everything it holds (for snapshots).

namespace deltastream {

void Tracker::SaveConsumersLocked(TrackerState& state) const {
  state.mode = options_.mode;
  state.current_batch = curr_batch_;
  for (const auto& [name, consumer] : consumers_) {
    ConsumerState& c = state.consumers.emplace_back();
    c.name = name;
    c.cursor = consumer->cursor;
    c.table_cursors.insert(consumer->table_cursors.begin(),
                           consumer->table_cursors.end());
    c.pending_reads = consumer->pending;
    c.resync_required = consumer->resync_required;
    c.lost_ids = consumer->lost_ids;
  }
}

TrackerState Tracker::SaveConsumers() const {
  ReaderLock lock(&mu_);
  TrackerState state;
  SaveConsumersLocked(state);
  return state;
}

absl::Status Tracker::SetConsumers(std::vector<ConsumerState> consumers) {
  std::set<std::string> names;
  for (const ConsumerState& c : consumers) {
    if (absl::Status status = ValidateName("consumer name", c.name);
        !status.ok()) {
      return status;
    }
    if (!names.insert(c.name).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("consumer '", c.name, "' appears twice"));
    }
  }
  ChangeLock lock(this);
  for (ConsumerState& c : consumers) {
    std::unique_ptr<Consumer>& consumer = consumers_[c.name];
    if (consumer == nullptr) {
      consumer = std::make_unique<Consumer>();
      consumer->name = c.name;
    }
    // The cursors, never moved back: each table's the further of the two.
    for (const auto& [fqn, cursor] : c.table_cursors) {
      SetCursor(*consumer, fqn, cursor);
    }
    consumer->cursor = std::max(consumer->cursor, c.cursor);
    consumer->DropTableCursorsBehind();
    // Pending reads: the agreed ones that a cursor has not passed (a read of
    // every table is passed at the consumer's own cursor, the lowest).
    consumer->pending.clear();
    for (PendingRead& read : c.pending_reads) {
      const bool covered =
          read.fqns.empty()
              ? read.end <= consumer->cursor
              : std::all_of(read.fqns.begin(), read.fqns.end(),
                            [&](const std::string& fqn) {
                              return read.end <= CursorOf(*consumer, fqn);
                            });
      if (!covered) consumer->pending.push_back(std::move(read));
    }
    if (c.resync_required && !consumer->resync_required) ++consumer->resyncs;
    consumer->resync_required = consumer->resync_required || c.resync_required;
    consumer->lost_ids = std::max(consumer->lost_ids, c.lost_ids);
  }
  // Reads gathered for consumers at one cursor may no longer be shared.
  shared_reads_.clear();
  if (options_.delete_on_read) DeleteUnneededLocked();
  return absl::OkStatus();
}

TrackerState Tracker::SaveState() const {
  ReaderLock lock(&mu_);
  TrackerState state;
  SaveConsumersLocked(state);
  state.compact_index = curr_compact_index_;
  state.cap_compactions = cap_compactions_;
  state.cap_drops = cap_drops_;
  state.dropped_ids = dropped_ids_;
  state.dropped_bytes = dropped_bytes_;
  state.tables = store_.Export();
  return state;
}

absl::Status Tracker::RestoreState(TrackerState state) {
  if (state.mode != options_.mode) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the snapshot was taken in ", TrackingModeName(state.mode),
        " mode; this tracker runs in ", TrackingModeName(options_.mode)));
  }
  if (!feature_map_.fqns.empty()) {
    for (const StoredTable& table : state.tables) {
      if (std::find(feature_map_.fqns.begin(), feature_map_.fqns.end(),
                    table.fqn) == feature_map_.fqns.end()) {
        return absl::FailedPreconditionError(
            absl::StrCat("the snapshot holds table '", table.fqn,
                         "', which this tracker does not track"));
      }
    }
  }
  // What RecordTables refuses, a snapshot cannot bring in either (one taken
  // before the rule would otherwise break every read again after a restart).
  for (const StoredTable& table : state.tables) {
    if (absl::Status status = ValidateName("table FQN", table.fqn);
        !status.ok()) {
      return status;
    }
    if (options_.mode != TrackingMode::kIdOnly && table.state_dim < 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the snapshot's table '", table.fqn, "' holds states of width ",
          table.state_dim, "; every width must be >= 1"));
    }
  }
  std::map<std::string, std::unique_ptr<Consumer>, std::less<>> consumers;
  for (ConsumerState& c : state.consumers) {
    if (absl::Status status = ValidateName("consumer name", c.name);
        !status.ok()) {
      return status;
    }
    auto consumer = std::make_unique<Consumer>();
    consumer->name = c.name;
    consumer->cursor = c.cursor;
    consumer->table_cursors.insert(c.table_cursors.begin(),
                                   c.table_cursors.end());
    consumer->pending = std::move(c.pending_reads);
    consumer->resync_required = c.resync_required;
    consumer->lost_ids = c.lost_ids;
    if (!consumers.emplace(c.name, std::move(consumer)).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("consumer '", c.name, "' appears twice"));
    }
  }
  for (const std::string& name : options_.consumers) {
    if (consumers.count(name) > 0) continue;
    auto consumer = std::make_unique<Consumer>();
    consumer->name = name;
    consumer->cursor = state.current_batch;
    consumers.emplace(name, std::move(consumer));
  }
  {
    ChangeLock lock(this);
    if (absl::Status status = store_.Import(std::move(state.tables));
        !status.ok()) {
      return status;
    }
    shared_reads_.clear();
    curr_batch_ = state.current_batch;
    curr_compact_index_ = state.compact_index;
    consumers_ = std::move(consumers);
    // The cap's counters stay this process's (since start, as the
    // consumers' are): state.cap_* are not taken, since a restored count
    // would go down after a crash, which Prometheus reads as a reset.
    batch_opened_.clear();
    batch_opened_[curr_batch_] = Opened::Now();
    run_start_batch_ = curr_batch_;
  }
  PublishBatch(state.current_batch);
  return absl::OkStatus();
}

}  // namespace deltastream
