#include "trainer/planner/planner.h"

#include <algorithm>
#include <map>
#include <memory>
#include <optional>
#include <tuple>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "trainer/planner/cost_estimator.h"
#include "trainer/planner/enumerator.h"
#include "trainer/planner/partitioners.h"
#include "trainer/planner/proposers.h"

namespace deltastream::planner {
namespace {

// Bytes in the largest unit that keeps them above 1.
std::string Gib(int64_t bytes) {
  const double value = static_cast<double>(bytes);
  if (value >= (1 << 30)) return absl::StrFormat("%.2f GiB", value / (1 << 30));
  if (value >= (1 << 20)) return absl::StrFormat("%.2f MiB", value / (1 << 20));
  return absl::StrFormat("%.2f KiB", value / (1 << 10));
}

int64_t Primary(const Storage& storage, const Topology& topology) {
  return topology.gpu ? storage.hbm : storage.ddr;
}

std::string TierName(const Topology& topology) {
  return topology.gpu ? "HBM" : "DDR";
}

std::vector<const ShardingOption*> Chosen(const OptionsByTable& options,
                                          const Proposal& proposal) {
  std::vector<const ShardingOption*> chosen(proposal.size());
  for (size_t t = 0; t < proposal.size(); ++t) {
    chosen[t] = &options[t][proposal[t]];
  }
  return chosen;
}

double TotalCost(const OptionsByTable& options, const Proposal& proposal) {
  double total = 0;
  for (size_t t = 0; t < proposal.size(); ++t) {
    total += options[t][proposal[t]].total_cost;
  }
  return total;
}

// Partitions greedily by cost, then memory-balanced when that fails.
std::pair<Partition, PartitionStrategy> PartitionEither(
    const std::vector<const ShardingOption*>& chosen, const Topology& topology,
    const Storage& usable) {
  Partition partition =
      PartitionShards(chosen, topology, usable, PartitionStrategy::kGreedyCost);
  if (partition.ok())
    return {std::move(partition), PartitionStrategy::kGreedyCost};
  return {PartitionShards(chosen, topology, usable,
                          PartitionStrategy::kMemoryBalanced),
          PartitionStrategy::kMemoryBalanced};
}

// Each table's option whose largest shard is the smallest (in the deciding
// tier), then the least storage in all, then the cheapest: the form most
// likely to fit.
Proposal SmallestProposal(const OptionsByTable& options,
                          const Topology& topology) {
  const auto key = [&](const ShardingOption& option) {
    int64_t largest = 0;
    for (const ShardEstimate& shard : option.shards) {
      largest = std::max(largest, Primary(shard.storage, topology));
    }
    return std::make_tuple(largest, Primary(option.total_storage, topology),
                           option.total_cost);
  };
  Proposal proposal(options.size(), 0);
  for (size_t t = 0; t < options.size(); ++t) {
    for (size_t j = 1; j < options[t].size(); ++j) {
      if (key(options[t][j]) < key(options[t][proposal[t]])) {
        proposal[t] = static_cast<int>(j);
      }
    }
  }
  return proposal;
}

// Why nothing fits, and what would help: the error of MakePlan.
absl::Status NothingFits(absl::Span<const TableSpec> tables,
                         OptimizerKind optimizer, const Topology& topology,
                         const StorageReservation& reservation,
                         const Storage& usable, const OptionsByTable& options,
                         const Proposal& smallest, const Partition& partition) {
  const std::string tier = TierName(topology);
  std::string message = absl::StrFormat(
      "no plan fits: %d tables on %d ranks (%s), %s %s per rank, of which "
      "%s reserved (%.0f%% + dense %s + KJT %s), %s left to the tables.\n",
      tables.size(), topology.world_size, topology.gpu ? "GPU" : "CPU",
      Gib(Primary(topology.capacity(), topology)), tier,
      Gib(Primary(reservation.total, topology)),
      topology.storage_reserve_percent * 100, Gib(reservation.dense),
      Gib(reservation.kjt), Gib(Primary(usable, topology)));
  // Per table, the shards that found no room; per rank, what is missing
  // with those shards put where there was most room.
  std::map<int, int> failing;
  for (const UnplacedShard& shard : partition.unplaced) ++failing[shard.table];
  absl::StrAppend(&message,
                  "Tables that cannot be placed, even in their smallest "
                  "form:\n");
  constexpr int kMaxLines = 20;
  int lines = 0;
  for (const auto& [t, count] : failing) {
    if (lines++ == kMaxLines) {
      absl::StrAppend(&message, "  ... and ", failing.size() - kMaxLines,
                      " more tables\n");
    }
    if (lines > kMaxLines) continue;
    const ShardingOption& option = options[t][smallest[t]];
    int64_t largest = 0;
    for (const ShardEstimate& shard : option.shards) {
      largest = std::max(largest, Primary(shard.storage, topology));
    }
    absl::StrAppendFormat(
        &message,
        "  table '%s': %s, %d of its %d shards (up to %s %s) find no "
        "room\n",
        tables[t].name, ShardingTypeName(option.type), count,
        option.shards.size(), Gib(largest), tier);
  }
  absl::StrAppend(&message, "Missing per rank:\n");
  for (int rank = 0; rank < topology.world_size; ++rank) {
    const int64_t needed = Primary(partition.used[rank], topology);
    const int64_t has = Primary(usable, topology);
    if (needed <= has) continue;
    absl::StrAppendFormat(&message,
                          "  rank %d: %s missing (its shards need %s, it has "
                          "%s)\n",
                          rank, Gib(needed - has), Gib(needed), Gib(has));
  }
  absl::StrAppend(&message, "What would make it fit:\n");
  // The least storage each table can take in all, and whether more ranks
  // shrink its shards (row-wise forms do).
  int64_t total = 0;
  int64_t buffers = 0;
  int64_t unsplittable = 0;  // the largest shard more ranks do not shrink
  for (size_t t = 0; t < options.size(); ++t) {
    int64_t least = -1;
    int64_t smallest_fixed = -1;
    for (const ShardingOption& option : options[t]) {
      const int64_t storage = Primary(option.total_storage, topology);
      if (least < 0 || storage < least) least = storage;
      if (option.type == v1::ROW_WISE || option.type == v1::TABLE_ROW_WISE) {
        smallest_fixed = 0;
        continue;
      }
      int64_t largest = 0;
      for (const ShardEstimate& shard : option.shards) {
        largest = std::max(largest, Primary(shard.storage, topology));
      }
      if (smallest_fixed < 0 || largest < smallest_fixed) {
        smallest_fixed = largest;
      }
    }
    total += least;
    unsplittable = std::max(unsplittable, smallest_fixed);
    for (const ShardEstimate& shard : options[t][smallest[t]].shards) {
      buffers += shard.input_bytes + shard.output_bytes;
    }
  }
  const int64_t per_rank = Primary(usable, topology);
  if (per_rank <= 0) {
    absl::StrAppend(&message,
                    "  - a smaller reservation: it takes all of a rank's ",
                    tier, " (lower STORAGE_RESERVE_PERCENT, now ",
                    topology.storage_reserve_percent * 100,
                    "%, or a smaller batch for the KJT share)\n");
  } else {
    const int64_t ranks = (total + per_rank - 1) / per_rank;
    absl::StrAppend(&message, "  - more ranks: the tables need at least ",
                    Gib(total), " of ", tier, " in all; about ",
                    std::max<int64_t>(ranks, topology.world_size + 1),
                    " ranks of this size hold that\n");
    if (unsplittable > per_rank) {
      absl::StrAppend(&message,
                      "  - more memory per rank: a table that cannot be "
                      "split row-wise needs ",
                      Gib(unsplittable), " on one rank\n");
    }
  }
  int64_t missing = 0;
  for (const UnplacedShard& shard : partition.unplaced) {
    missing += Primary(shard.missing, topology);
  }
  if (buffers > 0 && buffers * 100 >= missing) {
    absl::StrAppend(&message, "  - a smaller batch: I/O buffers take ",
                    Gib(buffers), " of it at batch size ", topology.batch_size,
                    " (halving it frees about ", Gib(buffers / 2), ")\n");
  }
  for (const auto& [t, unused] : failing) {
    const TableSpec& table = tables[t];
    if (table.sharding_types.empty()) continue;
    TableSpec free = table;
    free.sharding_types.clear();
    absl::StatusOr<std::vector<std::vector<ShardingOption>>> unconstrained =
        EnumerateOptions(absl::MakeConstSpan(&free, 1), optimizer, topology);
    if (!unconstrained.ok()) continue;
    const ShardingOption* best = nullptr;
    int64_t best_shard = 0;
    for (const ShardingOption& option : unconstrained->front()) {
      int64_t largest = 0;
      for (const ShardEstimate& shard : option.shards) {
        largest = std::max(largest, Primary(shard.storage, topology));
      }
      if (best == nullptr || largest < best_shard) {
        best = &option;
        best_shard = largest;
      }
    }
    if (best != nullptr) {
      absl::StrAppend(&message, "  - fewer constraints: table '", table.name,
                      "' is constrained; as ", ShardingTypeName(best->type),
                      " its largest shard would need ", Gib(best_shard),
                      " per rank\n");
    }
  }
  if (topology.storage_reserve_percent > 0 && per_rank > 0) {
    absl::StrAppend(&message, "  - a lower STORAGE_RESERVE_PERCENT (now ",
                    topology.storage_reserve_percent * 100,
                    "%: ", Gib(Primary(reservation.percent, topology)),
                    " per rank)\n");
  }
  return absl::ResourceExhaustedError(message);
}

Plan BuildPlan(const OptionsByTable& options, const Proposal& proposal,
               const Partition& partition, const Topology& topology,
               const StorageReservation& reservation, const Storage& usable) {
  Plan plan;
  plan.reservation = reservation;
  plan.usable = usable;
  plan.ranks.resize(topology.world_size);
  for (int rank = 0; rank < topology.world_size; ++rank) {
    plan.ranks[rank].capacity = topology.capacity();
    plan.ranks[rank].reserved = reservation.total;
  }
  for (size_t t = 0; t < proposal.size(); ++t) {
    ShardingOption option = options[t][proposal[t]];
    for (size_t s = 0; s < option.shards.size(); ++s) {
      ShardEstimate& shard = option.shards[s];
      shard.rank = partition.ranks[t][s];
      RankStats& stats = plan.ranks[shard.rank];
      stats.used += shard.storage;
      stats.cost += shard.cost;
      stats.input_bytes += shard.input_bytes;
      stats.output_bytes += shard.output_bytes;
      ++stats.shards[option.type];
    }
    plan.options.push_back(std::move(option));
  }
  double sum = 0;
  for (const RankStats& stats : plan.ranks) {
    plan.max_cost = std::max(plan.max_cost, stats.cost.total());
    sum += stats.cost.total();
  }
  plan.mean_cost = sum / topology.world_size;
  return plan;
}

}  // namespace

absl::Status ValidateDpBinsPerDevice(absl::string_view what, int bins) {
  if (bins < 1 || bins > kMaxDpBinsPerDevice) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, " must be in [1, ", kMaxDpBinsPerDevice, "], got ", bins));
  }
  return absl::OkStatus();
}

