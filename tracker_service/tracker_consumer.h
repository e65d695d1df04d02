#ifndef DELTASTREAM_TRACKER_SERVICE_TRACKER_CONSUMER_H_
#define DELTASTREAM_TRACKER_SERVICE_TRACKER_CONSUMER_H_

// Private to the tracker's own sources (tracker*.cc): one consumer's cursors
// and pending reads. Guarded by the owning tracker's lock.

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "tracker_service/tracker.h"

namespace deltastream {

struct Tracker::Consumer {
  std::string name;
  // Cursor of every table without an entry in `table_cursors`.
  int64_t cursor = -1;
  // Tables read on their own (a DeltaRequest naming a subset of tables).
  absl::flat_hash_map<std::string, int64_t> table_cursors;
  // Acknowledged mode: reads delivered and not committed, oldest first.
  std::vector<PendingRead> pending;
  bool resync_required = false;
  int64_t lost_ids = 0;
  // Since this process started (ConsumerStatus): not kept in snapshots.
  int64_t resyncs = 0;
  int64_t dropped_ids = 0;
  // When it was added (or restored) or last read or committed, or its
  // transfer or subscription went on (Touch), by MonotonicNow
  // (TrackerOptions::expire_consumers_after).
  absl::Duration last_contact = MonotonicNow();

  // The oldest batch it may not have read: its smallest cursor.
  int64_t SmallestCursor() const {
    int64_t smallest = cursor;
    for (const auto& [fqn, table_cursor] : table_cursors) {
      smallest = std::min(smallest, table_cursor);
    }
    return smallest;
  }
  // The ends of the pending reads of `fqn`.
  std::vector<int64_t> PendingEnds(const std::string& fqn) const {
    std::vector<int64_t> ends;
    for (const PendingRead& read : pending) {
      if (read.Reads(fqn)) ends.push_back(read.end);
    }
    return ends;
  }
  // Drops the table cursors that `cursor` reached: a table keeps its entry
  // only while it stands ahead.
  void DropTableCursorsBehind() {
    for (auto it = table_cursors.begin(); it != table_cursors.end();) {
      if (it->second <= cursor) {
        table_cursors.erase(it++);
      } else {
        ++it;
      }
    }
  }
};

}  // namespace deltastream

#endif  // DELTASTREAM_TRACKER_SERVICE_TRACKER_CONSUMER_H_
