#include "trainer/planner/plan_report.h"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace deltastream::planner {
namespace {

using Rows = std::vector<std::vector<std::string>>;

// Columns padded to their widest cell: the first left-aligned, the others
// right-aligned.
std::string Aligned(const Rows& rows) {
  std::vector<size_t> widths;
  for (const auto& row : rows) {
    widths.resize(std::max(widths.size(), row.size()), 0);
    for (size_t c = 0; c < row.size(); ++c) {
      widths[c] = std::max(widths[c], row[c].size());
    }
  }
  std::string out;
  for (const auto& row : rows) {
    std::string line;
    for (size_t c = 0; c < row.size(); ++c) {
      const std::string pad(widths[c] - row[c].size(), ' ');
      absl::StrAppend(
          &line, c == 0 ? "" : "  ",
          c == 0 || c + 1 == row.size() ? row[c] + pad : pad + row[c]);
    }
    line.erase(line.find_last_not_of(' ') + 1);
    absl::StrAppend(&out, line, "\n");
  }
  return out;
}

std::string Gib(int64_t bytes) {
  return absl::StrFormat("%.3f", static_cast<double>(bytes) / (1 << 30));
}
std::string Mib(int64_t bytes) {
  return absl::StrFormat("%.2f", static_cast<double>(bytes) / (1 << 20));
}
std::string Ms(double ms) { return absl::StrFormat("%.4f", ms); }
double Percent(int64_t used, int64_t capacity) {
  return capacity > 0
             ? 100.0 * static_cast<double>(used) / static_cast<double>(capacity)
             : 0;
}

std::string ShardCounts(const RankStats& stats) {
  std::vector<std::string> parts;
  for (const auto& [type, count] : stats.shards) {
    parts.push_back(absl::StrCat(ShardingTypeShortName(type), ":", count));
  }
  return parts.empty() ? "-" : absl::StrJoin(parts, " ");
}

// "0-7" or "3" or "0,2,5": the ranks of a table's shards.
std::string RankList(const ShardingOption& option) {
  std::vector<int> ranks;
  for (const ShardEstimate& shard : option.shards) ranks.push_back(shard.rank);
  std::sort(ranks.begin(), ranks.end());
  ranks.erase(std::unique(ranks.begin(), ranks.end()), ranks.end());
  if (ranks.size() > 2 &&
      ranks.back() - ranks.front() + 1 == static_cast<int>(ranks.size())) {
    return absl::StrCat(ranks.front(), "-", ranks.back());
  }
  return absl::StrJoin(ranks, ",");
}

}  // namespace

std::string FormatPlanReport(const Plan& plan,
                             absl::Span<const TableSpec> tables,
                             const Topology& topology) {
  std::string out = absl::StrFormat(
      "Sharding plan: %d tables on %d ranks (%s, %d per host), batch %d per "
      "rank; proposer %s, partitioner %s, %d proposals partitioned\n",
      tables.size(), topology.world_size, topology.gpu ? "GPU" : "CPU",
      topology.ranks_per_host(), topology.batch_size, plan.proposer,
      plan.partitioner, plan.proposals);
  absl::StrAppendFormat(
      &out,
      "Reserved per rank: HBM %s GiB, DDR %s GiB (%.0f%% + dense %s MiB + "
      "KJT %s MiB)\n\n",
      Gib(plan.reservation.total.hbm), Gib(plan.reservation.total.ddr),
      topology.storage_reserve_percent * 100, Mib(plan.reservation.dense),
      Mib(plan.reservation.kjt));

  Rows ranks;
  std::vector<std::string> header = {"Rank"};
  if (topology.gpu) header.insert(header.end(), {"HBM GiB", "HBM %"});
  header.insert(header.end(),
                {"DDR GiB", "DDR %", "Cost ms", "Fwd comp", "Bwd comp",
                 "Fwd comms", "Bwd comms", "In MiB", "Out MiB", "Shards"});
  ranks.push_back(header);
  for (size_t r = 0; r < plan.ranks.size(); ++r) {
    const RankStats& stats = plan.ranks[r];
    std::vector<std::string> row = {absl::StrCat(r)};
    if (topology.gpu) {
      row.push_back(Gib(stats.used.hbm));
      row.push_back(
          absl::StrFormat("%.1f", Percent(stats.used.hbm, stats.capacity.hbm)));
    }
    row.insert(
        row.end(),
        {Gib(stats.used.ddr),
         absl::StrFormat("%.1f", Percent(stats.used.ddr, stats.capacity.ddr)),
         Ms(stats.cost.total()), Ms(stats.cost.fwd_compute),
         Ms(stats.cost.bwd_compute), Ms(stats.cost.fwd_comms),
         Ms(stats.cost.bwd_comms), Mib(stats.input_bytes),
         Mib(stats.output_bytes), ShardCounts(stats)});
    ranks.push_back(std::move(row));
  }
  absl::StrAppend(&out, Aligned(ranks), "\n");

  Rows per_table = {{"Table", "Rows", "Dim", "Type", "Kernel", "Shards",
                     "Storage MiB", "Cost ms", "Ranks"}};
  for (const ShardingOption& option : plan.options) {
    const TableSpec& table = tables[option.table];
    per_table.push_back(
        {table.name, absl::StrCat(table.rows), absl::StrCat(table.dim),
         std::string(ShardingTypeShortName(option.type)),
         std::string(ComputeKernelName(option.kernel)),
         absl::StrCat(option.shards.size()),
         Mib(option.total_storage.hbm + option.total_storage.ddr),
         Ms(option.total_cost), RankList(option)});
  }
  absl::StrAppend(&out, Aligned(per_table), "\n");
  absl::StrAppendFormat(&out,
                        "Max rank cost %.4f ms, mean %.4f ms, imbalance "
                        "(max / mean) %.3f\n",
                        plan.max_cost, plan.mean_cost, plan.imbalance());
  return out;
}