absl::StatusOr<Plan> MakePlan(absl::Span<const TableSpec> tables,
                              OptimizerKind optimizer, const Topology& topology,
                              const StorageReservation& reservation,
                              const PlannerOptions& planner_options) {
  if (absl::Status status = ValidateTopology(topology); !status.ok()) {
    return status;
  }
  if (absl::Status status = ValidateDpBinsPerDevice(
          "dp_bins_per_device", planner_options.dp_bins_per_device);
      !status.ok()) {
    return status;
  }
  if (tables.empty()) return absl::InvalidArgumentError("no tables to plan");
  absl::StatusOr<OptionsByTable> enumerated =
      EnumerateOptions(tables, optimizer, topology);
  if (!enumerated.ok()) return enumerated.status();
  const OptionsByTable& options = *enumerated;
  const Storage usable = UsableStorage(topology, reservation);

  struct Best {
    Proposal proposal;
    Partition partition;
    std::string proposer;
    PartitionStrategy strategy;
  };
  std::optional<Best> best;
  // Proposals already partitioned (several proposers propose the same
  // plans), with whether they fitted.
  absl::flat_hash_map<Proposal, bool> seen;
  int partitioned = 0;

  auto evaluate = [&](const Proposal& proposal, const std::string& proposer,
                      bool* counted) -> bool {
    *counted = false;
    if (auto it = seen.find(proposal); it != seen.end()) return it->second;
    // No rank can carry less than the mean of the total cost.
    const double total = TotalCost(options, proposal);
    if (best && total / topology.world_size >= best->partition.max_cost) {
      return true;  // cannot beat the best (and greedy stops here)
    }
    *counted = true;
    ++partitioned;
    auto [partition, strategy] =
        PartitionEither(Chosen(options, proposal), topology, usable);
    const bool ok = partition.ok();
    if (ok && (!best || partition.max_cost < best->partition.max_cost)) {
      best = Best{proposal, std::move(partition), proposer, strategy};
    }
    seen.emplace(proposal, ok);
    return ok;
  };

  for (const std::string& name : planner_options.proposers) {
    std::unique_ptr<Proposer> proposer;
    if (name == "dp") {
      proposer =
          MakeDynamicProgrammingProposer(planner_options.dp_bins_per_device);
    } else {
      absl::StatusOr<std::unique_ptr<Proposer>> made = MakeProposer(name);
      if (!made.ok()) return made.status();
      proposer = *std::move(made);
    }
    proposer->Load(options, topology, usable);
    int evaluated = 0;
    if (proposer->uses_feedback()) {
      while (evaluated < planner_options.max_proposals) {
        std::optional<Proposal> proposal = proposer->Propose();
        if (!proposal) break;
        bool counted = false;
        proposer->Feedback(evaluate(*proposal, name, &counted));
        evaluated += counted ? 1 : 0;
      }
      continue;
    }
    // A proposer that ignores feedback proposes the same plans in any
    // order: the lowest lower bound first, until no later one can beat the
    // best (branch and bound: the same best plan as partitioning them all).
    proposer->OrderByTotalCost();
    while (evaluated < planner_options.max_proposals) {
      std::optional<Proposal> proposal = proposer->Propose();
      if (!proposal) break;
      if (best && TotalCost(options, *proposal) / topology.world_size >=
                      best->partition.max_cost) {
        break;
      }
      bool counted = false;
      evaluate(*proposal, name, &counted);
      evaluated += counted ? 1 : 0;
      proposer->Feedback(true);
    }
  }

  const Proposal smallest = SmallestProposal(options, topology);
  if (!best) {
    bool counted = false;
    evaluate(smallest, "smallest", &counted);
  }
  if (!best) {
    const Partition partition =
        PartitionShards(Chosen(options, smallest), topology, usable,
                        PartitionStrategy::kMemoryBalanced);
    return NothingFits(tables, optimizer, topology, reservation, usable,
                       options, smallest, partition);
  }
  Plan plan = BuildPlan(options, best->proposal, best->partition, topology,
                        reservation, usable);
  plan.proposer = best->proposer;
  plan.partitioner = std::string(PartitionStrategyName(best->strategy));
  plan.proposals = partitioned;
  return plan;
}

