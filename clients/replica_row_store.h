#ifndef DELTASTREAM_CLIENTS_REPLICA_ROW_STORE_H_
#define DELTASTREAM_CLIENTS_REPLICA_ROW_STORE_H_

// The storage behind a Replica (clients/replica.h): the interface its two
// backends implement, and what the facade hands them. Internal to
// //clients:replica; include clients/replica.h instead.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "clients/replica.h"

namespace deltastream {

using DenseParameters = std::vector<std::pair<std::string, at::Tensor>>;
using ReplicaTableInfos = std::map<std::string, ReplicaTableInfo, std::less<>>;

// One table's rows of an apply, validated: host, contiguous, in delta order.
struct ReplicaTableWrite {
  std::string fqn;
  ReplicaTableInfo info;  // dtype and dim (rows: unused)
  int64_t row_bytes = 0;
  // (ids int64 [n], values [n, dim]) per delta that has rows for the table.
  std::vector<std::pair<at::Tensor, at::Tensor>> parts;
};

// What one Apply or Reset writes.
struct ReplicaApplyPlan {
  bool reset = false;
  std::vector<ReplicaTableWrite> tables;
  bool replaces_dense = false;
  DenseParameters dense;  // when replaces_dense
  int64_t version = -1;
  std::string run_id;
};

// Bytes of one row of a table of `info`'s dtype and dim.
inline int64_t RowBytes(const ReplicaTableInfo& info) {
  return info.dim * static_cast<int64_t>(c10::elementSize(info.dtype));
}

// A prepared write, in two steps so that lookups wait only for the second.
class ReplicaStagedWrite {
 public:
  virtual ~ReplicaStagedWrite() = default;
  // Makes the write durable, if the backend is, without making it visible to
  // lookups; runs without the replica's locks (but under its apply mutex).
  // On error nothing changed.
  virtual absl::Status Persist() { return absl::OkStatus(); }
  // Makes the write visible; runs under the replica's writer lock, after
  // Persist succeeded. Cannot fail.
  virtual void Publish() = 0;
};

// Where rows live. Stage and Lookup run under the replica's reader lock (and
// Stage under its apply mutex: no other write runs meanwhile); Publish under
// its writer lock.
class Replica::RowStore {
 public:
  virtual ~RowStore() = default;
  // Tables held now (rows included).
  virtual const ReplicaTableInfos& tables() const = 0;
  // Prepares `plan` (which holds version, run id and the dense parameters
  // after it) without changing what lookups see.
  virtual absl::StatusOr<std::unique_ptr<ReplicaStagedWrite>> Stage(
      const ReplicaApplyPlan& plan, const DenseParameters& dense_after) = 0;
  // Fills `rows` (n rows of `info`'s size, zeroed) and `found` for `ids`.
  virtual absl::Status Lookup(absl::string_view fqn,
                              const ReplicaTableInfo& info, const int64_t* ids,
                              int64_t n, char* rows, bool* found) const = 0;
};

// What a reopened RocksDB replica holds besides rows.
struct ReplicaRestoredState {
  int64_t version = -1;
  std::string run_id;
  int64_t dense_version = -1;
  DenseParameters dense;
};

// The in-memory backend (clients/replica_memory_store.cc): empty.
std::unique_ptr<Replica::RowStore> NewMemoryRowStore();

// The RocksDB backend (clients/replica_rocksdb_store.cc) in `path`, created
// when missing; fills `restored` from an existing database. Errors as
// Replica::Open.
absl::StatusOr<std::unique_ptr<Replica::RowStore>> OpenRocksRowStore(
    const std::string& path, int64_t cache_bytes,
    ReplicaRestoredState* restored);

}  // namespace deltastream

#endif  // DELTASTREAM_CLIENTS_REPLICA_ROW_STORE_H_
