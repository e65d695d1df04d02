#include "trainer/tracking/shard_topology.h"

#include "absl/strings/str_cat.h"
#include "base/host_port.h"
#include "google/protobuf/text_format.h"
#include "tracker_service/tracked_modules.h"

namespace deltastream {

std::string ShardedTableFqn(const ShardedEmbeddingModule& module,
                            absl::string_view table) {
  return CleanFqn(absl::StrCat(
      module.path(), module.pooled() ? ".embedding_bags." : ".embeddings.",
      table));
}

RowOffsets ShardRowOffsets(absl::Span<ShardedEmbeddingModule* const> modules) {
  RowOffsets offsets;
  for (const ShardedEmbeddingModule* module : modules) {
    for (const EmbeddingShard& shard : module->local_shards()) {
      if (shard.sharding_type != v1::ROW_WISE &&
          shard.sharding_type != v1::TABLE_ROW_WISE) {
        continue;
      }
      offsets[ShardedTableFqn(*module, shard.table)] = shard.row_offset;
    }
  }
  return offsets;
}

ServiceTopology DescribeTopology(
    int rank, int world_size, absl::Span<ShardedEmbeddingModule* const> sharded,
    absl::Span<EmbeddingModule* const> modules,
    const std::vector<std::string>& fqns_to_skip) {
  ServiceTopology topology;
  topology.rank = rank;
  topology.world_size = world_size;
  for (const ShardedEmbeddingModule* module : sharded) {
    std::string text;
    google::protobuf::TextFormat::PrintToString(module->plan(), &text);
    if (sharded.size() > 1) {
      absl::StrAppend(&topology.plan, "# ", module->path(), "\n");
    }
    absl::StrAppend(&topology.plan, text);
    for (const EmbeddingShard& shard : module->shards()) {
      const std::string fqn = ShardedTableFqn(*module, shard.table);
      if (IsSkipped(fqn, fqns_to_skip)) continue;
      const EmbeddingTableConfig& table = module->tables()[shard.table_index];
      topology.shards.push_back(
          {fqn, v1::ShardingType_Name(shard.sharding_type), shard.rank,
           shard.row_offset, shard.rows, shard.col_offset, shard.cols,
           table.num_embeddings, table.embedding_dim});
    }
  }
  if (!sharded.empty()) return topology;
  for (const EmbeddingModule* module : modules) {
    for (size_t t = 0; t < module->tables().size(); ++t) {
      const std::string fqn =
          CleanFqn(module->TableFqn(static_cast<int64_t>(t)));
      if (IsSkipped(fqn, fqns_to_skip)) continue;
      const EmbeddingTableConfig& table = module->tables()[t];
      topology.shards.push_back({fqn, "TABLE_WISE", 0, 0, table.num_embeddings,
                                 0, table.embedding_dim, table.num_embeddings,
                                 table.embedding_dim});
    }
  }
  return topology;
}

std::string ReachableAddress(absl::string_view address) {
  absl::StatusOr<HostPort> listen = SplitHostPort(address);
  if (!listen.ok()) return std::string(address);
  if (listen->host != "0.0.0.0" && listen->host != "::" &&
      !listen->host.empty()) {
    return std::string(address);
  }
  const std::string name = FullHostName();
  if (name.empty()) return std::string(address);
  return JoinHostPort(name, listen->port);
}

absl::StatusOr<std::vector<std::string>> ExchangeEndpoints(
    ProcessGroup* group, const std::string& address) {
  if (group == nullptr) return std::vector<std::string>{address};
  constexpr absl::string_view kPrefix = "tracker/endpoint/";
  if (absl::Status status =
          group->StoreSet(absl::StrCat(kPrefix, group->rank()), address);
      !status.ok()) {
    return status;
  }
  // Every rank has written before any reads: a key left by an earlier
  // trainer on the same group (or store) is never taken for this one's.
  if (absl::Status status = group->Barrier("tracker.endpoints"); !status.ok()) {
    return status;
  }
  std::vector<std::string> endpoints;
  for (int r = 0; r < group->world_size(); ++r) {
    absl::StatusOr<std::string> endpoint =
        group->StoreGet(absl::StrCat(kPrefix, r));
    if (!endpoint.ok()) return endpoint.status();
    endpoints.push_back(*std::move(endpoint));
  }
  return endpoints;
}

}  // namespace deltastream
