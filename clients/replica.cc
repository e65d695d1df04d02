// The Replica facade: validates applies into a plan, has its backend
// (clients/replica_row_store.h) stage and persist it, and publishes it under
// the writer lock.
#include "clients/replica.h"

#include <ATen/core/Tensor.h>
#include <ATen/ops/zeros.h>

#include <map>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "clients/replica_row_store.h"
#include "proto/tensor_codec.h"

namespace deltastream {
namespace {

absl::Status CheckTableName(absl::string_view fqn) {
  if (fqn.empty()) return absl::InvalidArgumentError("a table has no name");
  if (fqn.find('\0') != absl::string_view::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("table name '", fqn, "' holds a 0 byte"));
  }
  return absl::OkStatus();
}

// Checks `deltas` against the tables held (`held`, unless resetting) and
// against each other; builds the plan.
absl::StatusOr<ReplicaApplyPlan> PlanApply(
    absl::Span<const ReceivedDelta> deltas, const ReplicaTableInfos& held,
    bool reset) {
  ReplicaApplyPlan plan;
  plan.reset = reset;
  std::map<std::string, size_t> table_index;
  for (const ReceivedDelta& delta : deltas) {
    for (const auto& [fqn, table] : delta.tables) {
      if (absl::Status s = CheckTableName(fqn); !s.ok()) return s;
      if (!table.ids.defined() || table.ids.numel() == 0) continue;
      auto invalid = [&fqn = fqn](absl::string_view what) {
        return absl::InvalidArgumentError(
            absl::StrCat("table '", fqn, "': ", what));
      };
      if (table.ids.scalar_type() != at::kLong || table.ids.dim() != 1) {
        return invalid("IDs must be int64 [n]");
      }
      const int64_t n = table.ids.size(0);
      if (!table.values.defined()) {
        return invalid(
            "rows without values (only a tracker inside the trainer sends "
            "the rows' current values)");
      }
      if (table.values.dim() != 2 || table.values.size(0) != n ||
          table.values.size(1) < 1) {
        return invalid(absl::StrCat("values must be [", n, ", dim >= 1], not ",
                                    table.values.sizes().vec().size(), "-D of ",
                                    table.values.numel(), " elements"));
      }
      if (absl::StatusOr<v1::Tensor::DType> wire =
              WireDType(table.values.scalar_type());
          !wire.ok()) {
        return invalid(wire.status().message());
      }
      ReplicaTableInfo info;
      info.dtype = table.values.scalar_type();
      info.dim = table.values.size(1);
      auto [it, added] = table_index.try_emplace(fqn, plan.tables.size());
      if (added) {
        ReplicaTableWrite write;
        write.fqn = fqn;
        write.info = info;
        write.row_bytes = RowBytes(info);
        plan.tables.push_back(std::move(write));
      }
      const ReplicaTableInfo& expected = !reset && held.count(fqn) > 0
                                             ? held.find(fqn)->second
                                             : plan.tables[it->second].info;
      if (info.dtype != expected.dtype || info.dim != expected.dim) {
        return invalid(
            absl::StrCat("rows of ", c10::toString(info.dtype), " x ", info.dim,
                         " do not match the table's ",
                         c10::toString(expected.dtype), " x ", expected.dim));
      }
      plan.tables[it->second].parts.emplace_back(
          table.ids.cpu().contiguous(), table.values.cpu().contiguous());
    }
    if (delta.dense.empty()) continue;
    absl::flat_hash_set<std::string> names;
    for (const auto& [name, tensor] : delta.dense) {
      if (name.empty() || !names.insert(name).second) {
        return absl::InvalidArgumentError(absl::StrCat(
            "dense parameter names must be unique and non-empty: '", name,
            "'"));
      }
      if (!tensor.defined() || !WireDType(tensor.scalar_type()).ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat("dense parameter '", name,
                         "' is undefined or not of a wire dtype"));
      }
    }
    plan.replaces_dense = true;
    plan.dense.clear();
    for (const auto& [name, tensor] : delta.dense) {
      plan.dense.emplace_back(name, tensor.cpu().contiguous());
    }
  }
  return plan;
}
}  // namespace

absl::StatusOr<std::unique_ptr<Replica>> Replica::Open(ReplicaOptions options) {
  if (options.db_path.empty()) {
    return std::unique_ptr<Replica>(new Replica("memory", NewMemoryRowStore()));
  }
  ReplicaRestoredState restored;
  absl::StatusOr<std::unique_ptr<RowStore>> store =
      OpenRocksRowStore(options.db_path, options.cache_bytes, &restored);
  if (!store.ok()) return store.status();
  std::unique_ptr<Replica> replica(
      new Replica(options.db_path, *std::move(store)));
  WriterLock lock(&replica->mu_);
  replica->version_ = restored.version;
  replica->run_id_ = std::move(restored.run_id);
  replica->dense_.version = restored.dense_version;
  replica->dense_.parameters = std::move(restored.dense);
  return replica;
}

