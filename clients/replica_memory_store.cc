// The in-memory backend of a Replica: per table a hash map from ID to a
// slot of a row buffer that grows in blocks.
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "clients/replica_row_store.h"

namespace deltastream {
namespace {

// Rows live in blocks of this many slots: a table grows without moving rows.
constexpr int64_t kSlotsPerBlock = 1 << 14;

struct MemoryTable {
  ReplicaTableInfo info;
  int64_t row_bytes = 0;
  absl::flat_hash_map<int64_t, int64_t> slot_of_id;
  std::vector<std::unique_ptr<char[]>> blocks;

  char* Row(int64_t slot) const {
    return blocks[slot / kSlotsPerBlock].get() +
           (slot % kSlotsPerBlock) * row_bytes;
  }
};
using MemoryTables = std::map<std::string, MemoryTable, std::less<>>;

// Writes `write`'s rows into `table` (created from `write` when new), later
// rows over earlier ones.
void WriteRows(const ReplicaTableWrite& write, MemoryTable& table) {
  if (table.row_bytes == 0) {
    table.info = write.info;
    table.row_bytes = write.row_bytes;
  }
  for (const auto& [ids, values] : write.parts) {
    const int64_t n = ids.size(0);
    if (table.slot_of_id.empty()) table.slot_of_id.reserve(n);
    const int64_t* id = ids.data_ptr<int64_t>();
    const char* row = static_cast<const char*>(values.data_ptr());
    for (int64_t i = 0; i < n; ++i) {
      const int64_t next = static_cast<int64_t>(table.slot_of_id.size());
      auto [it, added] = table.slot_of_id.try_emplace(id[i], next);
      if (added && next % kSlotsPerBlock == 0) {
        table.blocks.emplace_back(new char[kSlotsPerBlock * table.row_bytes]);
      }
      std::memcpy(table.Row(it->second), row + i * table.row_bytes,
                  table.row_bytes);
    }
  }
  table.info.rows = static_cast<int64_t>(table.slot_of_id.size());
}

class MemoryRowStore;

// An increment writes in place when published (nothing can fail); a reset
// swaps in tables built while staging, and the old ones are freed with the
// staged write, after the writer lock.
class MemoryStagedWrite : public ReplicaStagedWrite {
 public:
  MemoryStagedWrite(MemoryRowStore* store, const ReplicaApplyPlan* plan,
                    std::optional<MemoryTables> replacement)
      : store_(store), plan_(plan), replacement_(std::move(replacement)) {}
  void Publish() override;

 private:
  MemoryRowStore* const store_;
  const ReplicaApplyPlan* const plan_;
  std::optional<MemoryTables> replacement_;
};

class MemoryRowStore : public Replica::RowStore {
 public:
  const ReplicaTableInfos& tables() const override { return infos_; }

  absl::StatusOr<std::unique_ptr<ReplicaStagedWrite>> Stage(
      const ReplicaApplyPlan& plan, const DenseParameters&) override {
    std::optional<MemoryTables> replacement;
    if (plan.reset) {
      replacement.emplace();
      for (const ReplicaTableWrite& write : plan.tables) {
        WriteRows(write, (*replacement)[write.fqn]);
      }
    }
    return std::unique_ptr<ReplicaStagedWrite>(
        new MemoryStagedWrite(this, &plan, std::move(replacement)));
  }

  absl::Status Lookup(absl::string_view fqn, const ReplicaTableInfo& /*info*/,
                      const int64_t* ids, int64_t n, char* rows,
                      bool* found) const override {
    const MemoryTable& table = tables_.find(fqn)->second;
    for (int64_t i = 0; i < n; ++i) {
      auto it = table.slot_of_id.find(ids[i]);
      found[i] = it != table.slot_of_id.end();
      if (found[i]) {
        std::memcpy(rows + i * table.row_bytes, table.Row(it->second),
                    table.row_bytes);
      }
    }
    return absl::OkStatus();
  }

 private:
  friend class MemoryStagedWrite;

  void Publish(const ReplicaApplyPlan& plan,
               std::optional<MemoryTables>& replacement) {
    if (replacement.has_value()) {
      std::swap(tables_, *replacement);
    } else {
      for (const ReplicaTableWrite& write : plan.tables) {
        WriteRows(write, tables_[write.fqn]);
      }
    }
    infos_.clear();
    for (const auto& [fqn, table] : tables_) infos_[fqn] = table.info;
  }

  MemoryTables tables_;
  ReplicaTableInfos infos_;
};

void MemoryStagedWrite::Publish() { store_->Publish(*plan_, replacement_); }

}  // namespace

std::unique_ptr<Replica::RowStore> NewMemoryRowStore() {
  return std::make_unique<MemoryRowStore>();
}

}  // namespace deltastream