v1::ShardingPlan ToProto(const Plan& plan, absl::Span<const TableSpec> tables,
                         const Topology& topology) {
  v1::ShardingPlan out;
  out.set_world_size(topology.world_size);
  out.set_local_world_size(topology.ranks_per_host());
  out.set_proposer(plan.proposer);
  for (const ShardingOption& option : plan.options) {
    const TableSpec& table = tables[option.table];
    v1::TablePlan* table_plan = out.add_tables();
    table_plan->set_table(table.name);
    table_plan->set_sharding_type(option.type);
    table_plan->set_compute_kernel(option.kernel);
    table_plan->set_num_embeddings(table.rows);
    table_plan->set_embedding_dim(table.dim);
    for (const ShardEstimate& shard : option.shards) {
      v1::Shard* out_shard = table_plan->add_shards();
      out_shard->set_rank(shard.rank);
      out_shard->set_row_offset(shard.row_offset);
      out_shard->set_rows(shard.rows);
      out_shard->set_col_offset(shard.col_offset);
      out_shard->set_cols(shard.cols);
      // One tier holds it all (the rank's device memory); no double count.
      out_shard->set_storage_bytes(shard.storage.hbm + shard.storage.ddr);
      out_shard->set_hbm_bytes(shard.storage.hbm);
      out_shard->set_ddr_bytes(shard.storage.ddr);
      out_shard->set_cost(shard.cost.total());
    }
  }
  return out;
}

