#include "trainer/cursor_agreement.h"

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/full.h>
#include <ATen/ops/zeros.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <map>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/torch_status.h"
#include "tracker_service/tracker_snapshots.h"

namespace deltastream {
namespace {

// The table every name in `tables` is not: the cursor and the pending reads
// of tables no consumer reads on their own.
const std::string& AnyOtherTable() {
  static const std::string* const kNone = new std::string();
  return *kNone;
}

const ConsumerState* Find(const TrackerState& rank, const std::string& name) {
  for (const ConsumerState& c : rank.consumers) {
    if (c.name == name) return &c;
  }
  return nullptr;
}

// Whether `rank`'s store reads `fqn` from `batch` exactly: nothing recorded
// from there on is compacted with (or deleted as) what lies before it.
// Compaction (Tracker::CompactBetweenCursorsLocked, the tiered window from
// the furthest cursor or pending end) and deletion (below every cursor) keep
// every consumer's cursor and pending end apart, and touch nothing from the
// current batch on.
bool Serves(const TrackerState& rank, const std::string& fqn, int64_t batch) {
  if (batch >= rank.current_batch) return true;
  for (const ConsumerState& c : rank.consumers) {
    if (c.CursorOf(fqn) == batch) return true;
    for (const PendingRead& read : c.pending_reads) {
      if (read.end == batch &&
          (fqn.empty() ? read.fqns.empty() : read.Reads(fqn))) {
        return true;
      }
    }
  }
  return false;
}

// Whether a read of `fqn` that the agreed consumer makes from `batch` is
// served exactly by `rank`: it stood there already, or its store can.
bool RankServes(const TrackerState& rank, const std::string& name,
                const std::string& fqn, int64_t batch) {
  const ConsumerState* mine = Find(rank, name);
  if (mine != nullptr && mine->CursorOf(fqn) == batch) return true;
  return Serves(rank, fqn, batch);
}

bool SamePosition(const ConsumerState& a, const ConsumerState& b) {
  if (a.cursor != b.cursor || a.table_cursors != b.table_cursors ||
      a.pending_reads.size() != b.pending_reads.size()) {
    return false;
  }
  for (size_t i = 0; i < a.pending_reads.size(); ++i) {
    if (a.pending_reads[i].end != b.pending_reads[i].end ||
        a.pending_reads[i].fqns != b.pending_reads[i].fqns) {
      return false;
    }
  }
  return true;
}

}  // namespace

std::vector<ConsumerState> AgreeConsumers(
    absl::Span<const TrackerState> ranks) {
  // Every consumer by name, and every table some consumer reads on its own.
  std::map<std::string, std::vector<const ConsumerState*>> by_name;
  std::set<std::string> tables = {AnyOtherTable()};
  for (const TrackerState& rank : ranks) {
    for (const ConsumerState& c : rank.consumers) {
      by_name[c.name].push_back(&c);
      for (const auto& [fqn, cursor] : c.table_cursors) tables.insert(fqn);
      for (const PendingRead& read : c.pending_reads) {
        tables.insert(read.fqns.begin(), read.fqns.end());
      }
    }
  }
  std::vector<ConsumerState> agreed;
  for (const auto& [name, states] : by_name) {
    ConsumerState& c = agreed.emplace_back();
    c.name = name;
    c.cursor = INT64_MIN;
    for (const ConsumerState* s : states) {
      c.cursor = std::max(c.cursor, s->cursor);
      c.resync_required = c.resync_required || s->resync_required;
      c.lost_ids = std::max(c.lost_ids, s->lost_ids);
    }
    for (const ConsumerState* s : states) {
      for (const auto& [fqn, unused] : s->table_cursors) {
        int64_t furthest = c.cursor;
        for (const ConsumerState* t : states) {
          furthest = std::max(furthest, t->CursorOf(fqn));
        }
        if (furthest > c.cursor) c.table_cursors[fqn] = furthest;
      }
    }
    // Pending reads: each (end, tables) once, oldest first, those the agreed
    // cursors leave open, and only where every rank serves their end.
    std::map<std::pair<int64_t, std::vector<std::string>>, int64_t> pending;
    for (const ConsumerState* s : states) {
      for (const PendingRead& read : s->pending_reads) {
        auto [it, added] = pending.emplace(std::make_pair(read.end, read.fqns),
                                           read.lost_through);
        if (!added) it->second = std::max(it->second, read.lost_through);
      }
    }
    for (const auto& [key, lost_through] : pending) {
      const auto& [end, fqns] = key;
      const std::set<std::string> read_tables =
          fqns.empty() ? tables
                       : std::set<std::string>(fqns.begin(), fqns.end());
      bool open = false;
      bool served = true;
      for (const std::string& fqn : read_tables) {
        open = open || end > c.CursorOf(fqn);
        for (const TrackerState& rank : ranks) {
          served = served && RankServes(rank, name, fqn, end);
        }
      }
      if (open && served) c.pending_reads.push_back({end, fqns, lost_through});
    }
    // The agreed cursors, where some rank cannot serve them: resync.
    bool served = true;
    for (const std::string& fqn : tables) {
      for (const TrackerState& rank : ranks) {
        served = served && RankServes(rank, name, fqn, c.CursorOf(fqn));
      }
    }
    if (!served) {
      c.resync_required = true;
      // No read delivered before the restart can end this resync.
      for (PendingRead& read : c.pending_reads) read.lost_through = INT64_MAX;
    }
  }
  return agreed;
}

absl::StatusOr<CursorAgreement> AgreeCursors(Tracker& tracker,
                                             ProcessGroup& group) {
  const TrackerState mine = tracker.SaveConsumers();
  const std::string bytes = EncodeTrackerState(mine, tracker.options());
  const int world = group.world_size();
  std::vector<std::string> encoded(world);
  absl::Status status = CatchTorchErrors([&]() -> absl::Status {
    const auto longs = at::TensorOptions().dtype(at::kLong);
    at::Tensor size = at::full({1}, static_cast<int64_t>(bytes.size()), longs)
                          .to(group.device());
    at::Tensor sizes = at::empty({world}, longs.device(group.device()));
    if (absl::Status s = group.AllGather(size, sizes, "cursors.sizes");
        !s.ok()) {
      return s;
    }
    const at::Tensor all_sizes = sizes.cpu();
    const int64_t* n = all_sizes.data_ptr<int64_t>();
    const int64_t padded =
        std::max<int64_t>(1, *std::max_element(n, n + world));
    at::Tensor buffer = at::zeros({padded}, at::kByte);
    std::memcpy(buffer.data_ptr<uint8_t>(), bytes.data(), bytes.size());
    at::Tensor everyone =
        at::empty({world * padded},
                  at::TensorOptions().dtype(at::kByte).device(group.device()));
    if (absl::Status s = group.AllGather(buffer.to(group.device()), everyone,
                                         "cursors.agree");
        !s.ok()) {
      return s;
    }
    const at::Tensor host = everyone.cpu();
    const char* data = reinterpret_cast<const char*>(host.data_ptr<uint8_t>());
    for (int r = 0; r < world; ++r) {
      encoded[r].assign(data + r * padded, n[r]);
    }
    return absl::OkStatus();
  });
  if (!status.ok()) return status;
  std::vector<TrackerState> states(world);
  for (int r = 0; r < world; ++r) {
    if (absl::Status s = DecodeTrackerState(encoded[r], &states[r]); !s.ok()) {
      return absl::DataLossError(absl::StrCat(
          "rank ", r, "'s consumers (cursor agreement): ", s.message()));
    }
  }
  std::vector<ConsumerState> agreed = AgreeConsumers(states);
  CursorAgreement result;
  result.consumers = static_cast<int>(agreed.size());
  for (const ConsumerState& c : agreed) {
    const ConsumerState* before = Find(mine, c.name);
    if (before == nullptr) {
      ++result.added;
    } else if (!SamePosition(*before, c)) {
      ++result.moved;
    }
    if (c.resync_required && (before == nullptr || !before->resync_required)) {
      ++result.resync;
    }
  }
  if (absl::Status s = tracker.SetConsumers(std::move(agreed)); !s.ok()) {
    return s;
  }
  return result;
}

std::string DescribeCursorAgreement(const CursorAgreement& agreement,
                                    int world_size) {
  return absl::StrFormat(
      "cursors agreed across %d ranks: %d consumers, %d moved, %d added, %d "
      "told to resync",
      world_size, agreement.consumers, agreement.moved, agreement.added,
      agreement.resync);
}

}  // namespace deltastream