Replica::Replica(std::string where, std::unique_ptr<RowStore> store)
    : where_(std::move(where)), store_(std::move(store)) {}

Replica::~Replica() = default;

absl::Status Replica::Apply(absl::Span<const ReceivedDelta> deltas,
                            int64_t version, absl::string_view run_id) {
  return Write(deltas, version, run_id, /*reset=*/false);
}

absl::Status Replica::Reset(absl::Span<const ReceivedDelta> deltas,
                            int64_t version, absl::string_view run_id) {
  return Write(deltas, version, run_id, /*reset=*/true);
}

absl::Status Replica::Write(absl::Span<const ReceivedDelta> deltas,
                            int64_t version, absl::string_view run_id,
                            bool reset) {
  WriterLock apply_lock(&apply_mu_);
  std::unique_ptr<ReplicaStagedWrite> staged;
  ReplicaApplyPlan plan;
  {
    // Only this thread writes (apply_mu_): what it stages stays valid until
    // it installs.
    ReaderLock lock(&mu_);
    if (!reset && version < version_) {
      return absl::FailedPreconditionError(
          absl::StrCat("the replica is at version ", version_,
                       ": an apply cannot move it back to ", version,
                       " (only a reset can)"));
    }
    absl::StatusOr<ReplicaApplyPlan> planned =
        PlanApply(deltas, store_->tables(), reset);
    if (!planned.ok()) return planned.status();
    plan = *std::move(planned);
    plan.version = version;
    plan.run_id = std::string(run_id);
    const DenseParameters& dense_after =
        plan.replaces_dense ? plan.dense
                            : (reset ? DenseParameters() : dense_.parameters);
    absl::StatusOr<std::unique_ptr<ReplicaStagedWrite>> prepared =
        store_->Stage(plan, dense_after);
    if (!prepared.ok()) return prepared.status();
    staged = *std::move(prepared);
  }
  if (absl::Status s = staged->Persist(); !s.ok()) return s;
  WriterLock lock(&mu_);
  staged->Publish();
  version_ = version;
  run_id_ = std::string(run_id);
  if (plan.replaces_dense) {
    dense_.parameters = std::move(plan.dense);
    dense_.version = version;
  } else if (reset) {
    dense_.parameters.clear();
    dense_.version = -1;
  }
  return absl::OkStatus();
}

absl::StatusOr<ReplicaRows> Replica::Lookup(absl::string_view fqn,
                                            const at::Tensor& ids) const {
  if (!ids.defined() || ids.scalar_type() != at::kLong || ids.dim() != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("IDs for table '", fqn, "' must be int64 [n]"));
  }
  const at::Tensor host_ids = ids.cpu().contiguous();
  const int64_t n = host_ids.size(0);
  ReaderLock lock(&mu_);
  auto it = store_->tables().find(fqn);
  if (it == store_->tables().end()) {
    return absl::NotFoundError(
        absl::StrCat("the replica holds no table '", fqn, "'"));
  }
  const ReplicaTableInfo& info = it->second;
  const int64_t row_bytes =
      info.dim * static_cast<int64_t>(c10::elementSize(info.dtype));
  if (n > kMaxLookupBytes / row_bytes) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%d IDs of table '%s' (rows of %d bytes) would return more than the "
        "%d MiB one lookup returns: look them up in parts",
        n, fqn, row_bytes, kMaxLookupBytes >> 20));
  }
  ReplicaRows result;
  result.version = version_;
  result.run_id = run_id_;
  result.rows = at::zeros({n, info.dim}, at::TensorOptions(info.dtype));
  result.found = at::zeros({n}, at::TensorOptions(at::kBool));
  if (absl::Status s =
          store_->Lookup(fqn, info, host_ids.data_ptr<int64_t>(), n,
                         static_cast<char*>(result.rows.data_ptr()),
                         result.found.data_ptr<bool>());
      !s.ok()) {
    return s;
  }
  return result;
}

ReplicaDense Replica::Dense() const {
  ReaderLock lock(&mu_);
  return dense_;
}

int64_t Replica::Version() const {
  ReaderLock lock(&mu_);
  return version_;
}

std::string Replica::RunId() const {
  ReaderLock lock(&mu_);
  return run_id_;
}

std::map<std::string, ReplicaTableInfo> Replica::Tables() const {
  ReaderLock lock(&mu_);
  return std::map<std::string, ReplicaTableInfo>(store_->tables().begin(),
                                                 store_->tables().end());
}

int64_t Replica::RowCount(absl::string_view fqn) const {
  ReaderLock lock(&mu_);
  auto it = store_->tables().find(fqn);
  return it == store_->tables().end() ? 0 : it->second.rows;
}

}  // namespace deltastream