std::string FormatPlanJson(const Plan& plan, absl::Span<const TableSpec> tables,
                           const Topology& topology) {
  nlohmann::json out;
  out["world_size"] = topology.world_size;
  out["local_world_size"] = topology.ranks_per_host();
  out["gpu"] = topology.gpu;
  out["batch_size"] = topology.batch_size;
  out["proposer"] = plan.proposer;
  out["partitioner"] = plan.partitioner;
  out["proposals"] = plan.proposals;
  out["max_cost_ms"] = plan.max_cost;
  out["mean_cost_ms"] = plan.mean_cost;
  out["imbalance"] = plan.imbalance();
  out["reserved"] = {{"hbm_bytes", plan.reservation.total.hbm},
                     {"ddr_bytes", plan.reservation.total.ddr},
                     {"dense_bytes", plan.reservation.dense},
                     {"kjt_bytes", plan.reservation.kjt}};
  nlohmann::json ranks = nlohmann::json::array();
  for (size_t r = 0; r < plan.ranks.size(); ++r) {
    const RankStats& stats = plan.ranks[r];
    nlohmann::json shards = nlohmann::json::object();
    for (const auto& [type, count] : stats.shards) {
      shards[std::string(ShardingTypeShortName(type))] = count;
    }
    ranks.push_back(
        {{"rank", r},
         {"hbm_bytes", stats.used.hbm},
         {"ddr_bytes", stats.used.ddr},
         {"hbm_capacity_bytes", stats.capacity.hbm},
         {"ddr_capacity_bytes", stats.capacity.ddr},
         {"hbm_percent", Percent(stats.used.hbm, stats.capacity.hbm)},
         {"ddr_percent", Percent(stats.used.ddr, stats.capacity.ddr)},
         {"cost_ms", stats.cost.total()},
         {"fwd_compute_ms", stats.cost.fwd_compute},
         {"bwd_compute_ms", stats.cost.bwd_compute},
         {"fwd_comms_ms", stats.cost.fwd_comms},
         {"bwd_comms_ms", stats.cost.bwd_comms},
         {"input_bytes", stats.input_bytes},
         {"output_bytes", stats.output_bytes},
         {"shards", shards}});
  }
  out["ranks"] = ranks;
  nlohmann::json per_table = nlohmann::json::array();
  for (const ShardingOption& option : plan.options) {
    const TableSpec& table = tables[option.table];
    std::vector<int> shard_ranks;
    for (const ShardEstimate& shard : option.shards) {
      shard_ranks.push_back(shard.rank);
    }
    per_table.push_back(
        {{"table", table.name},
         {"rows", table.rows},
         {"dim", table.dim},
         {"sharding_type", std::string(ShardingTypeName(option.type))},
         {"compute_kernel", std::string(ComputeKernelName(option.kernel))},
         {"ranks", shard_ranks},
         {"hbm_bytes", option.total_storage.hbm},
         {"ddr_bytes", option.total_storage.ddr},
         {"cost_ms", option.total_cost}});
  }
  out["tables"] = per_table;
  return out.dump();
}

}  // namespace deltastream::planner