absl::Status ValidatePlan(const v1::ShardingPlan& plan,
                          absl::Span<const TableSpec> tables,
                          const Storage* usable) {
  const int world = plan.world_size();
  if (world < 1) return absl::InvalidArgumentError("plan: world_size < 1");
  absl::flat_hash_map<std::string, const TableSpec*> by_name;
  for (const TableSpec& table : tables) by_name[table.name] = &table;
  absl::flat_hash_map<std::string, bool> planned;
  std::vector<Storage> used(world);
  for (const v1::TablePlan& table_plan : plan.tables()) {
    auto invalid = [&](absl::string_view what) {
      return absl::InvalidArgumentError(
          absl::StrCat("plan: table '", table_plan.table(), "': ", what));
    };
    auto it = by_name.find(table_plan.table());
    if (it == by_name.end()) return invalid("not a table of the model");
    if (!planned.emplace(table_plan.table(), true).second) {
      return invalid("planned twice");
    }
    const TableSpec& table = *it->second;
    // The trainer builds every shard on the rank's device: no
    // FUSED_UVM_CACHING (host memory with a device cache).
    const v1::ComputeKernel kernel = table_plan.compute_kernel();
    if (kernel != v1::COMPUTE_KERNEL_UNSPECIFIED && kernel != v1::FUSED &&
        kernel != v1::DENSE) {
      return invalid(absl::StrCat(
          "compute kernel ",
          v1::ComputeKernel_IsValid(kernel) ? v1::ComputeKernel_Name(kernel)
                                            : absl::StrCat(kernel),
          " is not one the trainer runs (FUSED, DENSE)"));
    }
    if (table_plan.num_embeddings() != table.rows ||
        table_plan.embedding_dim() != table.dim) {
      return invalid(absl::StrCat("planned as ", table_plan.num_embeddings(),
                                  " x ", table_plan.embedding_dim(),
                                  ", the model has ", table.rows, " x ",
                                  table.dim));
    }
    std::vector<bool> holds(world, false);  // a shard of this table
    for (const v1::Shard& shard : table_plan.shards()) {
      if (shard.rank() < 0 || shard.rank() >= world) {
        return invalid(absl::StrCat("shard on rank ", shard.rank(),
                                    " outside [0, ", world, ")"));
      }
      if (holds[shard.rank()]) {
        return invalid(absl::StrCat("rank ", shard.rank(),
                                    " holds two shards (the trainer takes "
                                    "one per rank at most)"));
      }
      holds[shard.rank()] = true;
      if (shard.row_offset() < 0 || shard.col_offset() < 0 ||
          shard.rows() < 0 || shard.cols() < 0 ||
          shard.row_offset() + shard.rows() > table.rows ||
          shard.col_offset() + shard.cols() > table.dim) {
        return invalid("a shard lies outside the table");
      }
      used[shard.rank()] += Storage{shard.hbm_bytes(), shard.ddr_bytes()};
    }
    const auto& shards = table_plan.shards();
    if (table_plan.sharding_type() == v1::DATA_PARALLEL) {
      std::vector<int> per_rank(world, 0);
      for (const v1::Shard& shard : shards) {
        if (shard.rows() != table.rows || shard.cols() != table.dim) {
          return invalid("a data-parallel shard is not the whole table");
        }
        ++per_rank[shard.rank()];
      }
      for (int rank = 0; rank < world; ++rank) {
        if (per_rank[rank] != 1) {
          return invalid(absl::StrCat("data-parallel: rank ", rank, " holds ",
                                      per_rank[rank], " copies"));
        }
      }
      continue;
    }
    int64_t area = 0;
    for (int a = 0; a < shards.size(); ++a) {
      area += shards[a].rows() * shards[a].cols();
      for (int b = a + 1; b < shards.size(); ++b) {
        const v1::Shard& x = shards[a];
        const v1::Shard& y = shards[b];
        const bool rows_overlap = x.row_offset() < y.row_offset() + y.rows() &&
                                  y.row_offset() < x.row_offset() + x.rows();
        const bool cols_overlap = x.col_offset() < y.col_offset() + y.cols() &&
                                  y.col_offset() < x.col_offset() + x.cols();
        if (rows_overlap && cols_overlap) {
          return invalid(absl::StrCat("shards ", a, " and ", b, " overlap"));
        }
      }
    }
    if (area != table.rows * table.dim) {
      return invalid(absl::StrCat("shards cover ", area, " of ",
                                  table.rows * table.dim, " cells"));
    }
  }
  for (const TableSpec& table : tables) {
    if (!planned.contains(table.name)) {
      return absl::InvalidArgumentError(
          absl::StrCat("plan: table '", table.name, "' is not planned"));
    }
  }
  if (usable != nullptr) {
    for (int rank = 0; rank < world; ++rank) {
      if (!used[rank].FitsIn(*usable)) {
        return absl::InvalidArgumentError(
            absl::StrCat("plan: rank ", rank, " holds ", used[rank].hbm,
                         " HBM and ", used[rank].ddr, " DDR bytes, over its ",
                         usable->hbm, " and ", usable->ddr));
      }
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<Cost>> EstimateRankCosts(
    const v1::ShardingPlan& plan, absl::Span<const TableSpec> tables,
    const Topology& topology) {
  if (plan.world_size() != topology.world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("plan: world_size ", plan.world_size(),
                     ", the topology has ", topology.world_size));
  }
  if (absl::Status status = ValidatePlan(plan, tables); !status.ok()) {
    return status;
  }
  absl::flat_hash_map<std::string, const TableSpec*> by_name;
  for (const TableSpec& table : tables) by_name[table.name] = &table;
  std::vector<Cost> costs(topology.world_size);
  for (const v1::TablePlan& table_plan : plan.tables()) {
    for (const v1::Shard& shard : table_plan.shards()) {
      costs[shard.rank()] += EstimateShardCost(
          *by_name[table_plan.table()], table_plan.sharding_type(),
          shard.rows(), shard.cols(), topology);
    }
  }
  return costs;
}

}  // namespace deltastream::planner
